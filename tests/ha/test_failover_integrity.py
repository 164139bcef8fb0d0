"""Failover without divergence: what reaches the journal, and what can never wedge it."""
from __future__ import annotations

import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import InvalidParams
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter

BAD = "x\ud800y"  # a lone surrogate: no UTF-8 encoding exists


@pytest.fixture
def journaled(tmp_path):
    clocks = ManualClocks()
    writer = OpLogWriter(FileOpLogStore(tmp_path / "log"), window=8, clocks=clocks)
    m = MasterService(MasterConfig(), clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=1 << 20)
    return m, writer


def test_lone_surrogates_are_invalid_params_at_the_api_and_never_reach_the_journal(journaled):
    m, writer = journaled
    calls = [
        lambda: m.mount_segment(BAD, endpoint="e:1", client_id="c0", base=1 << 40, size=1 << 20),
        lambda: m.mount_segment("s", endpoint=BAD, client_id="c0", base=1 << 40, size=1 << 20),
        lambda: m.mount_segment("s", endpoint="e:1", client_id=BAD, base=1 << 40, size=1 << 20),
        lambda: m.put_start(BAD, 10, client_id="c0"),
        lambda: m.put_start("k", 10, client_id=BAD),
        lambda: m.put_start("k", 10, client_id="c0", config=ReplicateConfig(group_id=BAD)),
        lambda: m.put_start("k", 10, client_id="c0", config=ReplicateConfig(preferred_segments=(BAD,))),
        lambda: m.put_end(BAD, client_id="c0"),
        lambda: m.get_replica_list(BAD),
        lambda: m.exist_key(BAD),
        lambda: m.remove(BAD),
        lambda: m.batch_put_start(["ok", BAD], [1, 1], client_id="c0"),
        lambda: m.batch_get_replica_list([BAD]),
        lambda: m.remove_by_regex(BAD),
        lambda: m.ping(BAD),
        lambda: m.unmount_segment(BAD),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(InvalidParams):
            call()
    writer.flush()
    assert writer.outstanding == 0  # nothing reserved and left unfilled
    for i in range(20):  # more entries than the window: the writer still moves on
        m.put_start(f"k{i}", 10, client_id="c0")
        m.put_end(f"k{i}", client_id="c0")
        m.remove(f"k{i}", force=True)
        writer.flush()
    assert m.object_count() == 0 and m.to_arrow().num_rows == 0


def _primary_and_standby(tmp_path, clocks, **cfg):
    from mooncake_columnar.ha.standby import StandbyService
    store = FileOpLogStore(tmp_path / "ha")
    writer = OpLogWriter(store, window=1024, clocks=clocks)
    config = MasterConfig(**cfg)
    m = MasterService(config, clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=1 << 20)
    for i in range(10):
        m.put_start(f"k{i}", 64, client_id="c0")
        m.put_end(f"k{i}", client_id="c0")
    writer.flush()
    return m, StandbyService(store, config=config, clocks=clocks)


SEG0 = dict(name="seg0", endpoint="10.0.0.1:1", client="c0", base=1 << 32, size=1 << 20)


def test_a_restored_client_slow_to_find_the_new_primary_keeps_its_objects(tmp_path):
    clocks = ManualClocks()
    _, standby = _primary_and_standby(tmp_path, clocks, client_live_ttl_s=10)
    promoted = standby.promote(timeout_s=1.0)
    clocks.advance(s=60)  # far past client_live_ttl_s without a word from c0
    promoted.tick()
    assert promoted.object_count() == 10 and not promoted.exist_key("k0")  # kept, unreadable
    assert int(promoted.ping("c0")) == 1  # first contact: NEED_REMOUNT, liveness starts now
    report = promoted.remount_segments("c0", [SEG0])
    assert report.matched_objects == 10 and promoted.exist_key("k0")
    promoted.verify()


def test_after_first_contact_a_silent_restored_client_is_offboarded_as_upstream(tmp_path):
    clocks = ManualClocks()
    _, standby = _primary_and_standby(tmp_path, clocks, client_live_ttl_s=10)
    promoted = standby.promote(timeout_s=1.0)
    promoted.ping("c0")
    clocks.advance(s=11)
    promoted.tick()
    assert promoted.object_count() == 0


def test_a_remount_under_another_name_with_a_standby_segments_endpoint_is_refused(tmp_path):
    from mooncake_columnar.schema import PingStatus
    clocks = ManualClocks()
    _, standby = _primary_and_standby(tmp_path, clocks)
    promoted = standby.promote(timeout_s=1.0)
    renamed = dict(SEG0, name="seg0-renamed")
    with pytest.raises(InvalidParams, match="endpoint of standby segment 'seg0'"):
        promoted.remount_segments("c0", [renamed])
    assert promoted.ping("c0") == PingStatus.NEED_REMOUNT  # nothing published
    assert "seg0-renamed" not in promoted.segment_usage() and not promoted.exist_key("k0")
    assert promoted.remount_segments("c0", [SEG0]).matched_objects == 10


def test_complete_offload_is_journaled_and_the_disk_replicas_owner_survives_standby_and_snapshot(tmp_path):
    from mooncake_columnar.ha.standby import StandbyService
    from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
    from mooncake_columnar.snapshots.repository import SnapshotRepository
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "ha")
    writer = OpLogWriter(store, window=1024, clocks=clocks)
    config = MasterConfig(default_kv_lease_ttl_ms=100, enable_offload=True, offload_on_evict=True)
    m = MasterService(config, clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="owner", base=1 << 32, size=1 << 20)
    m.mount_segment("seg1", endpoint="10.0.0.2:1", client_id="other", base=1 << 40, size=1 << 20)
    m.put_start("k", 64, client_id="writer", config=ReplicateConfig(preferred_segments=("seg0",)))
    m.put_end("k", client_id="writer")
    clocks.advance(ms=200)
    assert m.evict(target=1.0).offloads_queued == 1
    m.complete_offload("k", client_id="owner")
    m.ping("late-client")  # interned after the owner: the owner must not come back as this one
    writer.flush()

    def disk_owner(master):
        (rep,) = [r for r in master.object_info("k").replicas if r.kind.name == "LOCAL_DISK"]
        return rep.endpoint

    assert disk_owner(m) == "owner"
    standby = StandbyService(store, config=config, clocks=clocks)
    standby.poll()
    assert disk_owner(standby.master) == "owner"
    standby.master.verify()
    repo = SnapshotRepository(tmp_path / "snap")
    SnapshotManager(m, repo, prefault=False).snapshot_now()
    restored, _ = restore_master(repo, config=config, clocks=clocks, drop_expired=False, prefault=False)
    assert disk_owner(restored) == "owner"


