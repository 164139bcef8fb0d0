"""Allocation units: a replica holds whole units of ``1 << unit_bits`` bytes of its segment (the
unit of upstream's allocator for that capacity), so no two replicas share one and a v1 rollback
can always express the layout. Segments up to 3.75 GiB have 1-byte units: byte-exact packing."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import InvalidParams, NoUsableSnapshot
from mooncake_columnar.kernels import allocation as ak
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig
from mooncake_columnar.snapshots.complete import write_snapshot
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.mooncake_v1_allocator import check_allocator
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.snapshots.state import SnapshotState
from mooncake_columnar.store.segments import Segment, SegmentTable

from mooncake_columnar.testing.states import make_state, publish_unvalidated
from mooncake_columnar.testing.v1_allocators import v1_allocators

GIB = 1 << 30
BIG, SMALL = 16 * GIB, GIB           # 8-byte units / 1-byte units
SEG, BASE = "seg_a", 1 << 40
CLIENT = "1001-1002"                  # UUID-shaped ("<u64>-<u64>"): the v1 writer requires it
CFG = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10)
ODD = [1001, 7, 13, 8, 9, 4095, 1]


def _master(size: int, clocks: ManualClocks | None = None, config: MasterConfig = CFG) -> MasterService:
    m = MasterService(config, clocks=clocks or ManualClocks(steady_ns=1_000 * NS_PER_S,
                                                            system_ns=1_796_000_000 * NS_PER_S))
    m.mount_segment(SEG, endpoint=f"{SEG}:17777", client_id=CLIENT, base=BASE, size=size)
    return m


def _put(m: MasterService, key: str, size: int) -> int:
    """Complete put; returns the replica's offset in the segment."""
    m.put_start(key, size, client_id=CLIENT, config=ReplicateConfig(replica_num=1))
    m.put_end(key, client_id=CLIENT)
    (d,) = m.get_replica_list(key)
    return d.address - BASE


def _free_list(m: MasterService) -> list[tuple[int, int]]:
    seg = m.segments
    c = seg.code(SEG)
    return list(zip(*(a.tolist() for a in seg.extents.of(c))))


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _check_allocator(m: MasterService) -> None:
    """Free extents sorted, not adjacent, on unit boundaries; replicas on unit boundaries; held
    extents and free extents tile the segment exactly (no overlap, no leak); used = held bytes."""
    seg = m.segments
    c = seg.code(SEG)
    cap, unit = int(seg.capacity[c]), 1 << int(seg.unit_bits[c])
    reps = m.export_state().replicas
    held = sorted((off, min(_round_up(off + size, unit), cap)) for off, size in
                  zip(reps.column("offset").to_pylist(), reps.column("size").to_pylist()))
    free = _free_list(m)
    assert all(s1 + l1 < s2 for (s1, l1), (s2, _) in zip(free, free[1:]))
    assert all(s % unit == 0 and ((s + n) % unit == 0 or s + n == cap) for s, n in free)
    assert all(off % unit == 0 for off, _ in held)
    pieces = sorted(held + [(s, s + n) for s, n in free])
    assert pieces[0][0] == 0 and pieces[-1][1] == cap
    assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    assert int(seg.used[c]) == sum(e - s for s, e in held) == cap - sum(n for _, n in free)


class _FirstFit:
    """Reference: first fit over a sorted free list, each replica holding whole units (unit 1:
    the byte-exact allocator as it always was)."""

    def __init__(self, capacity: int, unit: int) -> None:
        self.capacity, self.unit, self.free = capacity, unit, [(0, capacity)]

    def _held(self, off: int, size: int) -> int:
        return min(_round_up(off + size, self.unit), self.capacity) - off

    def alloc(self, size: int) -> int:
        for i, (s, n) in enumerate(self.free):
            h = self._held(s, size)
            if n >= max(size, h):
                self.free[i:i + 1] = [(s + h, n - h)] if n > h else []
                return s
        return -1

    def release(self, off: int, size: int) -> None:
        merged: list[tuple[int, int]] = []
        for s, n in sorted(self.free + [(off, self._held(off, size))]):
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((s, n))
        self.free = merged


