"""Upstream's per-segment OffsetBufferAllocator state and allocation handles in v1 snapshots.

Upstream's v1 ``segments`` payload carries each mounted segment's whole allocator, and every
memory replica's buffer carries the allocation handle that frees its node. An upstream master
drops (logs and skips) every object with a memory replica on a segment without an allocator, so
the rollback writer must emit both. SnapshotState keeps extents only, so the allocator is derived from them:
one used node per extent, one free node per gap, numbered in address order (:func:`derive_allocators`).

Layout, as upstream's msgpack serializers write it (integers unsigned):

* OffsetBufferAllocator = ``[segment_name, base, total_size, cur_size, transport_endpoint, OA]``
* OA (OffsetAllocator) = ``[base, multiplier_bits, capacity, allocated_size, allocated_num, A]``
* A (its core) = ``[size, current_capacity, max_capacity, free_storage, used_bins_top,
  used_bins[32] (u8), bin_indices[256] (u32), zstd(nodes), zstd(free_nodes), free_offset]``;
  a node is 25 little-endian bytes (:data:`NODE_DTYPE`), free_nodes is u32 LE per node slot.
* handle = ``[real_base, requested_size, [offset_in_units, node_index]]``

Byte quantities (base, capacity, sizes of buffers, cur_size, allocated_size) are bytes; node
offsets and sizes, ``size`` and ``free_storage`` are allocation units of ``1 << multiplier_bits``
bytes. :func:`check_allocator` states the invariants a loaded allocator relies on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import zstandard

from ..errors import (
    SerializeFail,
    SnapshotDecompressionLimit,
    SnapshotPayloadFieldError,
    SnapshotIntegrityError,
    SnapshotPayloadError,
)
from ..kernels.offset_allocator_v1 import (
    BINS_PER_LEAF,
    NUM_LEAF_BINS,
    NUM_TOP_BINS,
    UNUSED,
    NodeLayout,
    bin_round_down,
    canonical_nodes,
    extent_units,
    fit_extent_ends,
    multiplier_bits,
    walk_bin_lists,
)

NODE_DTYPE = np.dtype([("used", "u1"), ("offset", "<u4"), ("size", "<u4"), ("bin_prev", "<u4"),
                       ("bin_next", "<u4"), ("neighbor_prev", "<u4"), ("neighbor_next", "<u4")])
_LINKS = ("bin_prev", "bin_next", "neighbor_prev", "neighbor_next")
_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1


# ---- msgpack / zstd value helpers (shared with the v1 codec) --------------------------------------
# Stored bytes are hostile: a 32 KB frame can declare (and hold) gigabytes. Each frame may expand
# to at most ZSTD_MAX_RATIO times its stored size (plus a small allowance), far above what msgpack
# metadata reaches (under 4x in the upstream fixtures), and never past the configured maximum.
ZSTD_MAX_RATIO = 64
ZSTD_ALLOWANCE = 64 << 10
DEFAULT_MAX_DECOMPRESSED_BYTES = 4 << 30  # per payload file


def zstd_cap(stored_size: int, max_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> int:
    """Most bytes ``stored_size`` compressed bytes may decompress to."""
    return min(max_bytes, stored_size * ZSTD_MAX_RATIO + ZSTD_ALLOWANCE)


def unzstd(data: Any, what: str, max_size: int | None = None) -> bytes:
    """One complete zstd frame of at most ``max_size`` (default :func:`zstd_cap`) decompressed
    bytes, or SnapshotPayloadError (:class:`SnapshotDecompressionLimit` past the cap).

    The frame's declared content size is checked against the cap before the output is allocated
    (python-zstandard allocates the declared size, whatever ``max_output_size`` says); libzstd
    then refuses a frame whose blocks produce more than it declared.
    """
    if not isinstance(data, bytes):
        raise SnapshotPayloadFieldError(what, "zstd frame", f"expected bytes, got {type(data).__name__}")
    cap = zstd_cap(len(data)) if max_size is None else max_size
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError as e:
        raise SnapshotPayloadFieldError(what, "zstd frame", f"bad frame header: {e}") from None
    if declared > cap:
        raise SnapshotDecompressionLimit(what, "zstd frame", f"declares {declared} bytes, over the "
                                         f"cap of {cap}")
    dctx = zstandard.ZstdDecompressor()
    try:
        if declared == 0:  # decompress() would return b"" unread: stream it (libzstd enforces 0)
            dobj = dctx.decompressobj()
            out = dobj.decompress(data)
            if out or not dobj.eof or dobj.unused_data:
                raise SnapshotPayloadFieldError(what, "zstd frame", "truncated frame or trailing bytes")
            return out
        # size unknown (-1): the buffer is the cap, filled only as far as the frame goes
        return dctx.decompress(data, max_output_size=cap, allow_extra_data=False)
    except MemoryError:
        raise SnapshotDecompressionLimit(what, "zstd frame", f"no memory for {cap} bytes") from None
    except zstandard.ZstdError as e:
        if declared == -1 and "did not decompress full frame" in str(e):  # buffer full, or cut
            raise SnapshotDecompressionLimit(what, "zstd frame", f"truncated, or it decompresses "
                                             f"past the cap of {cap} bytes") from None
        raise SnapshotPayloadFieldError(what, "zstd frame", f"bad zstd frame: {e}") from None


class ZstdBudget:
    """The cap on what one stored payload file's zstd frames decompress to together: the file's
    :func:`zstd_cap`, each frame also within its own."""

    def __init__(self, stored_size: int, max_bytes: int):
        self.cap = self.left = zstd_cap(stored_size, max_bytes)

    def unzstd(self, data: Any, what: str) -> bytes:
        frame_cap = zstd_cap(len(data) if isinstance(data, bytes) else 0)
        if self.left >= frame_cap:
            out = unzstd(data, what, frame_cap)
        else:
            try:
                out = unzstd(data, what, self.left)
            except SnapshotDecompressionLimit:
                raise SnapshotDecompressionLimit(what, "zstd frame", f"over the payload's cap of "
                                                 f"{self.cap} bytes (its frames together)"
                                                 ) from None
        self.left -= len(out)
        return out


def is_uint(v: Any, limit: int = _U64) -> bool:
    return type(v) is int and 0 <= v <= limit


# ---- the state of one segment's allocator ---------------------------------------------------------
@dataclass(frozen=True, eq=False)
class AllocatorState:
    """One OffsetBufferAllocator as upstream serializes it (see the module docstring)."""
    segment_name: str
    base: int
    total_size: int
    cur_size: int
    endpoint: str
    allocator_base: int
    multiplier_bits: int
    capacity: int
    allocated_size: int
    allocated_num: int
    size: int
    current_capacity: int
    max_capacity: int
    free_storage: int
    used_bins_top: int
    used_bins: np.ndarray    # (NUM_TOP_BINS,) uint8
    bin_indices: np.ndarray  # (NUM_LEAF_BINS,) uint32
    nodes: np.ndarray        # (current_capacity,) NODE_DTYPE
    free_nodes: np.ndarray   # (current_capacity,) uint32
    free_offset: int


class AllocationHandles(NamedTuple):
    """The handles of one allocator's buffers, one row each (see the module docstring)."""
    real_base: np.ndarray       # uint64, bytes
    requested_size: np.ndarray  # int64, bytes
    offset: np.ndarray          # int64, units
    node: np.ndarray            # int64


