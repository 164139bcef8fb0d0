"""Eviction kernels: census, deterministic k-earliest selection, plan with group expansion.

All object/replica decisions go through :mod:`.predicates`; nothing here compares lease deadlines
or tests flag bits itself. Kernels release the GIL so a background eviction thread does not
stall the embedding process.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import prange

from .chains import next_row
from .jit import njit
from .prefetch import ROWS_AHEAD, prefetch
from .slot_index import slot_value
from .slot_lists import rows_before
from .predicates import (is_eviction_candidate, is_evictable_memory_replica, is_grouped,
                         is_hard_pinned, is_live, is_unreadable_memory_replica, lease_expired,
                         object_has_evictable_memory_replica, slot_in_use, soft_pin_active)


NOT_IN_BASE, IN_BASE, NO_PIN_CANDIDATE, SOFT_PINNED_CANDIDATE = 0, 1, 2, 3
_CHUNKS = 64


class Listed(NamedTuple):
    """Candidate rows (ascending) and their deadlines: every candidate whose deadline is at or
    below some bound, so the earliest ones among them are the earliest of all candidates."""

    rows: np.ndarray
    deadlines: np.ndarray


@njit(cache=True, nogil=True)
def _packed(buffer, chunk, found):
    """The first found[c] entries of every chunk's region buffer[c * chunk:], packed in order."""
    out = np.empty(found.sum(), buffer.dtype)
    k = 0
    for c in range(found.shape[0]):
        out[k:k + found[c]] = buffer[c * chunk:c * chunk + found[c]]
        k += found[c]
    return out


@njit(inline="always", cache=True)
def _classify(r, now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment, refcnt,
              seg_readable, more):
    """Row ``r``'s census code, and its complete memory replicas kept out only by readability
    (the RFC guard's skips; counted only for rows that would otherwise be candidates). ``r`` may
    be unsigned (the census's rows: see :func:`_census`); the chain walks take it signed."""
    f = flags[r]
    if not is_live(f):
        return NOT_IN_BASE, 0
    if is_hard_pinned(f):
        return NOT_IN_BASE, 0
    if only_tenant >= 0:
        if tenant[r] != only_tenant:
            return NOT_IN_BASE, 0
    rr = np.int64(r)
    if not object_has_evictable_memory_replica(rr, status, kind, segment, refcnt, seg_readable, more):
        skipped = 0
        if lease_expired(lease[r], now):
            while rr >= 0:
                for j in range(status.shape[1]):
                    if is_unreadable_memory_replica(status[rr, j], kind[rr, j], segment[rr, j],
                                                    refcnt[rr, j], seg_readable):
                        skipped += 1
                rr = next_row(more, rr)
        return NOT_IN_BASE, skipped
    if not lease_expired(lease[r], now):
        return IN_BASE, 0
    if soft_pin_active(f, soft_deadline, rr, now):
        return SOFT_PINNED_CANDIDATE, 0
    return NO_PIN_CANDIDATE, 0


@njit(inline="always", cache=True)
def _census_chunk(rows, columns, codes, listing, bound, found_rows, found_deadlines, at, room):
    """:func:`_census` of rows rows[0]..rows[1]-1: (IN_BASE, NO_PIN_CANDIDATE and
    SOFT_PINNED_CANDIDATE rows, the RFC guard's skips, rows listed, which may exceed ``room``)."""
    now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment, refcnt, seg_readable, more = columns
    skipped = in_base = no_pin = soft = k = 0
    for r in range(rows[0], rows[1]):
        code, skips = _classify(r, now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment,
                                refcnt, seg_readable, more)
        if not listing:
            codes[r] = code
        if code == NOT_IN_BASE:
            skipped += skips
        elif code == IN_BASE:
            in_base += 1
        elif code == SOFT_PINNED_CANDIDATE:
            soft += 1
        else:
            no_pin += 1
            if listing:
                d = lease[r]
                if d <= bound:
                    if k < room:
                        found_rows[at + k] = r
                        found_deadlines[at + k] = d
                    k += 1
    return in_base, no_pin, soft, skipped, k


