"""MasterService: validates requests, takes the one lock, reads the clock once, calls the
policies (policies/) and the store (store/metadata.py).

Upstream semantics (Mooncake Store master) with steady-clock int64-ns leases (RFC Phase 2).
Single-key calls raise the typed error of their code; batch calls return int32 codes.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence, overload

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .background import BackgroundRunner, MasterHealth
from .batching import (grow_ahead, grow_if_short, joined_codes, joined_columns, joined_results, read_in_chunks,
                       run_in_chunks)
from .changelog import ChangeLog, ChangeLogSink
from .clock import NS_PER_MS, NS_PER_S, Clocks, MonotonicClocks
from .config import MasterConfig
from .errors import ErrorCode, InvalidParams, ObjectNotFound, SegmentAlreadyExists
from .integrity import verify_engine
from .locking import MasterLock
from .messages import (DEFAULT_TENANT, BatchResult, ObjectInfo, ReplicaDescriptor, ReplicaKind, ReplicaStatus,
                       ReplicateConfig, SegmentInfo)
from .metrics import Metrics
from .policies import eviction as ev
from .policies import offload, puts, removal, views
from .policies import segments as seg_policy
from .policies.discard import discard_expired_puts
from .policies.recovery import RemountReport
from .policies.segments import require_client
from .policies.service import ClientLiveness
from .policies.views import ReplicaColumns
from .schema import OBJECTS_ARROW_SCHEMA, PingStatus
from .store.arrow_export import export_tables
from .store.arrow_io import load_tables
from .store.keys import as_string_array, string_buffers
from .store.metadata import MetadataStore
from .store.read_columns import SingleKeyReader
from .store.segments import Segment
from .validation import (
    locked,
    raise_code,
    require_bool,
    require_int,
    require_str,
    single_key,
    validate_tenant,
)
from .warm_up_hook import warm_up

# the one descriptor of a single-key get, built in get_replica_list itself: ReplicaDescriptor(...)
# without the Python frame of the NamedTuple's generated __new__, nor one of a helper (a call is
# about 3% of a get)
_new_descriptor = tuple.__new__
_MEMORY, _MEMORY_KIND, _COMPLETE = int(ReplicaKind.MEMORY), ReplicaKind.MEMORY, ReplicaStatus.COMPLETE

if TYPE_CHECKING:
    from .store.replica_ids import ReplicaIdIndex
    from .store.snapshot_state import SnapshotState


def _store_attribute(name: str, doc: str) -> property:
    """A read-only view of the store's ``name`` (kept for callers that predate the store)."""
    return property(lambda self: getattr(self.store, name), doc=doc)


