"""A v2 snapshot written range by range (snapshots/streamed.py): the same tables as a
whole-state write, in more record batches, and what a forked writer publishes above
STREAM_ROWS rows."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.messages import ReplicateConfig
from mooncake_columnar.schema import SoftPinAction
from mooncake_columnar.snapshots import streamed
from mooncake_columnar.snapshots.arrow_codec import OBJECTS_FILE, REPLICAS_FILE, decode_state, encode_state
from mooncake_columnar.snapshots.forked import FORK_AVAILABLE
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.store.arrow_export import freeze, frozen_state
from mooncake_columnar.testing.builders import canonical, make_master, put_objects


def _varied_master():
    """Objects of every shape a range boundary can cut: two tenants, groups, soft and hard pins,
    wide objects (continuation rows), one still in flight, and removed rows (gathered columns)."""
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = make_master(clocks, segments=6, max_replica_num=6)
    put_objects(m, [f"plain{i}" for i in range(40)])
    for i in range(9):
        m.put_start(f"t{i}", 1000, client_id="c0", config=ReplicateConfig(tenant_id="other"))
        m.put_end(f"t{i}", client_id="c0", tenant_id="other")
    put_objects(m, [f"g{i}" for i in range(7)], group_id="grp")
    put_objects(m, [f"soft{i}" for i in range(5)], soft_pin_action=SoftPinAction.ENABLE)
    put_objects(m, [f"hard{i}" for i in range(3)], hard_pin=True)
    put_objects(m, [f"wide{i}" for i in range(4)], replica_num=6)
    m.put_start("inflight", 1000, client_id="c0", config=ReplicateConfig(replica_num=2))
    m.batch_remove([f"plain{i}" for i in range(0, 40, 3)], force=True)
    return m, clocks


@pytest.mark.parametrize("rows", [1, 7, 64, 10_000])
def test_ranges_write_the_tables_of_a_whole_state_write(rows: int) -> None:
    m, _ = _varied_master()
    frozen = freeze(m.store, None)
    whole = decode_state(encode_state(frozen_state(frozen)))
    payloads = {name: p.to_buffer() for name, p in streamed.frozen_payloads(frozen, None, rows).items()}
    parts = decode_state(payloads)
    for name in ("objects", "replicas", "segments", "checksums"):
        assert getattr(parts, name).equals(getattr(whole, name)), name
    assert parts.replica_next_id == whole.replica_next_id
    batches = pa.ipc.open_file(payloads[OBJECTS_FILE]).num_record_batches
    assert (batches > 1) == (rows < frozen.rows)  # one per range holding a live object
    assert pa.ipc.open_file(payloads[REPLICAS_FILE]).num_record_batches == batches


@pytest.mark.parametrize("column, value, field", [("size_bytes", 0, "size_bytes"),  # the objects pass
                                                   ("replica_id", 0, "replica_id"),  # the replicas pass
                                                   ("replica_kind", 99, "kind")])
def test_a_range_that_fails_validation_publishes_nothing(tmp_path: Path, column: str, value: int,
                                                         field: str) -> None:
    m, _ = _varied_master()
    frozen = freeze(m.store, None)
    live = frozen.columns["flags"] != 0
    last = int(live.nonzero()[0][-1])
    frozen.columns[column][last] = value  # a forged value in the last range only
    repo = SnapshotRepository(tmp_path)
    from mooncake_columnar.errors import SnapshotFieldError
    from mooncake_columnar.snapshots.writer import publish_payloads
    with pytest.raises(SnapshotFieldError) as raised:
        publish_payloads(repo, streamed.frozen_payloads(frozen, None, 16), 1, 1)
    assert raised.value.field == field
    assert repo.published() == []


def test_each_ranges_replicas_table_is_built_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The objects pass checks the objects alone; the replicas pass checks each range's replicas
    table, the one it writes, against that range's objects."""
    from mooncake_columnar.store.arrow_export import FrozenRows
    m, _ = _varied_master()
    frozen = freeze(m.store, None)
    built: list[tuple[int, int]] = []
    replicas = FrozenRows.replicas

    def counted(self, needs):
        if self.hi > self.lo:  # (not the empty table that gives the schema)
            built.append((self.lo, self.hi))
        return replicas(self, needs)

    monkeypatch.setattr(FrozenRows, "replicas", counted)
    payloads = streamed.frozen_payloads(frozen, None, 16)
    for name in (OBJECTS_FILE, REPLICAS_FILE):
        payloads[name].to_buffer()
    assert sorted(built) == [(lo, min(lo + 16, frozen.rows)) for lo in range(0, frozen.rows, 16)]


@pytest.mark.skipif(not FORK_AVAILABLE, reason="fork() is POSIX only")
def test_forked_writer_above_stream_rows_publishes_range_by_range(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streamed, "STREAM_ROWS", 16)
    m, clocks = _varied_master()
    at_call = canonical(m)
    repo = SnapshotRepository(tmp_path)
    with SnapshotManager(m, repo, freeze="fork", prefault=False) as manager:
        future = manager.snapshot_now(background=True)
        m.batch_remove(["g2", "wide3"], force=True)  # after the fork: not in the snapshot
        sid = future.result()
    objects = pa.ipc.open_file(pa.memory_map(str(tmp_path / repo.cluster_id / sid / OBJECTS_FILE)))
    assert objects.num_record_batches > 1
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
    restored, _ = restore_master(repo, config=None, clocks=new, snapshot_restore_drop_expired=False, prefault=False)
    assert canonical(restored) == at_call
    restored.verify()


def test_estimated_bytes_count_the_live_keys_not_the_arena_capacity():
    """What a writer warms before writing is about the files' bytes: a periodic snapshot, whose
    recycled files cover its payloads, warms nothing more (the arena's spare capacity is no
    file's bytes)."""
    from mooncake_columnar.snapshots.arrow_codec import DIGEST_FILE
    from mooncake_columnar.tools.synthetic import build_master
    m = build_master(10_000)
    f = freeze(m.store, None)
    assert f.arena.nbytes > 1.5 * f.key_bytes  # spare capacity the estimate must not count
    written = sum(len(p.to_buffer()) for name, p in streamed.frozen_payloads(f, None, rows=4096).items()
                  if name != DIGEST_FILE)
    assert 0.9 * written <= streamed.estimated_bytes(f) <= 1.1 * written
