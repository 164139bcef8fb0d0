"""Journaled removals are freed once durable (ha/journal.py), by the oplog writer's callback. The
callback never waits for the master lock; what it cannot do at once, the next call that may
change the master does first, after finishing any growth in progress (store/growth.py), so the
master never changes under a growth job and no durable removal stays undone."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService
from mooncake_columnar.errors import EngineInvariantError
from mooncake_columnar.batching import grow_ahead
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.locking import MasterLock
from mooncake_columnar.store import growth
from mooncake_columnar.testing.builders import drain
from mooncake_columnar.tools.synthetic import fill, mount_segments, synthetic_keys


def _journaled(tmp_path) -> tuple[MasterService, OpLogWriter, FileOpLogStore]:
    clocks = ManualClocks()
    store = FileOpLogStore(tmp_path / "log")
    writer = OpLogWriter(store, window=1 << 16, clocks=clocks)
    m = MasterService(MasterConfig(), clocks=clocks, journal=writer, initial_capacity=1024)
    mount_segments(m, 2, 1 << 30)
    fill(m, 3000, object_bytes=4096)
    writer.flush()
    return m, writer, store


def _keys(m: MasterService) -> list[str]:
    return sorted(m.to_arrow().column("key").to_pylist())


def _standby_keys(store: FileOpLogStore, m: MasterService) -> list[str]:
    sb = StandbyService(store, clocks=m.clocks, config=m.config)
    sb.bootstrap()
    drain(sb)
    sb.master.verify()
    return sorted(sb.master.to_arrow().column("key").to_pylist())


def _flush_from_writer_thread(writer: OpLogWriter) -> None:
    t = threading.Thread(target=writer.flush, name="oplog-writer")
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()


@pytest.mark.parametrize("job", ["ColumnGrowth", "TableRehash", "ArenaGrowth", "SideTableGrowth"])
def test_a_removal_made_durable_in_the_middle_of_a_growth_job_waits_for_it(tmp_path, monkeypatch, job) -> None:
    m, writer, store = _journaled(tmp_path)
    removed = synthetic_keys(0, 500).to_pylist()
    m.batch_remove(removed, force=True)  # hidden; freed once its entries are durable
    staged: list[growth.StagedGrowth] = []
    step, yield_turn = growth.StagedGrowth.step, MasterLock.yield_turn

    def small_step(self: growth.StagedGrowth, budget_s: float = growth.STEP_S) -> bool:
        self.units_per_step = 1024
        staged[:] = [self]
        return step(self, budget_s)

    def yield_after_a_flush(self: MasterLock, *, reading: bool = False) -> None:
        current = staged[0].job if staged else None  # between two steps, the lock free
        if type(current).__name__ == job and (current.phase_starts or (0,))[-1] < staged[0].done_units \
                and not flushed:
            flushed.append(True)  # the job has copied part of what the removal changes
            _flush_from_writer_thread(writer)
        yield_turn(self, reading=reading)

    flushed: list[bool] = []
    monkeypatch.setattr(growth.StagedGrowth, "step", small_step)
    monkeypatch.setattr(MasterLock, "yield_turn", yield_after_a_flush)
    grow_ahead(m, 40_000, 400_000)
    assert flushed and m.lock.settle is None
    m.verify()
    keys = _keys(m)
    assert not set(removed) & set(keys) and len(keys) == 2500
    assert not any(m.exist_key(k) for k in removed)
    assert keys == _standby_keys(store, m)
    fresh = synthetic_keys(10_000, 20_000)
    assert (m.batch_put_start(fresh, np.full(20_000, 4096), client_id="client-0").codes == 0).all()
    m.verify()


def test_a_removal_made_durable_while_the_lock_is_busy_is_done_by_the_next_call(tmp_path) -> None:
    m, writer, store = _journaled(tmp_path)
    removed = synthetic_keys(0, 500).to_pylist()
    m.batch_remove(removed, force=True)
    with m.lock:  # another call holds the lock when the entries become durable
        _flush_from_writer_thread(writer)
    # no background round and no put follow: the next call to look at the state finds it freed
    keys = _keys(m)
    assert not set(removed) & set(keys) and len(keys) == 2500
    assert keys == _standby_keys(store, m)
    m.verify()


def test_a_durable_removal_that_fails_to_free_makes_the_master_unhealthy(tmp_path, monkeypatch) -> None:
    m, writer, _ = _journaled(tmp_path)
    m.batch_remove(synthetic_keys(0, 10).to_pylist(), force=True)

    def broken(rows: np.ndarray, ids: np.ndarray) -> np.ndarray:
        raise EngineInvariantError("free_list", "test: the free list refuses the extents")

    monkeypatch.setattr(m.store, "finalize_removed", broken)
    _flush_from_writer_thread(writer)  # the writer logs the callback's failure and goes on
    assert writer.callback_errors == 1
    h = m.health()
    assert not h.healthy and "free_list" in h.removal_error
