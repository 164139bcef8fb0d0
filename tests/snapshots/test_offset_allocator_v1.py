"""Upstream OffsetBufferAllocator state in v1 snapshots: bins, the derived allocators, the checker,
the real upstream fixtures, and a model of upstream's allocate/free run on what we write."""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np
import pyarrow as pa
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_columnar.clock import NS_PER_MS, NS_PER_S
from mooncake_columnar.errors import SerializeFail, SnapshotIntegrityError, SnapshotPayloadError
from mooncake_columnar.kernels.offset_allocator_v1 import (
    MAX_BIN_SIZE,
    UNUSED,
    bin_round_down,
    bin_round_up,
    bin_size,
    multiplier_bits,
)
from mooncake_columnar.schema import SEGMENTS_LEGACY_SCHEMA, ReplicaStatus
from mooncake_columnar.snapshots.mooncake_v1 import (
    SEGMENTS_FILE,
    decode_v1,
    encode_v1,
)
from mooncake_columnar.snapshots.mooncake_v1_allocator import (
    NODE_DTYPE,
    AllocationHandles,
    AllocatorState,
    check_allocator,
    derive_allocators,
    live_extents,
    pack_allocator,
    pack_handle,
    unpack_allocator,
    unpack_handle,
    unzstd,
)
from mooncake_columnar.snapshots.repository import SnapshotRepository

from mooncake_columnar.testing.states import make_state
from mooncake_columnar.testing.v1_allocators import v1_allocators
from tests.fixtures import MOONCAKE_V1 as FIXTURES
from tests.fixtures import V1_CASES as CASES

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)

GiB = 1 << 30


def _fixture_payloads(case: str) -> dict[str, bytes]:
    repo = SnapshotRepository(FIXTURES / case / "mooncake_master_snapshot")
    return repo.read(repo.latest()).payloads


def _rollback_payloads(case: str) -> dict[str, bytes]:
    """The fixture restored by our reader and written back by our writer."""
    payloads = _fixture_payloads(case)
    s0 = int(payloads["descriptor.txt"].split(b"|")[-1]) * NS_PER_MS
    state = decode_v1(payloads, restore_system_ns=s0, restore_steady_ns=NS_PER_S)
    return encode_v1(state, system_now_ns=s0, steady_now_ns=NS_PER_S)


# ---- bins -------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(st.integers(1, MAX_BIN_SIZE))
def test_bins_bracket_each_size(size: int) -> None:
    down, up = int(bin_round_down(size)), int(bin_round_up(size))
    assert int(bin_size(down)) <= size < int(bin_size(down + 1))
    assert int(bin_size(up - 1)) < size <= int(bin_size(up))
    assert 0 <= down <= up < 256


def test_bin_known_values() -> None:
    assert bin_round_down(np.arange(8)).tolist() == list(range(8))  # denormals are exact
    assert int(bin_size(bin_round_up(1000))) == 1024 and int(bin_size(bin_round_down(1000))) == 960
    assert int(bin_size(bin_round_up(3000))) == 3072  # the fixture's 3000-byte replica's node
    assert int(bin_size(bin_round_up(MAX_BIN_SIZE))) == MAX_BIN_SIZE


def test_multiplier_bits_fit_the_largest_bin() -> None:
    caps = np.array([0, 16 << 20, MAX_BIN_SIZE, MAX_BIN_SIZE + 1, 16 * GiB, 1 << 40])
    assert multiplier_bits(caps).tolist() == [0, 0, 0, 1, 3, 9]


# ---- the real upstream fixtures -----------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_upstream_fixture_allocators_pass_the_checker(case: str) -> None:
    """The invariants hold for what a real upstream master wrote (so they are upstream's)."""
    for view in v1_allocators(_fixture_payloads(case)).values():
        check_allocator(view.allocator, view.handles)
        assert view.allocator.cur_size == int(view.handles.requested_size.sum())


@pytest.mark.parametrize("case", CASES)
def test_derived_fixture_allocators_pass_the_checker(case: str) -> None:
    for view in v1_allocators(_rollback_payloads(case)).values():
        check_allocator(view.allocator, view.handles)