@njit(cache=True, nogil=True, parallel=True)
def _census(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment, refcnt,
            seg_readable, more, codes, listing, bound, found_rows, found_deadlines):
    """:func:`census` (``listing`` False), or, instead of the codes, the NO_PIN_CANDIDATE rows
    whose deadline is <= bound with their deadlines, ascending, from the same pass: each chunk
    writes up to a room's worth (``found_rows``/``found_deadlines``: ``_CHUNKS`` rooms) at its
    own start of them, then the chunks are packed in place, one after the other (each moves
    back: the chunks before it took no more than their rooms), and the listing is a view of
    them. A chunk that found more than its room classifies its rows again, into fresh arrays.
    Storing each deadline as it is tested, rather than gathering the listed rows' deadlines
    again, and reusing kept buffers took the pass from 0.29 to 0.21 s (synthetic 100M rows,
    6.7% listed; 0.18 s without a listing). Every page of a fresh buffer is a fault (about 2 ms
    per MB on this VM when the host has to back it), so the rooms are sized by the share of rows
    the sample expects, not by the rows, and hold 4-byte rows: rows fit 32 bits (the key index's
    slots hold 32-bit rows). Rows are unsigned: a signed row, which LLVM cannot prove
    non-negative, takes a wrap-around fix-up at every column access (10% more CPU). ``codes``
    (``rows_hw`` entries) is written for every row when not ``listing``: a kept buffer, not a
    fresh zeroed one (see :func:`census`). A listing writes no codes: the planner rarely needs
    them then (:class:`..policies.eviction._Planner`), and they were an eighth of the pass's
    memory traffic (a byte written per row, read first for ownership)."""
    chunk = (rows_hw + _CHUNKS - 1) // _CHUNKS
    room = found_rows.shape[0] // _CHUNKS
    skipped = np.zeros(_CHUNKS, np.int64)
    per_code = np.zeros((_CHUNKS, 4), np.int64)
    found = np.zeros(_CHUNKS, np.int64)
    for c in prange(_CHUNKS):
        rows = (np.uint64(c * chunk), np.uint64(min(rows_hw, (c + 1) * chunk)))
        columns = (now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment, refcnt, seg_readable,
                   more)
        if listing:  # (a constant in each call: each inlined copy of the loop tests it once)
            in_base, no_pin, soft, skips, k = _census_chunk(rows, columns, codes, True, bound, found_rows,
                                                           found_deadlines, c * room, room)
        else:
            in_base, no_pin, soft, skips, k = _census_chunk(rows, columns, codes, False, bound, found_rows,
                                                           found_deadlines, c * room, room)
        per_code[c, IN_BASE] = in_base
        per_code[c, NO_PIN_CANDIDATE] = no_pin
        per_code[c, SOFT_PINNED_CANDIDATE] = soft
        per_code[c, NOT_IN_BASE] = max(0, min(rows_hw, (c + 1) * chunk) - c * chunk) - in_base - no_pin - soft
        skipped[c] = skips
        found[c] = k
    if found.max() <= room:
        total = 0
        for c in range(_CHUNKS):
            for i in range(found[c]):
                found_rows[total + i] = found_rows[c * room + i]
                found_deadlines[total + i] = found_deadlines[c * room + i]
            total += found[c]
        return per_code.sum(axis=0), skipped.sum(), found_rows[:total], found_deadlines[:total]
    at = np.zeros(_CHUNKS + 1, np.int64)
    at[1:] = np.cumsum(found)
    listed_rows = np.empty(at[-1], np.uint32)
    listed_lease = np.empty(at[-1], np.int64)
    for c in prange(_CHUNKS):
        if found[c] <= room:
            listed_rows[at[c]:at[c + 1]] = found_rows[c * room:c * room + found[c]]
            listed_lease[at[c]:at[c + 1]] = found_deadlines[c * room:c * room + found[c]]
        else:  # more than its room (deadlines that cluster by row): its rows classified again
            i = at[c]
            for r in range(np.uint64(c * chunk), np.uint64(min(rows_hw, (c + 1) * chunk))):
                if lease[r] > bound:
                    continue
                code = _classify(r, now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment,
                                 refcnt, seg_readable, more)[0]
                if code == NO_PIN_CANDIDATE:
                    listed_rows[i] = r
                    listed_lease[i] = lease[r]
                    i += 1
    return per_code.sum(axis=0), skipped.sum(), listed_rows, listed_lease


_NO_ROOMS = (np.empty(0, np.uint32), np.empty(0, np.int64))
_NO_CODES = np.empty(0, np.uint8)  # a listing writes none


def _codes(rows_hw: int, out: np.ndarray | None) -> np.ndarray:
    return np.empty(rows_hw, np.uint8) if out is None else out[:rows_hw]


