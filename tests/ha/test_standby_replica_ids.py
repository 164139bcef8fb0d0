"""The standby's replica-id index (ha/replica_ids.py over kernels/id_set.py): the int64 set
against Python's set under churn, the index built at bootstrap, kept exact by apply while the
standby follows a real primary (ids out of order, removes, unmounts), checked by verify(),
refusing a forged id through StandbyService, and dropped at promotion."""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import EngineInvariantError, OpLogInvalidEntry
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogEntry, OpType, PutEndPayload, ReplicaDescriptor
from mooncake_columnar.ha.replica_ids import ReplicaIdIndex, held_ids
from mooncake_columnar.ha.standby import StandbyFailed, StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.kernels import id_set
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig
from mooncake_columnar.schema import ReplicaStatus
from mooncake_columnar.snapshots.standby import StandbySnapshotStore
from mooncake_columnar.testing.builders import standby


# ---- the kernels -------------------------------------------------------------------------------------

@pytest.mark.kernels
@pytest.mark.parametrize("seed", range(4))
def test_id_set_matches_a_python_set_under_add_and_remove_churn(seed: int) -> None:
    """Small value ranges and a small table: long probe runs that wrap around the table end,
    and backward-shift deletes inside them."""
    rng = random.Random(seed)
    table = np.zeros(id_set.capacity_for(48), np.int64)
    want: set[int] = set()
    for _ in range(400):
        values = np.array(rng.sample(range(1, 200), rng.randint(1, 12)), np.int64)
        if rng.random() < 0.5:
            fresh = np.array([v for v in values.tolist() if v not in want][: max(0, 48 - len(want))], np.int64)
            assert id_set.insert(table, fresh) == -1
            want |= set(fresh.tolist())
        else:
            assert id_set.remove(table, values) == len(want & set(values.tolist()))
            want -= set(values.tolist())
        assert sorted(id_set.members(table).tolist()) == sorted(want)
        probe = np.array(rng.sample(range(1, 200), 199), np.int64)  # lookups: the first member found
        first = next((k for k, v in enumerate(probe.tolist()) if v in want), -1)
        assert id_set.first_taken(table, probe, np.zeros(0, np.int64)) == (first, id_set.TAKEN_HELD if want else 0)


@pytest.mark.kernels
def test_id_set_insert_reports_a_value_already_present() -> None:
    table = np.zeros(16, np.int64)
    assert id_set.insert(table, np.array([5, 9], np.int64)) == -1
    assert id_set.insert(table, np.array([7, 9, 11], np.int64)) == 1
    assert sorted(id_set.members(table).tolist()) == [5, 7, 9]


@pytest.mark.kernels
def test_first_taken_judges_members_less_the_freed_and_repeats() -> None:
    table = np.zeros(16, np.int64)
    id_set.insert(table, np.array([3, 4, 5], np.int64))
    empty = np.zeros(0, np.int64)
    assert id_set.first_taken(table, np.array([1, 2, 6], np.int64), empty) == (-1, 0)
    assert id_set.first_taken(table, np.array([1, 4], np.int64), empty) == (1, id_set.TAKEN_HELD)
    assert id_set.first_taken(table, np.array([1, 4], np.int64), np.array([4], np.int64)) == (-1, 0)
    assert id_set.first_taken(table, np.array([4, 1, 4], np.int64), np.array([4], np.int64)) == (2, id_set.TAKEN_TWICE)
    assert id_set.first_taken(table, np.array([7, 7], np.int64), empty) == (1, id_set.TAKEN_TWICE)
    assert sorted(id_set.members(table).tolist()) == [3, 4, 5]  # nothing changed


@pytest.mark.kernels
def test_the_index_grows_and_keeps_its_load_under_three_quarters() -> None:
    index = ReplicaIdIndex()
    for start in range(1, 100_000, 7_000):
        index.replace(np.zeros(0, np.uint64), np.arange(start, start + 7_000, dtype=np.uint64))
        assert 4 * index.count <= 3 * index.table.size
    index.replace(np.arange(1, 50_001, dtype=np.uint64), np.zeros(0, np.uint64))
    assert index.count == 55_000 and sorted(id_set.members(index.table).tolist()) == list(range(50_001, 105_001))
    with pytest.raises(EngineInvariantError) as info:
        index.replace(np.array([3], np.uint64), np.zeros(0, np.uint64))  # not a member: drift
    assert info.value.check == "standby_replica_ids"


# ---- kept exact while following a real primary ------------------------------------------------------

def _primary(store: FileOpLogStore, clocks: ManualClocks) -> tuple[MasterService, OpLogWriter]:
    writer = OpLogWriter(store, window=1 << 20, clocks=clocks)
    m = MasterService(MasterConfig(), clocks=clocks, journal=writer)
    for i in range(2):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.0.{i}:1", client_id=f"c{i}", base=1 << 30, size=1 << 24)
    return m, writer