@pytest.mark.parametrize("case", CASES)
def test_derived_allocators_hold_the_same_extents_and_totals_as_upstream(case: str) -> None:
    theirs, ours = v1_allocators(_fixture_payloads(case)), v1_allocators(_rollback_payloads(case))
    assert set(theirs) == set(ours)
    for name, t in theirs.items():
        o = ours[name]
        for got, want in zip(live_extents(o.allocator), live_extents(t.allocator), strict=True):
            np.testing.assert_array_equal(got, want)
        fields = ("base", "total_size", "cur_size", "endpoint", "multiplier_bits", "capacity",
                  "allocated_size", "allocated_num", "size", "current_capacity", "max_capacity",
                  "free_storage", "used_bins_top", "free_offset")
        assert [getattr(o.allocator, f) for f in fields] == [getattr(t.allocator, f) for f in fields]
        # each replica's handle names a node over the same bytes
        assert o.replica_ids == t.replica_ids
        np.testing.assert_array_equal(o.handles.real_base, t.handles.real_base)
        np.testing.assert_array_equal(o.handles.requested_size, t.handles.requested_size)


@pytest.mark.parametrize("case", CASES)
def test_derived_allocators_reproduce_upstream_node_arrays_of_allocation_only_fixtures(case: str) -> None:
    """The fixtures' allocators only ever allocated, so upstream numbered nodes in address order,
    as the canonical layout does: the node arrays, stacks, bins and handles come back equal."""
    theirs, ours = v1_allocators(_fixture_payloads(case)), v1_allocators(_rollback_payloads(case))
    for name, t in theirs.items():
        o = ours[name]
        for f in ("nodes", "free_nodes", "bin_indices", "used_bins"):
            np.testing.assert_array_equal(getattr(o.allocator, f), getattr(t.allocator, f), err_msg=f)
        for got, want in zip(o.handles, t.handles, strict=True):
            np.testing.assert_array_equal(got, want)


def test_fixture_allocators_are_allocation_only() -> None:
    """Why the node-array test above can compare exactly: no node was ever freed or reused."""
    for case in CASES:
        for view in v1_allocators(_fixture_payloads(case)).values():
            a = view.allocator
            assert np.array_equal(a.free_nodes, np.arange(a.current_capacity))
            assert np.array_equal(np.sort(view.handles.node), np.arange(a.allocated_num))


def test_writer_node_blobs_carry_their_content_size() -> None:
    """Upstream's zstd_decompress refuses a frame without the decompressed size."""
    a = v1_allocators(_rollback_payloads("small_6"))["seg_a"].mounted[7]
    for blob in a[5][5][7:9]:
        assert zstandard.frame_content_size(blob) == len(zstandard.ZstdDecompressor().decompress(blob))


# ---- random layouts --------------------------------------------------------------------------------
_CAPACITIES = st.one_of(st.sampled_from([0, 1, 4096, MAX_BIN_SIZE, MAX_BIN_SIZE + 1, 16 * GiB]),
                        st.integers(1, 1 << 26))