def census(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment, refcnt,
           seg_readable, more, out=None):
    """Classify every row (in parallel chunks): NOT_IN_BASE, IN_BASE (evictable replica, lease
    live), NO_PIN_CANDIDATE or SOFT_PINNED_CANDIDATE (lease expired); ``only_tenant`` >= 0
    restricts everything to one tenant. Returns (codes, rows per code, complete memory replicas
    kept out only by readability: the RFC guard's skips). Candidates stay codes: listing 10M
    rows would cost more than the rest of a cycle. ``out``: a uint8 buffer of at least
    ``rows_hw`` entries for the codes, kept from one cycle to the next: a fresh one costs its
    page faults (synthetic 100M rows: the census 0.22-0.26 s into fresh memory, 0.17 s into a
    kept buffer, which is about the time of reading its columns)."""
    codes = _codes(rows_hw, out)
    counts, skipped = _census(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment,
                              refcnt, seg_readable, more, codes, False, 0, *_NO_ROOMS)[:2]
    return codes, counts, skipped


def listing_entries(rows_hw: int, share: float) -> int:
    """How many entries :func:`census_listing`'s buffers hold: a room per chunk, twice the share
    of a chunk's rows the sample expects (at least 1024, at most the chunk)."""
    chunk = (rows_hw + _CHUNKS - 1) // _CHUNKS
    return _CHUNKS * min(chunk, int(2 * share * chunk) + 1024)


def census_listing(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment,
                   refcnt, seg_readable, more, bound, share=1.0, listing_out=None):
    """:func:`census`'s counts, without the codes, plus ``Listed``: the NO_PIN_CANDIDATE rows
    whose deadline is <= ``bound`` (ascending, as uint32) and their deadlines, found in the same
    pass. ``share``: the part of all rows expected to be listed (:class:`ListingBound`); it
    sizes the pass's buffers, not the result. ``listing_out``: kept (uint32, int64) buffers of
    at least :func:`listing_entries` entries, which the listing then usually views (the same
    rules as :func:`census`'s ``out``)."""
    n = listing_entries(rows_hw, share)
    found = (np.empty(n, np.uint32), np.empty(n, np.int64)) if listing_out is None else (
        listing_out[0][:n], listing_out[1][:n])
    counts, skipped, rows, deadlines = _census(now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline,
                                               status, kind, segment, refcnt, seg_readable, more, _NO_CODES, True,
                                               bound, *found)
    return counts, skipped, Listed(rows, deadlines)


@njit(cache=True, nogil=True, parallel=True)
def census_sample(step, now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind,
                  segment, refcnt, seg_readable, more):
    """The census of every ``step``-th row: (rows per code, deadlines of its NO_PIN_CANDIDATE
    rows), to bound the earliest deadlines before the census lists them. (Parallel chunks: the
    serial compilation of this loop body runs about ten times slower per row.)"""
    samples = (rows_hw + step - 1) // step
    chunk = (samples + _CHUNKS - 1) // _CHUNKS
    per_code = np.zeros((_CHUNKS, 4), np.int64)
    out = np.empty(samples, np.int64)
    found = np.zeros(_CHUNKS, np.int64)
    for c in prange(_CHUNKS):
        k = c * chunk
        counts = np.zeros(4, np.int64)
        for i in range(c * chunk, min(samples, (c + 1) * chunk)):
            r = i * step
            code = _classify(r, now, tenant, only_tenant, flags, lease, soft_deadline, status, kind, segment,
                             refcnt, seg_readable, more)[0]
            counts[code] += 1
            if code == NO_PIN_CANDIDATE:
                out[k] = lease[r]
                k += 1
        per_code[c] = counts
        found[c] = k - c * chunk
    return per_code.sum(axis=0), _packed(out, chunk, found)


# Codes the planner gives the rows it takes: by a no-pin pass, or by the soft-pinned fallback.
PLANNED, PLANNED_SOFT = 4, 5