def test_an_eviction_cycle_larger_than_the_window_evicts_in_window_sized_chunks(tmp_path):
    clocks = ManualClocks()
    writer = OpLogWriter(FileOpLogStore(tmp_path / "log"), window=10, clocks=clocks)
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=100, oplog_admission_timeout_ms=0),
                      clocks=clocks, journal=writer)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 32, size=1 << 20)
    keys = [f"k{i}" for i in range(100)]
    for i in range(0, 100, 5):  # batches of 5 (within the window), flushed as a client would see
        m.batch_put_start(keys[i:i + 5], [64] * 5, client_id="c0")
        assert (m.batch_put_end(keys[i:i + 5], client_id="c0").codes == 0).all()
        writer.flush()
    clocks.advance(ms=200)
    evicted = 0
    for _ in range(20):  # no flusher thread: each cycle gets one window, the next tick goes on
        report = m.evict(target=1.0)
        evicted += report.evicted_objects
        assert report.evicted_objects <= 10
        writer.flush()
    assert evicted == 100 and m.object_count() == 0
    m.verify()


def test_a_failed_remount_gives_its_oplog_reservation_back(tmp_path):
    from mooncake_columnar.policies.recovery import RecoveryFault
    clocks = ManualClocks()
    _, standby = _primary_and_standby(tmp_path, clocks)
    promoted = standby.promote(timeout_s=1.0, journal_window=4)
    writer = promoted.journal.writer

    def fail(step):
        raise RecoveryFault(step)
    promoted.remount_fault = fail
    with pytest.raises(RecoveryFault):
        promoted.remount_segments("c0", [SEG0])
    assert writer.outstanding == 0  # nothing left reserved and unfilled
    promoted.remount_fault = None
    assert promoted.remount_segments("c0", [SEG0]).matched_objects == 10
    for i in range(6):  # more than the window: the log keeps moving
        promoted.put_start(f"new{i}", 64, client_id="c0")
        promoted.put_end(f"new{i}", client_id="c0")
        writer.flush()
    assert writer.outstanding == 0 and writer.durable_prefix > 0
