"""Hot standby: bootstrap from a standby snapshot, follow the oplog strictly in order, promote.

The standby's state lives in a container :class:`MasterService` that never serves (objects hold
NEVER_LEASED / NO_DEADLINE, segments are unreadable); :mod:`ha.apply` mutates it. Checks that
upstream's reader makes (``upstream-ha.md`` 1.7-1.8), all before anything of a poll is applied,
so a refused poll applies nothing:

* the durable prefix never moves backwards (regression: fatal);
* the batches chain contiguously from ``applied + 1`` (gap: fatal; the store also raises on
  compacted or lost history, and ``decode_batch`` on checksum or format errors);
* nothing past the durable prefix read at the start of the poll is applied.

An error while *applying* (e.g. a replica on a segment never mounted) leaves the container
partially updated, so the service turns terminal (:class:`StandbyFailed`) and must be rebuilt.

Promotion improves on upstream HEAD (``upstream-ha.md`` 3.2 gaps): catch up with a no-progress
timeout, fence the old producer by claiming a newer producer view, catch up once more (batches
that raced in before the fence), require applied == durable prefix, then build a serving master
whose memory segments are all unreadable and whose leases are all NEVER_LEASED (RFC Phase 1).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from ..clock import NS_PER_S, Clocks
from ..config import MasterConfig
from ..errors import (
    IncompleteOpLogCatchUp,
    MooncakeError,
    NoUsableStandbySnapshot,
    OpLogError,
    OpLogGap,
    OpLogRegression,
    OpLogStoreUnavailable,
    SnapshotError,
    SnapshotIntegrityError,
    StandbyFailed,
    StandbySnapshotError,
    StandbySnapshotUnreplayable,
    UnavailableInCurrentStatus,
)
from ..master import MasterService
from ..metrics import Metrics
from ..schema import (
    NEVER_LEASED,
    NO_DEADLINE,
    OBJECTS_ARROW_SCHEMA,
    REPLICAS_ARROW_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
)
from ..snapshots.repository import SnapshotRepository
from ..snapshots.standby import (
    STANDBY_OBJECTS_SCHEMA,
    STANDBY_SEGMENTS_SCHEMA,
    StandbySnapshot,
    StandbySnapshotStore,
)
from ..store.replica_ids import ReplicaIdIndex
from ..store.snapshot_state import SnapshotState, with_usage
from ..warm_up_hook import warm_up
from .apply import STANDBY_SEGMENT_BASE, apply_batch
from .oplog import OpLogBatch
from .writer import OpLogWriter
from .stores import OpLogStore

log = logging.getLogger(__name__)


# --- standby snapshot <-> engine state -------------------------------------------------------------


def standby_snapshot_of(m: MasterService, last_sequence_id: int) -> StandbySnapshot:
    """The standby-wire view of a container master: deadline columns are dropped here."""
    state = m.export_state()
    o, s = state.objects, state.segments
    objects = pa.table({
        "tenant": o.column("tenant"), "key": o.column("key"), "client": o.column("client"),
        "size": o.column("size_bytes"), "data_type": o.column("data_type"), "group": o.column("group"),
        "hard_pinned": o.column("hard_pinned"), "soft_pin_enabled": o.column("soft_pin_enabled"),
        "put_start_time_ms": o.column("put_start_time_ms"),
    }, schema=STANDBY_OBJECTS_SCHEMA)
    replicas = state.replicas.drop_columns(["readable"])
    segments = pa.table({"name": s.column("name"), "endpoint": s.column("endpoint"),
                         "client": s.column("client"), "capacity": s.column("size"),
                         "segment_id": s.column("segment_id"), "host_id": s.column("host_id")},
                        schema=STANDBY_SEGMENTS_SCHEMA)
    return StandbySnapshot(objects, replicas, segments, last_sequence_id)


def state_of_standby(snap: StandbySnapshot) -> SnapshotState:
    """An engine state from a standby snapshot: every lease NEVER_LEASED, no soft-pin interval,
    nothing in flight, every segment unreadable (RFC Phase 1: no deadline is reconstructed)."""
    n, o = snap.objects.num_rows, snap.objects
    object_index = snap.replicas.column("object_index").to_numpy()
    objects = pa.table({
        "tenant": o.column("tenant"), "key": o.column("key"), "client": o.column("client"),
        "size_bytes": o.column("size"), "data_type": o.column("data_type"), "group": o.column("group"),
        "hard_pinned": o.column("hard_pinned"), "soft_pin_enabled": o.column("soft_pin_enabled"),
        "lease_deadline_ns": np.full(n, NEVER_LEASED, np.int64),
        "soft_pin_deadline_ns": np.full(n, NO_DEADLINE, np.int64),
        "put_start_time_ms": o.column("put_start_time_ms"),
        "processing": np.zeros(n, np.bool_),
        "replica_count": np.bincount(object_index, minlength=n).astype(np.int32),
    }, schema=OBJECTS_ARROW_SCHEMA)
    replicas = snap.replicas.append_column(REPLICAS_ARROW_SCHEMA.field("readable"),
                                           pa.array(np.zeros(snap.replicas.num_rows, np.bool_)))
    k = snap.segments.num_rows
    segments = pa.table({
        "name": snap.segments.column("name"), "endpoint": snap.segments.column("endpoint"),
        "client": snap.segments.column("client"),
        "base": pa.array(np.full(k, STANDBY_SEGMENT_BASE, np.uint64)),
        "size": snap.segments.column("capacity"), "used": np.zeros(k, np.int64),
        "readable": np.zeros(k, np.bool_), "segment_id": snap.segments.column("segment_id"),
        "host_id": snap.segments.column("host_id"),
    }, schema=SEGMENTS_ARROW_SCHEMA)
    ids = snap.replicas.column("replica_id").to_numpy()
    next_id = int(ids.max()) + 1 if ids.size else 1
    return with_usage(SnapshotState(objects, replicas, segments, next_id))


def master_of_standby(snap: StandbySnapshot, *, config: MasterConfig | None = None,
                      clocks: Clocks) -> MasterService:
    """A fresh container master holding a decoded standby snapshot: its engine state passes
    SnapshotState.validate (extent overlaps included), the key index and the engine self-check
    (``MasterService.verify``); any failure raises a typed error and leaves no engine behind.
    The container gets its replica-id index (store/replica_ids.py), which oplog apply keeps."""
    state = state_of_standby(snap).validate(check_unique_keys=False, check_overlaps=True)
    try:
        master = MasterService.from_state(state, config=config, clocks=clocks, segments_readable=False,
                                          validated=True)  # the key index load checks key uniqueness
    except (ValueError, OverflowError) as exc:  # e.g. the allocator rebuild refusing extents that
        if isinstance(exc, MooncakeError):      # share an allocation unit: validation let them through
            raise
        raise SnapshotIntegrityError(f"replicas/segments: the engine refused the state: {exc}") from exc
    # replica ids unique among held replicas: the index build below cannot fail (the key lookups:
    # the bulk index build of from_state proved them)
    master.verify(key_lookups=False)
    master.standby_replica_ids = ReplicaIdIndex.of_master(master)
    return master


def promoted_master(container: MasterService, *, config: MasterConfig | None = None,
                    clocks: Clocks) -> MasterService:
    """The serving master a promotion builds from ``container``'s state (RFC Phase 1): every
    lease NEVER_LEASED, no soft-pin interval, nothing in flight, every memory segment unreadable
    until its client remounts (no deadline is carried over). Any master whose puts all ended
    serves as ``container`` (benches promote one they filled directly)."""
    state = state_of_standby(standby_snapshot_of(container, 0))
    return MasterService.from_state(state, config=config, clocks=clocks, segments_readable=False)


# --- the service ------------------------------------------------------------------------------------


class StandbyService:
    """Follows one OpLogStore; see the module docstring for the checks and the promotion order.

    ``sleep`` is called between catch-up retries during promotion (tests pass one that advances
    their ManualClocks); ``read_limit`` bounds the batches read per poll.
    """

    def __init__(self, store: OpLogStore, *, config: MasterConfig | None = None, clocks: Clocks,
                 snapshot_repo: StandbySnapshotStore | SnapshotRepository | None = None,
                 metrics: Metrics | None = None, read_limit: int = 1024,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.config = config if config is not None else MasterConfig()
        self.clocks = clocks
        if isinstance(snapshot_repo, SnapshotRepository):
            snapshot_repo = StandbySnapshotStore(snapshot_repo)
        self.snapshots = snapshot_repo
        self.metrics = metrics if metrics is not None else Metrics()
        self.read_limit = read_limit
        self._sleep = sleep
        self._lock = threading.Lock()
        self._master = MasterService(self.config, clocks=clocks)
        self._master.standby_replica_ids = ReplicaIdIndex()
        self.applied_sequence_id = 0
        self._observed_prefix = 0
        self._failed: BaseException | None = None
        self._promoted = False
        self.producer_view = 0  # the view claimed at promotion
        self.bootstrap_notes: list[str] = []  # why bootstrap passed over each standby snapshot
        self._follower: threading.Thread | None = None
        self._stop_following = threading.Event()

    @property
    def master(self) -> MasterService:
        """The container holding the followed state (inspection only; it never serves)."""
        return self._master

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise StandbyFailed(f"an earlier apply failed ({self._failed}); rebuild the standby")
        if self._promoted:
            raise UnavailableInCurrentStatus("this standby was promoted")

    # ---- bootstrap ---------------------------------------------------------------------------------
    def bootstrap(self) -> int:
        """Load the newest usable standby snapshot (if any); returns the sequence id it covers.

        A snapshot is rejected, and the next older one tried, when it does not decode, when the
        engine built from it fails a check or its self-check, or when the oplog no longer holds
        the entries right after it; ``bootstrap_notes`` says why each was passed over. Each is
        built into a fresh engine, so nothing of a rejected one stays. With none usable the
        standby follows the oplog alone if it still reaches sequence id 1, else
        NoUsableStandbySnapshot names what was tried. No snapshot at all: the oplog alone.
        Compiles the serving-path kernels first, so the promoted master never compiles."""
        warm_up()
        with self._lock:
            self._check_usable()
            if self.applied_sequence_id or self._master.object_count():
                raise UnavailableInCurrentStatus("bootstrap runs before the first poll")
            notes: list[str] = []
            self.bootstrap_notes = notes
            if self.snapshots is None:
                return 0
            try:
                found = self.snapshots.load_latest_with(self._accept_snapshot, notes)
            except NoUsableStandbySnapshot as exc:
                gap = self._oplog_gap_after(0)
                if gap is not None:
                    raise NoUsableStandbySnapshot(f"{exc}; the oplog alone cannot replace them: {gap}",
                                                  notes) from exc
                notes.append("no standby snapshot is usable: following the oplog from sequence id 1")
                log.warning("standby bootstrap: %s", notes[-1])
                return 0
            if found is None:
                return 0
            sid, (master, snap) = found
            self._master = master
            self.applied_sequence_id = self._observed_prefix = snap.last_sequence_id
            self.metrics.set("standby_applied_sequence_id", snap.last_sequence_id)
            log.info("standby bootstrapped from snapshot %s at sequence %d (%d objects)",
                     sid, snap.last_sequence_id, snap.objects.num_rows)
            return snap.last_sequence_id

    def _oplog_gap_after(self, sequence_id: int) -> OpLogGap | None:
        """Why the oplog cannot be followed from ``sequence_id`` (its next entries compacted or
        lost, or the log ends before it), or None. Other store errors propagate: they say
        nothing about the snapshot."""
        try:
            self.store.read_batches(sequence_id, 1)
        except OpLogGap as gap:
            return gap
        return None

    def _accept_snapshot(self, sid: str, snap: StandbySnapshot) -> tuple[MasterService, StandbySnapshot]:
        """A fresh engine from one decoded candidate, or a StandbySnapshotError rejecting it."""
        gap = self._oplog_gap_after(snap.last_sequence_id)
        if gap is not None:
            raise StandbySnapshotUnreplayable(
                f"the oplog cannot be followed from its sequence id {snap.last_sequence_id}: {gap}")
        try:
            return master_of_standby(snap, config=self.config, clocks=self.clocks), snap
        except SnapshotError:
            raise
        except Exception as exc:  # a failed self-check, or any other: the whole candidate fails
            raise StandbySnapshotError(
                f"the engine built from it is unusable: {type(exc).__name__}: {exc}") from exc

    # ---- following ---------------------------------------------------------------------------------
    def poll(self, limit: int | None = None) -> int:
        """Apply the durable entries after ``applied_sequence_id`` (at most ``limit`` batches).

        Returns how many entries were applied. Store errors propagate with nothing applied;
        OpLogStoreUnavailable is retryable, OpLogGap / OpLogCorrupt / OpLogRegression are not.
        """
        with self._lock:
            self._check_usable()
            try:
                return self._poll_locked(limit or self.read_limit)
            except OpLogError as exc:
                self.metrics.inc("standby_poll_errors", kind=type(exc).__name__)
                raise

    def _poll_locked(self, limit: int) -> int:
        applied = self.applied_sequence_id
        prefix = self.store.durable_prefix()
        if prefix < self._observed_prefix:
            raise OpLogRegression(f"durable prefix {prefix} is behind the {self._observed_prefix} already seen")
        self._observed_prefix = prefix
        self.metrics.set("standby_apply_lag_entries", prefix - applied)
        if prefix == applied:
            return 0
        batches = self.store.read_batches(applied, limit)
        if not batches:
            raise OpLogGap(f"durable prefix is {prefix} but no batch holds sequence id {applied + 1}")
        slices: list[OpLogBatch] = []  # the unapplied part of each batch, all checked before any is applied
        expected = applied + 1
        for b in batches:
            if b.first_sequence_id > expected:
                raise OpLogGap(f"batch starts at {b.first_sequence_id}, expected sequence id {expected}")
            if b.last_sequence_id < expected:  # upstream: older entries skipped, then nothing holds expected
                raise OpLogGap(f"batch {b.first_sequence_id}..{b.last_sequence_id} was read where sequence "
                               f"id {expected} was expected (history missing)")
            last = min(b.last_sequence_id, prefix)  # never past the prefix read above
            whole = b.first_sequence_id == expected and b.last_sequence_id == last
            slices.append(b if whole else OpLogBatch(expected, b.columns.slice(
                expected - b.first_sequence_id, last - b.first_sequence_id + 1)))
            expected = last + 1
            if last == prefix:
                break
        t0 = time.perf_counter()
        try:
            for part in slices:  # in order; a batch's columns stay cache-sized through the apply
                apply_batch(self._master, part)
        except Exception as exc:
            self._failed = exc
            self.metrics.inc("standby_apply_failures")
            raise StandbyFailed(f"applying sequence ids {applied + 1}..{expected - 1}: {exc}") from exc
        self.applied_sequence_id = expected - 1
        count = self.applied_sequence_id - applied
        m = self.metrics
        m.inc("standby_applied_entries", count)
        m.inc("standby_applied_batches", len(slices))
        m.inc("standby_apply_seconds", time.perf_counter() - t0)
        m.set("standby_applied_sequence_id", self.applied_sequence_id)
        m.set("standby_apply_lag_entries", prefix - self.applied_sequence_id)
        return count

    # ---- standby snapshots ---------------------------------------------------------------------------
    def write_snapshot(self, *, compact: bool = False) -> str:
        """Publish a standby snapshot of the applied state; returns its id.

        ``compact``: afterwards delete the oplog batches it covers, but only once the published
        snapshot has been read back and decoded (the batches are the only other copy).
        """
        if self.snapshots is None:
            raise UnavailableInCurrentStatus("no standby snapshot repository configured")
        with self._lock:  # a consistent cut: no poll applies while the state is exported
            self._check_usable()
            snap = standby_snapshot_of(self._master, self.applied_sequence_id)
        sid = self.snapshots.publish(snap, self.clocks)
        self.metrics.inc("standby_snapshots_written")
        if compact and snap.last_sequence_id:
            self.snapshots.load(sid)
            removed = self.store.compact_through(snap.last_sequence_id)
            self.metrics.inc("standby_compacted_batches", removed)
        return sid

    def start(self, interval_s: float = 0.05) -> None:
        """Follow the log on a background thread: poll() every ``interval_s`` until stop().
        A retryable store error is retried on the next round; any other error stops following
        (the standby is then failed closed, as poll() leaves it)."""
        if self._follower is not None:
            return
        self._stop_following.clear()

        def follow() -> None:
            while not self._stop_following.wait(interval_s):
                try:
                    self.poll()
                except OpLogStoreUnavailable:
                    continue
                except Exception:
                    log.exception("standby stopped following the oplog")
                    return

        self._follower = threading.Thread(target=follow, name="mooncake-standby-follow", daemon=True)
        self._follower.start()

    def stop(self) -> None:
        if self._follower is None:
            return
        self._stop_following.set()
        self._follower.join()
        self._follower = None

    # ---- promotion -----------------------------------------------------------------------------------
    def _catch_up(self, clocks: Clocks, timeout_ns: int, poll_interval_s: float) -> None:
        """Poll until caught up with the prefix; IncompleteOpLogCatchUp after ``timeout_ns``
        without progress, or at once on a non-retryable error."""
        last_progress = clocks.steady_ns()
        while True:
            try:
                if self.poll() == 0:
                    return  # poll() returns 0 without error only when applied == the prefix it read
                last_progress = clocks.steady_ns()
                continue
            except OpLogStoreUnavailable as exc:
                problem: BaseException = exc
            except OpLogError as exc:
                raise IncompleteOpLogCatchUp(f"final catch-up failed at {self.applied_sequence_id}: {exc}") from exc
            if clocks.steady_ns() - last_progress >= timeout_ns:
                raise IncompleteOpLogCatchUp(
                    f"no progress for {timeout_ns / NS_PER_S:g} s at sequence {self.applied_sequence_id} "
                    f"(durable prefix {self._observed_prefix}): {problem}") from problem
            self._sleep(poll_interval_s)

    def promote(self, timeout_s: float, clocks: Clocks | None = None, *, view: int | None = None,
                poll_interval_s: float = 0.05, journal_window: int | None = None) -> MasterService:
        """Final catch-up, fence the old producer, verify, and return the new serving master.

        ``view``: the producer view to claim (the etcd leader's view_version); default: one
        above the store's current view. The claim is made on ``self.store``, so the new primary's
        OpLogWriter must write through that handle.
        """
        clocks = clocks if clocks is not None else self.clocks
        timeout_ns = int(timeout_s * NS_PER_S)
        self._check_usable()
        warm_up()  # before the fence: the first remount must not compile in its window
        self._catch_up(clocks, timeout_ns, poll_interval_s)
        claim = view if view is not None else self.store.producer_view() + 1
        self.store.set_producer_view(claim)  # from here the deposed primary's appends fail
        self._catch_up(clocks, timeout_ns, poll_interval_s)  # batches that landed before the fence
        with self._lock:
            self._check_usable()
            durable = self.store.durable_prefix()
            if self.applied_sequence_id != durable:
                raise IncompleteOpLogCatchUp(f"applied {self.applied_sequence_id} but the durable prefix is {durable}")
            promoted = promoted_master(self._master, config=self.config, clocks=clocks)
            self._master.standby_replica_ids = None  # the container is done following: drop its index
            self._promoted = True
            self.producer_view = claim
        if journal_window is not None:  # the new primary journals through the fenced handle
            promoted.attach_journal(OpLogWriter(self.store, window=journal_window, clocks=clocks))
        self.metrics.inc("standby_promotions")
        log.info("standby promoted at sequence %d with producer view %d (%d objects, every segment "
                 "unreadable until remount)", durable, claim, promoted.objects.live_count)
        return promoted
