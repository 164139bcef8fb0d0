"""Key-index passes over stored rows: the bulk delete of many rows (eviction, batch remove) and
the one-by-one insert of rows known to be absent, both staged so that the cache misses of many
rows overlap. The table layout, hashing and probing are :mod:`.hashing`'s."""
from __future__ import annotations

import numpy as np
from numba import prange

from .dispatch import BATCH_MIN, variant
from .hashing import (EMPTY_SLOT, ROW_MASK, delete_in, delete_row, fill_slot, find_or_empty_slot, hash_key, home_slot,
                      ref_length, ref_offset, region_of, region_start, slot_entry, tag_home)
from .jit import njit
from .nrt_free import nrt_free, nrt_free_core
from .prefetch import prefetch
from .rowbits import bit, has_bit, words_for

_BLOCK = 64  # rows staged together (as hashing's batch lookup stages keys)


@njit(inline="always", cache=True)
def _hash_block(rows, b, m, arena, key_refs, row_tenant, hs, scratch):
    """Hash rows[b:b+m] into hs[:m] in two steps so their cache misses overlap: first load each
    row's key_ref and tenant and touch its key bytes (short iterations: many misses in flight),
    then hash the bytes, now in cache. Hashing straight away is latency-bound: the byte loop
    fills the CPU's reorder window, so about one miss is in flight at a time. Returns the key
    bytes of the block."""
    refs, tenants, touch = scratch[0], scratch[1], scratch[2]
    key_bytes = 0
    for t in range(m):
        r = rows[b + t]
        ref = key_refs[r]
        refs[t] = ref
        tenants[t] = row_tenant[r]
        length = ref_length(ref)
        key_bytes += length
        if length:
            touch[t] = arena[ref_offset(ref)] + arena[ref_offset(ref) + length - 1]
    for t in range(m):
        hs[t] = hash_key(arena, ref_offset(refs[t]), ref_length(refs[t]), tenants[t])
    return key_bytes


@njit(inline="always", cache=True)
def _stage_block(table, rows, b, arena, key_refs, row_tenant, hs, scratch):
    """Hash rows[b:b+len(hs)] and load their home slots (independent misses overlap); returns the
    block length and its key bytes. The caller then probes with the hashes while the slots are
    in cache."""
    m = min(hs.shape[0], rows.shape[0] - b)
    key_bytes = _hash_block(rows, b, m, arena, key_refs, row_tenant, hs, scratch)
    for t in range(m):
        prefetch(table, home_slot(hs[t], table.shape[0]))
    return m, key_bytes


_REGIONS = 256
_CHUNKS = 64
_SLOTS_PER_LINE = 8  # int64 slots in a 64-byte cache line
_AHEAD = 16  # rows: how far ahead :func:`_hash_rows` starts the loads of the keys it hashes next
_PARALLEL_DELETE_MIN = BATCH_MIN  # below this, thread start-up costs more than it saves
# From 1/_SWEEP_RATIO of the table's slots on, one pass over the whole table deletes a batch (about
# 1.1 ns per slot, plus 90 ns per deleted row for its run) instead of hashing and probing each row
# (about 170 ns per row in a table far larger than the cache). One thread, 13.3M slots: 50K rows
# 0.019 against 0.012 CPU s, 200K rows 0.040 against 0.046, 500K rows (an eviction of 5% of 10M
# objects) 0.058 against 0.085-0.11. Smaller batches keep the per-row path.
_SWEEP_RATIO = 64
# Slots: how far ahead of its test the sweep starts loading the bitset word of a slot's row. The
# rows are in random order, so the words are random reads; a bitset beyond the cache (12.5 MB at
# 100M rows) made them three quarters of the sweep. 134M slots, two threads: 0.55 -> 0.17 s
# (13.4M slots, the bitset in cache: 0.0165 -> 0.0136 s).
_MARK_AHEAD = np.uint64(128)


