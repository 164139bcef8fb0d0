"""Periodic complete snapshots of a live MasterService, and restoring a MasterService from them.

Writer (RFC Phase 3 "Snapshot write sequence"): under the master's lock, copy the raw columns
(memcpy into reused, already-faulted buffers, so later mutations cannot leak into the snapshot)
and capture ONE (system, steady) pair; release the lock; build the Arrow tables from the copies,
then stream and publish them (payloads, manifest LAST, then latest.txt) on the caller's thread or
this manager's single writer thread; apply retention.

Restore: :func:`restore_master` runs :func:`restore_latest` (v2 and v1 candidates, newest first,
whole-candidate fallback), then rebuilds the engine with ``MasterService.from_state``. No recovery
TTL is granted: the converted historical deadlines stand. A bad or dangling ``latest.txt`` falls
back to the listed snapshots (``stats.notes`` says why); a storage error raises
:class:`~mooncake_columnar.errors.SnapshotStorageUnavailable` rather than restoring an older
candidate.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Literal, overload

import numpy as np

from ..clock import Clocks
from ..config import MasterConfig
from ..errors import (InvalidParams, NoUsableSnapshot, RollbackRefused, SnapshotPublishError,
                      SnapshotStorageUnavailable)
from ..memory import FreeMemoryWarmer, prefault
from ..warm_up_hook import warm_up
from ..store.arrow_export import FrozenColumns, freeze, frozen_state
from .complete import RestoreStats, max_granted_ttl_ns, restore_latest_with
from .forked import FORK_AVAILABLE, IdFromParent, WriterProcess, fork_writer, private_bytes
from .manifest import SnapshotIdAllocator
from .repository import SnapshotRepository
from ..store.snapshot_state import SnapshotState
from . import streamed
from .writer import Published, publish_payloads, publish_state

if TYPE_CHECKING:
    from ..master import MasterService

log = logging.getLogger(__name__)

_COMPRESSIONS = (None, "zstd", "lz4")
_FREEZES = ("auto", "copy", "fork")
# freeze="auto" forks from this many rows: below, the in-process copy takes milliseconds and its
# buffers are small, and a fork costs a process start.
FORK_FROM_ROWS = 1_000_000


@dataclass
class _FreezeBuffers:
    """Reusable destinations of the frozen column copies. First touches of fresh memory cost
    more than the copy itself (about 2 ms per MB on this VM), so buffers are faulted in before
    the lock is taken and kept for the next snapshot: the lock then covers only the memcpy."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def reserve(self, rows: int, slots: int) -> None:
        """Make every buffer hold ``rows`` rows (with headroom for growth), faulted in."""
        from ..schema import OBJECT_COLUMNS, REPLICA_COLUMNS
        from ..store.arrow_export import FROZEN_OBJECT_COLUMNS, FROZEN_REPLICA_COLUMNS
        cap = rows + rows // 8 + 1024
        fresh = []
        for name in (*FROZEN_OBJECT_COLUMNS, *FROZEN_REPLICA_COLUMNS):
            have = self.arrays.get(name)
            shape = (cap,) if name in FROZEN_OBJECT_COLUMNS else (cap, slots)
            if have is None or have.shape[0] < rows or have.shape[1:] != shape[1:]:
                dtype = OBJECT_COLUMNS.get(name) or REPLICA_COLUMNS[name]
                self.arrays[name] = np.empty(shape, dtype)
                fresh.append(self.arrays[name])
        prefault(fresh)  # fault the pages in now, outside the lock, from several threads

    def alloc(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        have = self.arrays.get(name)
        if have is None or have.shape[0] < shape[0] or have.shape[1:] != shape[1:] or have.dtype != dtype:
            have = self.arrays[name] = np.empty((shape[0] + shape[0] // 8 + 1024, *shape[1:]), dtype)
        return have[:shape[0]]


class SnapshotManager:
    """Complete snapshots of ``master`` into ``repo``.

    ``write_v1=True`` publishes upstream's ``messagepack|1.0.0`` format instead of v2 (rollback to
    a v1-only master); both formats restore here. A v1 snapshot the writer refuses
    (:class:`~mooncake_columnar.errors.RollbackRefused`: segments awaiting their clients'
    remount, or client ids upstream cannot hold) publishes nothing into ``repo``: upstream
    restores only the snapshot latest.txt names and fails outright on one it cannot load, so the
    last good v1 snapshot stays the latest there. The state is still persisted when
    ``v2_fallback_repo`` is given: the snapshot goes there as v2 (what this engine restores;
    ``fallback_snapshot_id`` on the error names it). Either way the refusal is raised from
    :meth:`snapshot_now` (the periodic thread logs it), counted in the ``snapshot_v1_refused``
    metric and kept in :attr:`last_v1_refusal` until a v1 snapshot is published again.
    ``retention`` snapshots are kept (upstream
    ``snapshot_retention_count``, which must be >= 1) counting only published snapshots; an
    unpublished directory (a crashed writer's) is deleted once idle for ``unpublished_grace_s``
    (default: the repository's, 3600 s). ``prefault``: before writing to a local
    repository, fault fresh memory in from several threads (see :mod:`..memory`; a VM that
    hands freed memory back to its host otherwise faults every page cache page one at a time),
    and let retention keep the payload files it deletes for the next snapshot to overwrite in
    place (one more snapshot's worth of disk; :meth:`SnapshotRepository.retain`).
    ``freeze``: how the state is captured under the lock. ``"copy"``: the columns are copied
    into freeze buffers kept between snapshots; ``"fork"``: a forked child process writes the
    snapshot from its copy-on-write image of the master (:mod:`.forked`: the lock covers the fork,
    no buffers; v2 into a local repository on POSIX only); ``"auto"`` (default): fork where that
    applies and the master has at least :data:`FORK_FROM_ROWS` rows, else copy.
    """

    def __init__(self, master: "MasterService", repo: SnapshotRepository, *,
                 interval_s: float = 600, retention: int = 2, compression: str | None = None,
                 write_v1: bool = False, prefault: bool = True,
                 unpublished_grace_s: float | None = None,
                 v2_fallback_repo: SnapshotRepository | None = None, freeze: str = "auto") -> None:
        if freeze not in _FREEZES:
            raise InvalidParams(f"freeze must be one of {_FREEZES}, got {freeze!r}")
        if freeze == "fork" and not (FORK_AVAILABLE and repo.is_local and not write_v1):
            raise InvalidParams("freeze='fork' writes v2 snapshots into a local repository, on a system with fork()")
        self.freeze_mode = freeze
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or interval_s <= 0:
            raise InvalidParams(f"interval_s must be a positive number, got {interval_s!r}")
        if isinstance(retention, bool) or not isinstance(retention, int) or retention < 1:
            raise InvalidParams(f"retention must be an int >= 1, got {retention!r}")
        if compression not in _COMPRESSIONS:
            raise InvalidParams(f"compression must be one of {_COMPRESSIONS}, got {compression!r}")
        if write_v1 and compression is not None:
            raise InvalidParams("compression applies to v2 Arrow payloads only (v1 is always zstd)")
        if unpublished_grace_s is not None and (
                isinstance(unpublished_grace_s, bool) or not isinstance(unpublished_grace_s, (int, float))
                or not 0 <= unpublished_grace_s < float("inf")):
            raise InvalidParams(f"unpublished_grace_s must be a finite number >= 0, got {unpublished_grace_s!r}")
        if v2_fallback_repo is not None and (not write_v1 or not isinstance(v2_fallback_repo, SnapshotRepository)):
            raise InvalidParams("v2_fallback_repo must be a SnapshotRepository, and applies with write_v1 only")
        self.unpublished_grace_s = unpublished_grace_s
        self.v2_fallback_repo = v2_fallback_repo
        self._fallback_ids = SnapshotIdAllocator(v2_fallback_repo.list) if v2_fallback_repo is not None else None
        self.last_v1_refusal: RollbackRefused | None = None
        self.master = master
        self.repo = repo
        self.interval_s = float(interval_s)
        self.retention = retention
        self.compression = compression
        self.write_v1 = bool(write_v1)
        self.prefault = bool(prefault)
        self._ids = SnapshotIdAllocator(self.repo.list)
        # One worker: background snapshots publish in the order they were frozen.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-snapshot")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Freeze buffers not in use by a snapshot (about 70 bytes per object, kept between
        # snapshots: the price of a lock held only for a memcpy).
        self._spare_buffers: _FreezeBuffers | None = None
        self._buffers_lock = threading.Lock()

    # ---- one snapshot ---------------------------------------------------------------------------
    def freeze(self) -> tuple[FrozenColumns, int, int, _FreezeBuffers]:
        """(columns, system_now_ns, steady_now_ns, their buffers) captured together under the
        master's lock, which is held for the column memcpy only."""
        m = self.master
        with self._buffers_lock:
            buffers, self._spare_buffers = self._spare_buffers or _FreezeBuffers(), None
        buffers.reserve(m.objects.high_water, m.objects.slots)  # outside the lock; a no-op when warm
        t0 = time.perf_counter()
        with m.lock:
            frozen = freeze(m.store, buffers.alloc)
            # ONE pair for the whole frozen state (never per object): RFC "Snapshot clock context".
            system_ns, steady_ns = m.clocks.system_ns(), m.clocks.steady_ns()
        m.metrics.set("snapshot_lock_held_seconds", time.perf_counter() - t0)
        return frozen, int(system_ns), int(steady_ns), buffers

    def _release(self, buffers: _FreezeBuffers) -> None:
        with self._buffers_lock:
            if self._spare_buffers is None:
                self._spare_buffers = buffers

    def _encode_and_publish(self, frozen: FrozenColumns, system_ns: int, steady_ns: int,
                            buffers: _FreezeBuffers, t0: float) -> str:
        metrics = self.master.metrics
        try:
            state = frozen_state(frozen, buffers.alloc)
            try:
                published = publish_state(self.repo, state, system_ns, steady_ns, ids=self._ids, v1=self.write_v1,
                                          compression=self.compression, keys_known_unique=True,
                                          prefault=self.prefault)
            except RollbackRefused as refusal:
                self._refused_v1(refusal, state, system_ns, steady_ns)
                raise
            if self.write_v1:
                self.last_v1_refusal = None
        except RollbackRefused:
            metrics.inc("snapshot_failure")
            metrics.inc("snapshot_v1_refused")
            raise
        except Exception:
            metrics.inc("snapshot_failure")
            log.exception("complete snapshot failed")
            raise
        finally:
            # The tables are views of the buffers; nothing reads them once published.
            self._release(buffers)
        return self._published(published, t0)

    # ---- the forked writer (freeze="fork") ------------------------------------------------------
    def _forks(self) -> bool:
        if self.freeze_mode == "auto":
            return (FORK_AVAILABLE and self.repo.is_local and not self.write_v1
                    and self.master.objects.high_water >= FORK_FROM_ROWS)
        return self.freeze_mode == "fork"

    def _fork(self) -> tuple[WriterProcess, int]:
        """Fork the writer under the master's lock, which is held for the fork only; returns it
        and the system time of the snapshot's clock pair."""
        warm_up()  # a no-op once done (MasterService.start does it): else every child loads them
        m = self.master
        t0 = time.perf_counter()
        with m.lock:
            # ONE pair for the whole state, as in freeze()
            system_ns, steady_ns = int(m.clocks.system_ns()), int(m.clocks.steady_ns())
            child = fork_writer(lambda ids: self._write_in_child(system_ns, steady_ns, ids))
        m.metrics.set("snapshot_lock_held_seconds", time.perf_counter() - t0)
        return child, system_ns

    def _write_in_child(self, system_ns: int, steady_ns: int, ids: IdFromParent) -> dict:
        """In the forked child: the master's columns are this process's own, so no copy."""
        frozen = freeze(self.master.store, None)
        if frozen.rows <= streamed.STREAM_ROWS:  # one range: the whole-state write (fewer passes)
            published = publish_state(self.repo, frozen_state(frozen), system_ns, steady_ns, ids=ids,
                                      compression=self.compression, keys_known_unique=True, prefault=self.prefault)
        else:  # range by range: the writer's own memory stays about one range's tables
            published = publish_payloads(self.repo, streamed.frozen_payloads(frozen, self.compression),
                                         system_ns, steady_ns, ids=ids,
                                         warm_bytes=streamed.estimated_bytes(frozen) if self.prefault else 0)
        # the child's own memory with the tables still alive (its RSS also counts shared pages)
        return {"snapshot_id": published.snapshot_id, "stored_bytes": published.stored_bytes,
                "private_bytes": private_bytes()}

    def _finish_forked(self, child: WriterProcess, system_ns: int, t0: float) -> str:
        """Name the child's snapshot (in fork order: this runs on the one writer thread) and wait
        for it to publish."""
        metrics = self.master.metrics
        try:
            try:
                sid = self._ids.next_id(system_ns)
            except BaseException:  # (a storage error listing the ids) the child gives up
                with contextlib.suppress(SnapshotPublishError):
                    child.finish(None)
                raise
            result, peak_rss = child.finish(sid)
        except Exception:
            metrics.inc("snapshot_failure")
            log.exception("complete snapshot failed")
            raise
        metrics.set("snapshot_writer_peak_rss_bytes", float(peak_rss))
        metrics.set("snapshot_writer_private_bytes", float(result["private_bytes"]))
        return self._published(Published(result["snapshot_id"], int(result["stored_bytes"])), t0)

    def _published(self, published: Published, t0: float) -> str:
        metrics = self.master.metrics
        sid = published.snapshot_id
        metrics.set("snapshot_bytes", float(published.stored_bytes))
        try:
            deleted = self.repo.retain(self.retention, unpublished_grace_s=self.unpublished_grace_s,
                                       recycle=self.prefault)
        except Exception:  # the snapshot itself is published and usable: only retention failed
            log.exception("snapshot retention failed after publishing %s", sid)
            metrics.inc("snapshot_retention_failure")
        else:
            if deleted:
                log.info("snapshot retention deleted %s", deleted)
        metrics.inc("snapshot_success")
        metrics.set("snapshot_duration_seconds", time.perf_counter() - t0)
        log.info("snapshot %s persisted to %s (%d bytes, %.2f s)", sid, self.repo.base, published.stored_bytes,
                 time.perf_counter() - t0)
        return sid

    def _refused_v1(self, refusal: RollbackRefused, state: SnapshotState, system_ns: int, steady_ns: int) -> None:
        """A refused v1 snapshot: nothing goes to ``repo`` (its latest stays a v1 upstream can
        load); the state goes to the v2 fallback repository when there is one."""
        log.warning("v1 rollback snapshot not written: %s", refusal)
        self.last_v1_refusal = refusal
        fallback = self.v2_fallback_repo
        if fallback is None:
            return
        fid = publish_state(fallback, state, system_ns, steady_ns, ids=self._fallback_ids,
                            keys_known_unique=True).snapshot_id
        refusal.fallback_snapshot_id = fid
        try:
            fallback.retain(self.retention, unpublished_grace_s=self.unpublished_grace_s)
        except Exception:  # the fallback snapshot itself is published
            log.exception("snapshot retention failed in the v2 fallback repository after %s", fid)
        log.warning("v1 rollback refused: the state was published as v2 snapshot %s in the fallback "
                    "repository", fid)

    @overload
    def snapshot_now(self, *, background: Literal[False] = False) -> str: ...
    @overload
    def snapshot_now(self, *, background: bool) -> str | Future[str]: ...

    def snapshot_now(self, *, background: bool = False) -> str | Future[str]:
        """Freeze now and publish; returns the snapshot id, or its Future when ``background``.

        The freeze always happens on the calling thread, so the snapshot reflects the master at
        the moment of the call even when encoding and upload run later.
        """
        t0 = time.perf_counter()
        if self._forks():
            try:
                child, system_ns = self._fork()
            except Exception:
                self.master.metrics.inc("snapshot_failure")
                raise
            # on the writer thread either way: children publish in the order they were forked
            done = self._executor.submit(self._finish_forked, child, system_ns, t0)
            return done if background else done.result()
        try:
            frozen, system_ns, steady_ns, buffers = self.freeze()
        except Exception:
            self.master.metrics.inc("snapshot_failure")
            raise
        if background:
            return self._executor.submit(self._encode_and_publish, frozen, system_ns, steady_ns, buffers, t0)
        return self._encode_and_publish(frozen, system_ns, steady_ns, buffers, t0)

    # ---- periodic -------------------------------------------------------------------------------
    def start(self) -> None:
        """Snapshot every ``interval_s`` on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            raise InvalidParams("snapshot manager already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mooncake-snapshot-timer",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # Event.wait returns early on stop(): no sleeping thread outlives the manager.
        while not self._stop.wait(self.interval_s):
            try:
                self.snapshot_now()
            except Exception:  # counted in snapshot_now; the next period retries
                log.exception("periodic snapshot failed")

    def stop(self, *, wait: bool = True) -> None:
        """Stop the periodic thread (interrupting its wait) and the writer thread, and free the
        spare freeze buffers."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and wait:
            thread.join()
        self._executor.shutdown(wait=wait)
        with self._buffers_lock:
            self._spare_buffers = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "SnapshotManager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def primary_snapshot_manager(master: "MasterService", repo: SnapshotRepository, *,
                             enable_snapshot: bool, enable_oplog: bool, start: bool = True,
                             **kwargs) -> SnapshotManager | None:
    """Upstream's gate: the primary runs the complete-snapshot writer only when
    ``enable_snapshot and not enable_oplog``; in batch-record oplog mode snapshots are owned by
    the standby, so nothing is created or started and None is returned."""
    if not enable_snapshot:
        return None
    if enable_oplog:
        log.info("Skipping primary snapshot generation: oplog mode, snapshots are owned by standby")
        master.metrics.inc("snapshot_writer_skipped_oplog_mode")
        return None
    manager = SnapshotManager(master, repo, **kwargs)
    if start:
        manager.start()
    return manager


@dataclass
class MasterRestoreStats(RestoreStats):
    """:class:`RestoreStats` of :func:`restore_master`, plus ``notes``: why latest.txt was not
    followed, and each manifest accepted without a checksum (written before manifest checksums)."""

    notes: list[str] = field(default_factory=list)


def _with_notes(stats: RestoreStats, notes: list[str]) -> MasterRestoreStats:
    return MasterRestoreStats(**{f.name: getattr(stats, f.name) for f in fields(RestoreStats)},
                              notes=list(notes))


class _RestoreView:
    """The repository as one restore sees it: the candidate order fixed once (with the reasons
    latest.txt was not followed), manifest warnings collected, and storage errors remembered (the
    candidate loop turns every exception into a fallback)."""

    def __init__(self, repo: SnapshotRepository) -> None:
        self._repo = repo
        plan = repo.candidate_plan()
        self.ids, self.notes = plan.ids, list(plan.notes)
        for note in plan.notes:
            log.warning("restore: %s", note)
        self.storage_errors: list[SnapshotStorageUnavailable] = []

    def candidates(self) -> list[str]:
        return list(self.ids)

    def read_manifest(self, snapshot_id: str) -> bytes:
        try:
            return self._repo.read_manifest(snapshot_id, notes=self.notes)
        except SnapshotStorageUnavailable as e:
            self.storage_errors.append(e)
            raise

    def read_payloads(self, snapshot_id: str, names: tuple[str, ...]):
        try:
            return self._repo.read_payloads(snapshot_id, names)
        except SnapshotStorageUnavailable as e:
            self.storage_errors.append(e)
            raise

    def __getattr__(self, name: str):
        return getattr(self._repo, name)


def restore_master(repo: SnapshotRepository, *, config: MasterConfig | None = None,
                   clocks: Clocks | None = None, snapshot_restore_drop_expired: bool = True,
                   drop_expired: bool | None = None, prefault: bool = True
                   ) -> tuple["MasterService", MasterRestoreStats]:
    """A MasterService rebuilt from the newest usable complete snapshot (v2 or v1).

    ``snapshot_restore_drop_expired`` (alias ``drop_expired``): drop non-hard-pinned objects whose
    lease and soft pin are both expired (RFC default); False keeps them as evictable cache.
    Segments come back mounted and readable; their clients must ping/remount within
    ``client_live_ttl_s``. A candidate whose engine fails the self-check (``MasterService.verify``)
    is rejected like any other (``stats.failures``, typed in ``stats.rejections``), and so is one
    whose lease or soft-pin deadlines run longer than ``config`` (or the default config) grants
    (:func:`~.complete.max_granted_ttl_ns`: a forged clock pair). Raises
    :class:`~mooncake_columnar.errors.NoUsableSnapshot` (with
    ``.stats``) when every candidate fails. The stats are a :class:`MasterRestoreStats`: ``notes``
    records why a bad or dangling latest.txt was passed over (the listed snapshots are then tried
    newest first) and every manifest accepted without a checksum. A storage error (unreachable
    S3, I/O error) raises :class:`~mooncake_columnar.errors.SnapshotStorageUnavailable`, also when
    it hit only a newer candidate: restoring an older one because the storage was flaky would
    silently lose state. ``prefault``: first fault in, from several threads,
    fresh memory for the engine and the decode (:mod:`..memory`), sized from the newest local
    candidate.
    """
    from ..clock import MonotonicClocks
    from ..master import MasterService

    if drop_expired is not None:
        snapshot_restore_drop_expired = drop_expired
    if not isinstance(snapshot_restore_drop_expired, bool):
        raise InvalidParams("snapshot_restore_drop_expired must be a bool")
    clocks = clocks if clocks is not None else MonotonicClocks()
    t0 = time.perf_counter()
    warmer = None
    view = _RestoreView(repo)  # lists the storage: an unreachable one raises here, typed
    if prefault and repo.is_local:
        candidates = view.candidates()
        if candidates:  # the engine holds about the payload's bytes: most of them warmed in the
            # background while the candidate is decoded (mapped files, their pages let go as
            # read: little allocation); all of them at once would be the restore's peak RSS
            warmer = FreeMemoryWarmer(repo.stored_bytes(candidates[0]) * 3 // 4)

    def build(state: SnapshotState) -> "MasterService":
        if warmer is not None:
            warmer.wait()  # before the engine's allocations
        # Inside the candidate's failure scope: an engine-side rejection falls back too, and so
        # does an engine that fails its self-check (EngineInvariantError): a loaded state always
        # passes MasterService.verify() (its key lookups were proven by the index build).
        master = MasterService.from_state(state, config=config, clocks=clocks, segments_readable=True,
                                          validated=True)
        t0 = time.perf_counter()
        master.verify(key_lookups=False)
        verify_seconds.append(time.perf_counter() - t0)
        return master

    verify_seconds: list[float] = []  # each built candidate's self-check
    limit = (config or MasterConfig()).snapshot_max_decompressed_bytes
    try:
        master, manifest, stats = restore_latest_with(view, clocks, build,  # type: ignore[arg-type]
                                                      snapshot_restore_drop_expired,
                                                      build_checks_unique_keys=True,
                                                      max_ttl_ns=max_granted_ttl_ns(config),
                                                      max_decompressed_bytes=limit)
    except NoUsableSnapshot as e:
        e.stats = _with_notes(e.stats, view.notes) if isinstance(e.stats, RestoreStats) else e.stats
        if view.storage_errors:
            raise SnapshotStorageUnavailable(
                f"snapshot storage failed while reading candidates: {view.storage_errors[0]}") from e
        raise
    finally:
        if warmer is not None:
            warmer.wait()
    stats = _with_notes(stats, view.notes)
    stats.phase_seconds["verify"] = verify_seconds[-1]  # part of "build"
    if view.storage_errors:
        raise SnapshotStorageUnavailable(
            f"snapshot storage failed while reading a newer candidate ({view.storage_errors[0]}); "
            f"not restoring the older {stats.snapshot_id}")
    metrics = master.metrics
    metrics.inc("restore_v2_total" if manifest.is_v2 else "restore_v1_total")
    metrics.inc("clock_conversion_failures_total", stats.conversion_failures)
    metrics.inc("snapshot_candidate_fallbacks_total", stats.fallbacks)
    metrics.inc("restore_unchecked_manifest_total", int(manifest.unchecked_clock_pair))
    metrics.set("restore_objects_restored", stats.objects_restored)
    metrics.set("restore_objects_dropped", stats.objects_dropped)
    metrics.set("restore_duration_seconds", time.perf_counter() - t0)
    return master, stats
