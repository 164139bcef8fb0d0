"""Array kernels for upstream's OffsetAllocator state (the per-segment allocator in v1 snapshots).

Upstream's allocator splits one segment into nodes that tile ``[0, size)`` in allocation units
(``1 << multiplier_bits`` bytes). A node is either used (one allocation) or free; free nodes sit in
one of 256 size bins (a 3-bit-mantissa float of the size) linked as doubly linked lists, with an
8-bit leaf mask per top bin and a 32-bit top mask for the search. Address-adjacent nodes are
linked as neighbours so that a free can coalesce.

Everything here works on whole columns: extents of all segments at once, sorted by (segment,
start) and grouped with a CSR pointer, so no work is done per replica in Python.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from .jit import njit

UNUSED = 0xFFFFFFFF  # upstream's "no node" index
NUM_TOP_BINS = 32
BINS_PER_LEAF = 8
NUM_LEAF_BINS = NUM_TOP_BINS * BINS_PER_LEAF
MANTISSA_BITS = 3
MAX_BIN_SIZE = 4026531840  # largest bin size (3.75 GiB): an allocator's size in units stays below it


# ---- size bins ------------------------------------------------------------------------------------
def _bin_parts(size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(is_denormal, exponent, mantissa, dropped low bits) of each size as a 3-bit float."""
    size = np.asarray(size, np.int64)
    # frexp is exact here: sizes are below 2**53
    highest = np.frexp(np.maximum(size, 1).astype(np.float64))[1].astype(np.int64) - 1
    shift = np.maximum(highest - MANTISSA_BITS, 0)
    mantissa = (size >> shift) & ((1 << MANTISSA_BITS) - 1)
    dropped = size & ((np.int64(1) << shift) - 1)
    return size < (1 << MANTISSA_BITS), shift + 1, mantissa, dropped


def bin_round_down(size: np.ndarray) -> np.ndarray:
    """The largest bin whose size is <= ``size``: where a free node of that size is filed."""
    denormal, exponent, mantissa, _ = _bin_parts(size)
    return np.where(denormal, size, (exponent << MANTISSA_BITS) | mantissa)


def bin_round_up(size: np.ndarray) -> np.ndarray:
    """The smallest bin whose size is >= ``size``: what an allocation of ``size`` searches from."""
    denormal, exponent, mantissa, dropped = _bin_parts(size)
    # a mantissa carry into the exponent is intended: it is still the next bin up
    return np.where(denormal, size, (exponent << MANTISSA_BITS) + mantissa + (dropped != 0))


def bin_size(bins: np.ndarray) -> np.ndarray:
    """The size (in units) that each bin stands for."""
    bins = np.asarray(bins, np.int64)
    exponent, mantissa = bins >> MANTISSA_BITS, bins & ((1 << MANTISSA_BITS) - 1)
    return np.where(exponent == 0, mantissa,
                    (mantissa | (1 << MANTISSA_BITS)) << np.maximum(exponent - 1, 0))


def multiplier_bits(capacity: npt.ArrayLike) -> np.ndarray:
    """Per segment, the fewest bits a byte size is shifted by so it fits the largest bin."""
    capacity = np.asarray(capacity, np.int64)
    bits = np.zeros(capacity.shape, np.int64)
    while ((capacity >> bits) > MAX_BIN_SIZE).any():
        bits += (capacity >> bits) > MAX_BIN_SIZE
    return bits