# ---- placement --------------------------------------------------------------------------------------
def test_odd_sized_puts_take_whole_units_on_a_big_segment_and_bytes_on_a_small_one() -> None:
    big, small = _master(BIG), _master(SMALL)
    assert [_put(big, f"k{i}", z) for i, z in enumerate(ODD)] == [0, 1008, 1016, 1032, 1040, 1056, 5152]
    assert [_put(small, f"k{i}", z) for i, z in enumerate(ODD)] == [0, 1001, 1008, 1021, 1029, 1038, 5133]
    assert _free_list(big) == [(5160, BIG - 5160)] and _free_list(small) == [(5134, SMALL - 5134)]
    assert big.segment_usage()[SEG] == (5160, BIG) and small.segment_usage()[SEG] == (sum(ODD), SMALL)
    for m in (big, small):
        _check_allocator(m)
        with pytest.raises(InvalidParams):  # size 0 never reaches the allocator, as before
            m.put_start("zero", 0, client_id=CLIENT)


@pytest.mark.kernels
def test_the_partial_last_unit_is_never_allocated_but_a_restored_tail_extent_frees() -> None:
    """A capacity that is not a whole number of units leaves a tail upstream's allocator cannot
    hold: nothing is placed there; an extent found there (a rebuild) is held up to the end."""
    t = SegmentTable()
    c = t.mount(Segment(SEG, "ep", CLIENT, BASE, BIG + 5))  # 8-byte units, a 5-byte tail
    args = (*t.extents.arrays(), t.unit_bits, t.capacity, c)
    assert ak.alloc_first_fit(*args, BIG) == 0
    assert ak.alloc_first_fit(*args, 6) == -1    # does not fit the 5 bytes left
    assert ak.alloc_first_fit(*args, 3) == -1    # fits, but only in the partial last unit
    assert int(t.extents.count[c]) == 1
    t.rebuild_allocator(c, np.array([0, BIG]), np.array([BIG, 3]))  # e.g. from a snapshot
    assert int(t.extents.count[c]) == 0 and int(t.used[c]) == BIG + 5
    t.free(c, BIG, 3)
    t.free(c, 0, BIG)
    assert int(t.used[c]) == 0 and int(t.extents.count[c]) == 1
    assert [a.tolist() for a in t.extents.of(c)] == [[0], [BIG + 5]]
    with pytest.raises(RuntimeError, match="double free"):
        t.free(c, 8, 1)


_OPS = st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_OPS)
def test_random_puts_and_removes_match_first_fit_in_whole_units(ops: list[tuple[bool, int]]) -> None:
    """Puts (True, size) and removes (False, pick among the live keys) in any order: offsets are
    first fit in whole units on 16 GiB and byte-exact first fit on 1 GiB, and the allocator
    invariants hold after every step."""
    for capacity, unit in ((BIG, 8), (SMALL, 1)):
        m, model, live = _master(capacity), _FirstFit(capacity, unit), {}
        for i, (is_put, value) in enumerate(ops):
            if is_put or not live:
                live[f"k{i}"] = (_put(m, f"k{i}", value), value)
                assert live[f"k{i}"][0] == model.alloc(value)
            else:
                key = sorted(live)[value % len(live)]
                m.remove(key, force=True)
                model.release(*live.pop(key))
            _check_allocator(m)
            assert _free_list(m) == model.free
        m.remove_all(force=True)
        assert _free_list(m) == [(0, capacity)] and m.segment_usage()[SEG] == (0, capacity)


# ---- freeing: eviction, discarded puts, removal --------------------------------------------------------
def test_eviction_discard_and_removal_free_the_held_extents() -> None:
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = _master(BIG, clocks, dataclasses.replace(CFG, client_live_ttl_s=3600))  # the client outlives the wait
    m.put_start("abandoned", 12_345, client_id=CLIENT)  # never completed: discarded, then released
    for i in range(15):
        _put(m, f"big{i}", GIB - 3 - i)
        _put(m, f"odd{i}", 2 * i + 1)
    assert m.segments.used[0] > 0.9 * BIG  # above the high watermark
    clocks.advance(s=CFG.put_start_release_timeout_s + 1)
    report = m.tick()
    assert report is not None and report.evicted_objects > 0
    assert not m.exist_key("abandoned")
    _check_allocator(m)
    m.remove_all(force=True)
    assert m.object_count() == 0
    assert _free_list(m) == [(0, BIG)] and int(m.segments.used[0]) == 0


