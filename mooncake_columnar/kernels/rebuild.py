"""The allocator rebuild, the one derivation of free space from held replicas: each segment's free
extents are the gaps between the held extents (:func:`.allocation.held_end`: whole allocation
units) of the memory replicas on it, and its used bytes their sum.

One streaming pass over object rows (a bitset of rows, each walked with its continuation chain)
when the replicas lie in increasing offset order on each segment, as bulk loads and restores
allocate them: no extent is gathered. Otherwise (``UNSORTED``) :func:`free_extents_sorted` gathers
the extents, sorts them by (segment, offset) and streams them through the same kernel as the rows
of one-slot columns. Restore, standby bootstrap and promotion (both load a state), remount
recovery and ``SegmentTable.rebuild_allocator`` all come here.
"""
from __future__ import annotations

import numpy as np
from .jit import njit

from ..schema import KIND_MEMORY
from .allocation import by_segment, held_end, order_by_segment_offset
from .chains import next_row
from .predicates import is_memory_replica_on
from .rowbits import has_bit

OK, UNSORTED, OVERLAP, OUT_OF_RANGE, SHARED_UNIT = 0, 1, 2, 3, 4
_NO_CHAINS = np.empty(0, np.int32)


@njit(cache=True, nogil=True)
def _stream(bits, on_segment, capacity, unit_bits, off_bits, sizes, rep_status, rep_kind, rep_seg, rep_off, more,
            held, last, gap_seg, gap_start, gap_len, fault):
    """One pass over the memory replicas on flagged segments of the rows in ``bits``, row by row:
    checks that each extent lies inside its segment and at or past the held end of the previous
    one on it (``held``; ``last``: where that one is, as row * slots + slot) and appends the gap
    before it to ``gap_*`` (in walk order, segments interleaved). Returns (status, gaps written);
    a fault comes with (segment, previous start, previous end, start, end, previous row, row) in
    ``fault``."""
    slots = rep_status.shape[1]
    k = 0
    for w in range(bits.shape[0]):
        word = bits[w]
        if not word:
            continue
        for b in range(64):
            if not has_bit(word, b):
                continue
            r = (w << 6) + b
            while r >= 0:
                for j in range(slots):
                    c = rep_seg[r, j]
                    if not is_memory_replica_on(rep_status[r, j], rep_kind[r, j], c, on_segment):
                        continue
                    o, z = np.int64(rep_off[r, j]) << off_bits[c], sizes[r]
                    status = OK
                    if o < 0 or z <= 0 or o > capacity[c] - z:  # no int64 overflow on hostile sizes
                        status = OUT_OF_RANGE
                    elif o < held[c]:
                        status = _behind(o, rep_off, off_bits[c], sizes, last[c], slots)
                    if status != OK:
                        fault[0], fault[3], fault[4], fault[6] = c, o, o + z, r
                        if last[c] >= 0:
                            fault[5] = last[c] // slots
                            fault[1] = np.int64(rep_off[fault[5], last[c] % slots]) << off_bits[c]
                            fault[2] = fault[1] + sizes[fault[5]]
                        return status, k
                    last[c] = r * slots + j
                    if o > held[c]:
                        gap_seg[k], gap_start[k], gap_len[k] = c, held[c], o - held[c]
                        k += 1
                    held[c] = held_end(o, z, unit_bits[c], capacity[c])
                r = next_row(more, r)
    return OK, k


