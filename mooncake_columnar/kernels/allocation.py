"""Offset allocation over sorted free extents (first fit), one extent list per segment.

Extents of segment s live in ``starts[s][:counts[s]]`` / ``lengths[s][:counts[s]]`` sorted by
start and never adjacent (frees coalesce). ``starts``/``lengths`` are numba typed Lists so one
kernel can place a whole batch across segments.

A replica holds whole allocation units of ``1 << unit_bits[s]`` bytes (:func:`held_end`), as
upstream's allocator does, so no two replicas ever share a unit and a v1 rollback can always
express the layout. Segments up to 3.75 GiB have 1-byte units: byte-exact extents.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.typed import List

from .dispatch import BATCH_MIN, variant
from .moves import move
from .predicates import memory_segment


_EXTENTS = types.int64[::1]


@njit(cache=True)
def new_extent_lists():
    """Empty (starts, lengths) typed Lists. The lists are made and changed in cached kernels
    (this one, :func:`grow_extent_lists`, :func:`free_whole_segment`, :func:`install_extents`):
    Numba compiles its typed-List methods called from Python again in every process, cache or
    not (about a second of a master's construction and first mount on this host)."""
    return List.empty_list(_EXTENTS), List.empty_list(_EXTENTS)


@njit(cache=True)
def grow_extent_lists(starts, lengths, count):
    """Append ``count`` empty extent arrays to each list."""
    for _ in range(count):
        starts.append(np.empty(8, np.int64))
        lengths.append(np.empty(8, np.int64))


@njit(cache=True)
def free_whole_segment(starts, lengths, counts, s, size):
    """One free extent covering segment ``s`` (a mount: its arrays hold at least one)."""
    starts[s][0] = 0
    lengths[s][0] = size
    counts[s] = 1


@njit(cache=True)
def install_extents(starts, lengths, counts, s, st, ln):
    """Make ``st``/``ln`` (copied, with room to grow) the free extents of segment ``s``."""
    n = st.shape[0]
    new_st = np.empty(n + max(8, n), np.int64)
    new_ln = np.empty(n + max(8, n), np.int64)
    move(new_st, 0, st, 0, n)
    move(new_ln, 0, ln, 0, n)
    starts[s] = new_st
    lengths[s] = new_ln
    counts[s] = n


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
def alloc_first_fit(starts, lengths, counts, unit_bits, capacity, s, size):
    """Allocate ``size`` bytes on segment ``s``; returns the offset or -1. The extent taken is
    the held one (whole units), so the next allocation starts on a unit boundary. Nothing is
    placed in a partial last unit (a capacity that is not a whole number of units): upstream's
    allocator only has ``capacity >> unit_bits`` units, so a v1 rollback could not express it."""
    st = starts[s]
    ln = lengths[s]
    n = counts[s]
    for i in range(n):
        if ln[i] >= size:
            off = st[i]
            held = held_end(off, size, unit_bits[s], capacity[s]) - off
            if ln[i] < held or held & ((np.int64(1) << unit_bits[s]) - 1):
                continue  # too short, or only the partial last unit: upstream cannot hold that
            if ln[i] == held:
                move(st, i, st, i + 1, n - 1 - i)
                move(ln, i, ln, i + 1, n - 1 - i)
                counts[s] = n - 1
            else:
                st[i] += held
                ln[i] -= held
            return off
    return -1


@njit(cache=True)
def free_extent(starts, lengths, counts, used, unit_bits, capacity, s, offset, size):
    """Return the extent held by a replica at ``offset`` of ``size`` bytes to segment ``s``,
    coalescing neighbours, and take it off ``used[s]``. False (nothing changed) on overlap."""
    st = starts[s]
    ln = lengths[s]
    n = counts[s]
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
        if n == st.shape[0]:
            grown_st = np.empty(max(8, 2 * n), np.int64)
            grown_ln = np.empty(max(8, 2 * n), np.int64)
            move(grown_st, 0, st, 0, n)
            move(grown_ln, 0, ln, 0, n)
            starts[s] = grown_st
            lengths[s] = grown_ln
            st = grown_st
            ln = grown_ln
        move(st, pos + 1, st, pos, n - pos)
        move(ln, pos + 1, ln, pos, n - pos)
        st[pos] = offset
        ln[pos] = held
        counts[s] = n + 1
    used[s] -= held
    return True


@njit(cache=True, nogil=True)
def _merge_free(starts, lengths, counts, s, offs, sizes, lo, hi, unit_bits, capacity):
    """Merge the held extents of the replicas offs/sizes[lo:hi] (sorted by offset) into segment
    s's free list in one linear pass; returns the bytes freed.

    Returns -1 (and changes nothing) if any of them overlaps free space or each other.
    """
    st = starts[s]
    ln = lengths[s]
    n = counts[s]
    m = hi - lo
    out_st = np.empty(max(8, n + m), np.int64)
    out_ln = np.empty(max(8, n + m), np.int64)
    k = 0
    i = 0
    j = lo
    freed = 0
    while i < n or j < hi:
        if j >= hi or (i < n and st[i] < offs[j]):
            a, b = st[i], ln[i]
            i += 1
        else:
            a = offs[j]
            b = held_end(a, sizes[j], unit_bits[s], capacity[s]) - a
            freed += b
            j += 1
        if k > 0 and out_st[k - 1] + out_ln[k - 1] > a:
            return -1  # overlap: a double free or a corrupt extent
        if k > 0 and out_st[k - 1] + out_ln[k - 1] == a:
            out_ln[k - 1] += b
        else:
            out_st[k] = a
            out_ln[k] = b
            k += 1
    starts[s] = out_st
    lengths[s] = out_ln
    counts[s] = k
    return freed


@njit(cache=True, nogil=True)
def _free_sorted(segs, offsets, sizes, starts, lengths, counts, used, unit_bits, capacity):
    bad = 0
    lo = 0
    while lo < segs.shape[0]:
        hi = lo
        while hi < segs.shape[0] and segs[hi] == segs[lo]:
            hi += 1
        freed = _merge_free(starts, lengths, counts, segs[lo], offsets, sizes, lo, hi, unit_bits, capacity)
        if freed >= 0:
            used[segs[lo]] -= freed
        else:
            bad += hi - lo
        lo = hi
    return bad


@njit(cache=True, nogil=True)
def by_segment(segs, offsets, sizes, n_segments):
    """Stable counting sort of extents by segment; also says whether the offsets then ascend
    within every segment (extents listed in row order usually do: rows are allocated in offset
    order by bulk loads and restores), in which case no comparison sort is needed."""
    n = segs.shape[0]
    start = np.zeros(n_segments + 1, np.int64)
    for i in range(n):
        start[segs[i] + 1] += 1
    for s in range(n_segments):
        start[s + 1] += start[s]
    out_seg = np.empty(n, np.int64)
    out_off = np.empty(n, np.int64)
    out_len = np.empty(n, np.int64)
    last = np.full(n_segments, -1, np.int64)
    ascending = True
    for i in range(n):
        s = segs[i]
        k = start[s]
        start[s] = k + 1
        out_seg[k] = s
        out_off[k] = offsets[i]
        out_len[k] = sizes[i]
        ascending &= offsets[i] > last[s]
        last[s] = offsets[i]
    return out_seg, out_off, out_len, ascending


_by_segment_small = variant(by_segment, "_small", nogil=False)
_free_sorted_small = variant(_free_sorted, "_small", nogil=False)


def free_extent_list(segs: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, starts, lengths,
                     counts: np.ndarray, used: np.ndarray, unit_bits: np.ndarray, capacity: np.ndarray) -> int:
    """Free the held extents of many replicas (segment, offset, object size) at once: sorted per
    segment, then merged linearly (one O(n + m) pass per segment instead of one array insertion
    per extent). Returns how many were rejected."""
    if segs.size == 0:
        return 0
    segs, offsets, sizes = (np.ascontiguousarray(a, np.int64) for a in (segs, offsets, sizes))
    small = segs.size < BATCH_MIN  # one remove: keep the GIL (see :mod:`.dispatch`)
    by_seg, offs, lens, ascending = (_by_segment_small if small else by_segment)(segs, offsets, sizes,
                                                                                  used.shape[0])
    if not ascending:
        order = order_by_segment_offset(segs, offsets)
        by_seg, offs, lens = segs[order], offsets[order], sizes[order]
    free_sorted = _free_sorted_small if small else _free_sorted
    return int(free_sorted(by_seg, offs, lens, starts, lengths, counts, used, unit_bits, capacity))


def order_by_segment_offset(segs: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Positions of extents (segment, offset) sorted by segment, then offset: an argsort of one
    int64 key (segment in the high bits: about 2x faster than lexsort) when both fit in it."""
    if not segs.size:
        return np.zeros(0, np.int64)
    seg_bits = max(1, int(segs.max()).bit_length())
    if int(segs.min()) >= 0 and int(offsets.min()) >= 0 and int(offsets.max()) < (1 << (63 - seg_bits)):
        return np.argsort((segs.astype(np.int64) << (63 - seg_bits)) | offsets)
    return np.lexsort((offsets, segs))