# ---- rebuilds: remount recovery ----------------------------------------------------------------------
def _live_big_master() -> MasterService:
    """A 16 GiB segment after odd-sized puts and a few removes (holes in the layout)."""
    m = _master(BIG)
    for i, z in enumerate(ODD * 3):
        _put(m, f"k{i}", z + i)
    for i in (1, 4, 5, 11):
        m.remove(f"k{i}", force=True)
    return m


def _reversed_rows(state: SnapshotState) -> SnapshotState:
    """The same state with its objects (one replica each) listed in reverse: offsets descend."""
    order = np.arange(state.objects.num_rows)[::-1].copy()
    reps = state.replicas.take(pa.array(order))
    reps = reps.set_column(reps.schema.get_field_index("object_index"), reps.schema.field("object_index"),
                           pa.array(np.arange(order.size, dtype=np.int64)))
    return dataclasses.replace(state, objects=state.objects.take(pa.array(order)), replicas=reps)


def _promoted(m: MasterService, state: SnapshotState) -> MasterService:
    """A standby promotion: same state, segment unreadable until its client remounts."""
    p = MasterService.from_state(state, config=m.config, clocks=m.clocks, segments_readable=False)
    p.liveness.touch(CLIENT, 2**62)
    return p


def _remount(m: MasterService) -> None:
    m.remount_segments(CLIENT, [dict(name=SEG, endpoint=f"{SEG}:17777", client=CLIENT, base=BASE, size=BIG)])


@pytest.mark.parametrize("in_offset_order", [True, False])
def test_remount_rebuilds_the_live_allocator_of_a_big_segment(in_offset_order: bool) -> None:
    """Streaming rebuild (rows in offset order) and gather + sort rebuild (not) alike."""
    m = _live_big_master()
    state = m.export_state()
    p = _promoted(m, state if in_offset_order else _reversed_rows(state))
    assert _free_list(p) == _free_list(m)  # the load's rebuild (store.arrow_io) agrees too
    p.segments.install_allocator(0, np.zeros(0, np.int64), np.zeros(0, np.int64), 0)  # remount must rebuild
    _remount(p)
    assert _free_list(p) == _free_list(m) and int(p.segments.used[0]) == int(m.segments.used[0])
    _check_allocator(p)
    assert _put(p, "after", 3) == _put(m, "after", 3)


def test_a_memory_replica_offset_column_counts_units_and_every_view_gives_bytes() -> None:
    """The slot column holds offset >> unit_bits (4 bytes a slot); reads and snapshots give bytes."""
    m = _master(BIG)
    assert (_put(m, "a", 1001), _put(m, "b", 1000)) == (0, 1008)
    o = m.objects
    assert o.replica_offset.dtype == np.uint32
    assert sorted(int(v) for v in o.replica_offset[o.live_rows(), 0]) == [0, 1008 >> 3]
    assert sorted(m.export_state().replicas.column("offset").to_pylist()) == [0, 1008]
    addresses = m.batch_get_replica_list(["a", "b"]).replicas.column("address").to_pylist()
    assert addresses == [BASE, BASE + 1008]


@pytest.mark.parametrize("in_offset_order", [True, False])
def test_remount_refuses_an_offset_column_one_unit_into_the_previous_extent(in_offset_order: bool) -> None:
    """A memory replica's offset column counts its segment's units (8 bytes here), so a layout
    sharing a unit cannot be written there; a corrupted value one unit back overlaps the previous
    extent in bytes: the remount fails and changes nothing (no clamping)."""
    m = _master(BIG)
    _put(m, "a", 1001)   # [0, 1001), holds [0, 1008)
    _put(m, "b", 1000)   # [1008, 2008): unit 126
    _put(m, "c", 8)
    state = m.export_state()
    p = _promoted(m, state if in_offset_order else _reversed_rows(state))
    o = p.objects
    row = next(r for r in o.live_rows() if int(o.replica_offset[r, 0]) == 1008 >> 3)
    o.replica_offset[row, 0] = 1000 >> 3  # [1000, 2000): overlaps "a"
    before = _free_list(p), int(p.segments.used[0])
    with pytest.raises(ValueError, match="overlap"):
        _remount(p)
    assert (_free_list(p), int(p.segments.used[0])) == before and not p.segments.readable[0]