@njit(inline="always", cache=True)
def _hash_rows(rows, lo, hi, arena, key_refs, row_tenant, hs):
    """Hash rows[lo:hi] into hs[lo:hi]; returns their key bytes. Software-pipelined: each step
    prefetches the key ref and tenant of the row 2 * _AHEAD ahead and the key bytes of the row
    _AHEAD ahead (its key ref has arrived by then), so the misses of many rows are in flight
    while one is hashed (a third less time than :func:`_hash_block`'s blocks on 500K rows)."""
    key_bytes = 0
    for i in range(lo, hi):
        if i + 2 * _AHEAD < hi:
            prefetch(key_refs, rows[i + 2 * _AHEAD])
            prefetch(row_tenant, rows[i + 2 * _AHEAD])
        if i + _AHEAD < hi:
            prefetch(arena, ref_offset(key_refs[rows[i + _AHEAD]]))
        ref = key_refs[rows[i]]
        key_bytes += ref_length(ref)
        hs[i] = hash_key(arena, ref_offset(ref), ref_length(ref), row_tenant[rows[i]])
    return key_bytes


def delete_rows(table, rows, arena, key_refs, row_tenant) -> int:
    """Delete rows from the index (absent ones are ignored); returns their key bytes."""
    if rows.shape[0] < _PARALLEL_DELETE_MIN:  # serial, and keeping the GIL (see :mod:`.dispatch`)
        return int(_delete_rows_small(table, rows, arena, key_refs, row_tenant))
    if rows.shape[0] * _SWEEP_RATIO >= table.shape[0]:
        return int(_delete_rows_sweep(table, rows, key_refs))
    return int(_delete_rows_parallel(table, rows, arena, key_refs, row_tenant))


@njit(cache=True, nogil=True)
def _delete_rows_serial(table, rows, arena, key_refs, row_tenant):
    return _delete_rows_into(np.empty(_BLOCK, np.uint64), np.empty((3, _BLOCK), np.int64), table, rows, arena,
                             key_refs, row_tenant)


@nrt_free
def _delete_rows_into(hs, scratch, table, rows, arena, key_refs, row_tenant):
    key_bytes = 0
    for b in range(0, rows.shape[0], _BLOCK):
        m, block_bytes = _stage_block(table, rows, b, arena, key_refs, row_tenant, hs, scratch)
        key_bytes += block_bytes
        for t in range(m):
            delete_row(table, rows[b + t], hs[t])
    return key_bytes


_delete_rows_small = variant(_delete_rows_serial, "_small", nogil=False)


@njit(cache=True, nogil=True, parallel=True)
def _delete_rows_parallel(table, rows, arena, key_refs, row_tenant):
    """Hashes in parallel, then the deletions bucketed by table region and the regions in
    parallel. A delete only touches slots of its own region; the few whose probe run crosses a
    region boundary are done afterwards, one at a time. Every pass over the rows is parallel
    (a serial bucketing pass was a quarter of the time on two cores)."""
    n = rows.shape[0]
    size = table.shape[0]
    regions = min(_REGIONS, size)
    hs = np.empty(n, np.uint64)
    per_chunk = (n + _CHUNKS - 1) // _CHUNKS  # rows per chunk
    key_bytes = np.zeros(_CHUNKS, np.int64)
    counts = np.zeros((_CHUNKS, regions), np.int64)
    for c in prange(_CHUNKS):
        end = min(n, (c + 1) * per_chunk)
        key_bytes[c] = _hash_rows(rows, c * per_chunk, end, arena, key_refs, row_tenant, hs)
        for i in range(c * per_chunk, end):
            counts[c, region_of(home_slot(hs[i], size), size, regions)] += 1
    # grouped by region, rows in input order within one (chunk by chunk)
    start = np.empty(regions + 1, np.int64)
    k = 0
    for g in range(regions):
        start[g] = k
        for c in range(_CHUNKS):
            k, counts[c, g] = k + counts[c, g], k  # counts becomes each chunk's first position
    start[regions] = k
    grouped_rows = np.empty(n, np.int64)
    grouped_hs = np.empty(n, np.uint64)
    for c in prange(_CHUNKS):
        for i in range(c * per_chunk, min(n, (c + 1) * per_chunk)):
            g = region_of(home_slot(hs[i], size), size, regions)
            grouped_rows[counts[c, g]] = rows[i]
            grouped_hs[counts[c, g]] = hs[i]
            counts[c, g] += 1
    crossed = np.zeros(n, np.bool_)
    for g in prange(regions):
        stop = region_start(g + 1, size, regions)
        last_empty = _last_empty(table, region_start(g, size, regions), stop)
        order = _by_home(grouped_hs, start[g], start[g + 1], size, g, regions)
        for b in range(0, order.shape[0], _BLOCK):
            for t in range(b, min(order.shape[0], b + _BLOCK)):  # a block's home slots first: misses overlap
                home = home_slot(grouped_hs[order[t]], size)
                prefetch(table, home)
                # and the next line: from its home a delete walks to the end of the run (11.5
                # slots on average at 75% load, 1.4 line boundaries crossed: 10M keys, 5% deleted)
                prefetch(table, min(size - 1, home + _SLOTS_PER_LINE))
            for t in range(b, min(order.shape[0], b + _BLOCK)):
                h = grouped_hs[order[t]]
                if delete_in(table, slot_entry(h, grouped_rows[order[t]]), home_slot(h, size), stop, last_empty) < 0:
                    crossed[order[t]] = True
    for t in range(n):
        if crossed[t]:
            delete_row(table, grouped_rows[t], grouped_hs[t])
    return key_bytes.sum()