class MasterService:
    """Object metadata of a Mooncake Store master, as columns."""

    objects = _store_attribute("objects", "The object and replica columns (store/objects.py).")
    keys = _store_attribute("keys", "The key index (store/keys.py).")
    inflight = _store_attribute("inflight", "In-flight puts (store/inflight.py).")
    segments = _store_attribute("segments", "Mounted segments and their allocators.")
    tenants = _store_attribute("tenants", "Tenant name dictionary.")
    clients = _store_attribute("clients", "Client name dictionary.")
    groups = _store_attribute("groups", "Group dictionary (tenant-scoped names).")
    group_head = _store_attribute("group_head", "First member row of each group.")
    ledger = _store_attribute("ledger", "Per-tenant memory ledger (multi-tenant mode).")
    offloads = _store_attribute("offloads", "Queued offload tasks.")
    next_replica_id = _store_attribute("next_replica_id", "The id the next replica gets.")

    def __init__(self, config: MasterConfig | None = None, *, clocks: Clocks | None = None,
                 initial_capacity: int = 1024, journal: ChangeLogSink | None = None) -> None:
        if config is None:
            config = MasterConfig()
        if not isinstance(config, MasterConfig):
            raise InvalidParams("config must be a MasterConfig")
        self.config = config
        self.clocks: Clocks = clocks if clocks is not None else MonotonicClocks()
        self._lock = MasterLock()  # reentrant, taken in turns without lock convoys (locking.py)
        self.store = MetadataStore(initial_capacity, ledger_on=config.enable_multi_tenants,
                                   offload_limit=config.offloading_queue_limit)
        self._single_reader = SingleKeyReader(self.store)  # get_replica_list/exist_key's kernel and columns
        # a standby container only: the replica ids its objects hold, kept by oplog apply
        # (store/replica_ids.py); None on a serving master
        self.standby_replica_ids: "ReplicaIdIndex | None" = None
        self.metrics = Metrics()
        # HA primary: operations go to the change log; removals free space only once durable
        self.journal: ChangeLog | None = None
        if journal is not None:
            self.journal = self._change_log(journal)
        self._removal_error: str | None = None  # the last durable removal that failed to free (health)
        self.remount_fault: Callable[[str], None] | None = None  # tests: fail a remount at a named step
        self.eviction_armed = False
        self.liveness = ClientLiveness(config.client_live_ttl_s * NS_PER_S)
        # late-bound, so a tick wrapped or replaced on the instance is what the thread runs
        self._background = BackgroundRunner(lambda: self.tick(), self.metrics, "mooncake-master-background",
                                            self._lock)

    @property
    def lock(self) -> MasterLock:
        """The master lock: hold it to read or change the store between calls."""
        return self._lock

    def attach_journal(self, writer: ChangeLogSink) -> None:
        """Start journaling every change to ``writer`` (a promoted standby becoming the primary:
        its writer writes through the store handle that claimed the new producer view)."""
        with self._lock:
            self.journal = self._change_log(writer)

    def _change_log(self, sink: ChangeLogSink) -> ChangeLog:
        return sink.change_log(self.store, self._finalize_removed, self.config.oplog_admission_timeout_ms / 1000)

    @property
    def config(self) -> MasterConfig:
        """The master's settings."""
        return self._config

    @config.setter
    def config(self, config: MasterConfig) -> None:
        # lease_ttl_ns: the read lease TTL every read grants, derived once per config (a property
        # computing it was a twentieth of a single-key get)
        self._config, self.lease_ttl_ns = config, config.default_kv_lease_ttl_ms * NS_PER_MS

    # ================================================================================ background
    def tick(self) -> "ev.EvictionReport | None":
        """One round of background work: client expiry, eviction when triggered, expired puts
        and offloads, release of discarded space. The background thread calls this; tests call
        it directly with ManualClocks. One turn of the master lock, before the waiting clients
        (the one that woke the round waits for it), handed to them at once when done (the
        background thread sleeps until its next round)."""
        self._lock.take(first=True)
        try:
            self.expire_clients()
            now_ms = self.clocks.system_ns() // NS_PER_MS
            timeout_ms = self.config.put_start_release_timeout_s * 1000
            discard_expired_puts(self.store, timeout_ms, now_ms)
            offload.expire_offloads(self.store, timeout_ms, now_ms)
            report = self.evict()
            self.store.release_discarded(now_ms)
            self._single_reader.release()  # columns replaced since the last single-key read
            return report
        finally:
            self._lock.leave(going_idle=True)

    def start(self, interval_s: float = 0.01) -> None:
        """Run tick() on a background thread every ``interval_s`` (upstream: 10 ms). A failing
        tick is logged, counted and reported by ``health()``; the next ticks still run. The
        serving-path kernels are compiled first (once per process), never under the lock later."""
        warm_up()  # warmup.warm_up_kernels (registered: it exercises this class, so it sits above it)
        self._background.start(interval_s)

    def stop(self) -> None:
        self._background.stop()

    def health(self) -> MasterHealth:
        """Background thread and journal state: ``healthy`` is False while the last tick failed,
        the thread died, the oplog writer is terminal, or a durable removal could not be freed."""
        error = self.journal.terminal_error if self.journal is not None else None
        return MasterHealth(self._background.health(), repr(error) if error is not None else None,
                            self._removal_error)

    def verify(self, *, key_lookups: bool = True) -> None:
        """Self-check: raise EngineInvariantError naming the first broken structural invariant
        (extents, allocators, key index, free rows, in-flight slots, groups, ledger, ids).
        ``key_lookups=False``: right after :meth:`from_state`, whose bulk index build proved
        that every LIVE row is found by its own key (``integrity.verify_engine``)."""
        with self._lock:
            verify_engine(self, key_lookups=key_lookups)

    # ================================================================================ eviction
    @overload
    def evict(self, target: float, lower: float | None = None) -> "ev.EvictionReport": ...
    @overload
    def evict(self, target: None = None, lower: float | None = None) -> "ev.EvictionReport | None": ...

    @locked
    def evict(self, target: float | None = None, lower: float | None = None) -> "ev.EvictionReport | None":
        """One BatchEvict cycle. Without arguments: only when above the high watermark or armed
        by an allocation failure eviction can fix (upstream trigger). With ``target`` (and
        optionally ``lower``) as ratios of the eviction base: run exactly that cycle."""
        if target is None:
            targets = ev.eviction_targets(self)
            if targets is None:
                return None
            target, lower = targets
        for name, v in (("target", target), ("lower", lower)):
            if v is not None and not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise InvalidParams(f"{name} must be a ratio in [0, 1], got {v!r}")
        return ev.batch_evict(self, float(target), float(target if lower is None else lower))

    @locked
    def eviction_plan(self, target: float) -> "ev.EvictionPlan":
        """What a first pass at ``target`` would remove, without removing it (oplog hook, tests)."""
        return ev.first_pass_plan(self, target)

    # ================================================================================ puts
    def put_start(self, key: str, size: int, *, client_id: str,
                  config: ReplicateConfig = ReplicateConfig()) -> list[ReplicaDescriptor]:
        """Allocate PROCESSING replicas for a new object; returns their descriptors."""
        if type(key) is str:  # a put that crosses a growth threshold grows in steps first
            grow_if_short(self, 1, 4 * len(key))
        return self._put_start_one(key, size, client_id, config)

    @locked
    def _put_start_one(self, key: str, size: int, client_id: str,
                       config: ReplicateConfig) -> list[ReplicaDescriptor]:
        offsets, data = single_key(key)
        size = require_int("size", size, 1)
        codes, rows = puts.start(self, offsets, data, np.array([size], np.int64),
                                 require_client(self.config, client_id), config,
                                 helper_body=_compile_put_end_and_get)
        raise_code(int(codes[0]), f"put_start {key!r}")
        return views.descriptors(self.store, int(rows[0]), readable_only=False)

    def batch_put_start(self, keys, sizes, *, client_id: str,
                        config: ReplicateConfig = ReplicateConfig()) -> BatchResult:
        """Vectorized put_start with one config for every key; per-key codes and replica table.
        Like every batch call, runs in chunks of keys in order, the lock released in between
        (batching.py): the same result as the chunks' calls made one after another."""
        return joined_results(self._batch_put_start(keys, sizes, client_id, config))

    def batch_put_start_columns(self, keys, sizes, *, client_id: str, config: ReplicateConfig = ReplicateConfig()
                                ) -> tuple[np.ndarray, ReplicaColumns]:
        """:meth:`batch_put_start`'s codes and replica columns, without building the Arrow table
        (a server encodes its response straight from the columns)."""
        return joined_columns(self._batch_put_start(keys, sizes, client_id, config))

    def _batch_put_start(self, keys, sizes, client_id: str, config: ReplicateConfig) -> list:
        arr = self._key_array(keys)
        offsets, data = string_buffers(arr)
        sizes = np.asarray(sizes)
        if sizes.shape != (len(arr),) or not np.issubdtype(sizes.dtype, np.integer):
            raise InvalidParams("sizes must be an integer array with one size per key")
        sizes = sizes.astype(np.int64)
        client = require_client(self.config, client_id)

        def chunk(lo: int, hi: int) -> tuple[np.ndarray, ReplicaColumns]:
            codes, rows = puts.start(self, offsets[lo:hi + 1], data, sizes[lo:hi], client, config,
                                     helper_body=_compile_put_end_and_get)
            return codes, views.replica_columns(self.store, np.flatnonzero(codes == 0), rows, lo)

        return run_in_chunks(self._lock, len(arr), chunk,
                             before=lambda lo, hi: grow_ahead(self, hi - lo, int(offsets[hi] - offsets[lo])))

    @locked
    def put_end(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """Mark the object's PROCESSING replicas COMPLETE (idempotent once complete)."""
        offsets, data = single_key(key)
        codes = puts.end(self, offsets, data, require_str("client_id", client_id), tenant_id)
        raise_code(int(codes[0]), f"put_end {key!r}")

    def batch_put_end(self, keys, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        client = require_str("client_id", client_id)
        parts = run_in_chunks(self._lock, offsets.size - 1,
                              lambda lo, hi: puts.end(self, offsets[lo:hi + 1], data, client, tenant_id))
        return BatchResult(joined_codes(parts))

    @locked
    def put_revoke(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """Abort an in-progress put: its PROCESSING replicas are freed and the object removed."""
        offsets, data = single_key(key)
        client = require_str("client_id", client_id)
        removal.revoke(self, int(self.store.lookup(offsets, data, tenant_id)[0]), client, f"put_revoke {key!r}")

    # ================================================================================ reads
    # get_replica_list and exist_key take the lock themselves, as the decorator ``locked`` would with
    # reading=True (they may run between the steps of a staged growth): its wrapper's call with
    # *args, **kwargs alone costs a tenth of a single-key read
    def get_replica_list(self, key: str, tenant_id: str = DEFAULT_TENANT) -> list[ReplicaDescriptor]:
        """Readable replicas of the object; grants the read lease (group rule)."""
        lock = self._lock
        lock.take_reading()
        try:
            code, row, _, count, replica_id, kind, segment, offset, size = self._single_reader.read(
                key, tenant_id, self.clocks.steady_ns(), self.lease_ttl_ns)
            if code:
                raise_code(code, f"get_replica_list {key!r}")
            if count == 1:  # the common case: the kernel read the one readable replica's slot
                if kind == _MEMORY:  # readable: its segment is mounted (``offset``: bytes into it)
                    seg = self.store.segments.info[segment]
                    return [_new_descriptor(ReplicaDescriptor, (replica_id, _MEMORY_KIND, _COMPLETE, seg.name,
                                                                seg.endpoint, seg.base + offset, size, True))]
                return [views.readable_disk_descriptor(self.store, replica_id, kind, segment, size)]
            return views.readable_descriptors(self.store, row)
        finally:
            lock.leave()

    def batch_get_replica_list(self, keys, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        return joined_results(read_in_chunks(self, offsets, data, tenant_id, want_replicas=True))

    def batch_get_replica_columns(self, keys, tenant_id: str = DEFAULT_TENANT) -> tuple[np.ndarray, ReplicaColumns]:
        """:meth:`batch_get_replica_list`'s codes and replica columns, without building the Arrow
        table (a server encodes its response straight from the columns)."""
        offsets, data = string_buffers(self._key_array(keys))
        return joined_columns(read_in_chunks(self, offsets, data, tenant_id, want_replicas=True))

    def exist_key(self, key: str, tenant_id: str = DEFAULT_TENANT) -> bool:
        """True when a readable replica exists (and then the read lease is granted)."""
        lock = self._lock
        lock.take_reading()
        try:
            return self._single_reader.read(key, tenant_id, self.clocks.steady_ns(), self.lease_ttl_ns)[0] == 0
        finally:
            lock.leave()

    def batch_exist_key(self, keys, tenant_id: str = DEFAULT_TENANT) -> np.ndarray:
        offsets, data = string_buffers(self._key_array(keys))
        return joined_codes([(lo, codes == 0) for lo, (codes, _) in
                             read_in_chunks(self, offsets, data, tenant_id, want_replicas=False)])

    # ================================================================================ removal
    @locked
    def remove(self, key: str, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> None:
        """Remove one object: OBJECT_HAS_LEASE unless force; REPLICA_IS_NOT_READY while incomplete."""
        offsets, data = single_key(key)
        codes = removal.remove_keys(self, offsets, data, tenant_id, require_bool("force", force))
        raise_code(int(codes[0]), f"remove {key!r}")

    def batch_remove(self, keys, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> np.ndarray:
        """Per-key codes; in chunks (see batch_put_start): an oplog window that fills up refuses
        the chunk it happens in (UNAVAILABLE_IN_CURRENT_STATUS), earlier chunks are removed."""
        offsets, data = string_buffers(self._key_array(keys))
        force = require_bool("force", force)
        parts = run_in_chunks(self._lock, offsets.size - 1,
                              lambda lo, hi: removal.remove_keys(self, offsets[lo:hi + 1], data, tenant_id, force))
        return joined_codes(parts)

    @locked
    def remove_all(self, *, force: bool = False, tenant_id: str | None = None) -> int:
        """Remove every unleased (or, with force, every) complete object; returns the count."""
        rows = self.store.tenant_rows(tenant_id)
        return removal.remove_rows_where_allowed(self, rows, require_bool("force", force))

    @locked
    def remove_by_regex(self, pattern: str, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> int:
        """Remove objects of the tenant whose key matches ``pattern`` (search semantics)."""
        require_str("pattern", pattern)
        force = require_bool("force", force)
        rows = self.store.tenant_rows(validate_tenant(tenant_id))
        try:
            hit = pc.match_substring_regex(self.store.keys.keys_of(rows), pattern).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidParams(f"bad regex {pattern!r}: {e}") from None
        return removal.remove_rows_where_allowed(self, rows[hit.astype(bool)], force)

    def _finalize_removed(self, rows: np.ndarray, replica_ids: np.ndarray) -> None:
        """Durable-callback of journaled removals (the writer's thread): free what is still
        REMOVED. It never waits for the master lock, whose holder may be waiting for the very
        window space this durability frees: when the lock is busy, or a growth job is copying
        the structures this changes, the next call that may mutate does it first."""
        self._lock.run_or_defer(lambda: self._free_durable(rows, replica_ids))

    def _free_durable(self, rows: np.ndarray, replica_ids: np.ndarray) -> None:
        try:
            self.store.finalize_removed(rows, replica_ids)
        except Exception as e:  # raised on to the writer (logged) or the call that ran it; health() tells
            self._removal_error = repr(e)
            raise

    # ================================================================================ segments
    @locked
    def mount_segment(self, name: str, *, endpoint: str, client_id: str, base: int, size: int,
                      segment_id: str | None = None, host_id: str = "") -> str:
        """Mount a memory segment; returns its segment id. Re-mounting an identical segment is a
        no-op. ``segment_id``: upstream's segment UUID (``"<u64>-<u64>"``) as the client's
        ``Segment`` carries it; without one the master generates one (as upstream's client does)
        and keeps it, so a v1 rollback snapshot names the segment by the id it is known by."""
        table = self.store.segments
        seg = seg_policy.requested_segment(self.config, name, endpoint, client_id, base, size, segment_id, host_id)
        self.liveness.touch(seg.client, self.clocks.steady_ns())
        existing = table.get(seg.name)
        if existing is not None:
            if existing.same_mount(seg):
                return existing.segment_id
            raise SegmentAlreadyExists(f"segment {seg.name!r} is mounted with different parameters")
        if seg.segment_id in table.by_id:
            raise SegmentAlreadyExists(f"segment id {seg.segment_id!r} is already mounted as "
                                       f"{table.mounted(table.by_id[seg.segment_id]).name!r}")
        seg = replace(seg, segment_id=seg.segment_id or table.fresh_id())
        table.check_room([seg])
        journaled = seg_policy.journal_segments(self, [seg], mounted=True)
        table.mount(seg)
        journaled.submit()
        return seg.segment_id

    @locked
    def unmount_segment(self, name: str) -> None:
        """Unmount: its replicas are dropped at once; objects left without replicas are removed."""
        code = self.store.segments.code(require_str("name", name))
        if code >= 0:  # idempotent, as upstream
            seg_policy.unmount(self, [code])

    @locked
    def unmount_segment_by_id(self, segment_id: str) -> None:
        """Unmount the segment mounted under upstream's segment id (idempotent, as upstream's
        UnmountSegment, which names segments by id)."""
        code = self.store.segments.code_of_id(require_str("segment_id", segment_id))
        if code >= 0:
            seg_policy.unmount(self, [code])

    @locked
    def ping(self, client_id: str) -> PingStatus:
        """OK for a client that has remounted; NEED_REMOUNT otherwise (upstream Ping)."""
        client = require_str("client_id", client_id)
        self.liveness.touch(client, self.clocks.steady_ns())
        return PingStatus.OK if client in self.liveness.remounted else PingStatus.NEED_REMOUNT

    @locked
    def remount_segments(self, client_id: str, segments: Sequence[Segment | dict]) -> RemountReport:
        """The client's answer to NEED_REMOUNT.

        Identical already-mounted segments are a no-op; unknown ones are mounted; segments restored
        from a standby (unreadable, invalid endpoint) are recovered in RFC Phase 1 order and their
        objects get ONE recovery lease. Everything is validated first; a failure mounts, publishes
        and grants nothing (retry later) and the client stays NEED_REMOUNT.
        """
        return seg_policy.remount(self, client_id, segments)

    @locked
    def expire_clients(self) -> list[str]:
        """Clients silent for client_live_ttl_s: forget them and unmount their segments."""
        return seg_policy.expire_clients(self)

    # ================================================================================ offload
    @locked
    def offload_tasks(self) -> pa.Table:
        """Queued offloads: which key's replica to copy to its owner's local disk."""
        return offload.offload_tasks(self.store)

    @locked
    def complete_offload(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """The client copied the object to local disk: add the LOCAL_DISK replica, unpin the source."""
        offsets, data = single_key(key)
        row = int(self.store.lookup(offsets, data, tenant_id)[0])
        offload.complete_offload(self, row, client_id, repr(key))

    # ================================================================================ inspection
    @locked
    def object_info(self, key: str, tenant_id: str = DEFAULT_TENANT) -> ObjectInfo:
        """Deadlines (steady ns), flags and every replica with its readability."""
        offsets, data = single_key(key)
        row = int(self.store.lookup(offsets, data, tenant_id)[0])
        if row < 0:
            raise_code(ErrorCode.OBJECT_NOT_FOUND, f"object_info {key!r}")
        return views.object_info(self.store, row, key)

    @locked
    def to_arrow(self) -> pa.Table:
        """The object table (one row per object, ordered by row) as a pyarrow Table."""
        return export_tables(self.store).objects.cast(OBJECTS_ARROW_SCHEMA)

    @locked
    def export_state(self) -> "SnapshotState":
        """The whole state as Arrow tables (plain layout: string name columns), steady-ns
        deadlines of this process. Snapshots use the encoded layout straight from
        ``store.arrow_io`` instead (no per-row strings)."""
        return export_tables(self.store).plain()

    @classmethod
    def from_state(cls, state: "SnapshotState", *, config: MasterConfig | None = None,
                   clocks: Clocks | None = None, segments_readable: bool = True,
                   validated: bool = False) -> "MasterService":
        """A master rebuilt from a SnapshotState (either layout) whose deadlines are already in
        this process's steady domain. ``segments_readable=False`` restores every segment with an
        invalid endpoint (standby promotion: unreadable until its client remounts).
        ``validated``: the caller already ran ``state.validate`` on it (a snapshot decode)."""
        if not validated:
            state.validate(check_unique_keys=False)  # loading the key index checks uniqueness
        m = cls(config, clocks=clocks, initial_capacity=max(1024, state.objects.num_rows))
        s = m.store
        load_tables(s, state, segments_readable=segments_readable)
        s.next_replica_id = max(s.next_replica_id, int(state.replica_next_id))
        if s.ledger_on:  # rebuild tenant usage from the restored replicas
            s.charge(s.objects.live_rows(), +1)
        if segments_readable:  # a restart: restored clients must ping within client_live_ttl_s
            now = m.clocks.steady_ns()
            for client in set(state.segments.column("client").to_pylist()):
                m.liveness.touch(client, now)
        # a promotion: a client's liveness starts at its first contact with the new primary; until
        # then its segments and objects stay, unreadable and protected (the guard has no TTL)
        return m

    @locked
    def object_count(self) -> int:
        return self.store.objects.live_count

    @locked
    def segment_usage(self) -> dict[str, tuple[int, int]]:
        """name -> (held bytes, capacity bytes). Held bytes are the engine allocator's: each
        replica rounded up to the segment's allocation unit; :meth:`segment_info` also reports
        the exact bytes upstream would (they differ above 3.75 GiB of capacity)."""
        s = self.store.segments
        return {info.name: (int(s.used[c]), int(s.capacity[c])) for c, info in enumerate(s.info) if info}

    @locked
    def segment_info(self) -> dict[str, SegmentInfo]:
        """name -> :class:`SegmentInfo` of every mounted segment: its upstream identity, and both
        usage figures (``used_bytes`` exact as upstream's QuerySegments, ``held_bytes`` in whole
        allocation units). One vectorized pass over the replica slots; also sets the gauges
        ``segment_used_bytes`` and ``segment_held_bytes`` (label ``segment``)."""
        return views.segment_info(self.store, self.metrics)

    @locked
    def column_bytes(self) -> dict[str, int]:
        """The ``columns`` figure of :meth:`metadata_bytes`, column by column."""
        return self.store.objects.column_bytes()

    @locked
    def metadata_bytes(self) -> dict[str, int]:
        """Resident bytes of the metadata (columns, index, in-flight puts, the soft-pin and group
        side tables), key bytes separately."""
        s = self.store
        return {"columns": s.objects.resident_bytes(), "index": s.keys.resident_bytes(),
                "inflight": s.inflight.resident_bytes(),
                "side_tables": s.soft_pins.resident_bytes() + s.group_of.resident_bytes(),
                "key_bytes": int(s.keys.arena_used)}

    # ================================================================================ helpers
    def _key_array(self, keys) -> pa.Array:
        try:
            arr = as_string_array(keys)
        except (TypeError, UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise InvalidParams(f"keys must be a list of str or a string array: {e}") from None
        if arr.null_count:
            raise InvalidParams("keys must not contain nulls")
        return arr


def _compile_put_end_and_get() -> None:
    """What the first put's compile helper (compile_helper.py) runs in its forked process:
    put_ends and a get of an absent key on a throwaway master: each runs its kernel in full (a
    kernel compiles for its argument types, whatever the key's fate). The order matters: first
    what the put needs next (its in-flight slot index). The first put_end names a tenant no put
    named yet, so its lookup ends before the key index and only the completion kernels compile
    (about 0.6 s). By then the put beside it has compiled and cached the key index's hash and
    probe, which the get and the second put_end (its lookup kernel) load instead of compiling
    them again."""
    m = MasterService(MasterConfig())
    m.mount_segment("helper", endpoint="127.0.0.1:1", client_id="helper", base=1 << 40, size=1 << 26)
    calls = (lambda: m.store.inflight.take(np.zeros(0, np.int64)),  # the put's in-flight slot index
             lambda: m.put_end("absent", client_id="helper"),
             lambda: m.store.tenants.code(DEFAULT_TENANT),  # named from here on
             lambda: m.get_replica_list("absent"),
             lambda: m.put_end("absent", client_id="helper"))
    for call in calls:
        try:
            call()
        except ObjectNotFound:
            pass
