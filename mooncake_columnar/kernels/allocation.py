"""Offset allocation over sorted free extents (first fit), one extent list per segment.

Extents of segment s live in ``starts/lengths[base[s]:base[s] + counts[s]]`` (flat arrays, one
region per segment: store/free_extents.py, which makes room before a kernel here adds extents)
sorted by start and never adjacent (frees coalesce), so one kernel can place a whole batch
across segments.

A replica holds whole allocation units of ``1 << unit_bits[s]`` bytes (:func:`held_end`), as
upstream's allocator does, so no two replicas ever share a unit and a v1 rollback can always
express the layout. Segments up to 3.75 GiB have 1-byte units: byte-exact extents.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .dispatch import variant
from .jit import njit
from .moves import move
from .predicates import memory_segment


@njit(inline="always", cache=True)
def held_end(offset, size, unit_bits, capacity):
    """End of the bytes a replica at ``offset`` of ``size`` bytes holds: its extent rounded up to
    the segment's allocation unit, clipped at the segment end. The one held-extent rule: every
    allocation, free and rebuild goes through it. Works on scalars and (offset, size) arrays."""
    mask = (np.int64(1) << unit_bits) - 1
    return np.minimum((offset + size + mask) & ~mask, capacity)


@njit(inline="always", cache=True)
def offset_shift(kind, seg, unit_bits):
    """Bits a replica slot's ``replica_offset`` is shifted left by to give its byte offset. A
    memory replica starts on a unit boundary (see :func:`held_end`) and its segment has at most
    ``offset_allocator_v1.MAX_BIN_SIZE`` units, so its offset is kept in units (a uint32 column
    instead of an int64); any other kind's offset is kept in bytes. Scalars."""
    s = memory_segment(kind, seg)
    if s < 0:
        return np.int64(0)
    return unit_bits[s]


@njit(cache=True)
def alloc_first_fit(starts, lengths, base, counts, unit_bits, capacity, s, size):
    """Allocate ``size`` bytes on segment ``s``; returns the offset or -1. The extent taken is
    the held one (whole units), so the next allocation starts on a unit boundary. Nothing is
    placed in a partial last unit (a capacity that is not a whole number of units): upstream's
    allocator only has ``capacity >> unit_bits`` units, so a v1 rollback could not express it."""
    b = base[s]
    n = counts[s]
    for i in range(b, b + n):
        if lengths[i] >= size:
            off = starts[i]
            held = held_end(off, size, unit_bits[s], capacity[s]) - off
            if lengths[i] < held or held & ((np.int64(1) << unit_bits[s]) - 1):
                continue  # too short, or only the partial last unit: upstream cannot hold that
            if lengths[i] == held:
                move(starts, i, starts, i + 1, b + n - 1 - i)
                move(lengths, i, lengths, i + 1, b + n - 1 - i)
                counts[s] = n - 1
            else:
                starts[i] += held
                lengths[i] -= held
            return off
    return -1


@njit(cache=True)
def free_extent(starts, lengths, base, counts, used, unit_bits, capacity, s, offset, size):
    """Return the extent held by a replica at ``offset`` of ``size`` bytes to segment ``s``,
    coalescing neighbours, and take it off ``used[s]``. False (nothing changed) on overlap.
    The region has room for one more extent (the caller made it)."""
    b = base[s]
    n = counts[s]
    st = starts[b:b + n + 1]
    ln = lengths[b:b + n + 1]
    held = held_end(offset, size, unit_bits[s], capacity[s]) - offset
    pos = np.searchsorted(st[:n], offset)
    if pos > 0 and st[pos - 1] + ln[pos - 1] > offset:
        return False
    if pos < n and offset + held > st[pos]:
        return False
    merge_prev = pos > 0 and st[pos - 1] + ln[pos - 1] == offset
    merge_next = pos < n and offset + held == st[pos]
    if merge_prev and merge_next:
        ln[pos - 1] += held + ln[pos]
        move(st, pos, st, pos + 1, n - 1 - pos)
        move(ln, pos, ln, pos + 1, n - 1 - pos)
        counts[s] = n - 1
    elif merge_prev:
        ln[pos - 1] += held
    elif merge_next:
        st[pos] = offset
        ln[pos] += held
    else:
        move(st, pos + 1, st, pos, n - pos)
        move(ln, pos + 1, ln, pos, n - pos)
        st[pos] = offset
        ln[pos] = held
        counts[s] = n + 1
    used[s] -= held
    return True