@st.composite
def layouts(draw) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segments, and replicas (segment row, offset, size, held): held extents never overlap and
    start on an allocation unit (the end may fall inside one); others lie anywhere."""
    n_seg = draw(st.integers(1, 3))
    caps = [draw(_CAPACITIES) for _ in range(n_seg)]
    rows, offs, sizes, held = [], [], [], []
    for s, cap in enumerate(caps):
        unit = 1 << int(multiplier_bits(cap))
        units, cursor = cap // unit, 0
        for gap, length, short in draw(st.lists(st.tuples(
                st.integers(0, 1 << draw(st.integers(0, 24))), st.integers(1, 1 << 12),
                st.integers(0, unit - 1)), max_size=30)):
            if cursor + gap + length > units:
                break
            cursor += gap
            rows.append(s), offs.append(cursor * unit), held.append(True)
            sizes.append(length * unit - min(short, length * unit - 1))
            cursor += length
        for _ in range(draw(st.integers(0, 2))):  # REMOVED or empty buffers: no extent of their own
            size = draw(st.integers(0, cap))
            rows.append(s), offs.append(draw(st.integers(0, cap - size))), sizes.append(size)
            held.append(False)
    segments = pa.table({
        "name": [f"seg{s}" for s in range(n_seg)], "endpoint": [f"ep{s}" for s in range(n_seg)],
        "client": [""] * n_seg, "base": pa.array([(s + 1) << 40 for s in range(n_seg)], pa.uint64()),
        "size": pa.array(caps, pa.int64()), "used": pa.array([0] * n_seg, pa.int64()),
        "readable": [True] * n_seg}, schema=SEGMENTS_LEGACY_SCHEMA)
    order = np.random.default_rng(draw(st.integers(0, 1 << 30))).permutation(len(rows))
    cols = (np.array(c, np.int64)[order] for c in (rows, offs, sizes))
    return (segments, *cols, np.array(held, bool)[order])


def _derived_views(segments, seg_row, offset, size, held
                   ) -> list[tuple[AllocatorState, AllocationHandles, np.ndarray]]:
    """Each segment's derived allocator and handles as upstream would read them back (through
    msgpack), and the replicas each handle belongs to."""
    derived = derive_allocators(segments, seg_row, offset, size, held)
    compressor = zstandard.ZstdCompressor(level=3)
    base = segments.column("base").to_numpy()
    views = []
    for row in range(segments.num_rows):
        wire = msgpack.unpackb(msgpack.packb(pack_allocator(derived.state(row), compressor)))
        mine = np.flatnonzero((seg_row == row) & (derived.node >= 0))
        packed = [pack_handle(int(base[row]) + int(offset[i]), int(size[i]), int(derived.offset[i]),
                              int(derived.node[i])) for i in mine]
        decoded = [unpack_handle(msgpack.unpackb(msgpack.packb(v)), "h") for v in packed]
        handles = AllocationHandles(np.array([d[0] for d in decoded], np.uint64),
                                    *(np.array([d[k] for d in decoded], np.int64) for k in (1, 2, 3)))
        views.append((unpack_allocator(wire, f"seg{row}"), handles, mine))
    return views


@settings(max_examples=60, deadline=None)
@given(layouts())
def test_random_layouts_derive_checked_allocators_whose_handles_give_back_the_extents(layout) -> None:
    segments, seg_row, offset, size, held = layout
    for row, (a, handles, mine) in enumerate(_derived_views(*layout)):
        check_allocator(a, handles)
        assert np.array_equal(np.sort(mine), np.sort(np.flatnonzero(held & (seg_row == row))))
        base = int(segments.column("base")[row].as_py())
        np.testing.assert_array_equal(handles.real_base.astype(np.int64) - base, offset[mine])
        np.testing.assert_array_equal(handles.requested_size, size[mine])
        assert a.cur_size == int(size[seg_row == row].sum())  # every buffer, held or not
        # the used nodes, in address order, are the extents in address order
        node_off, node_size, used = live_extents(a)
        ext = np.sort(offset[mine])
        assert np.array_equal(node_off[used], ext >> a.multiplier_bits << a.multiplier_bits)


def test_extents_sharing_an_allocation_unit_cannot_be_written() -> None:
    """Above 3.75 GiB upstream counts in units of 2**bits bytes; two extents in one unit have no
    upstream representation (each needs its own node), so the writer refuses."""
    segments = pa.table({"name": ["big"], "endpoint": ["ep"], "client": [""],
                         "base": pa.array([1 << 40], pa.uint64()), "size": pa.array([16 * GiB]),
                         "used": pa.array([0]), "readable": [True]}, schema=SEGMENTS_LEGACY_SCHEMA)
    one = np.zeros(2, np.int64)
    with pytest.raises(SerializeFail, match="allocation unit 8 bytes"):
        derive_allocators(segments, one, np.array([0, 3]), np.array([3, 5]), np.ones(2, bool))
    derive_allocators(segments, one, np.array([0, 8]), np.array([3, 5]), np.ones(2, bool))


# ---- the checker catches corruption; the decoder rejects malformed values --------------------------
def _small_state() -> tuple[AllocatorState, AllocationHandles]:
    view = v1_allocators(_fixture_payloads("small_6"))["seg_b"]
    return view.allocator, view.handles


def _with_node(a: AllocatorState, i: int, **fields) -> AllocatorState:
    nodes = a.nodes.copy()
    for k, v in fields.items():
        nodes[k][i] = v
    return dataclasses.replace(a, nodes=nodes)


_CORRUPTIONS = {
    "used_flag_cleared": lambda a: _with_node(a, 0, used=0),
    "bin_back_link": lambda a: _with_node(a, 3, bin_prev=1),
    "bin_of_wrong_size": lambda a: _with_node(a, 3, size=100),
    "free_storage": lambda a: dataclasses.replace(a, free_storage=a.free_storage - 1),
    "leaf_mask": lambda a: dataclasses.replace(a, used_bins=np.zeros(32, np.uint8)),
    "top_mask": lambda a: dataclasses.replace(a, used_bins_top=a.used_bins_top | 1),
    "free_offset": lambda a: dataclasses.replace(a, free_offset=a.free_offset + 1),
    "free_stack": lambda a: dataclasses.replace(a, free_nodes=np.where(
        np.arange(a.current_capacity) == a.free_offset, 0, a.free_nodes).astype(np.uint32)),
    "neighbor_link": lambda a: _with_node(a, 1, neighbor_next=3),
    "gap_in_tiling": lambda a: _with_node(a, 1, size=1),
    "multiplier": lambda a: dataclasses.replace(a, multiplier_bits=1),
    "capacity_order": lambda a: dataclasses.replace(a, max_capacity=a.current_capacity - 1),
    "bases_disagree": lambda a: dataclasses.replace(a, allocator_base=a.base + 1),
}


@pytest.mark.parametrize("corruption", sorted(_CORRUPTIONS))
def test_checker_rejects_a_corrupted_allocator(corruption: str) -> None:
    a, handles = _small_state()
    check_allocator(a, handles)
    with pytest.raises(SnapshotIntegrityError):
        check_allocator(_CORRUPTIONS[corruption](a), handles)


def test_checker_rejects_adjacent_free_nodes() -> None:
    a, _ = _small_state()  # seg_b: used 0..2 then one free node 3; free node 2 as well
    a = _with_node(a, 2, used=0, bin_prev=UNUSED, bin_next=UNUSED)
    b = int(bin_round_down(int(a.nodes["size"][2])))
    bins = a.bin_indices.copy()
    bins[b] = 2
    used_bins = a.used_bins.copy()
    used_bins[b >> 3] |= 1 << (b & 7)
    a = dataclasses.replace(a, bin_indices=bins, used_bins=used_bins,
                            used_bins_top=a.used_bins_top | (1 << (b >> 3)),
                            free_storage=a.free_storage + int(a.nodes["size"][2]))
    with pytest.raises(SnapshotIntegrityError, match="adjacent free"):
        check_allocator(a)


@pytest.mark.parametrize("handles_change", ["free_node", "shared_node", "offset", "beyond_node", "count"])
def test_checker_rejects_bad_handles(handles_change: str) -> None:
    a, h = _small_state()
    node, offset, size = h.node.copy(), h.offset.copy(), h.requested_size.copy()
    if handles_change == "free_node":
        node[0] = 3
    elif handles_change == "shared_node":
        node[1] = node[0]
    elif handles_change == "offset":
        offset[0] += 1
    elif handles_change == "beyond_node":
        size[0] += 1 << 20
    with pytest.raises(SnapshotIntegrityError):
        if handles_change == "count":
            check_allocator(a, AllocationHandles(*(x[1:] for x in h)))
        else:
            check_allocator(a, AllocationHandles(h.real_base, size, offset, node))


_MALFORMED = {
    "not_a_list": lambda v: 7,
    "short_buffer_allocator": lambda v: v[:5],
    "negative_base": lambda v: [v[0], -1, *v[2:]],
    "short_core": lambda v: v[:5] + [v[5][:5] + [v[5][5][:9]]],
    "used_bins_length": lambda v: _core(v, 5, v[5][5][5][:31]),
    "bin_index_too_wide": lambda v: _core(v, 6, [1 << 32] + v[5][5][6][1:]),
    "nodes_not_zstd": lambda v: _core(v, 7, b"nope"),
    "nodes_truncated": lambda v: _core(v, 7, zstandard.ZstdCompressor().compress(b"\0" * 24)),
    "free_nodes_wrong_length": lambda v: _core(v, 8, zstandard.ZstdCompressor().compress(b"\0" * 4)),
}


def _core(v: list, i: int, new) -> list:
    core = list(v[5][5])
    core[i] = new
    return [*v[:5], [*v[5][:5], core]]


@pytest.mark.parametrize("malformation", sorted(_MALFORMED))
def test_unpack_rejects_a_malformed_allocator(malformation: str) -> None:
    seg = msgpack.unpackb(unzstd(_fixture_payloads("small_6")[SEGMENTS_FILE], "s"), strict_map_key=False)
    value = next(iter(seg["ms"].values()))[7]
    unpack_allocator(value, "ok")
    with pytest.raises(SnapshotPayloadError):
        unpack_allocator(_MALFORMED[malformation](value), "bad")


@pytest.mark.parametrize("handle", [None, [1, 2], [1, 2, [3]], [1, 2, [3, 1 << 32]], [-1, 2, [3, 4]]])
def test_unpack_rejects_a_malformed_handle(handle) -> None:
    with pytest.raises(SnapshotPayloadError):
        unpack_handle(handle, "bad")


# ---- a model of upstream's allocator, run on the derived state --------------------------------------
class UpstreamModel:
    """Upstream's allocate/free semantics (bins, splitting, coalescing, the free-node stack) over a
    loaded AllocatorState, to show what we write keeps working after an upstream master loads it."""

    def __init__(self, a: AllocatorState):
        self.a = a
        self.n = {f: a.nodes[f].astype(np.int64).tolist() for f in NODE_DTYPE.names}
        self.heads = a.bin_indices.astype(np.int64).tolist()
        self.leaf, self.top = a.used_bins.astype(np.int64).tolist(), a.used_bins_top
        self.stack, self.sp = a.free_nodes.astype(np.int64).tolist(), a.free_offset
        self.free_storage = a.free_storage

    def _file(self, size: int, offset: int) -> int:
        b = int(bin_round_down(size))
        if self.heads[b] == UNUSED:
            self.leaf[b >> 3] |= 1 << (b & 7)
            self.top |= 1 << (b >> 3)
        i, self.sp = self.stack[self.sp], self.sp + 1
        for f, v in (("used", 0), ("offset", offset), ("size", size), ("bin_prev", UNUSED),
                     ("bin_next", self.heads[b]), ("neighbor_prev", UNUSED), ("neighbor_next", UNUSED)):
            self.n[f][i] = v
        if self.heads[b] != UNUSED:
            self.n["bin_prev"][self.heads[b]] = i
        self.heads[b] = i
        self.free_storage += size
        return i

    def _pop_head(self, b: int) -> None:
        i = self.heads[b]
        self.heads[b] = self.n["bin_next"][i]
        if self.heads[b] != UNUSED:
            self.n["bin_prev"][self.heads[b]] = UNUSED
        else:
            self.leaf[b >> 3] &= ~(1 << (b & 7))
            if not self.leaf[b >> 3]:
                self.top &= ~(1 << (b >> 3))

    def _unfile(self, i: int) -> None:
        prev, nxt = self.n["bin_prev"][i], self.n["bin_next"][i]
        if prev == UNUSED:
            self._pop_head(int(bin_round_down(self.n["size"][i])))
        else:
            self.n["bin_next"][prev] = nxt
            if nxt != UNUSED:
                self.n["bin_prev"][nxt] = prev
        self.sp -= 1
        self.stack[self.sp] = i
        self.free_storage -= self.n["size"][i]

    def free(self, i: int, requested: int) -> None:
        offset, size = self.n["offset"][i], self.n["size"][i]
        prev, nxt = self.n["neighbor_prev"][i], self.n["neighbor_next"][i]
        if prev != UNUSED and not self.n["used"][prev]:
            offset, size = self.n["offset"][prev], size + self.n["size"][prev]
            self._unfile(prev)
            prev = self.n["neighbor_prev"][prev]
        if nxt != UNUSED and not self.n["used"][nxt]:
            size += self.n["size"][nxt]
            self._unfile(nxt)
            nxt = self.n["neighbor_next"][nxt]
        self.sp -= 1
        self.stack[self.sp] = i
        j = self._file(size, offset)
        self._link(prev, j, nxt)
        self.a = dataclasses.replace(self.a, allocated_num=self.a.allocated_num - 1,
                                     allocated_size=self.a.allocated_size - requested)

    def _link(self, prev: int, j: int, nxt: int) -> None:
        self.n["neighbor_prev"][j], self.n["neighbor_next"][j] = prev, nxt
        if prev != UNUSED:
            self.n["neighbor_next"][prev] = j
        if nxt != UNUSED:
            self.n["neighbor_prev"][nxt] = j

    def allocate(self, units: int) -> int | None:
        if self.sp == self.a.max_capacity:
            return None
        if self.sp == len(self.stack):  # grow by one node slot
            self.stack.append(len(self.stack))
            for f in NODE_DTYPE.names:
                self.n[f].append(0 if f in ("used", "offset", "size") else UNUSED)
        want = int(bin_round_up(units))
        candidates = [b for b in range(want, 256) if self.leaf[b >> 3] >> (b & 7) & 1]
        if not candidates:
            return None
        b = candidates[0]
        i, rounded = self.heads[b], int(bin_size(want))
        total = self.n["size"][i]
        self._pop_head(b)
        self.free_storage -= total
        self.n["used"][i], self.n["size"][i] = 1, rounded
        if total > rounded:
            j = self._file(total - rounded, self.n["offset"][i] + rounded)
            self._link(i, j, self.n["neighbor_next"][i])
        self.a = dataclasses.replace(self.a, allocated_num=self.a.allocated_num + 1,
                                     allocated_size=self.a.allocated_size + (units << self.a.multiplier_bits))
        return i

    def state(self) -> AllocatorState:
        nodes = np.zeros(len(self.stack), NODE_DTYPE)
        for f in NODE_DTYPE.names:
            nodes[f] = self.n[f]
        return dataclasses.replace(
            self.a, nodes=nodes, free_nodes=np.array(self.stack, np.uint32),
            current_capacity=len(self.stack), free_offset=self.sp, free_storage=self.free_storage,
            bin_indices=np.array(self.heads, np.uint32), used_bins=np.array(self.leaf, np.uint8),
            used_bins_top=self.top)


def _handles(a: AllocatorState, live: dict[int, tuple[int, int]]) -> AllocationHandles:
    """Handles of the live allocations {node: (byte offset, size)}."""
    nodes = np.array(sorted(live), np.int64)
    off = np.array([live[i][0] for i in nodes], np.int64)
    size = np.array([live[i][1] for i in nodes], np.int64)
    return AllocationHandles((off + a.base).astype(np.uint64), size,
                             a.nodes["offset"][nodes].astype(np.int64), nodes)


@settings(max_examples=40, deadline=None)
@given(layouts(), st.randoms(use_true_random=False), st.lists(st.integers(1, 1 << 16), max_size=8))
def test_upstream_model_frees_and_allocates_on_derived_allocators(layout, rnd, requests) -> None:
    """Free half the handles, allocate, free everything: after every step the allocator passes the
    checker, allocations never overlap live extents, and at the end one free node spans it all."""
    for a, h, _ in _derived_views(*layout):
        model = UpstreamModel(a)
        live = {int(n): (int(r) - a.base, int(s)) for n, r, s in zip(h.node, h.real_base, h.requested_size)}
        order = list(live)
        rnd.shuffle(order)
        for node in order[:len(order) // 2]:
            model.free(node, live.pop(node)[1])
            check_allocator(model.state(), _handles(model.state(), live))
        for units in requests:
            node = model.allocate(units)
            if node is not None:
                s = model.state()
                live[node] = (int(s.nodes["offset"][node]) << s.multiplier_bits, units << s.multiplier_bits)
                check_allocator(s, _handles(s, live))
        for node in list(live):
            model.free(node, live.pop(node)[1])
        end = model.state()
        check_allocator(end, _handles(end, live))
        off, size, used = live_extents(end)
        assert end.free_storage == end.size and not used.any()
        one_free_node = ([0], [end.size]) if end.size else ([], [])
        assert (off.tolist(), (size >> end.multiplier_bits).tolist()) == one_free_node


# ---- the writer end to end -----------------------------------------------------------------------------
def test_writer_gives_every_held_replica_a_handle_and_every_segment_an_allocator() -> None:
    n = 200
    status = np.where(np.arange(2 * n) % 9 == 0, ReplicaStatus.REMOVED, ReplicaStatus.COMPLETE)
    state = make_state(n, replicas_per_object=2, status=status)  # 16 GiB segments: 8-byte units
    payloads = encode_v1(state, system_now_ns=0, steady_now_ns=0)
    views = v1_allocators(payloads)
    reps = state.replicas.to_pylist()
    for seg in state.segments.to_pylist():
        view = views[seg["name"]]
        check_allocator(view.allocator, view.handles)
        mine = [r for r in reps if r["segment"] == seg["name"]]
        held = sorted(r["replica_id"] for r in mine if r["status"] != ReplicaStatus.REMOVED)
        assert view.replica_ids == held
        # used: every buffer's bytes, as upstream's cur_size (QuerySegments) counts them
        assert view.allocator.cur_size == seg["used"] == sum(r["size"] for r in mine)
        assert view.allocator.allocated_size == sum(r["size"] for r in mine if r["status"] != ReplicaStatus.REMOVED)
        assert view.mounted[2:4] == [seg["base"], seg["size"]] and view.allocator.multiplier_bits == 3
