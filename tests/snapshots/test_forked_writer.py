"""The forked snapshot writer (SnapshotManager freeze="fork"): a child process writes the
snapshot from its copy-on-write image of the master taken under the lock."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.errors import InvalidParams, SnapshotPublishError, SnapshotStorageUnavailable
from mooncake_columnar.snapshots import manager as manager_module
from mooncake_columnar.snapshots.forked import FORK_AVAILABLE, fork_writer
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.builders import canonical, make_master, put_objects

pytestmark = pytest.mark.skipif(not FORK_AVAILABLE, reason="fork() is POSIX only")


def _master(n: int):
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = make_master(clocks, segments=2)
    put_objects(m, [f"k{i}" for i in range(n)])
    return m, clocks


def _restored(repo: SnapshotRepository, clocks: ManualClocks):
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
    return restore_master(repo, config=None, clocks=new, snapshot_restore_drop_expired=False, prefault=False)


def test_forked_snapshot_holds_the_state_at_the_call_not_later_changes(tmp_path: Path) -> None:
    m, clocks = _master(300)
    at_call = canonical(m)
    repo = SnapshotRepository(tmp_path)
    with SnapshotManager(m, repo, freeze="fork", prefault=False) as manager:
        future = manager.snapshot_now(background=True)
        m.batch_remove([f"k{i}" for i in range(0, 300, 2)], force=True)  # after the fork
        put_objects(m, ["later"])
        sid = future.result()
    restored, stats = _restored(repo, clocks)
    assert stats.snapshot_id == sid == repo.latest()
    assert canonical(restored) == at_call


def test_forked_snapshots_publish_in_call_order_each_with_its_own_state(tmp_path: Path) -> None:
    m, clocks = _master(50)
    repo = SnapshotRepository(tmp_path)
    with SnapshotManager(m, repo, freeze="fork", prefault=False, retention=5) as manager:
        first = manager.snapshot_now(background=True)
        put_objects(m, ["second-only"])
        second = manager.snapshot_now(background=True)
        ids = [first.result(), second.result()]
    assert ids[0] < ids[1] and repo.latest() == ids[1]
    restored, _ = _restored(repo, clocks)
    assert restored.exist_key("second-only") and restored.object_count() == 51


def test_forked_snapshot_reports_lock_time_and_the_writers_peak_rss(tmp_path: Path) -> None:
    m, _ = _master(20)
    with SnapshotManager(m, SnapshotRepository(tmp_path), freeze="fork", prefault=False) as manager:
        manager.snapshot_now()
    assert 0 < m.metrics.get("snapshot_lock_held_seconds") < 5
    assert m.metrics.get("snapshot_writer_peak_rss_bytes") > 0 and m.metrics.get("snapshot_writer_private_bytes") > 0
    assert m.metrics.get("snapshot_success") == 1


def test_small_master_in_auto_mode_is_copied_in_process(tmp_path: Path) -> None:
    m, _ = _master(20)
    with SnapshotManager(m, SnapshotRepository(tmp_path), prefault=False) as manager:
        manager.snapshot_now()
    assert m.metrics.get("snapshot_writer_peak_rss_bytes") == 0  # no writer process


def test_forked_writer_failure_is_typed_counted_and_publishes_nothing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _master(20)
    repo = SnapshotRepository(tmp_path)

    def broken(*args, **kwargs):
        raise OSError("disk full")
    monkeypatch.setattr(SnapshotRepository, "publish", broken)  # the child inherits the patch
    with SnapshotManager(m, repo, freeze="fork", prefault=False) as manager:
        with pytest.raises(SnapshotPublishError, match="OSError: disk full"):
            manager.snapshot_now()
    assert m.metrics.get("snapshot_failure") == 1 and m.metrics.get("snapshot_success") == 0
    assert repo.list() == []


def test_forked_writer_publishes_nothing_when_no_id_can_be_allocated(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    m, _ = _master(20)
    repo = SnapshotRepository(tmp_path)
    manager = SnapshotManager(m, repo, freeze="fork", prefault=False)

    def unavailable(system_ns: int) -> str:
        raise SnapshotStorageUnavailable("listing failed")
    monkeypatch.setattr(manager._ids, "next_id", unavailable)
    children = []

    def recorded(body):
        children.append(fork_writer(body))
        return children[-1]
    monkeypatch.setattr(manager_module, "fork_writer", recorded)
    with pytest.raises(SnapshotStorageUnavailable):
        manager.snapshot_now()
    manager.stop()
    assert repo.list() == []
    with pytest.raises(ChildProcessError):  # the child was waited for: no zombie left
        os.waitpid(children[0].pid, os.WNOHANG)


def test_forked_writer_after_parallel_kernels_ran_in_the_master(tmp_path: Path) -> None:
    """Batches large enough for the parallel (OpenMP) kernels ran in the parent; the child
    never enters the OpenMP runtime, which aborts a forked child."""
    m, clocks = _master(6_000)
    m.batch_get_replica_list([f"k{i}" for i in range(6_000)])
    repo = SnapshotRepository(tmp_path)
    with SnapshotManager(m, repo, freeze="fork", prefault=False) as manager:
        manager.snapshot_now()
    restored, _ = _restored(repo, clocks)
    assert restored.object_count() == 6_000


@pytest.mark.parametrize("kwargs", [{"write_v1": True}, {"freeze": "sometimes"}])
def test_fork_freeze_refuses_what_it_cannot_write(tmp_path: Path, kwargs: dict) -> None:
    m, _ = _master(1)
    with pytest.raises(InvalidParams):
        SnapshotManager(m, SnapshotRepository(tmp_path), **{"freeze": "fork", **kwargs})
