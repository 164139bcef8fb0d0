"""Compile every kernel the serving path uses before a master serves.

Numba compiles a kernel at its first call (``cache=True`` keeps the machine code on disk, but a
fresh host, which is exactly where a standby gets promoted, starts with an empty cache). A kernel
compiled inside a remount eats the recovery window; one compiled under the master lock stalls
every client. So ``warm_up_kernels`` runs a miniature of every serving path once per process, on
its own throwaway objects: a journaled primary (single-key and batch calls, large enough to take
the parallel kernels too), eviction and background ticks, a standby that follows, bootstraps from
a standby snapshot and promotes, remounts, a complete snapshot written and restored, and the
self-check. ``MasterService.start()``, ``StandbyService.bootstrap()`` and ``promote()`` call it
(promote before it fences) through warm_up_hook.py, since they sit below this module;
``mooncake-columnar warmup`` does it at image build time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

from . import warm_up_hook

log = logging.getLogger(__name__)

_lock = threading.RLock()
_state = {"done": False, "running": False}
_BIG = 6_000  # above every serial/parallel cut-over of the kernels (e.g. bulk index deletes)


def warm_up_kernels() -> float:
    """Compile (or load from the Numba cache) every serving-path kernel, once per process.
    Returns the seconds it took; 0.0 when already done or running on this thread."""
    with _lock:
        if _state["done"] or _state["running"]:
            return 0.0
        _state["running"] = True
        t0 = time.perf_counter()
        try:
            with tempfile.TemporaryDirectory(prefix="mooncake-warmup-") as tmp, _quiet_package_logs():
                _exercise(Path(tmp))
        finally:
            _state["running"] = False
        _state["done"] = True
        seconds = time.perf_counter() - t0
        log.info("serving-path kernels ready in %.2f s", seconds)
        return seconds


@contextlib.contextmanager
def _quiet_package_logs() -> Iterator[None]:
    """The miniature's own standbys promote and its snapshots restore: their INFO lines would read
    as if the serving master did so; only warnings and errors of the package pass meanwhile."""
    package = logging.getLogger("mooncake_columnar")
    level = package.level
    package.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        package.setLevel(level)


def _exercise(tmp: Path) -> None:
    from .clock import ManualClocks
    from .config import MasterConfig
    from .ha.standby import StandbyService
    from .ha.stores import FileOpLogStore
    from .ha.writer import OpLogWriter
    from .master import MasterService
    from .messages import ReplicateConfig
    from .snapshots.manager import SnapshotManager, restore_master
    from .snapshots.repository import SnapshotRepository
    from .tools.synthetic import fill, mount_segments, synthetic_keys

    clocks = ManualClocks()
    # a long recovery TTL: a compiling (cold-cache) warmup remount is not worth a slow-remount warning
    config = MasterConfig(default_kv_lease_ttl_ms=1_000, recovery_kv_lease_ttl_ms=3_600_000,
                          enable_offload=True, offload_on_evict=True,
                          put_start_discard_timeout_s=1, put_start_release_timeout_s=2)
    store = FileOpLogStore(tmp / "oplog")
    writer = OpLogWriter(store, window=4 * _BIG, max_batch_entries=4096, clocks=clocks)
    m = MasterService(config, clocks=clocks, journal=writer)
    standby = StandbyService(store, config=config, clocks=clocks,
                             snapshot_repo=SnapshotRepository(tmp / "standby"))
    mount_segments(m, 2, 64 << 20)
    for n in (1, 2, _BIG):  # one key, and the serial and the parallel variants of batches
        keys = synthetic_keys(0, n)
        fill(m, n, replica_num=2, group_id="g", hard_pin=False)
        m.batch_get_replica_list(keys)
        m.batch_exist_key(keys)
        m.batch_remove(keys, force=True)
        writer.flush()
    for key in ("one", "two"):
        m.put_start(key, 4096, client_id="client-0", config=ReplicateConfig(replica_num=2))
        m.put_end(key, client_id="client-0")
        m.get_replica_list(key)
        m.exist_key(key)
        m.object_info(key)
    m.remove("two", force=True)
    m.put_start("abandoned", 4096, client_id="client-0")
    m.put_revoke("abandoned", client_id="client-0")
    m.put_start("abandoned", 4096, client_id="client-0")
    fill(m, _BIG, object_bytes=4096)
    clocks.advance(s=3)
    m.evict(target=0.05)  # the census lists the earliest candidates (a small share of the rows)
    m.evict(target=0.5)   # it does not: the first pass takes most of them
    _delete_few_of_many()
    _evict_without_journal(config, clocks)
    m.offload_tasks()
    m.tick()
    m.remove_by_regex("^obj")
    m.verify()
    writer.flush()
    standby.poll()
    standby.write_snapshot()
    SnapshotManager(m, SnapshotRepository(tmp / "snapshots"), prefault=False).snapshot_now()
    restored, _ = restore_master(SnapshotRepository(tmp / "snapshots"), config=config, clocks=clocks,
                                 drop_expired=False, prefault=False)
    restored.verify()

    _promote_and_remount(store, config, clocks, SnapshotRepository(tmp / "standby"))
    # the same on a master whose objects all hold one replica (the engine's one-slot layouts)
    store = FileOpLogStore(tmp / "oplog-1")
    writer = OpLogWriter(store, window=4 * _BIG, max_batch_entries=4096, clocks=clocks)
    m = MasterService(config, clocks=clocks, journal=writer)
    mount_segments(m, 2, 64 << 20)
    fill(m, _BIG)
    writer.flush()
    SnapshotManager(m, SnapshotRepository(tmp / "snapshots-1"), prefault=False).snapshot_now()
    restore_master(SnapshotRepository(tmp / "snapshots-1"), config=config, clocks=clocks, prefault=False)
    _promote_and_remount(store, config, clocks, None)


def _evict_without_journal(config, clocks) -> None:
    """An eviction applied at once (a master without a journal hides nothing first, and one
    without offload drops the replicas)."""
    from .master import MasterService
    from .tools.synthetic import fill, mount_segments

    m = MasterService(dataclasses.replace(config, enable_offload=False), clocks=clocks)
    mount_segments(m, 2, 64 << 20)
    fill(m, 64, object_bytes=4096)
    clocks.advance(s=3)
    m.evict(target=0.5)


def _delete_few_of_many() -> None:
    """The bulk key-index delete of a batch small beside its table, which hashes and probes each
    row (the batches above are large beside their tables: those sweep the table): absent rows
    of a throwaway index, whose table alone is that large."""
    from .store.keys import KeyIndex
    from .store.objects import ObjectTable

    objects = ObjectTable(_BIG)
    KeyIndex(objects, 64 * _BIG).remove(objects.take_rows(_BIG))


def _promote_and_remount(store, config, clocks, standby_snapshots) -> None:
    from .ha.standby import StandbyService
    from .tools.synthetic import segment_request, synthetic_keys
    follower = StandbyService(store, config=config, clocks=clocks, snapshot_repo=standby_snapshots)
    follower.bootstrap()
    follower.poll()
    promoted = follower.promote(timeout_s=1.0, journal_window=1024)
    for i in range(2):
        promoted.ping(f"client-{i}")
        promoted.remount_segments(f"client-{i}", [segment_request(promoted, i)])
    promoted.batch_get_replica_list(synthetic_keys(0, 16))
    promoted.verify()


# the service, standby and snapshot manager run it through the hook: they sit below this module
warm_up_hook.register(warm_up_kernels)