def pack_allocator(a: AllocatorState, compressor: zstandard.ZstdCompressor) -> list:
    """The msgpack value of one OffsetBufferAllocator."""
    core = [a.size, a.current_capacity, a.max_capacity, a.free_storage, a.used_bins_top,
            a.used_bins.tolist(), a.bin_indices.tolist(),
            compressor.compress(a.nodes.tobytes()),
            compressor.compress(a.free_nodes.astype("<u4").tobytes()), a.free_offset]
    return [a.segment_name, a.base, a.total_size, a.cur_size, a.endpoint,
            [a.allocator_base, a.multiplier_bits, a.capacity, a.allocated_size, a.allocated_num,
             core]]


def unpack_allocator(value: Any, what: str) -> AllocatorState:
    """An AllocatorState from its msgpack value; SnapshotPayloadError where upstream's
    deserializer would fail (shape, types, widths, zstd frames, blob lengths)."""
    if not (isinstance(value, list) and len(value) == 6 and isinstance(value[0], str)
            and all(is_uint(v) for v in value[1:4]) and isinstance(value[4], str)):
        raise SnapshotPayloadError(f"{what}: malformed OffsetBufferAllocator")
    oa = value[5]
    if not (isinstance(oa, list) and len(oa) == 6 and all(is_uint(v) for v in oa[:5])):
        raise SnapshotPayloadError(f"{what}: malformed OffsetAllocator")
    core = oa[5]
    if not (isinstance(core, list) and len(core) == 10
            and all(is_uint(v, _U32) for v in (*core[:5], core[9]))
            and _uint_list(core[5], NUM_TOP_BINS, 0xFF) and _uint_list(core[6], NUM_LEAF_BINS, _U32)):
        raise SnapshotPayloadError(f"{what}: malformed OffsetAllocator core")
    cap = core[1]
    # node arrays of a sparse allocator compress far beyond the ratio cap: cap them at their size
    limit = min(cap * NODE_DTYPE.itemsize, DEFAULT_MAX_DECOMPRESSED_BYTES)
    nodes = unzstd(core[7], f"{what} nodes", limit)
    free_nodes = unzstd(core[8], f"{what} free nodes", min(cap * 4, limit))
    if len(nodes) != cap * NODE_DTYPE.itemsize or len(free_nodes) != cap * 4:
        raise SnapshotPayloadError(f"{what}: node arrays do not hold current_capacity={cap} nodes")
    return AllocatorState(
        segment_name=value[0], base=value[1], total_size=value[2], cur_size=value[3],
        endpoint=value[4], allocator_base=oa[0], multiplier_bits=oa[1], capacity=oa[2],
        allocated_size=oa[3], allocated_num=oa[4], size=core[0], current_capacity=cap,
        max_capacity=core[2], free_storage=core[3], used_bins_top=core[4],
        used_bins=np.array(core[5], np.uint8), bin_indices=np.array(core[6], np.uint32),
        nodes=np.frombuffer(nodes, NODE_DTYPE), free_nodes=np.frombuffer(free_nodes, "<u4"),
        free_offset=core[9])


