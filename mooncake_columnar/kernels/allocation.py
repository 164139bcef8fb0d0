"""Offset allocation over sorted free extents (first fit), one extent list per segment.

Extents of segment s live in ``starts[s][:counts[s]]`` / ``lengths[s][:counts[s]]`` sorted by
start and never adjacent (frees coalesce). ``starts``/``lengths`` are numba typed Lists so one
kernel can place a whole batch across segments.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def alloc_first_fit(starts, lengths, counts, s, size):
    """Allocate ``size`` bytes on segment ``s``; returns the offset or -1."""
    st = starts[s]
    ln = lengths[s]
    n = counts[s]
    for i in range(n):
        if ln[i] >= size:
            off = st[i]
            if ln[i] == size:
                st[i:n - 1] = st[i + 1:n].copy()
                ln[i:n - 1] = ln[i + 1:n].copy()
                counts[s] = n - 1
            else:
                st[i] += size
                ln[i] -= size
            return off
    return -1


@njit(cache=True)
def free_extent(starts, lengths, counts, s, offset, size):
    """Return [offset, offset+size) to segment ``s``, coalescing neighbours. False on overlap."""
    st = starts[s]
    ln = lengths[s]
    n = counts[s]
    pos = np.searchsorted(st[:n], offset)
    if pos > 0 and st[pos - 1] + ln[pos - 1] > offset:
        return False
    if pos < n and offset + size > st[pos]:
        return False
    merge_prev = pos > 0 and st[pos - 1] + ln[pos - 1] == offset
    merge_next = pos < n and offset + size == st[pos]
    if merge_prev and merge_next:
        ln[pos - 1] += size + ln[pos]
        st[pos:n - 1] = st[pos + 1:n].copy()
        ln[pos:n - 1] = ln[pos + 1:n].copy()
        counts[s] = n - 1
    elif merge_prev:
        ln[pos - 1] += size
    elif merge_next:
        st[pos] = offset
        ln[pos] += size
    else:
        if n == st.shape[0]:
            grown_st = np.empty(max(8, 2 * n), np.int64)
            grown_ln = np.empty(max(8, 2 * n), np.int64)
            grown_st[:n] = st[:n]
            grown_ln[:n] = ln[:n]
            starts[s] = grown_st
            lengths[s] = grown_ln
            st = grown_st
            ln = grown_ln
        st[pos + 1:n + 1] = st[pos:n].copy()
        ln[pos + 1:n + 1] = ln[pos:n].copy()
        st[pos] = offset
        ln[pos] = size
        counts[s] = n + 1
    return True


@njit(cache=True, nogil=True)
def _merge_free(starts, lengths, counts, s, offs, sizes, lo, hi):
    """Merge the sorted extents offs[lo:hi] into segment s's free list in one linear pass.

    Returns False (and changes nothing) if any of them overlaps free space or each other.
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
    while i < n or j < hi:
        if j >= hi or (i < n and st[i] < offs[j]):
            a, b = st[i], ln[i]
            i += 1
        else:
            a, b = offs[j], sizes[j]
            j += 1
        if k > 0 and out_st[k - 1] + out_ln[k - 1] > a:
            return False  # overlap: a double free or a corrupt extent
        if k > 0 and out_st[k - 1] + out_ln[k - 1] == a:
            out_ln[k - 1] += b
        else:
            out_st[k] = a
            out_ln[k] = b
            k += 1
    starts[s] = out_st
    lengths[s] = out_ln
    counts[s] = k
    return True


@njit(cache=True, nogil=True)
def _free_sorted(segs, offsets, sizes, starts, lengths, counts, used):
    bad = 0
    lo = 0
    while lo < segs.shape[0]:
        hi = lo
        total = 0
        while hi < segs.shape[0] and segs[hi] == segs[lo]:
            total += sizes[hi]
            hi += 1
        if _merge_free(starts, lengths, counts, segs[lo], offsets, sizes, lo, hi):
            used[segs[lo]] -= total
        else:
            bad += hi - lo
        lo = hi
    return bad


@njit(cache=True, nogil=True)
def _by_segment(segs, offsets, sizes, n_segments):
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


def free_extent_list(segs: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, starts, lengths,
                     counts: np.ndarray, used: np.ndarray) -> int:
    """Free many extents at once: sorted per segment, then merged linearly (one O(n + m) pass per
    segment instead of one array insertion per extent). Returns how many were rejected."""
    if segs.size == 0:
        return 0
    segs, offsets, sizes = (np.ascontiguousarray(a, np.int64) for a in (segs, offsets, sizes))
    by_seg, offs, lens, ascending = _by_segment(segs, offsets, sizes, used.shape[0])
    if not ascending:
        if int(offsets.max()) < (1 << 47) and used.shape[0] <= (1 << 15):
            order = np.argsort((segs << 47) | offsets)  # one int64 key: faster than lexsort
        else:
            order = np.lexsort((offsets, segs))
        by_seg, offs, lens = segs[order], offsets[order], sizes[order]
    return int(_free_sorted(by_seg, offs, lens, starts, lengths, counts, used))


def free_extents_from_occupied(capacity: int, offsets: np.ndarray, sizes: np.ndarray):
    """Vectorized rebuild: the gaps between occupied extents become free space.

    Returns (starts, lengths) or raises ValueError naming the first overlap / out-of-range extent.
    """
    offsets = np.asarray(offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    if offsets.size > 1 and (offsets[1:] >= offsets[:-1]).all():
        o, z = offsets, sizes  # already in offset order (the usual case after a bulk load)
    else:
        order = np.argsort(offsets, kind="stable")
        o, z = offsets[order], sizes[order]
    ends = o + z
    bad = (o < 0) | (z <= 0) | (ends > capacity)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"extent [{o[i]}, {ends[i]}) outside segment capacity {capacity}")
    overlap = o[1:] < ends[:-1]
    if overlap.any():
        i = int(np.flatnonzero(overlap)[0])
        raise ValueError(f"extents [{o[i]}, {ends[i]}) and [{o[i + 1]}, {ends[i + 1]}) overlap")
    gap_starts = np.concatenate(([0], ends))
    gap_ends = np.concatenate((o, [capacity]))
    keep = gap_ends > gap_starts
    return gap_starts[keep], (gap_ends - gap_starts)[keep]