# ---- extents -> canonical nodes -------------------------------------------------------------------
def extent_units(offset: np.ndarray, size: np.ndarray, bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) in allocation units of the smallest unit range covering each byte extent."""
    return offset >> bits, (offset + size + (np.int64(1) << bits) - 1) >> bits


def fit_extent_ends(ext_seg: np.ndarray, start: np.ndarray, end: np.ndarray,
                    seg_units: np.ndarray) -> tuple[np.ndarray, int]:
    """Node end of each extent (sorted by segment, start) and the first extent that does not fit.

    Upstream rounds every allocation up to its bin size, so a node is that long where the next
    extent (or the segment end) leaves room, and exactly as long as the extent where it does not:
    a restored upstream layout comes back node for node, a tightly packed one still fits. The
    returned index is -1, or an extent that is empty, overlaps its successor in units (two
    extents share an allocation unit) or reaches past the last whole unit of its segment.
    """
    limit = seg_units[ext_seg]
    same_next = ext_seg[1:] == ext_seg[:-1]
    limit[:-1][same_next] = start[1:][same_next]
    bad = np.flatnonzero((end > limit) | (start >= end))
    rounded = start + bin_size(bin_round_up(end - start))
    return np.minimum(rounded, limit), int(bad[0]) if bad.size else -1


class NodeLayout(NamedTuple):
    """Nodes of every segment in address order, grouped by segment (``ptr``, CSR).

    Node indexes (``ext_node``, links, ``bin_heads``) are local to their segment; ``UNUSED`` marks
    no node.
    """
    ptr: np.ndarray            # (n_seg + 1,) int64
    used: np.ndarray           # (n_nodes,) bool
    offset: np.ndarray         # (n_nodes,) int64, units
    size: np.ndarray           # (n_nodes,) int64, units
    neighbor_prev: np.ndarray  # (n_nodes,) int64
    neighbor_next: np.ndarray
    bin_prev: np.ndarray
    bin_next: np.ndarray
    bin_heads: np.ndarray      # (n_seg, NUM_LEAF_BINS) int64
    used_bins: np.ndarray      # (n_seg, NUM_TOP_BINS) int64, leaf bit masks
    used_bins_top: np.ndarray  # (n_seg,) int64
    free_storage: np.ndarray   # (n_seg,) int64, units
    ext_node: np.ndarray       # (n_ext,) int64: each extent's node


def canonical_nodes(seg_units: np.ndarray, ext_seg: np.ndarray, start: np.ndarray,
                    end: np.ndarray) -> NodeLayout:
    """The allocator nodes that hold exactly the given extents: a used node per extent, one free
    node per gap, numbered in address order within each segment.

    Extents are sorted by (segment, start), non-overlapping and within ``[0, seg_units)``.
    """
    n_seg = seg_units.shape[0]
    counts = np.bincount(ext_seg, minlength=n_seg)
    ext_ptr = np.r_[0, np.cumsum(counts)]
    first = np.diff(ext_seg, prepend=-1) != 0
    prev_end = np.zeros_like(end)
    prev_end[1:] = end[:-1]
    gap_start = np.where(first, 0, prev_end)
    has = counts > 0
    tail_start = np.zeros(n_seg, np.int64)
    tail_start[has] = end[ext_ptr[1:][has] - 1]
    # Candidates in address order: (gap, extent) per extent, then each segment's tail gap.
    where_tail = 2 * ext_ptr[1:]
    cand_off = np.insert(np.column_stack([gap_start, start]).ravel(), where_tail, tail_start)
    cand_end = np.insert(np.column_stack([start, end]).ravel(), where_tail, seg_units)
    cand_used = np.insert(np.tile([False, True], ext_seg.size), where_tail, False)
    cand_seg = np.insert(np.repeat(ext_seg, 2), where_tail, np.arange(n_seg))
    keep = cand_used | (cand_end > cand_off)  # empty gaps are not nodes
    node_seg = cand_seg[keep]
    ptr = np.r_[0, np.cumsum(np.bincount(node_seg, minlength=n_seg))]
    local = np.arange(node_seg.size) - ptr[node_seg]
    ext_node = local[np.flatnonzero(cand_used[keep])]
    used, offset = cand_used[keep], cand_off[keep]
    return _link(ptr, node_seg, local, used, offset, cand_end[keep] - offset, ext_node)


def _link(ptr: np.ndarray, node_seg: np.ndarray, local: np.ndarray, used: np.ndarray,
          offset: np.ndarray, size: np.ndarray, ext_node: np.ndarray) -> NodeLayout:
    """Neighbour links (address order), bin lists (ascending node index), masks and free totals."""
    n_seg = ptr.shape[0] - 1
    last = local == (ptr[1:] - ptr[:-1])[node_seg] - 1
    neighbor_prev = np.where(local == 0, UNUSED, local - 1)
    neighbor_next = np.where(last, UNUSED, local + 1)
    bin_prev = np.full(local.shape, UNUSED, np.int64)
    bin_next = bin_prev.copy()
    free = np.flatnonzero(~used)
    bins = bin_round_down(size[free])
    free = free[np.lexsort((free, bins, node_seg[free]))]
    bins, seg = bin_round_down(size[free]), node_seg[free]
    same = (seg[1:] == seg[:-1]) & (bins[1:] == bins[:-1])
    bin_prev[free[1:][same]] = local[free[:-1][same]]
    bin_next[free[:-1][same]] = local[free[1:][same]]
    head = np.ones(free.size, bool)
    head[1:] = ~same
    bin_heads = np.full((n_seg, NUM_LEAF_BINS), UNUSED, np.int64)
    bin_heads[seg[head], bins[head]] = local[free[head]]
    occupied = bin_heads != UNUSED
    leaf_bits = occupied.reshape(n_seg, NUM_TOP_BINS, BINS_PER_LEAF) << np.arange(BINS_PER_LEAF)
    used_bins = leaf_bits.sum(axis=2)
    used_bins_top = ((used_bins != 0) << np.arange(NUM_TOP_BINS)).sum(axis=1)
    free_storage = np.zeros(n_seg, np.int64)
    np.add.at(free_storage, seg, size[free])
    return NodeLayout(ptr, used, offset, size, neighbor_prev, neighbor_next, bin_prev, bin_next,
                      bin_heads, used_bins, used_bins_top, free_storage, ext_node)


# ---- checks ---------------------------------------------------------------------------------------
@njit(cache=True)
def walk_bin_lists(bin_heads, used, leaf_bin, bin_prev, bin_next):
    """Follow every bin list from its head. Returns (error, bin, in_bin): error 0 when each list
    holds only free nodes of its own bin, each node at most once, with back links matching;
    1 index out of range, 2 used node or node seen twice, 3 bad back link, 4 node of another bin."""
    n = used.shape[0]
    in_bin = np.zeros(n, np.bool_)
    for b in range(bin_heads.shape[0]):
        prev = UNUSED
        node = bin_heads[b]
        while node != UNUSED:
            if node >= n:
                return 1, b, in_bin
            if used[node] or in_bin[node]:
                return 2, b, in_bin
            if bin_prev[node] != prev:
                return 3, b, in_bin
            if leaf_bin[node] != b:
                return 4, b, in_bin
            in_bin[node] = True
            prev = node
            node = bin_next[node]
    return 0, -1, in_bin
