"""Per-batch object kernels: placement + insertion of new puts, put completion, read classification.

Each kernel walks its batch sequentially so that duplicates inside one batch behave exactly as
the same calls made one after another.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .jit import njit

from ..errors import ErrorCode
from ..schema import (FLAG_GROUP_REFRESH, FLAG_GROUPED, FLAG_PROCESSING, KIND_MEMORY, ST_COMPLETE, ST_EMPTY,
                      ST_PROCESSING)
from . import allocation as ak
from .chains import next_row
from . import hashing as hk
from .dispatch import BATCH_MIN, variant
from .moves import move
from .nrt_free import nrt_free, nrt_free_core
from .prefetch import ROWS_AHEAD, prefetch
from .leases import commit_soft_pin, grant_until
from .rowbits import bit, words_for
from .slot_index import find_slot, slot_value
from .predicates import (has_pending_soft_pin, is_grouped, is_live, is_memory_replica_on, is_put_in_flight,
                         is_readable_replica, memory_replica_segment, lease_expired, slot_in_use, slot_is_complete,
                         slot_is_processing)

_BLOCK = 32
# batch result codes, from the one ErrorCode table (module-level ints: Numba compiles them in)
OK = int(ErrorCode.OK)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
ALREADY_EXISTS = int(ErrorCode.OBJECT_ALREADY_EXISTS)
NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
NO_HANDLE = int(ErrorCode.NO_AVAILABLE_HANDLE)
ILLEGAL_CLIENT = int(ErrorCode.ILLEGAL_CLIENT)
INVALID_WRITE = int(ErrorCode.INVALID_WRITE)
HAS_LEASE = int(ErrorCode.OBJECT_HAS_LEASE)

_PROCESSING_FLAG = int(FLAG_PROCESSING)
_GROUPED = int(FLAG_GROUPED)
_REFRESH = int(FLAG_GROUP_REFRESH)
_MEM = int(KIND_MEMORY)
_ST_PROC = int(ST_PROCESSING)
_ST_DONE = int(ST_COMPLETE)
_ST_EMPTY = int(ST_EMPTY)


@nrt_free_core
def _place_one(size, replica_num, preferred, allocatable, capacity, unit_bits, used, starts, lengths, base,
               counts, tried, out_seg, out_off):
    """Allocate up to replica_num replicas on distinct segments: preferred first, then most free.
    Returns how many were placed. (One allocation call site: each is typed and lowered.)"""
    nseg = allocatable.shape[0]
    tried[:] = 0
    placed = 0
    p = 0
    while placed < replica_num:
        s = np.int64(-1)
        while s < 0 and p < preferred.shape[0]:
            c = preferred[p]
            p += 1
            if c >= 0 and not tried[c] and allocatable[c]:
                s = c
        best_free = -1
        for c in range(nseg if s < 0 else 0):
            if allocatable[c] and not tried[c]:
                free = capacity[c] - used[c]
                if free >= size and free > best_free:
                    s = c
                    best_free = free
        if s < 0:
            break
        tried[s] = True
        off = ak.alloc_first_fit(starts, lengths, base, counts, unit_bits, capacity, s, size)
        if off >= 0:
            used[s] += ak.held_end(off, size, unit_bits[s], capacity[s]) - off
            out_seg[placed] = s
            out_off[placed] = off
            placed += 1
    return placed


@nrt_free
def _insert_new_puts(seg_buf, off_buf, tried, hashes, picks, offsets, data, tenant, sizes, replica_num, preferred,
                     free_rows, table, arena, arena_used, key_refs, row_tenant,
                     allocatable, capacity, unit_bits, used, starts, lengths, base, counts,
                     rep_seg, rep_off, rep_status, rep_kind, rep_id, next_replica_id,
                     codes, out_rows, ex_row, ex_seg, ex_off, ex_id):
    """Create objects for batch keys ``picks``; keys already present get ALREADY_EXISTS.

    Takes rows from ``free_rows`` in order; writes codes/out_rows per key. Replicas beyond the
    row's slots (a wide put) go to ``ex_*`` (object row, segment, byte offset, id) for the caller
    to place in continuation rows. Returns (rows used, new arena size, next replica id, extras).
    The first four are scratch (:func:`insert_new_puts` allocates them): no reference counting
    here (:mod:`.nrt_free`), and no kernel of its own around this one to compile.
    """
    used_rows = 0
    extras = 0
    hot = rep_status.shape[1]
    for i in range(picks.shape[0]):
        t = i % _BLOCK
        if t == 0:  # stage: hash a block and prefetch its home slots so the misses overlap
            for u in range(min(_BLOCK, picks.shape[0] - i)):
                k = picks[i + u]
                h = hk.hash_key(data, offsets[k], offsets[k + 1] - offsets[k], tenant)
                hashes[u] = np.int64(h)
                prefetch(table, hk.home_slot(h, table.shape[0]))
        k = picks[i]
        s = offsets[k]
        ln = offsets[k + 1] - s
        h = np.uint64(hashes[t])
        existing, slot = hk.find_or_empty_slot(table, arena, key_refs, row_tenant, data, s, ln, tenant, h)
        if existing >= 0:  # complete, in flight, or created by an earlier key of this batch
            codes[k] = ALREADY_EXISTS
            continue
        placed = _place_one(sizes[k], replica_num, preferred, allocatable, capacity, unit_bits, used,
                            starts, lengths, base, counts, tried, seg_buf, off_buf)
        if placed == 0:
            codes[k] = NO_HANDLE
            continue
        row = free_rows[used_rows]
        used_rows += 1
        for j in range(placed):
            if j < hot:
                rep_seg[row, j] = seg_buf[j]
                rep_off[row, j] = off_buf[j] >> unit_bits[seg_buf[j]]  # in units: ak.offset_shift
                rep_status[row, j] = _ST_PROC
                rep_kind[row, j] = _MEM
                rep_id[row, j] = next_replica_id
            else:
                ex_row[extras] = row
                ex_seg[extras] = seg_buf[j]
                ex_off[extras] = off_buf[j]
                ex_id[extras] = next_replica_id
                extras += 1
            next_replica_id += 1
        move(arena, arena_used, data, s, ln)
        key_refs[row] = hk.key_ref(arena_used, ln)
        row_tenant[row] = tenant
        arena_used += ln
        hk.fill_slot(table, slot, h, row)  # nothing touched the table since the probe
        codes[k] = OK
        out_rows[k] = row
    return used_rows, arena_used, next_replica_id, extras


_insert_new_puts_nogil = variant(_insert_new_puts, "_nogil", nogil=True)


def insert_new_puts(picks, offsets, data, tenant, sizes, replica_num, preferred, free_rows, table, arena,
                    arena_used, key_refs, row_tenant, allocatable, *args):
    """See :func:`_insert_new_puts`, given its scratch (drops the GIL for batches, see :mod:`.dispatch`)."""
    # scratch all int64 (tried: 0/1; hashes: their bits, cast back)
    scratch = (np.empty(replica_num, np.int64), np.empty(replica_num, np.int64),
               np.empty(allocatable.shape[0], np.int64), np.empty(_BLOCK, np.int64))
    kernel = _insert_new_puts if picks.shape[0] < BATCH_MIN else _insert_new_puts_nogil
    return kernel(*scratch, picks, offsets, data, tenant, sizes, replica_num, preferred, free_rows, table, arena,
                  arena_used, key_refs, row_tenant, allocatable, *args)


@nrt_free
def _complete_puts(rows, client, now, codes, flags, client_col, lease, soft_deadline, rep_status,
                   inflight_index, inflight_owner, pending_ttl, released, more):
    """put_end for many rows: PROCESSING -> COMPLETE, lease = max(lease, now), soft-pin commit.

    ``codes`` is pre-filled (NOT_FOUND where row < 0). Inflight slots of finished puts (found
    through the in-flight table's row index) are written to ``released`` (else -1). Returns the
    number of replicas completed.
    """
    done = 0
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            continue
        if client_col[r] != client:
            codes[i] = ILLEGAL_CLIENT
            continue
        f = flags[r]
        in_flight = is_put_in_flight(f)
        all_complete = True
        had_complete = False
        completed = 0
        rr = r
        while rr >= 0:  # one walk for both cases (each loop is typed and lowered)
            for j in range(rep_status.shape[1]):
                st = rep_status[rr, j]
                if slot_is_complete(st):
                    had_complete = True
                elif in_flight and slot_is_processing(st):
                    rep_status[rr, j] = _ST_DONE
                    completed += 1
                elif slot_in_use(st):
                    all_complete = False
            rr = next_row(more, rr)
        if not in_flight:
            codes[i] = OK if all_complete else INVALID_WRITE
            continue
        done += completed
        slot = find_slot(inflight_index, inflight_owner, r)
        if has_pending_soft_pin(f) and not had_complete and completed > 0:
            commit_soft_pin(flags, soft_deadline, r, now, pending_ttl[slot])
        flags[r] = flags[r] & ~np.uint8(_PROCESSING_FLAG)
        released[i] = slot
        grant_until(lease, r, now)
        codes[i] = OK
    return done


_complete_puts_nogil = variant(_complete_puts, "_nogil", nogil=True)


def complete_puts(rows, *args):
    """See :func:`_complete_puts` (drops the GIL for batches)."""
    if rows.shape[0] < BATCH_MIN:
        return _complete_puts(rows, *args)
    return _complete_puts_nogil(rows, *args)


@njit(cache=True)
def link_group_members(rows, gcode, group_head, links, flags):
    """Add new rows (their code already in the group table, ``links``: its links()) to group
    ``gcode``'s circular member list and mark the group for refresh."""
    index, owner, nxt = links
    head = group_head[gcode]
    for i in range(rows.shape[0]):
        r = rows[i]
        flags[r] |= np.uint8(_GROUPED)
        s = find_slot(index, owner, r)
        if head < 0:
            head = r
            nxt[s] = r
        else:
            h = find_slot(index, owner, head)
            nxt[s] = nxt[h]
            nxt[h] = r
    group_head[gcode] = head
    r = head
    while True:  # upstream: a new member puts the group in groups_needing_lease_refresh_
        flags[r] |= np.uint8(_REFRESH)
        r = slot_value(links, r, head)
        if r == head:
            break


@njit(cache=True)
def unlink_group_members(rows, group_head, groups, links, flags):
    """Remove rows from their group's circular member list, keeping group_head on a member
    (``groups``, ``links``: the GroupTable's parts() and links()); their slots stay taken."""
    index, owner, nxt = links
    for i in range(rows.shape[0]):
        r = rows[i]
        if not is_grouped(flags[r]):
            continue
        g = slot_value(groups, r, -1)
        s = find_slot(index, owner, r)
        p = r
        ps = s
        while nxt[ps] != r:
            p = nxt[ps]
            ps = find_slot(index, owner, p)
        nxt[ps] = nxt[s]
        nxt[s] = r
        if group_head[g] == r:
            group_head[g] = p if p != r else -1


@njit(cache=True)
def _classify_removals(rows, now, force, lease, rep_status, codes, more):
    """remove/batch_remove/remove_all: OBJECT_HAS_LEASE unless force; NOT_READY while incomplete."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            codes[i] = NOT_FOUND
            continue
        if not force and not lease_expired(lease[r], now):
            codes[i] = HAS_LEASE
            continue
        codes[i] = OK
        while r >= 0:
            for j in range(rep_status.shape[1]):
                st = rep_status[r, j]
                if slot_in_use(st) and not slot_is_complete(st):
                    codes[i] = NOT_READY
            r = next_row(more, r)


_classify_removals_nogil = variant(_classify_removals, "_nogil", nogil=True)


def classify_removals(rows, *args):
    """See :func:`_classify_removals` (drops the GIL for batches)."""
    if rows.shape[0] < BATCH_MIN:
        return _classify_removals(rows, *args)
    return _classify_removals_nogil(rows, *args)


@njit(cache=True)
def drop_slots_on_segment(code, rows_hw, flags, rep_seg, rep_status, rep_kind, more):
    """Unmount: clear every memory replica slot on segment ``code``; returns rows left with none."""
    out = np.empty(rows_hw, np.int64)
    n = 0
    for r in range(rows_hw):
        if not is_live(flags[r]):
            continue
        touched = False
        remaining = 0
        rr = r
        while rr >= 0:
            for j in range(rep_status.shape[1]):
                if not slot_in_use(rep_status[rr, j]):
                    continue
                if memory_replica_segment(rep_status[rr, j], rep_kind[rr, j], rep_seg[rr, j]) == code:
                    rep_status[rr, j] = _ST_EMPTY
                    rep_seg[rr, j] = -1
                    touched = True
                else:
                    remaining += 1
            rr = next_row(more, rr)
        if touched and remaining == 0:
            out[n] = r
            n += 1
    return out[:n]


@njit(cache=True)
def readable_mask(rows, slots, rep_status, rep_kind, rep_seg, seg_readable):
    """is_readable_replica for each (rows[i], slots[i])."""
    out = np.empty(rows.shape[0], np.bool_)
    for i in range(rows.shape[0]):
        r = rows[i]
        j = slots[i]
        out[i] = is_readable_replica(rep_status[r, j], rep_kind[r, j], rep_seg[r, j], seg_readable)
    return out


@njit(inline="always", cache=True)
def _any_on_segments(r, on_segment, rep_status, rep_kind, rep_seg, more):
    while r >= 0:
        for j in range(rep_status.shape[1]):
            if is_memory_replica_on(rep_status[r, j], rep_kind[r, j], rep_seg[r, j], on_segment):
                return True
        r = next_row(more, r)
    return False


@njit(cache=True, nogil=True, parallel=True)
def objects_on_segments(on_segment, rows_hw, flags, rep_status, rep_kind, rep_seg, more):
    """Remount's one columnar pass: the bitset (:mod:`.rowbits`) of the objects with a memory
    replica on any segment flagged in ``on_segment`` (each object once, however many replicas
    match), and how many there are."""
    words = words_for(rows_hw)
    bits = np.empty(words, np.uint64)
    chunks = 64
    step = (words + chunks - 1) // chunks
    found = np.zeros(chunks, np.int64)
    for c in prange(chunks):  # chunks of whole words: no two threads write one word
        k = 0
        for w in range(c * step, min(words, (c + 1) * step)):
            word = np.uint64(0)
            for b in range(min(64, rows_hw - (w << 6))):
                r = (w << 6) + b
                if is_live(flags[r]) and _any_on_segments(r, on_segment, rep_status, rep_kind, rep_seg, more):
                    word |= bit(b)
                    k += 1
            bits[w] = word
        found[c] = k
    return bits, found.sum()


@njit(inline="always", cache=True)
def _frees_extent(r, j, allocatable, rep_kind, rep_seg):
    s = rep_seg[r, j]
    if rep_kind[r, j] != _MEM:
        return False
    if s < 0:
        return False
    return allocatable[s]


@njit(cache=True, nogil=True, parallel=True)
def _clear_slots_parallel(rows, mask, allocatable, sizes, rep_status, rep_kind, rep_seg, rep_off, unit_bits, offs,
                          lens):
    """Clear the replica slots set in ``mask`` (slot j of rows[i] where mask[i, j]: the matrix a
    caller selects slots with, so no list of them is built first); returns the memory extents
    they held on allocatable segments as (byte offset, size) grouped by segment in code order,
    in (i, j) order within one, with how many each segment has (what a merged free takes),
    whether their offsets ascend within every segment, and the bytes dropped. The extents are
    written to the front of ``offs`` and ``lens`` (an entry per set slot at least, made by the
    caller: see :meth:`..store.metadata.MetadataStore.clear_slots`) and returned as views of
    them. Parallel: chunks count their extents per segment, then fill their share of each
    segment's part. Grouping here saves the free a serial
    pass over the extents and their copies (0.06-0.1 s of an eviction of 5M objects); counts per
    segment rather than a segment per extent save it another pass and 8 bytes per extent."""
    n = rows.shape[0]
    nseg = allocatable.shape[0]
    chunks = 64 if n >= BATCH_MIN else 1  # (a few slots: no per-chunk tables of every segment)
    step = (n + chunks - 1) // chunks
    at = np.zeros((chunks, nseg), np.int64)
    for c in prange(chunks):
        end = min(n, (c + 1) * step)
        for i in range(c * step, end):
            if i + ROWS_AHEAD < end:  # sparse rows: their misses overlap only when started early
                prefetch(rep_kind, (rows[i + ROWS_AHEAD], 0))
                prefetch(rep_seg, (rows[i + ROWS_AHEAD], 0))
            for j in range(mask.shape[1]):
                if mask[i, j] and _frees_extent(rows[i], j, allocatable, rep_kind, rep_seg):
                    at[c, rep_seg[rows[i], j]] += 1
    per_segment = at.sum(axis=0)
    total = 0
    for g in range(nseg):  # segment by segment, chunk by chunk: each (chunk, segment)'s first position
        for c in range(chunks):
            total, at[c, g] = total + at[c, g], total
    first = np.full((chunks, nseg), -1, np.int64)  # each (chunk, segment)'s first and last offsets
    last = np.full((chunks, nseg), -1, np.int64)
    ascending = np.ones(chunks, np.bool_)
    dropped = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        end = min(n, (c + 1) * step)
        for i in range(c * step, end):
            if i + ROWS_AHEAD < end:
                prefetch(sizes, rows[i + ROWS_AHEAD])
                prefetch(rep_off, (rows[i + ROWS_AHEAD], 0))
                prefetch(rep_status, (rows[i + ROWS_AHEAD], 0))
            r = rows[i]
            for j in range(mask.shape[1]):
                if not mask[i, j]:
                    continue
                if _frees_extent(r, j, allocatable, rep_kind, rep_seg):
                    g = rep_seg[r, j]
                    off = np.int64(rep_off[r, j]) << unit_bits[g]  # a memory replica's: in units
                    k = at[c, g]
                    offs[k] = off
                    lens[k] = sizes[r]
                    at[c, g] = k + 1
                    if first[c, g] < 0:
                        first[c, g] = off
                    elif off <= last[c, g]:
                        ascending[c] = False
                    last[c, g] = off
                dropped[c] += sizes[r]
                rep_status[r, j] = _ST_EMPTY
                rep_seg[r, j] = -1
    ordered = ascending.all()
    for g in range(nseg):  # and across the chunks' parts of each segment
        previous = np.int64(-1)
        for c in range(chunks):
            if first[c, g] >= 0:
                ordered &= first[c, g] > previous
                previous = last[c, g]
    return per_segment, offs[:total], lens[:total], ordered, dropped.sum()


_clear_slots_serial = variant(_clear_slots_parallel, "_serial")


def clear_slots(rows, *args):
    """See :func:`_clear_slots_parallel`; a few rows (one remove) take the serial variant that
    keeps the GIL and wakes no worker thread (see :mod:`.dispatch`)."""
    if rows.shape[0] < BATCH_MIN:
        return _clear_slots_serial(rows, *args)
    return _clear_slots_parallel(rows, *args)
