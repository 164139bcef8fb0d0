"""StandbyService: follow, fail closed, snapshot + compaction, promotion, killed primary, etcd leg,
and the oplog state machine (standby state == primary state minus deadlines)."""
from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.errors import (
    ErrorCode,
    FencedWrite,
    MooncakeError,
    OpLogChecksumError,
    OpLogCorrupt,
    OpLogGap,
    OpLogStoreUnavailable,
    ReplicaNotReady,
    UnavailableInCurrentStatus,
)
from mooncake_columnar.ha.leader import LeaderElection
from mooncake_columnar.ha.oplog import (
    OpLogBatch,
    OpLogEntry,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    SegmentPayload,
)
from mooncake_columnar.ha.standby import (
    IncompleteOpLogCatchUp,
    OpLogRegression,
    StandbyFailed,
    StandbyService,
)
from mooncake_columnar.ha.stores import EtcdOpLogStore, FileOpLogStore, OpLogStore
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig, SoftPinAction
from mooncake_columnar.schema import (
    NEVER_LEASED,
    NO_DEADLINE,
    PingStatus,
    ReplicaStatus,
)
from mooncake_columnar.snapshots.standby import StandbySnapshotStore
from mooncake_columnar.testing.builders import canonical, drain, primary, put_objects, standby
from mooncake_columnar.testing.etcd_server import EtcdServer

SEG = SegmentPayload("seg0", "10.0.0.1:1", 1 << 24, "c0")


# --- hand-built oplog ---------------------------------------------------------------------------------


def put(seq: int, key: str, offset: int, *, hard: bool = False, soft: bool = False, size: int = 100,
        tenant: str = "default", segment: str = "seg0") -> OpLogEntry:
    rep = ReplicaDescriptor(seq, 0, segment, offset, size, int(ReplicaStatus.COMPLETE))
    return OpLogEntry(seq, OpType.PUT_END, tenant, key, PutEndPayload("c0", size, (rep,), 0, "", hard, soft))


def remove(seq: int, key: str) -> OpLogEntry:
    return OpLogEntry(seq, OpType.REMOVE, "default", key)


def mount(seq: int, seg: SegmentPayload = SEG) -> OpLogEntry:
    return OpLogEntry(seq, OpType.SEGMENT_MOUNT, "default", seg.name, seg)


def write_log(store: OpLogStore, *batches: list[OpLogEntry]) -> None:
    for entries in batches:
        store.append_batch(OpLogBatch(entries[0].sequence_id, tuple(entries)))


def three_batches(store: OpLogStore) -> None:
    write_log(store, [mount(1), put(2, "a", 0), put(3, "b", 100, hard=True)],
              [put(4, "c", 200, soft=True), remove(5, "a")],
              [put(6, "b", 300, hard=True), put(7, "d", 400)])


def keys_of(m: MasterService) -> list[str]:
    return sorted(m.to_arrow().column("key").to_pylist())


# --- following ----------------------------------------------------------------------------------------