@njit(inline="always", cache=True)
def _slot(p, size):
    """The slot of position ``p`` (0 <= p < 2 * size: a sweep's runs may wrap around the table's
    end). Positions are unsigned: no negative-index fix-up at each access."""
    return p - size if p >= size else p


@njit(cache=True, nogil=True, parallel=True)
def _delete_rows_sweep(table, rows, key_refs):
    """The rows marked in a bitset, then one parallel pass over the table: no key is hashed and
    no row's key bytes are read, each slot's row is tested against the bitset (1.25 MB at 10M
    rows: in cache). Within a run holding a deleted entry, every later entry is re-inserted at
    the first empty slot from its home (they only move back): the table that deleting the rows
    one at a time leaves (backward-shift deletion leaves a run as if the key had never been
    inserted). A chunk owns the runs that start from its first empty slot up to the next
    chunk's, found before any slot changes, so no run is shared."""
    size = table.shape[0]
    bits = np.zeros(words_for(key_refs.shape[0]) + 1, np.uint64)  # + 1: see _marked
    for i in range(rows.shape[0]):
        bits[rows[i] >> 6] |= bit(rows[i] & 63)
    chunks = min(_CHUNKS, size)
    first = np.empty(chunks + 1, np.int64)
    for c in prange(chunks):
        lo = c * size // chunks
        p = lo
        while table[np.uint64(_slot(p, size))] != EMPTY_SLOT and p < lo + size - 1:  # (the index is never full)
            p += 1
        first[c] = p
    first[chunks] = first[0] + size
    key_bytes = np.zeros(chunks, np.int64)
    per_chunk = (rows.shape[0] + chunks - 1) // chunks
    for c in prange(chunks):
        for i in range(c * per_chunk, min(rows.shape[0], (c + 1) * per_chunk)):
            key_bytes[c] += ref_length(key_refs[rows[i]])
        _sweep_runs(table, bits, np.uint64(first[c]), np.uint64(first[c + 1]))
    return key_bytes.sum()


@njit(inline="always", cache=True)
def _row_bit(bits, v):
    """The bit of ``bits`` that slot value ``v``'s row has; an empty slot's "row" (2**32 - 1)
    has one in the bitset's last word, kept zero: no branch on emptiness (a coin toss at 75%
    load)."""
    return min(np.uint64(v) & np.uint64(ROW_MASK), np.uint64(bits.shape[0] - 1) << np.uint64(6))


@njit(inline="always", cache=True)
def _marked(bits, v):
    """Slot value ``v`` holds a row marked in ``bits``."""
    r = _row_bit(bits, v)
    return has_bit(bits[r >> np.uint64(6)], r & np.uint64(63))


@njit(inline="always", cache=True)
def _sweep_runs(table, bits, a, b):
    """Delete the marked entries of the runs at positions a..b-1 (unsigned; ``a`` an empty slot):
    a tight scan for the next marked entry, then its run rebuilt up to the run's end."""
    size = np.uint64(table.shape[0])
    for part in range(2):  # the positions before the table's end, then those wrapped past it
        lo, hi = (a, min(b, size)) if part == 0 else (max(a, size), b)
        shift = np.uint64(0) if part == 0 else size
        for p in range(lo, hi):  # (the slots of a rebuilt run are passed again: none is marked now)
            prefetch(bits, _row_bit(bits, table[min(p + _MARK_AHEAD, hi - np.uint64(1)) - shift]) >> np.uint64(6))
            if _marked(bits, table[p - shift]):
                _rebuild_run(table, bits, p, size)