def _held(m: MasterService) -> list[int]:
    return sorted(held_ids(m.objects).tolist())


def test_the_index_follows_ids_out_of_order_removes_replacements_and_unmounts(tmp_path: Path) -> None:
    """Puts end in another order than they started (ids below the next id are fresh), two
    replicas per object (continuation rows), removes and an unmount free ids: after each poll
    the index equals the ids the standby holds, which equal the primary's."""
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "oplog")
    p, w = _primary(store, clocks)
    sb = standby(FileOpLogStore(tmp_path / "oplog"), clocks)
    two = ReplicateConfig(replica_num=2)
    rng = random.Random(7)
    for step in range(6):
        keys = [f"s{step}k{i}" for i in range(40)]
        p.batch_put_start(keys, [4096] * len(keys), client_id="c0", config=two)
        rng.shuffle(keys)  # PUT_ENDs in another order than the ids were handed out
        p.batch_put_end(keys, client_id="c0")
        p.batch_remove(keys[:10], force=True)
        if step == 3:
            p.unmount_segment("seg1")  # the second replica of every object goes
            p.mount_segment("seg1", endpoint="10.0.0.1:1", client_id="c1", base=1 << 30, size=1 << 24)
        w.flush()
        sb.poll()
        sb.master.verify()  # the index check included
        index = sb.master.standby_replica_ids
        assert sorted(id_set.members(index.table).tolist()) == _held(sb.master) == _held(p)
        assert index.count == len(_held(p))


def test_bootstrap_builds_the_index_and_promotion_drops_it(tmp_path: Path) -> None:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "oplog")
    p, w = _primary(store, clocks)
    keys = [f"k{i}" for i in range(30)]
    p.batch_put_start(keys, [4096] * 30, client_id="c0", config=ReplicateConfig(replica_num=2))
    p.batch_put_end(keys, client_id="c0")
    w.flush()
    snaps = StandbySnapshotStore.open(str(tmp_path / "snaps"), "c")
    first = standby(FileOpLogStore(tmp_path / "oplog"), clocks, snapshot_repo=snaps)
    first.poll()
    first.write_snapshot()
    sb = standby(FileOpLogStore(tmp_path / "oplog"), clocks, snapshot_repo=snaps)
    assert sb.bootstrap() == first.applied_sequence_id
    index = sb.master.standby_replica_ids
    assert index is not None and index.count == 60 == len(_held(p))
    sb.master.verify()
    promoted = sb.promote(timeout_s=1.0)
    assert sb.master.standby_replica_ids is None and promoted.standby_replica_ids is None
    promoted.verify()


def _following_one_object(tmp_path: Path) -> tuple[FileOpLogStore, StandbyService]:
    """(the primary's store, a standby that applied its one object)."""
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "oplog")
    p, w = _primary(store, clocks)
    p.put_start("victim", 4096, client_id="c0")
    p.put_end("victim", client_id="c0")
    w.flush()
    sb = standby(FileOpLogStore(tmp_path / "oplog"), clocks)
    sb.poll()
    return store, sb


def test_standby_service_refuses_a_forged_id_held_by_another_object(tmp_path: Path) -> None:
    """A PUT_END carrying the replica id of an object the standby holds fails the poll closed
    (typed, naming the entry); the container is left as it was and still verifies."""
    store, sb = _following_one_object(tmp_path)
    stolen = int(held_ids(sb.master.objects)[0])
    before = sb.master.to_arrow()
    seq = sb.applied_sequence_id + 1
    rep = ReplicaDescriptor(stolen, 0, "seg0", 1 << 20, 100, int(ReplicaStatus.COMPLETE))
    forged = OpLogEntry(seq, OpType.PUT_END, "default", "thief", PutEndPayload("c0", 100, (rep,), 0, "", False, False))
    store.append_batch(OpLogBatch(seq, (forged,)))
    with pytest.raises(StandbyFailed) as info:
        sb.poll()
    cause = info.value.__cause__
    assert isinstance(cause, OpLogInvalidEntry) and cause.field == "replica_id" and cause.sequence_id == seq
    assert sb.master.to_arrow().equals(before)
    sb.master.verify()


def test_verify_reports_an_index_that_drifted_from_the_columns(tmp_path: Path) -> None:
    _, sb = _following_one_object(tmp_path)
    sb.master.verify()
    sb.master.standby_replica_ids.replace(held_ids(sb.master.objects), np.array([999], np.uint64))
    with pytest.raises(EngineInvariantError) as info:
        sb.master.verify()
    assert info.value.check == "standby_replica_ids" and "999" in str(info.value)