def test_follows_hand_built_batches_in_order(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    write_log(store, [mount(1), put(2, "a", 0), put(3, "b", 100, hard=True)])
    sb = standby(FileOpLogStore(tmp_path), clocks)
    assert sb.bootstrap() == 0
    assert sb.poll() == 3 and sb.applied_sequence_id == 3
    assert keys_of(sb.master) == ["a", "b"]
    write_log(store, [put(4, "c", 200, soft=True), remove(5, "a")], [put(6, "b", 300, hard=True), put(7, "d", 400)])
    assert sb.poll(limit=1) == 2 and sb.applied_sequence_id == 5
    assert sb.poll() == 2 and sb.poll() == 0
    assert keys_of(sb.master) == ["b", "c", "d"]
    b = sb.master.object_info("b")
    assert b.hard_pinned and b.replicas[0].address - 1 == 300  # the later PUT_END replaced the descriptor
    assert sb.master.object_info("c").soft_pin_enabled
    assert b.lease_deadline_ns == NEVER_LEASED and b.soft_pin_deadline_ns == NO_DEADLINE
    m = sb.metrics
    assert m.get("standby_applied_entries") == 7 and m.get("standby_applied_batches") == 3
    assert m.get("standby_apply_lag_entries") == 0 and m.get("standby_applied_sequence_id") == 7


def test_same_key_ops_in_one_batch_apply_in_sequence_order(tmp_path: Path) -> None:
    """Within a batch the later op on a (tenant, key) wins, also across a segment op that splits
    the batch into runs, and against objects applied by earlier batches."""
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    seg1 = SegmentPayload("seg1", "10.0.0.2:1", 1 << 24, "c1")
    write_log(store, [mount(1), put(2, "x", 0), put(3, "y", 100)])
    write_log(store, [
        put(4, "a", 200), remove(5, "a"), put(6, "a", 300, hard=True),    # PUT_END, REMOVE, PUT_END: a stays
        put(7, "b", 400), remove(8, "b"),                                 # PUT_END, REMOVE: b goes
        remove(9, "x"), put(10, "x", 500, soft=True),                     # earlier x replaced
        remove(11, "y"),                                                  # earlier y removed
        put(12, "c", 600, tenant="t2"), put(13, "c", 700),                # same key, two tenants: both stay
        mount(14, seg1),                                                  # a segment op splits the runs
        put(15, "a", 0, segment="seg1"), put(16, "d", 800), remove(17, "d"), put(18, "d", 900),
    ])
    sb = standby(FileOpLogStore(tmp_path), clocks)
    assert sb.poll() == 18
    objects = sb.master.to_arrow()
    assert sorted(zip(objects.column("tenant").to_pylist(), objects.column("key").to_pylist())) == [
        ("default", "a"), ("default", "c"), ("default", "d"), ("default", "x"), ("t2", "c")]

    def where(key: str, tenant: str = "default") -> tuple[str, int]:
        r = sb.master.object_info(key, tenant_id=tenant).replicas[0]
        return r.segment, r.address - 1

    assert where("a") == ("seg1", 0) and not sb.master.object_info("a").hard_pinned  # the last PUT_END wins
    assert where("x") == ("seg0", 500) and sb.master.object_info("x").soft_pin_enabled
    assert where("c") == ("seg0", 700) and where("c", "t2") == ("seg0", 600)
    assert where("d") == ("seg0", 900)
    # the reference: the same entries applied one batch (and one poll) each
    single = FileOpLogStore(tmp_path / "single")
    write_log(single, *[[e] for b in store.read_batches(0) for e in b.entries])
    one_by_one = standby(single, clocks, read_limit=1)
    drain(one_by_one)
    assert canonical(one_by_one.master) == canonical(sb.master)


class Fake:
    """Wraps a store: a stale/regressing prefix, a failing Nth read, or extra batches."""

    def __init__(self, inner: OpLogStore) -> None:
        self.inner = inner
        self.prefix_override: int | None = None
        self.fail_reads: set[int] = set()
        self.reads = 0
        self.replace_batches: list[OpLogBatch] | None = None

    def durable_prefix(self) -> int:
        return self.inner.durable_prefix() if self.prefix_override is None else self.prefix_override

    def read_batches(self, after_seq: int, limit: int | None = None) -> list[OpLogBatch]:
        self.reads += 1
        if self.reads in self.fail_reads:
            raise OpLogStoreUnavailable(f"injected failure of read {self.reads}")
        if self.replace_batches is not None:
            return self.replace_batches
        return self.inner.read_batches(after_seq, limit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_never_applies_past_the_durable_prefix_it_read(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    fake = Fake(store)
    fake.prefix_override = 4  # a prefix read that is older than the batches read right after it
    sb = standby(fake, ManualClocks())
    assert sb.poll() == 4 and sb.applied_sequence_id == 4
    assert keys_of(sb.master) == ["a", "b", "c"]
    fake.prefix_override = None
    assert sb.poll() == 3 and keys_of(sb.master) == ["b", "c", "d"]


def test_nth_read_failure_applies_nothing_and_the_next_poll_resumes(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    fake = Fake(store)
    fake.fail_reads = {2}
    sb = standby(fake, ManualClocks(), read_limit=1)
    assert sb.poll() == 3
    with pytest.raises(OpLogStoreUnavailable):
        sb.poll()
    assert sb.applied_sequence_id == 3 and keys_of(sb.master) == ["a", "b"]
    assert sb.metrics.get("standby_poll_errors", kind="OpLogStoreUnavailable") == 1
    assert sb.poll() == 2 and sb.poll() == 2 and sb.applied_sequence_id == 7


def test_gap_fails_closed(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    (tmp_path / "batches" / f"{4:020d}.msgpack").unlink()  # history lost in the middle
    sb = standby(FileOpLogStore(tmp_path), ManualClocks(), read_limit=1)
    assert sb.poll() == 3
    with pytest.raises(OpLogGap):
        sb.poll()
    assert sb.applied_sequence_id == 3 and keys_of(sb.master) == ["a", "b"]


def test_gap_inside_a_read_applies_nothing_of_it(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    fake = Fake(store)
    batches = store.read_batches(0)
    fake.replace_batches = [batches[0], batches[2]]  # 4..5 missing from what the store hands back
    sb = standby(fake, ManualClocks())
    with pytest.raises(OpLogGap):
        sb.poll()
    assert sb.applied_sequence_id == 0 and keys_of(sb.master) == []


def test_regressions_fail_closed(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    fake = Fake(store)
    sb = standby(fake, ManualClocks())
    assert sb.poll() == 7
    fake.prefix_override = 5  # the log moved backwards behind what was applied
    with pytest.raises(OpLogRegression):
        sb.poll()
    write_log(store, [put(8, "e", 500)])
    fake.prefix_override = None
    fake.replace_batches = store.read_batches(0)[:1]  # an old batch where 8.. was expected
    with pytest.raises(OpLogGap):
        sb.poll()
    assert sb.applied_sequence_id == 7 and "e" not in keys_of(sb.master)


def test_torn_batch_file_fails_closed(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    path = tmp_path / "batches" / f"{6:020d}.msgpack"
    path.write_bytes(path.read_bytes()[:-7])
    sb = standby(FileOpLogStore(tmp_path), ManualClocks(), read_limit=1)
    sb.poll()
    sb.poll()
    with pytest.raises(OpLogCorrupt):
        sb.poll()
    assert sb.applied_sequence_id == 5 and keys_of(sb.master) == ["b", "c"]


def test_corrupted_checksum_fails_closed(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    path = tmp_path / "batches" / f"{1:020d}.msgpack"
    data = bytearray(path.read_bytes())
    at = data.index(b"10.0.0.1:1")
    data[at] ^= 0x01  # one flipped bit inside the checksummed entries
    path.write_bytes(bytes(data))
    sb = standby(FileOpLogStore(tmp_path), ManualClocks())
    with pytest.raises(OpLogChecksumError):
        sb.poll()
    assert sb.applied_sequence_id == 0 and keys_of(sb.master) == []


@pytest.mark.parametrize("entries", [
    [put(1, "a", 0)],                          # a replica on a segment never mounted
    [mount(1), put(2, "a", 0, size=2**63)],    # a size the engine's int64 cannot hold
], ids=["unknown-segment", "size-past-int64"])
def test_unappliable_entry_makes_the_standby_terminal(tmp_path: Path, entries: list[OpLogEntry]) -> None:
    store = FileOpLogStore(tmp_path)
    write_log(store, entries)
    sb = standby(store, ManualClocks())
    with pytest.raises(StandbyFailed):
        sb.poll()
    with pytest.raises(StandbyFailed):
        sb.poll()
    with pytest.raises(StandbyFailed):
        sb.promote(1.0)


# --- snapshots and compaction -------------------------------------------------------------------------


def test_snapshot_compaction_and_bootstrap(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "oplog")
    three_batches(store)
    snaps = StandbySnapshotStore.open(str(tmp_path / "snaps"), "c")
    sb = standby(store, clocks, snapshot_repo=snaps)
    sb.poll(limit=2)
    sb.write_snapshot(compact=True)  # covers 1..5: the first two batches go
    assert sorted(p.name for p in (tmp_path / "oplog" / "batches").iterdir()) == [f"{6:020d}.msgpack"]
    assert sb.metrics.get("standby_snapshots_written") == 1 and sb.metrics.get("standby_compacted_batches") == 2
    write_log(store, [put(8, "e", 500)])

    fresh = standby(FileOpLogStore(tmp_path / "oplog"), clocks, snapshot_repo=snaps)
    assert fresh.bootstrap() == 5
    assert keys_of(fresh.master) == ["b", "c"]
    assert fresh.poll() == 3 and keys_of(fresh.master) == ["b", "c", "d", "e"]
    with pytest.raises(UnavailableInCurrentStatus):
        fresh.bootstrap()
    # Without the snapshot the compacted history is a gap, not an empty start.
    with pytest.raises(OpLogGap):
        standby(FileOpLogStore(tmp_path / "oplog"), clocks).poll()


# --- promotion ----------------------------------------------------------------------------------------


def test_phase1_promoted_unremounted_replica_unreadable(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    sb = standby(FileOpLogStore(tmp_path), clocks)
    m = sb.promote(timeout_s=1.0)
    assert sb.producer_view == 1 and store.producer_view() == 1
    assert m.object_count() == 3
    assert all(not readable for _, readable in _segment_readability(m))
    for key in ("b", "c", "d"):
        info = m.object_info(key)
        assert info.lease_deadline_ns == NEVER_LEASED and info.soft_pin_deadline_ns == NO_DEADLINE
        assert not any(r.readable for r in info.replicas)
        with pytest.raises(ReplicaNotReady):
            m.get_replica_list(key)
    assert m.object_info("b").hard_pinned and m.object_info("c").soft_pin_enabled
    clocks.advance(s=3600)  # an expired lease never makes the unremounted replica evictable
    m.evict(target=1.0)
    assert m.object_count() == 3
    # It serves at once: pings (the old client is told to remount), new mounts, puts and gets.
    assert m.ping("c0") == PingStatus.NEED_REMOUNT
    m.mount_segment("seg1", endpoint="10.0.0.2:1", client_id="c1", base=1 << 30, size=1 << 20)
    m.put_start("new", 10, client_id="c1", config=ReplicateConfig(preferred_segments=("seg1",)))
    m.put_end("new", client_id="c1")
    assert len(m.get_replica_list("new")) == 1
    with pytest.raises(UnavailableInCurrentStatus):
        sb.poll()


def _segment_readability(m: MasterService) -> list[tuple[str, bool]]:
    segs = m.export_state().segments
    return list(zip(segs.column("name").to_pylist(), segs.column("readable").to_pylist()))


def test_promote_refuses_when_applied_is_behind_the_durable_prefix(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    fake = Fake(store)
    fake.fail_reads = set(range(2, 10_000))  # the store keeps failing after the first read
    sb = standby(fake, clocks, read_limit=1)
    start = clocks.steady_ns()
    with pytest.raises(IncompleteOpLogCatchUp) as err:
        sb.promote(timeout_s=2.0, poll_interval_s=0.1)
    assert err.value.code == ErrorCode.INCOMPLETE_OPLOG_CATCH_UP
    assert sb.applied_sequence_id == 3 and store.durable_prefix() == 7
    assert clocks.steady_ns() - start >= 2 * NS_PER_S  # it waited for no progress, on the injected clock
    assert store.producer_view() == 0  # nothing was fenced

    # Transient failures within the no-progress window are retried through.
    fake.fail_reads = {fake.reads + 1, fake.reads + 2}
    m = sb.promote(timeout_s=2.0, poll_interval_s=0.1)
    assert keys_of(m) == ["b", "c", "d"]


def test_promote_fails_at_once_on_a_gap(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    (tmp_path / "batches" / f"{4:020d}.msgpack").unlink()
    start = clocks.steady_ns()
    with pytest.raises(IncompleteOpLogCatchUp) as err:
        standby(FileOpLogStore(tmp_path), clocks).promote(timeout_s=30.0)
    assert isinstance(err.value.__cause__, OpLogGap) and clocks.steady_ns() == start


def test_promote_catches_batches_that_raced_in_before_the_fence(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    three_batches(store)
    old_primary = FileOpLogStore(tmp_path)
    sb_store = FileOpLogStore(tmp_path)

    class RaceBeforeFence(Fake):
        def set_producer_view(self, view: int) -> None:
            write_log(old_primary, [put(8, "late", 500)])  # lands between catch-up and fence
            self.inner.set_producer_view(view)

    sb = standby(RaceBeforeFence(sb_store), clocks)
    m = sb.promote(timeout_s=1.0)
    assert "late" in keys_of(m) and sb.applied_sequence_id == 8
    with pytest.raises(FencedWrite):  # and after the fence the old producer cannot append
        write_log(old_primary, [put(9, "zombie", 600)])


# --- a real primary -----------------------------------------------------------------------------------


def test_follows_a_real_primary(tmp_path: Path) -> None:
    clocks = ManualClocks()
    p, w = primary(FileOpLogStore(tmp_path), clocks)
    put_objects(p, [f"k{i}" for i in range(20)])
    put_objects(p, ["hard"], hard_pin=True)
    put_objects(p, ["soft"], soft_pin_action=SoftPinAction.ENABLE)
    p.remove("k0", force=True)
    w.flush()
    sb = standby(FileOpLogStore(tmp_path), clocks)
    sb.poll()
    sb.master.verify()
    assert canonical(sb.master) == canonical(p)
    assert sb.master.object_info("hard").hard_pinned and sb.master.object_info("soft").soft_pin_enabled


def test_killed_primary_no_durable_remove_resurrects_every_durable_put_end_survives(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path)
    p, w = primary(store, clocks)
    put_objects(p, [f"k{i}" for i in range(50)])
    p.batch_remove([f"k{i}" for i in range(10)], force=True)
    w.flush()
    durable_puts = {f"k{i}" for i in range(10, 50)}
    removed_durable = {f"k{i}" for i in range(10)}
    # The un-durable tail: more puts and removes that never reach the store.
    put_objects(p, [f"tail{i}" for i in range(5)])
    p.batch_remove([f"k{i}" for i in range(40, 45)], force=True)
    assert w.outstanding > 0  # entries reserved but never made durable
    del p, w  # killed: the tail is never flushed
    sb = standby(FileOpLogStore(tmp_path), clocks)
    m = sb.promote(timeout_s=1.0)
    m.verify()
    keys = set(keys_of(m))
    assert not keys & removed_durable
    assert durable_puts <= keys
    assert not any(k.startswith("tail") for k in keys)


def test_promotion_fences_the_old_primary_writer(tmp_path: Path) -> None:
    clocks = ManualClocks()
    p, w = primary(FileOpLogStore(tmp_path), clocks)
    put_objects(p, ["a", "b"])
    w.flush()
    standby(FileOpLogStore(tmp_path), clocks).promote(timeout_s=1.0)
    put_objects(p, ["zombie"])
    with pytest.raises(FencedWrite):
        w.flush()


# --- etcd ---------------------------------------------------------------------------------------------

_clusters = itertools.count()


def test_etcd_follow_and_promote_with_leadership(etcd: EtcdServer) -> None:
    cluster = f"sb{os.getpid()}-{next(_clusters)}"
    clocks = ManualClocks()
    old_leader = LeaderElection(etcd.endpoint, cluster, "primary:1", clocks=clocks)
    assert old_leader.campaign()
    primary_store = EtcdOpLogStore(etcd.endpoint, cluster)
    primary_store.set_producer_view(old_leader.view_version)
    p, w = primary(primary_store, clocks, max_batch_entries=8)
    put_objects(p, [f"k{i}" for i in range(30)], hard_pin=True)
    p.batch_remove([f"k{i}" for i in range(5)], force=True)
    w.flush()
    sb = standby(EtcdOpLogStore(etcd.endpoint, cluster), clocks)
    assert sb.poll(limit=2) == 16
    assert sb.poll() > 0 and canonical(sb.master) == canonical(p)

    old_leader.resign()  # in production: its lease expires
    new_leader = LeaderElection(etcd.endpoint, cluster, "standby:1", clocks=clocks)
    assert new_leader.campaign() and not new_leader.ready()
    m = sb.promote(timeout_s=1.0, view=new_leader.view_version)
    clocks.advance(s=3)
    assert new_leader.keepalive()  # renewed during the warmup, as its keepalive thread does
    clocks.advance(s=2)
    assert new_leader.ready()
    assert keys_of(m) == sorted(f"k{i}" for i in range(5, 30))
    assert all(m.object_info(k).lease_deadline_ns == NEVER_LEASED for k in keys_of(m))
    put_objects(p, ["zombie"])
    with pytest.raises(FencedWrite):
        w.flush()


# --- the oplog state machine --------------------------------------------------------------------------


def segments_of(m: MasterService) -> set[tuple]:
    segs = m.export_state().segments.to_pylist()
    return {(s["name"], s["endpoint"], s["client"], s["size"]) for s in segs}


KEYS = [f"k{i}" for i in range(12)]
op = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(1, 4000), st.booleans(),
              st.sampled_from(list(SoftPinAction)), st.sampled_from(["", "g1", "g2"]),
              st.sampled_from(["default", "t2"])),
    st.tuples(st.just("start"), st.sampled_from(KEYS), st.integers(1, 4000)),
    st.tuples(st.just("remove"), st.sampled_from(KEYS), st.booleans()),
    st.tuples(st.just("get"), st.sampled_from(KEYS)),
    st.tuples(st.just("evict"), st.floats(0.05, 1.0)),
    st.tuples(st.just("advance"), st.integers(1, 30_000)),
    st.tuples(st.just("mount"),),
    st.tuples(st.just("unmount"),),
    st.tuples(st.just("flush"),),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, max_size=40))
def test_oplog_state_machine_standby_equals_primary_minus_deadlines(tmp_path_factory: pytest.TempPathFactory,
                                                                    ops: list[tuple]) -> None:
    path = tmp_path_factory.mktemp("sm")
    clocks = ManualClocks()
    p, w = primary(FileOpLogStore(path), clocks, max_batch_entries=4)
    sb = standby(FileOpLogStore(path), clocks, read_limit=3)
    for o in ops:
        try:
            if o[0] == "put":
                _, key, size, hard, soft, group, tenant = o
                cfg = ReplicateConfig(hard_pin=hard, soft_pin_action=soft, group_id=group, tenant_id=tenant)
                p.put_start(key, size, client_id="c0", config=cfg)
                p.put_end(key, client_id="c0", tenant_id=tenant)
            elif o[0] == "start":
                p.put_start(o[1], o[2], client_id="c0", config=ReplicateConfig())
            elif o[0] == "remove":
                p.remove(o[1], force=o[2])
            elif o[0] == "get":
                p.get_replica_list(o[1])
            elif o[0] == "evict":
                p.evict(target=o[1])
            elif o[0] == "advance":
                clocks.advance(ms=o[1])
            elif o[0] == "mount":
                p.mount_segment("seg1", endpoint="10.0.0.2:1", client_id="c1", base=1 << 30, size=1 << 14)
            elif o[0] == "unmount":
                p.unmount_segment("seg1")
            else:
                w.flush()
                sb.poll()
        except MooncakeError:
            pass  # refusals (not found, has lease, no space...) are part of the random walk
    w.flush()
    drain(sb)
    assert sb.applied_sequence_id == w.durable_prefix
    assert canonical(sb.master) == canonical(p)
    assert segments_of(sb.master) == segments_of(p)
    sb.master.verify()
    p.verify()


def test_background_follower_applies_new_batches_until_stopped(tmp_path):
    from mooncake_columnar import ManualClocks, MasterConfig, MasterService
    from mooncake_columnar.ha.writer import OpLogWriter
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "log")
    writer = OpLogWriter(store, window=64, clocks=clocks)
    primary = MasterService(MasterConfig(), clocks=clocks, journal=writer)
    primary.mount_segment("seg0", endpoint="e:1", client_id="c0", base=1 << 32, size=1 << 20)
    standby = StandbyService(store, clocks=clocks)
    standby.start(interval_s=0.001)
    try:
        primary.put_start("k", 64, client_id="c0")
        primary.put_end("k", client_id="c0")
        writer.flush()
        deadline = time.monotonic() + 30  # bounds the wait for real progress (not a TTL)
        while standby.applied_sequence_id < store.durable_prefix():
            assert time.monotonic() < deadline, "the follower thread made no progress"
    finally:
        standby.stop()
    assert standby.master.to_arrow().column("key").to_pylist() == ["k"]