@nrt_free_core
def _rebuild_run(table, bits, p, size):
    """Delete the entry at position ``p`` (marked) and every later marked one of its run; move
    the others back to the first empty slot from their home."""
    table[_slot(p, size)] = EMPTY_SLOT
    free = p   # the first empty position from the first deleted one on, among those passed
    holes = 1  # empty positions before the current one (entries deleted in the run so far)
    while True:
        p += np.uint64(1)
        at = _slot(p, size)
        v = table[at]
        if v == EMPTY_SLOT:
            return
        if _marked(bits, v):
            table[at] = EMPTY_SLOT
            holes += 1
            free = min(free, p)
            continue
        home = np.uint64(tag_home(v >> 32, size))  # then the probe distance, then the home's position
        home = p - (at - home if at >= home else at + size - home)
        if holes == 1:  # ``free`` is the one empty slot before p: v moves there or stays
            moved = home <= free  # (selects, not branches: whether it moves is a coin toss)
            table[_slot(free, size)] = v if moved else EMPTY_SLOT
            table[at] = EMPTY_SLOT if moved else v
            free = p if moved else free
            continue
        table[at] = EMPTY_SLOT
        if home <= free:  # every slot from the home to ``free`` is taken: v goes there
            table[_slot(free, size)] = v
            free += np.uint64(1)
            while free < p and table[_slot(free, size)] != EMPTY_SLOT:
                free += np.uint64(1)
        else:
            q = home
            while table[_slot(q, size)] != EMPTY_SLOT:
                q += np.uint64(1)
            table[_slot(q, size)] = v


@njit(inline="always", cache=True)
def _last_empty(table, lo, stop):
    """The last empty slot of window lo..stop-1 (``stop`` 0: the table's end), or -1 if none.
    Deletes leave it empty (entries only shift back into the holes of their own run), so a run
    before it never reaches the window's end: those deletes skip the check."""
    i = (stop if stop > 0 else table.shape[0]) - 1
    while i >= lo:
        if table[i] == EMPTY_SLOT:
            return i
        i -= 1
    return -1


_SUB_BITS = 8


@njit(inline="always", cache=True)
def _by_home(hs, lo, hi, size, g, regions):
    """Positions lo..hi-1 (hashes of homes in region ``g``) ordered by home slot to 1/256 of the
    region (a counting sort): the region's slots are then walked in (nearly) ascending order,
    which the hardware prefetcher follows."""
    first = g << _SUB_BITS
    at = np.zeros((1 << _SUB_BITS) + 1, np.int64)
    for i in range(lo, hi):
        at[region_of(home_slot(hs[i], size), size, regions << _SUB_BITS) - first + 1] += 1
    for s in range(1 << _SUB_BITS):
        at[s + 1] += at[s]
    order = np.empty(hi - lo, np.int64)
    for i in range(lo, hi):
        s = region_of(home_slot(hs[i], size), size, regions << _SUB_BITS) - first
        order[at[s]] = i
        at[s] += 1
    return order


@njit(cache=True)
def insert_rows_unique(table, rows, arena, key_refs, row_tenant):
    """Insert rows whose keys should all be distinct; returns the index (into ``rows``) of the
    first row whose (tenant, key) is already present, or -1. Used to load snapshots, where the
    index itself is the uniqueness check."""
    hs = np.empty(_BLOCK, np.uint64)
    scratch = np.empty((3, _BLOCK), np.int64)
    for b in range(0, rows.shape[0], _BLOCK):
        m = _stage_block(table, rows, b, arena, key_refs, row_tenant, hs, scratch)[0]
        for t in range(m):
            r = rows[b + t]
            ref = key_refs[r]
            existing, slot = find_or_empty_slot(table, arena, key_refs, row_tenant, arena, ref_offset(ref),
                                                ref_length(ref), row_tenant[r], hs[t])
            if existing >= 0:
                return b + t
            fill_slot(table, slot, hs[t], r)
    return -1