# ---- snapshots: v2 round trip, rejected candidates, v1 rollback ----------------------------------------
def _restored(repo: SnapshotRepository, m: MasterService) -> tuple[MasterService, object]:
    clocks = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=m.clocks.system_ns() + NS_PER_S)
    return restore_master(repo, config=CFG, clocks=clocks, snapshot_restore_drop_expired=False)


def _layout(m: MasterService) -> list[tuple[str, int, int]]:
    return sorted((k, d.address, d.size) for k in m.to_arrow().column("key").to_pylist()
                  for d in m.get_replica_list(k))


def test_v2_snapshot_round_trip_restores_the_same_free_extents(tmp_path: Path) -> None:
    m = _live_big_master()
    repo = SnapshotRepository(tmp_path)
    SnapshotManager(m, repo).snapshot_now()
    r, stats = _restored(repo, m)
    assert stats.format_version == "2.0.0" and stats.fallbacks == 0
    assert _free_list(r) == _free_list(m) and int(r.segments.used[0]) == int(m.segments.used[0])
    assert _layout(r) == _layout(m)
    _check_allocator(r)


def _shared_unit_state(second_offset: int) -> SnapshotState:
    """Two hard-pinned objects on one 16 GiB segment: [0, 1001) and [second_offset, +1000)."""
    state = make_state(2, segments=(SEG,), hard=True)
    objs, reps = state.objects, state.replicas
    objs = objs.set_column(objs.schema.get_field_index("size_bytes"), objs.schema.field("size_bytes"),
                           pa.array([1001, 1000], pa.int64()))
    for name, values in (("offset", [0, second_offset]), ("size", [1001, 1000])):
        i = reps.schema.get_field_index(name)
        reps = reps.set_column(i, reps.schema.field(name), pa.array(values, pa.int64()))
    return dataclasses.replace(state, objects=objs, replicas=reps)


S0, C0 = 1_796_000_000 * NS_PER_S, 1_000 * NS_PER_S
# an extent starting inside an 8-byte unit shares it with the one before: the state validation says so
_OFF_UNIT = "replicas.offset row 1: 1001: not a multiple of its segment's allocation unit"


def test_a_v2_candidate_whose_extents_share_a_unit_is_rejected_for_an_older_one(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    good = write_snapshot(repo, _shared_unit_state(1008), S0, C0)
    # the writer refuses that state: published past it, as a forger would
    bad = publish_unvalidated(repo, _shared_unit_state(1001), S0 + NS_PER_S, C0 + NS_PER_S)
    clocks = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=S0 + 2 * NS_PER_S)
    r, stats = restore_master(repo, config=CFG, clocks=clocks)
    assert stats.snapshot_id == good and stats.fallbacks == 1
    assert stats.failures[0][0] == bad and _OFF_UNIT in stats.failures[0][1]
    assert r.object_count() == 2 and _free_list(r) == [(2008, BIG - 2008)]


def test_a_lone_v2_candidate_whose_extents_share_a_unit_leaves_no_usable_snapshot(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    publish_unvalidated(repo, _shared_unit_state(1001), S0, C0)
    with pytest.raises(NoUsableSnapshot) as e:
        restore_master(repo, config=CFG, clocks=ManualClocks(steady_ns=7 * NS_PER_S, system_ns=S0 + NS_PER_S))
    assert _OFF_UNIT in e.value.stats.failures[0][1]


def test_v1_rollback_of_odd_sizes_on_a_big_segment_succeeds_and_restores(tmp_path: Path) -> None:
    """Before allocation units this raised SerializeFail: byte-packed replicas shared 8-byte units."""
    m = _live_big_master()
    repo = SnapshotRepository(tmp_path)
    sid = SnapshotManager(m, repo, write_v1=True).snapshot_now()
    views = v1_allocators(repo.read(sid).payloads)
    assert list(views) == [SEG] and views[SEG].allocator.multiplier_bits == 3
    check_allocator(views[SEG].allocator, views[SEG].handles)
    r, stats = _restored(repo, m)
    assert stats.format_version == "1.0.0"
    assert _layout(r) == _layout(m) and _free_list(r) == _free_list(m)
    _check_allocator(r)