@njit(inline="always", cache=True)
def _behind(o, rep_off, off_bits, sizes, at, slots):
    """Why an extent at ``o`` starts before the held end of the previous one (at row * slots +
    slot ``at``) on its segment."""
    start = np.int64(rep_off[at // slots, at % slots]) << off_bits
    if o < start:
        return UNSORTED
    if o < start + sizes[at // slots]:
        return OVERLAP
    return SHARED_UNIT


@njit(cache=True, nogil=True)
def free_extents(bits, on_segment, capacity, unit_bits, off_bits, sizes, rep_status, rep_kind, rep_seg, rep_off,
                 more):
    """(status, fault, starts, lengths, lo, hi, used): the free extents of every segment flagged
    in ``on_segment`` from the memory replicas of the rows in ``bits`` (walked in row order, each
    with its chain); segment c's are ``starts/lengths[lo[c]:hi[c]]``, ``used[c]`` its held bytes.
    A replica's byte offset is ``rep_off << off_bits[c]``: ``unit_bits`` for the engine's
    ``replica_offset`` column (allocation units, see allocation.offset_shift), zeros for bytes.
    A status other than OK (extents out of offset order, overlapping in bytes or in an allocation
    unit, or outside the segment) comes with no extents; see :func:`_stream` for ``fault``.

    The gaps go to arrays sized for the worst case (only the pages written are touched), then
    are grouped by segment: one pass over the replicas."""
    n_seg = capacity.shape[0]
    held = np.zeros(n_seg, np.int64)
    last = np.full(n_seg, -1, np.int64)
    fault = np.full(7, -1, np.int64)
    bound = (bits.shape[0] * 64 + more.shape[0]) * rep_status.shape[1] + n_seg  # a gap per extent, a tail each
    gap_seg = np.empty(bound, np.int32)
    gap_start = np.empty(bound, np.int64)
    gap_len = np.empty(bound, np.int64)
    status, k = _stream(bits, on_segment, capacity, unit_bits, off_bits, sizes, rep_status, rep_kind, rep_seg,
                        rep_off, more, held, last, gap_seg, gap_start, gap_len, fault)
    used = np.zeros(n_seg, np.int64)
    if status != OK:
        return status, fault, gap_start[:0], gap_len[:0], used, used, used
    for c in range(n_seg):
        if on_segment[c] and held[c] < capacity[c]:
            gap_seg[k], gap_start[k], gap_len[k] = c, held[c], capacity[c] - held[c]
            k += 1
    # grouped by segment, in order within each
    per_segment, starts, lengths, _ = by_segment(gap_seg[:k], gap_start[:k], gap_len[:k], n_seg)
    hi = np.cumsum(per_segment)
    lo = hi - per_segment
    for c in range(n_seg):
        if on_segment[c]:  # held extents and gaps partition the segment
            used[c] = capacity[c] - lengths[lo[c]:hi[c]].sum()
    return OK, fault, starts, lengths, lo, hi, used


@njit(cache=True, nogil=True)
def gather_extents(bits, matched, on_segment, unit_bits, sizes, rep_status, rep_kind, rep_seg, rep_off, more):
    """(segment, byte offset, size) of the memory replicas on flagged segments of the ``matched`` rows
    in ``bits``, in row order. One pass into arrays sized for the worst case: only the pages
    written are touched."""
    bound = (matched + more.shape[0]) * rep_status.shape[1]  # continuation rows: at most one per row
    segs = np.empty(bound, np.int32)
    offs = np.empty(bound, np.int64)
    lens = np.empty(bound, np.int64)
    k = 0
    for w in range(bits.shape[0]):
        word = bits[w]
        if word:
            for b in range(64):
                if has_bit(word, b):
                    r = (w << 6) + b
                    while r >= 0:
                        for j in range(rep_status.shape[1]):
                            if is_memory_replica_on(rep_status[r, j], rep_kind[r, j], rep_seg[r, j], on_segment):
                                segs[k] = rep_seg[r, j]
                                offs[k] = np.int64(rep_off[r, j]) << unit_bits[segs[k]]
                                lens[k] = sizes[r]
                                k += 1
                        r = next_row(more, r)
    return segs[:k], offs[:k], lens[:k]


def all_rows(n: int) -> np.ndarray:
    """The bitset of rows [0, n)."""
    bits = np.full((n + 63) >> 6, np.uint64(0xFFFF_FFFF_FFFF_FFFF))
    if n & 63:
        bits[-1] = np.uint64((1 << (n & 63)) - 1)
    return bits


def _writable(a: np.ndarray, dtype) -> np.ndarray:
    """``a`` as a contiguous writable array of ``dtype``: the engine columns' types, so the
    kernel compiled for them serves (a read-only Arrow view would compile another)."""
    a = np.ascontiguousarray(a, dtype)
    return a if a.flags.writeable else a.copy()


def free_extents_sorted(seg: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, on_segment: np.ndarray,
                        capacity: np.ndarray, unit_bits: np.ndarray) -> tuple:
    """:func:`free_extents` of extents given as arrays (segment, offset, object size), in any
    order: streamed as they are, else sorted by (segment, offset) first. The rows in a fault are
    positions in these arrays."""
    seg, offsets, sizes, capacity, unit_bits = (_writable(a, t) for a, t in (
        (seg, np.int32), (offsets, np.int64), (sizes, np.int64), (capacity, np.int64), (unit_bits, np.int64)))
    n = seg.size
    # one-slot columns, every slot a memory replica: the kernel the engine columns take
    status_col = np.ones((n, 1), np.uint8)
    kind_col = np.full((n, 1), KIND_MEMORY, np.uint8)
    in_bytes = np.zeros_like(unit_bits)
    out = free_extents(all_rows(n), on_segment, capacity, unit_bits, in_bytes, sizes, status_col, kind_col,
                       seg.reshape(n, 1), offsets.reshape(n, 1), _NO_CHAINS)
    if out[0] != UNSORTED:
        return out
    order = order_by_segment_offset(seg, offsets)
    status, fault, *rest = free_extents(all_rows(n), on_segment, capacity, unit_bits, in_bytes, sizes[order],
                                        status_col, kind_col, seg[order].reshape(n, 1), offsets[order].reshape(n, 1),
                                        _NO_CHAINS)
    if status != OK:  # the rows named are positions in the sorted arrays: back to the caller's
        fault[5:] = np.where(fault[5:] >= 0, order[np.maximum(fault[5:], 0)], -1)
    return (status, fault, *rest)


def fault_message(status: int, fault: np.ndarray, unit_bits: np.ndarray, capacity: np.ndarray) -> str:
    """What a rebuild refused, naming the extents (``fault`` as :func:`free_extents` returns it)."""
    c, a, b, o, e = (int(v) for v in fault[:5])
    if status == OUT_OF_RANGE:
        return f"extent [{o}, {e}) outside segment capacity {int(capacity[c])}"
    what = "overlap" if status == OVERLAP else f"share an allocation unit of {1 << int(unit_bits[c])} bytes"
    return f"extents [{a}, {b}) and [{o}, {e}) {what}"