@njit(cache=True, nogil=True, parallel=True)
def rows_coded(codes, code, lease, bound):
    """Ascending rows whose code is ``code`` and, when ``bound`` is not None, whose deadline is
    <= bound. One parallel pass: each chunk writes its matches at its own start of a row-sized
    buffer (only the pages written are ever touched), then the chunks are packed."""
    n = codes.shape[0]
    chunk = (n + _CHUNKS - 1) // _CHUNKS
    found = np.empty(n, np.int64)
    count = np.zeros(_CHUNKS, np.int64)
    for c in prange(_CHUNKS):
        k = c * chunk
        for r in range(c * chunk, min(n, (c + 1) * chunk)):
            if codes[r] != code:
                continue
            if bound is not None:
                if lease[r] > bound:
                    continue
            found[k] = r
            k += 1
        count[c] = k - c * chunk
    return _packed(found, chunk, count)


_SAMPLE = 1 << 16
_CENSUS_SAMPLE = 1 << 14  # each sampled row reads every census column: fewer than _SAMPLE


@njit(cache=True, nogil=True)
def _at_most(rows, lease, bound):
    """Rows whose deadline is <= bound, in input order (one pass, no gathered copy)."""
    out = np.empty(rows.shape[0], np.int64)
    n = 0
    for i in range(rows.shape[0]):
        if lease[rows[i]] <= bound:
            out[n] = rows[i]
            n += 1
    return out[:n]