@njit(cache=True, nogil=True)
def _merge_free(starts, lengths, base, counts, s, offs, sizes, lo, hi, unit_bits, capacity):
    """Merge the held extents of the replicas offs/sizes[lo:hi] (sorted by offset) into segment
    s's free list (its region has room for ``hi - lo`` more); returns the bytes freed.

    Returns -1 (and changes nothing) if any of them overlaps free space or each other.

    In place, in two passes over the merged order: the first only checks; the second writes from
    the region's end backwards, coalescing neighbours (a write never reaches an entry not yet
    read: fewer have been written than read), then moves the list to the region's start. No
    merged copy: at 100M objects a segment's list holds millions of extents after a few
    evictions, and two fresh copies of it were hundreds of MB of page faults per eviction.
    """
    b = base[s]
    n = counts[s]
    i = b
    j = lo
    freed = 0
    end = np.int64(-1)  # the end of the previous extent in merged order
    while i < b + n or j < hi:
        if j >= hi or (i < b + n and starts[i] < offs[j]):
            a, w = starts[i], lengths[i]
            i += 1
        else:
            a = offs[j]
            w = held_end(a, sizes[j], unit_bits[s], capacity[s]) - a
            freed += w
            j += 1
        if end > a:
            return -1  # overlap: a double free or a corrupt extent
        end = a + w
    put = b + n + hi - lo  # the list is written below this position
    i = b + n - 1
    j = hi - 1
    a0 = w0 = np.int64(0)  # the extent being built (lowest start so far), not yet written
    pending = False
    while i >= b or j >= lo:
        if j < lo or (i >= b and starts[i] > offs[j]):
            a, w = starts[i], lengths[i]
            i -= 1
        else:
            a = offs[j]
            w = held_end(a, sizes[j], unit_bits[s], capacity[s]) - a
            j -= 1
        if pending and a + w == a0:
            a0, w0 = a, w0 + w
            continue
        if pending:
            put -= 1
            starts[put], lengths[put] = a0, w0
        a0, w0, pending = a, w, True
    if pending:
        put -= 1
        starts[put], lengths[put] = a0, w0
    k = b + n + hi - lo - put
    move(starts, b, starts, put, k)
    move(lengths, b, lengths, put, k)
    counts[s] = k
    return freed


@njit(cache=True, nogil=True, parallel=True)
def free_sorted(per_segment, offsets, sizes, starts, lengths, base, counts, used, unit_bits, capacity):
    """Free the held extents of replicas grouped by segment in code order (``per_segment[s]`` of
    segment s's, sorted by offset), each segment's region with room for its share; returns how
    many were rejected (a segment's all, on any overlap). The segments merge in parallel: each
    touches only its own region of the pool (100M objects, four segments: about half the time
    of merging them one after the other)."""
    n_seg = per_segment.shape[0]
    first = np.zeros(n_seg + 1, np.int64)  # where each segment's extents start, then their end
    first[1:] = np.cumsum(per_segment)
    freeing = np.flatnonzero(per_segment)
    freed = np.zeros(n_seg, np.int64)
    for i in prange(freeing.shape[0]):
        s = freeing[i]
        freed[s] = _merge_free(starts, lengths, base, counts, s, offsets, sizes, first[s], first[s + 1], unit_bits,
                               capacity)
    bad = 0
    for s in freeing:
        if freed[s] >= 0:
            used[s] -= freed[s]
        else:
            bad += per_segment[s]
    return bad


@njit(cache=True, nogil=True)
def by_segment(segs, offsets, sizes, n_segments):
    """Stable counting sort of extents by segment: (extents per segment, offsets, sizes); also
    says whether the offsets then ascend within every segment (extents listed in row order
    usually do: rows are allocated in offset order by bulk loads and restores), in which case no
    comparison sort is needed."""
    n = segs.shape[0]
    per_segment = np.zeros(n_segments, np.int64)
    for i in range(n):
        per_segment[segs[i]] += 1
    start = np.zeros(n_segments, np.int64)
    start[1:] = np.cumsum(per_segment)[:-1]
    out_off = np.empty(n, np.int64)
    out_len = np.empty(n, np.int64)
    last = np.full(n_segments, -1, np.int64)
    ascending = True
    for i in range(n):
        s = segs[i]
        k = start[s]
        start[s] = k + 1
        out_off[k] = offsets[i]
        out_len[k] = sizes[i]
        ascending &= offsets[i] > last[s]
        last[s] = offsets[i]
    return per_segment, out_off, out_len, ascending


by_segment_small = variant(by_segment, "_small", nogil=False)  # one remove: keeps the GIL (see .dispatch)
free_sorted_small = variant(free_sorted, "_small", nogil=False, parallel=False)


def order_by_segment_offset(segs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions of extents (segment, offset) sorted by segment, then offset: an argsort of one
    int64 key (segment in the high bits: about 2x faster than lexsort) when both fit in it."""
    if not segs.size:
        return np.zeros(0, np.int64)
    seg_bits = max(1, int(segs.max()).bit_length())
    if int(segs.min()) >= 0 and int(offsets.min()) >= 0 and int(offsets.max()) < (1 << (63 - seg_bits)):
        return np.argsort((segs.astype(np.int64) << (63 - seg_bits)) | offsets)
    return np.lexsort((offsets, segs))