def _uint_list(v: Any, n: int, limit: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(is_uint(x, limit) for x in v)


def pack_handle(real_base: int, requested_size: int, offset: int, node: int) -> list:
    """The msgpack value of one allocation handle."""
    return [real_base, requested_size, [offset, node]]


def unpack_handle(value: Any, what: str) -> tuple[int, int, int, int]:
    """(real_base, requested_size, offset, node) of a handle, or SnapshotPayloadError."""
    if not (isinstance(value, list) and len(value) == 3 and is_uint(value[0]) and is_uint(value[1])
            and isinstance(value[2], list) and len(value[2]) == 2
            and all(is_uint(v, _U32) for v in value[2])):
        raise SnapshotPayloadError(f"{what}: malformed offset allocation handle")
    return value[0], value[1], value[2][0], value[2][1]


# ---- derive every segment's allocator from the replicas' extents ----------------------------------
def _initial_node_capacity(size: np.ndarray) -> np.ndarray:
    """Upstream's node slots for a fresh segment allocator (one per 4 KiB, 1 Ki..64 Ki)."""
    return np.clip(size // 4096, 1024, 64 * 1024)


def _max_node_capacity(size: np.ndarray) -> np.ndarray:
    """Upstream's node limit of a segment allocator (one per KiB, 1 Mi..64 Mi)."""
    return np.clip(size // 1024, 1 << 20, 64 << 20)


@dataclass(frozen=True, eq=False)
class SegmentAllocators:
    """Canonical allocators of all segments (rows of the segments table) and, per replica, the
    node its handle points at (``node`` -1: the buffer has no handle)."""
    names: list[str]
    endpoints: list[str]
    base: np.ndarray
    capacity: np.ndarray
    bits: np.ndarray
    node_capacity: np.ndarray
    max_capacity: np.ndarray
    cur_size: np.ndarray
    allocated_size: np.ndarray
    allocated_num: np.ndarray
    layout: NodeLayout
    node: np.ndarray    # per replica, int64
    offset: np.ndarray  # per replica, int64 units

    def state(self, row: int) -> AllocatorState:
        """Segment ``row``'s allocator with every node slot filled (unused slots as upstream
        initializes them; the free-node stack is the identity, so slots past the live nodes are
        the ones to hand out next)."""
        lay, cap = self.layout, int(self.node_capacity[row])
        lo, hi = lay.ptr[row], lay.ptr[row + 1]
        nodes = np.zeros(cap, NODE_DTYPE)
        for name in _LINKS:
            nodes[name] = UNUSED
        for name in NODE_DTYPE.names or ():  # NodeLayout names its columns like the node fields (a structured dtype)
            nodes[name][:hi - lo] = getattr(lay, name)[lo:hi]
        base, units = int(self.base[row]), int(self.capacity[row]) >> int(self.bits[row])
        return AllocatorState(
            segment_name=self.names[row], base=base, total_size=int(self.capacity[row]),
            cur_size=int(self.cur_size[row]), endpoint=self.endpoints[row], allocator_base=base,
            multiplier_bits=int(self.bits[row]), capacity=int(self.capacity[row]),
            allocated_size=int(self.allocated_size[row]),
            allocated_num=int(self.allocated_num[row]), size=units, current_capacity=cap,
            max_capacity=int(self.max_capacity[row]), free_storage=int(lay.free_storage[row]),
            used_bins_top=int(lay.used_bins_top[row]),
            used_bins=lay.used_bins[row].astype(np.uint8),
            bin_indices=lay.bin_heads[row].astype(np.uint32),
            nodes=nodes, free_nodes=np.arange(cap, dtype=np.uint32), free_offset=int(hi - lo))


def derive_allocators(segments: pa.Table, seg_row: np.ndarray, offset: np.ndarray,
                      size: np.ndarray, held: np.ndarray) -> SegmentAllocators:
    """Every segment's allocator holding exactly the extents of the ``held`` memory replicas.

    ``seg_row``/``offset``/``size`` (bytes) describe every memory replica; held ones (they own
    their extent, size > 0) get a used node and a handle, the others only count in ``cur_size``
    (upstream subtracts each buffer's size from it when the buffer goes). SerializeFail where
    upstream's allocator cannot hold the extents: in a segment above 3.75 GiB (allocation unit
    > 1 byte) two extents share a unit, or an extent reaches the partial unit at the end.
    """
    capacity = segments.column("size").to_numpy().astype(np.int64)
    n_seg = capacity.shape[0]
    bits = multiplier_bits(capacity)
    units = capacity >> bits
    ext = np.flatnonzero(held)
    ext = ext[np.lexsort((offset[ext], seg_row[ext]))]
    ext_seg = seg_row[ext]
    start, exact_end = extent_units(offset[ext], size[ext], bits[ext_seg])
    end, bad = fit_extent_ends(ext_seg, start, exact_end, units)
    if bad >= 0:
        row = ext_seg[bad]
        raise SerializeFail(
            f"v1 writer: the extent at offset {int(offset[ext[bad]])} of segment "
            f"{segments.column('name')[int(row)].as_py()!r} does not fit upstream's allocator "
            f"(allocation unit {1 << int(bits[row])} bytes)")
    layout = canonical_nodes(units, ext_seg, start, end)
    live = np.diff(layout.ptr)
    node_capacity = np.maximum(_initial_node_capacity(capacity), live)
    node, unit_offset = np.full(seg_row.shape, -1, np.int64), np.zeros(seg_row.shape, np.int64)
    node[ext], unit_offset[ext] = layout.ext_node, start

    def per_segment(rows: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        # float sums are exact here: byte totals of one segment stay far below 2**53
        return np.bincount(rows, weights, minlength=n_seg).astype(np.int64)

    return SegmentAllocators(
        names=segments.column("name").to_pylist(), endpoints=segments.column("endpoint").to_pylist(),
        base=segments.column("base").to_numpy(), capacity=capacity, bits=bits,
        node_capacity=node_capacity,
        max_capacity=np.maximum(_max_node_capacity(capacity), node_capacity),
        cur_size=per_segment(seg_row, size), allocated_size=per_segment(ext_seg, size[ext]),
        allocated_num=per_segment(ext_seg), layout=layout, node=node, offset=unit_offset)


# ---- invariants ---------------------------------------------------------------------------------
_WALK_ERRORS = {1: "bin {bin} links to a node index out of range",
                2: "bin {bin} holds a used node, or a node twice (cycle or shared tail)",
                3: "bin {bin}: a node's back link does not name its predecessor",
                4: "bin {bin} holds a node whose size files it in another bin"}


def check_allocator(a: AllocatorState, handles: AllocationHandles | None = None) -> None:
    """Raise SnapshotIntegrityError unless ``a`` is an allocator upstream can load and keep using.

    Header: the buffer allocator's and the allocator's base and capacity agree; multiplier_bits
    is the fewest that fit the capacity into the largest bin and size = capacity >> bits;
    1 <= current_capacity <= max_capacity, free_offset <= current_capacity, one node slot and
    one stack slot per unit of current_capacity.
    Bins: walking each bin list from bin_indices meets only free nodes filed in that bin (size
    rounded down), each once, with back links naming the predecessor (head: none); leaf bit
    (t, l) is set iff bin 8t+l is non-empty and top bit t iff any leaf bit of t is;
    free_storage is the total size of the binned nodes.
    Nodes: the live nodes (used, or in a bin) number free_offset and the free-node stack above
    free_offset is a permutation of the others; live nodes have size > 0, tile [0, size) in
    address order with neighbour links naming their address neighbours (ends: none), and no two
    free nodes are adjacent (frees coalesce).
    Handles (if given, every buffer's: discarded replicas' too): one per used node, each naming
    a used node and its offset, the node covering the buffer's bytes; allocated_num and
    allocated_size are their count and bytes.
    Upstream may leave stale bin links in used nodes and stale slots below free_offset in the
    stack; nothing reads them, so neither is checked.
    """
    def fail(what: str) -> SnapshotIntegrityError:
        return SnapshotIntegrityError(f"allocator of segment {a.segment_name!r}: {what}")

    _check_header(a, fail)
    used, in_bin, err, at = _walk(a)
    if err:
        raise fail(_WALK_ERRORS[err].format(bin=at))
    _check_masks(a, fail)
    if a.free_storage != int(a.nodes["size"][in_bin].astype(np.int64).sum()):
        raise fail("free_storage is not the total size of the binned nodes")
    live = used | in_bin
    if a.free_offset != int(live.sum()):
        raise fail("free_offset is not the number of live nodes")
    if not np.array_equal(np.sort(a.free_nodes[a.free_offset:]), np.flatnonzero(~live)):
        raise fail("the free-node stack above free_offset is not exactly the unused node slots")
    _check_address_order(a, np.flatnonzero(live), used, fail)
    if handles is not None:
        _check_handles(a, handles, used, fail)


def _walk(a: AllocatorState) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(used, in a bin, walk error, bin) per node slot."""
    nodes = a.nodes
    used = nodes["used"] != 0
    err, at, in_bin = walk_bin_lists(a.bin_indices.astype(np.int64), used,
                                     bin_round_down(nodes["size"].astype(np.int64)),
                                     nodes["bin_prev"].astype(np.int64),
                                     nodes["bin_next"].astype(np.int64))
    return used, in_bin, int(err), int(at)


def _check_header(a: AllocatorState, fail) -> None:
    if (a.allocator_base, a.capacity) != (a.base, a.total_size):
        raise fail("buffer allocator and offset allocator disagree on base or capacity")
    bits = int(multiplier_bits(np.array([a.capacity]))[0])
    if a.multiplier_bits != bits or a.size != a.capacity >> bits:
        raise fail(f"multiplier_bits/size {a.multiplier_bits}/{a.size} do not match "
                   f"capacity {a.capacity}")
    # upstream's constructor files the whole range into node slot 0 before the fields are
    # overwritten, so at least one slot must exist
    if not (1 <= a.current_capacity <= a.max_capacity and a.free_offset <= a.current_capacity
            and len(a.nodes) == len(a.free_nodes) == a.current_capacity):
        raise fail("node capacities out of order")


def _check_masks(a: AllocatorState, fail) -> None:
    occupied = (a.bin_indices != UNUSED).reshape(NUM_TOP_BINS, BINS_PER_LEAF)
    leaf = (occupied << np.arange(BINS_PER_LEAF)).sum(axis=1)
    top = int(((leaf != 0) << np.arange(NUM_TOP_BINS)).sum())
    if not np.array_equal(leaf, a.used_bins) or top != a.used_bins_top:
        raise fail("bin masks do not match the non-empty bins")


def _check_address_order(a: AllocatorState, live: np.ndarray, used: np.ndarray, fail) -> None:
    nodes = a.nodes
    order = live[np.argsort(nodes["offset"][live], kind="stable")]
    off, size = nodes["offset"][order].astype(np.int64), nodes["size"][order].astype(np.int64)
    if order.size == 0:
        if a.size:
            raise fail("no live node covers the segment")
        return
    if (size == 0).any() or off[0] != 0 or off[-1] + size[-1] != a.size \
            or (off[1:] != off[:-1] + size[:-1]).any():
        raise fail("live nodes do not tile [0, size)")
    prev, nxt = np.full(order.size, UNUSED, np.int64), np.full(order.size, UNUSED, np.int64)
    prev[1:], nxt[:-1] = order[:-1], order[1:]
    if not (np.array_equal(nodes["neighbor_prev"][order], prev)
            and np.array_equal(nodes["neighbor_next"][order], nxt)):
        raise fail("neighbour links do not follow address order")
    free = ~used[order]
    if (free[1:] & free[:-1]).any():
        raise fail("two adjacent free nodes (not coalesced)")


def _check_handles(a: AllocatorState, h: AllocationHandles, used: np.ndarray, fail) -> None:
    node = h.node.astype(np.int64)
    if ((node < 0) | (node >= a.current_capacity)).any() or not used[node].all():
        raise fail("a handle names a node that is not used")
    if np.unique(node).size != node.size or node.size != int(used.sum()):
        raise fail("handles and used nodes are not one to one")
    n_off = a.nodes["offset"][node].astype(np.int64)
    n_end = n_off + a.nodes["size"][node].astype(np.int64)
    if not np.array_equal(h.offset.astype(np.int64), n_off):
        raise fail("a handle's offset is not its node's offset")
    real = h.real_base.astype(np.uint64)
    if (real < np.uint64(a.base)).any():
        raise fail("a handle's buffer starts below the segment base")
    rel, bits = (real - np.uint64(a.base)).astype(np.int64), a.multiplier_bits
    if (h.requested_size <= 0).any() or (rel < n_off << bits).any() \
            or (rel + h.requested_size > n_end << bits).any():
        raise fail("a handle's node does not cover its buffer")
    if (a.allocated_num, a.allocated_size) != (node.size, int(h.requested_size.sum())):
        raise fail("allocated_num/allocated_size do not count the handles")


def live_extents(a: AllocatorState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset, size, used) in bytes of the live nodes in address order (for comparisons)."""
    nodes = a.nodes
    used, in_bin, _, _ = _walk(a)
    live = np.flatnonzero(used | in_bin)
    live = live[np.argsort(nodes["offset"][live], kind="stable")]
    bits = a.multiplier_bits
    return (nodes["offset"][live].astype(np.int64) << bits,
            nodes["size"][live].astype(np.int64) << bits, used[live])