@njit(cache=True, nogil=True)
def _sample_coded(codes, code, lease, step):
    """Deadlines of the rows with ``code`` among every ``step``-th row."""
    out = np.empty((codes.shape[0] + step - 1) // step, np.int64)
    n = 0
    for r in range(0, codes.shape[0], step):
        if codes[r] == code:
            out[n] = lease[r]
            n += 1
    return out[:n]


def _bound(sample: np.ndarray, k: int, count: int) -> int | None:
    """A deadline that probably has a little more than k of ``count`` rows at or below it."""
    if sample.size < 1024:
        return None
    sample = np.sort(sample)
    return int(sample[min(sample.size - 1, int(sample.size * k / count * 1.25) + 64)])


_SELECT_BITS = 12  # buckets of :func:`_kth`'s histogram: 2**12 per chunk (32 KB, in cache)


@njit(cache=True, nogil=True, parallel=True)
def _select_bucket(keys, k):
    """The histogram step of :func:`_kth`: (lowest key, bucket shift, bucket of the k-th smallest,
    keys in the buckets before it, keys in it). Keys are offset by the lowest one as unsigned
    (exact for any int64 range); parallel chunks, each with its own histogram."""
    n = keys.shape[0]
    chunks = min(_CHUNKS, (n >> 15) + 1)  # a small eviction's few keys: one histogram, not 2 MB of them
    per = (n + chunks - 1) // chunks
    lows = np.empty(chunks, np.int64)
    highs = np.empty(chunks, np.int64)
    for c in prange(chunks):
        lo = hi = keys[min(c * per, n - 1)]
        for i in range(c * per, min(n, (c + 1) * per)):
            lo = min(lo, keys[i])
            hi = max(hi, keys[i])
        lows[c], highs[c] = lo, hi
    low = lows.min()
    span = np.uint64(highs.max()) - np.uint64(low)
    shift = 0
    while (span >> np.uint64(shift)) >= np.uint64(1 << _SELECT_BITS):
        shift += 1
    counts = np.zeros((chunks, 1 << _SELECT_BITS), np.int64)
    for c in prange(chunks):
        for i in range(c * per, min(n, (c + 1) * per)):
            counts[c, (np.uint64(keys[i]) - np.uint64(low)) >> np.uint64(shift)] += 1
    total = counts.sum(axis=0)
    below = 0
    b = 0
    while below + total[b] < k:
        below += total[b]
        b += 1
    return low, shift, b, below, total[b]


@njit(cache=True, nogil=True)
def _in_bucket(keys, low, shift, b, count):
    """The keys of bucket ``b`` (``count`` of them) of :func:`_select_bucket`'s histogram."""
    out = np.empty(count, np.int64)
    m = 0
    for i in range(keys.shape[0]):
        if (np.uint64(keys[i]) - np.uint64(low)) >> np.uint64(shift) == np.uint64(b):
            out[m] = keys[i]
            m += 1
    return out


def _kth(keys: np.ndarray, k: int) -> tuple[int, int]:
    """The k-th smallest of ``keys``, and how many of the k smallest equal it. A histogram of the
    keys finds the bucket holding it, and only that bucket is partitioned: at 100M objects
    (about 6M listed deadlines) np.partition of them all took 60-75 ms."""
    low, shift, b, below, count = _select_bucket(keys, k)
    part = _in_bucket(keys, low, shift, b, count)
    j = k - int(below)  # the k-th smallest is the bucket's j-th
    part.partition(j - 1)
    kth = part[j - 1]
    return int(kth), j - int(np.count_nonzero(part[:j] < kth))


def earliest_first(rows: np.ndarray, lease: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` rows with the earliest lease, sorted by (lease, row): deterministic on ties.

    ``rows`` must be ascending. A strided sample of the deadlines bounds the k-th one, one pass
    keeps the rows at or below that bound, and only they are partitioned and sorted; when the
    sample misjudges (too few kept) the whole set is used, so the result never depends on it.
    """
    if k <= 0 or rows.size == 0:
        return rows[:0]
    k = min(k, rows.size)
    if k < rows.size:
        if k < rows.size // 4 and rows.size > 4 * _SAMPLE:
            bound = _bound(lease[rows[:: rows.size // _SAMPLE]], k, rows.size)
            kept = _at_most(rows, lease, bound) if bound is not None else rows
            rows = kept if kept.size >= k else rows
        rows = _at_most(rows, lease, _kth(lease[rows], k)[0])
    return rows[np.argsort(lease[rows], kind="stable")][:k]  # stable: ties stay in (ascending) row order


class ListingBound(NamedTuple):
    """:func:`listing_bound`'s answer: the deadline, and the share of all rows that the sample
    puts at or below it as NO_PIN_CANDIDATE (what :func:`census_listing` will probably list)."""

    deadline: int
    share: float


def listing_bound(ratio: float, now, rows_hw, tenant, only_tenant, flags, lease, soft_deadline, status, kind,
                  segment, refcnt, seg_readable, more) -> ListingBound | None:
    """A deadline that probably has a little more than the first pass's ``ratio`` of the base at
    or below it, judged by the census of a strided sample, for :func:`census_listing` (same
    arguments as :func:`census`); None when that pass takes most candidates anyway (listing them
    saves nothing) or the sample is too small."""
    counts, deadlines = census_sample(max(1, rows_hw // _CENSUS_SAMPLE), now, rows_hw, tenant, only_tenant, flags,
                                      lease, soft_deadline, status, kind, segment, refcnt, seg_readable, more)
    want = ratio * int(counts[IN_BASE] + counts[NO_PIN_CANDIDATE] + counts[SOFT_PINNED_CANDIDATE])
    if not 0 < want < deadlines.size // 4:
        return None
    bound = _bound(deadlines, math.ceil(want), deadlines.size)
    if bound is None:
        return None
    return ListingBound(bound, int(np.count_nonzero(deadlines <= bound)) / max(1, int(counts.sum())))


def _listed_here(codes: np.ndarray, code: int, count: int, lease: np.ndarray, k: int) -> Listed:
    """At least the ``k`` earliest rows coded ``code``: those at or below a sampled bound, or
    all of them when the sample misjudges."""
    if k < count // 4:
        bound = _bound(_sample_coded(codes, code, lease, max(1, codes.size // _SAMPLE)), k, count)
        if bound is not None:
            rows = rows_coded(codes, code, lease, bound)
            if rows.size >= k:
                return Listed(rows, lease[rows])
    rows = rows_coded(codes, code, lease, None)
    return Listed(rows, lease[rows])


def earliest_coded(codes: np.ndarray, code: int, count: int, lease: np.ndarray, k: int,
                   listed: Listed | None = None) -> np.ndarray:
    """The rows ``earliest_first(rows_coded(codes, code), lease, k)`` returns (``count`` rows have
    ``code``), in ascending row order, without listing every candidate or sorting. ``listed``:
    the rows coded ``code`` whose deadline is at or below some bound (:func:`census_listing`);
    used when it holds at least ``k`` rows, else the candidates are listed here."""
    if k <= 0 or count == 0:
        return np.zeros(0, np.int64)
    if listed is None or listed.rows.size < k:
        listed = _listed_here(codes, code, count, lease, k)
    rows, keys = listed
    if k >= rows.size:
        return rows.astype(np.int64)  # (a copy: a census listing's rows are uint32, in a kept buffer)
    return rows_before(rows, keys, *_kth(keys, k))


@njit(cache=True, nogil=True)
def any_grouped(rows, flags):
    for i in range(rows.shape[0]):
        if is_grouped(flags[rows[i]]):
            return True
    return False


@njit(cache=True, nogil=True)
def _member_blocks_group(r, now, lease, flags, group_links):
    """Upstream: one member with a live lease protects its whole group."""
    m = r
    while True:
        if not lease_expired(lease[m], now):
            return True
        m = slot_value(group_links, m, r)
        if m == r:
            return False


@njit(cache=True, nogil=True)
def _evictable_bytes(r, sizes, status, kind, segment, refcnt, seg_readable, more):
    n = 0
    rr = np.int64(r)
    while rr >= 0:
        for j in range(status.shape[1]):
            if is_evictable_memory_replica(status[rr, j], kind[rr, j], segment[rr, j], refcnt[rr, j], seg_readable):
                n += 1
        rr = next_row(more, rr)
    return n * sizes[r]


@njit(cache=True, nogil=True)
def plan(ordered, want, want_bytes, now, allow_soft, codes, flags, lease, soft_deadline, group_links,
         sizes, status, kind, segment, refcnt, seg_readable, more):
    """Walk census candidates in order until ``want`` objects (or ``want_bytes`` of evictable
    memory, tenant quota) are planned; a grouped candidate brings every safe member of its
    group, or nothing when one member still holds a lease.

    ``ordered`` comes from this cycle's census (same ``now``, same lock), so plain candidates are
    taken as they are; group members, which the census did not order, are checked with the
    shared predicate here, and every planned row is re-validated by :func:`finalize`.
    ``codes`` (the census codes, shared across passes) marks planned rows PLANNED or, by the
    soft-pinned fallback, PLANNED_SOFT. Returns (rows planned, bytes).
    """
    n = 0
    freed = 0
    mark = np.uint8(PLANNED_SOFT if allow_soft else PLANNED)
    count_bytes = want_bytes < 9223372036854775807
    for i in range(ordered.shape[0]):
        if n >= want or freed >= want_bytes:
            break
        r = ordered[i]
        if codes[r] >= PLANNED:
            continue
        if not is_grouped(flags[r]):
            codes[r] = mark
            n += 1
            if count_bytes:
                freed += _evictable_bytes(r, sizes, status, kind, segment, refcnt, seg_readable, more)
            continue
        if _member_blocks_group(r, now, lease, flags, group_links):
            continue
        m = r
        while True:  # safe members go; hard- or soft-pinned ones stay
            if codes[m] < PLANNED and is_eviction_candidate(m, now, allow_soft, flags, lease, soft_deadline,
                                                     status, kind, segment, refcnt, seg_readable, more):
                codes[m] = mark
                n += 1
                if count_bytes:
                    freed += _evictable_bytes(m, sizes, status, kind, segment, refcnt, seg_readable, more)
            m = slot_value(group_links, m, r)
            if m == r:
                break
    return n, freed


@njit(cache=True, nogil=True, parallel=True)
def finalize(rows, codes, coded, now, flags, lease, soft_deadline, status, kind, segment, refcnt,
             seg_readable, more, keep, owner, chain, removed, remaining):
    """Re-validate planned rows (sorted by row: a streaming pass) with the shared predicate and
    mark, per row of their chains (``owner``/``chain``: ObjectTable.chains), the replicas
    eviction drops and those that remain (oplog PUT_END(remaining)). A row planned by the
    soft-pinned fallback is coded PLANNED_SOFT in ``codes``; when not ``coded`` (a census that
    listed, see :class:`..policies.eviction._Planner`) none was, and ``codes`` is not read.
    """
    n = rows.shape[0]
    for i in prange(n):
        if i + ROWS_AHEAD < n:  # sparse rows: their misses overlap only when started early
            ahead = rows[i + ROWS_AHEAD]
            prefetch(flags, ahead)
            prefetch(lease, ahead)
            prefetch(status, (ahead, 0))
            prefetch(kind, (ahead, 0))
            prefetch(segment, (ahead, 0))
            prefetch(refcnt, (ahead, 0))
        r = rows[i]
        keep[i] = is_eviction_candidate(r, now, coded and codes[r] == PLANNED_SOFT, flags, lease, soft_deadline,
                                        status, kind, segment, refcnt, seg_readable, more)
    for k in prange(chain.shape[0]):
        r = chain[k]
        for j in range(status.shape[1]):
            drop = False
            if keep[owner[k]]:
                drop = is_evictable_memory_replica(status[r, j], kind[r, j], segment[r, j], refcnt[r, j],
                                                   seg_readable)
            removed[k, j] = drop
            remaining[k, j] = False if drop else slot_in_use(status[r, j])
