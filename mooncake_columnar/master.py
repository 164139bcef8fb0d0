"""MasterService: validates requests, takes the one lock, reads the clock once, calls kernels.

Upstream semantics (Mooncake Store master) with steady-clock int64-ns leases (RFC Phase 2).
Single-key calls raise the typed error of their code; batch calls return int32 codes.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import eviction as ev
from .background import BackgroundRunner, MasterHealth
from .clock import NS_PER_MS, Clocks, MonotonicClocks
from .config import MAX_TTL_MS, MasterConfig
from .errors import EngineInvariantError, ErrorCode, InvalidParams, error_for_code
from .kernels import allocation as ak
from .kernels import objects as ok
from .kernels.erase_guard import first_not_erasable
from .messages import DEFAULT_TENANT, BatchResult, ReplicaDescriptor, ReplicateConfig
from .ha.journal import Journal, finalize_removed
from .batching import grow_ahead, grow_if_short, joined_codes, joined_results, read_in_chunks, run_in_chunks
from .integrity import verify_engine
from .locking import MasterLock
from .warmup import warm_up_kernels
from .metrics import Metrics
from .offload import OffloadQueue
from .quota import TenantLedger
from .schema import (
    FLAG_HARD_PINNED,
    FLAG_LIVE,
    FLAG_PENDING_SOFT_PIN,
    FLAG_PROCESSING,
    MAX_KEY_BYTES,
    ST_PROCESSING,
    ObjectDataType,
    ReplicaKind,
    ReplicaStatus,
    SoftPinAction,
)
from .service_discard import DiscardMixin
from .service_offload import OffloadMixin
from .service_segments import SegmentsMixin
from .service_views import ReplicaColumns, ViewsMixin
from .store.inflight import InflightTable
from .store.keys import KeyIndex, as_string_array, string_buffers
from .store.objects import ObjectTable
from .store.segments import SegmentTable
from .store.strings import StringDictionary
if TYPE_CHECKING:
    from .ha.replica_ids import ReplicaIdIndex
    from .ha.writer import OpLogWriter
from .validation import (
    _COMPLETE,
    _locked,
    _locked_reading,
    _raise_code,
    _require_bool,
    _require_int,
    _require_str,
    _single_key,
    _validate_tenant,
)


class MasterService(SegmentsMixin, OffloadMixin, DiscardMixin, ViewsMixin):
    """Object metadata of a Mooncake Store master, as columns."""

    def __init__(self, config: MasterConfig | None = None, *, clocks: Clocks | None = None,
                 initial_capacity: int = 1024, journal: "OpLogWriter | None" = None) -> None:
        if config is None:
            config = MasterConfig()
        if not isinstance(config, MasterConfig):
            raise InvalidParams("config must be a MasterConfig")
        self.config = config
        self.clocks: Clocks = clocks if clocks is not None else MonotonicClocks()
        self._lock = MasterLock()  # reentrant, taken in turns without lock convoys (locking.py)
        self.objects = ObjectTable(initial_capacity)
        self.keys = KeyIndex(self.objects, initial_capacity)
        self.inflight = InflightTable()
        self.segments = SegmentTable()
        self.tenants = StringDictionary()
        self.clients = StringDictionary()
        self.groups = StringDictionary()           # "tenant\0group" -> code (groups are tenant-scoped)
        self._group_names: list[str] = []
        self.group_head = np.full(16, -1, np.int64)
        self.next_replica_id = 1
        # a standby container only: the replica ids its objects hold, kept by oplog apply
        # (ha/replica_ids.py); None on a serving master
        self.standby_replica_ids: "ReplicaIdIndex | None" = None
        self.metrics = Metrics()
        # HA primary: operations go to the oplog writer; removals free space only once durable
        self.journal = self._journal_for(journal) if journal is not None else None
        self._durable_removals: deque[tuple[np.ndarray, np.ndarray]] = deque()  # finalizations the lock was busy for
        self.remount_fault: Callable[[str], None] | None = None  # tests: fail a remount at a named step
        self.ledger = TenantLedger()  # maintained only in multi-tenant mode (quota admission)
        self.offloads = OffloadQueue(config.offloading_queue_limit)
        self.eviction_armed = False
        # late-bound, so a tick wrapped or replaced on the instance is what the thread runs
        self._background = BackgroundRunner(lambda: self.tick(), self.metrics, "mooncake-master-background",
                                            self._lock)
        self._ok_clients: set[str] = set()
        self._client_deadline_ns: dict[str, int] = {}
        # Replicas of abandoned puts: space stays allocated until release_at (system ms), as upstream.
        self._discarded_seg = np.empty(0, np.int64)
        self._discarded_off = np.empty(0, np.int64)
        self._discarded_size = np.empty(0, np.int64)
        self._discarded_release_ms = np.empty(0, np.int64)

    def attach_journal(self, writer: "OpLogWriter") -> None:
        """Start journaling every change to ``writer`` (a promoted standby becoming the primary:
        its writer writes through the store handle that claimed the new producer view)."""
        with self._lock:
            self.journal = self._journal_for(writer)

    def _journal_for(self, writer: "OpLogWriter") -> Journal:
        return Journal(writer, self.config.oplog_admission_timeout_ms / 1000)

    # ---- derived config ---------------------------------------------------------------------
    @property
    def lease_ttl_ns(self) -> int:
        return self.config.default_kv_lease_ttl_ms * NS_PER_MS

    def tick(self) -> "ev.EvictionReport | None":
        """One round of background work: client expiry, eviction when triggered, expired puts
        and offloads, release of discarded space. The background thread calls this; tests call
        it directly with ManualClocks. One turn of the master lock, before the waiting clients
        (the one that woke the round waits for it), handed to them at once when done (the
        background thread sleeps until its next round)."""
        self._lock.take(first=True)
        try:
            self._finish_durable_removals()
            self.expire_clients()
            now_ms = self.clocks.system_ns() // NS_PER_MS
            self._discard_expired_puts(now_ms)
            self._expire_offloads(now_ms)
            report = self.evict()
            self._release_discarded(now_ms)
            return report
        finally:
            self._lock.leave(going_idle=True)

    def start(self, interval_s: float = 0.01) -> None:
        """Run tick() on a background thread every ``interval_s`` (upstream: 10 ms). A failing
        tick is logged, counted and reported by ``health()``; the next ticks still run. The
        serving-path kernels are compiled first (once per process), never under the lock later."""
        warm_up_kernels()
        self._background.start(interval_s)

    def stop(self) -> None:
        self._background.stop()

    def health(self) -> MasterHealth:
        """Background thread and journal state: ``healthy`` is False while the last tick failed,
        the thread died, or the oplog writer is terminal."""
        journal_error = None
        if self.journal is not None and self.journal.writer.terminal_error is not None:
            journal_error = repr(self.journal.writer.terminal_error)
        return MasterHealth(self._background.health(), journal_error)

    def verify(self) -> None:
        """Self-check: raise EngineInvariantError naming the first broken structural invariant
        (extents, allocators, key index, free rows, in-flight slots, groups, ledger, ids)."""
        with self._lock:
            verify_engine(self)

    # ================================================================================ eviction
    @_locked
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

    @_locked
    def eviction_plan(self, target: float) -> "ev.EvictionPlan":
        """What a first pass at ``target`` would remove, without removing it (oplog hook, tests)."""
        return ev.first_pass_plan(self, target)

    def _apply_eviction(self, plan: "ev.EvictionPlan") -> tuple[int, int, int]:
        """Drop planned replicas (offloading instead where configured); returns
        (objects evicted, bytes freed, offloads queued)."""
        o = self.objects
        queued = 0
        if self.config.enable_offload and self.config.offload_on_evict and plan.rows.size:
            plan, queued = self._offload_instead(plan)
        hit = plan.chains.any(plan.removed)
        if not hit.any():
            return 0, 0, queued
        plan = plan.subset(hit)
        if self.journal is not None:  # hide now, free once durable; a full window stops the cycle
            done = self.journal.hide_then_free(self, plan.rows, plan)
            if done < plan.rows.size:
                self.metrics.inc("eviction_oplog_backpressure")
                plan = plan.part(0, done)
            return int(plan.rows.size), int((o.size_bytes[plan.rows] * plan.chains.count(plan.removed)).sum()), queued
        r_idx, slot = np.nonzero(plan.removed)
        freed = self._drop_slots(plan.chains.rows[r_idx], slot)
        self._erase_rows(plan.rows[~plan.chains.any(o.replica_status[plan.chains.rows] != 0)], slots_cleared=True)
        return int(plan.rows.size), freed, queued

    # ================================================================================ puts
    def _resolve_put_config(self, config: ReplicateConfig) -> tuple[int, int, int]:
        """Validate a ReplicateConfig; returns (tenant code, flags, pending soft-pin ttl ns)."""
        if not isinstance(config, ReplicateConfig):
            raise InvalidParams("config must be a ReplicateConfig")
        _require_int("replica_num", config.replica_num, 1, self.config.max_replica_num)
        hard = _require_bool("hard_pin", config.hard_pin)
        _require_str("group_id", config.group_id, allow_empty=True)
        tenant = _validate_tenant(config.tenant_id)
        try:
            ObjectDataType(config.data_type)
        except (ValueError, TypeError):
            raise InvalidParams(f"unknown data_type {config.data_type!r}") from None
        for s in config.preferred_segments:
            _require_str("preferred_segments item", s)
        ttl_ms = self._resolve_soft_pin(config)
        flags = int(FLAG_LIVE | FLAG_PROCESSING) | (int(FLAG_HARD_PINNED) if hard else 0)
        if ttl_ms:
            flags |= int(FLAG_PENDING_SOFT_PIN)
        return self.tenants.code(tenant), flags, ttl_ms * NS_PER_MS

    def _resolve_soft_pin(self, config: ReplicateConfig) -> int:
        """Upstream ResolveSoftPinRequest; returns the ENABLE ttl in ms (0: no pin)."""
        try:
            action = SoftPinAction(config.soft_pin_action)
        except (ValueError, TypeError):
            raise InvalidParams(f"unknown soft_pin_action {config.soft_pin_action!r}") from None
        ttl = config.soft_pin_ttl_ms
        if action != SoftPinAction.ENABLE:
            if ttl is not None:
                raise InvalidParams(f"soft_pin_ttl_ms is only valid with ENABLE, not {action.name}")
            return 0
        if ttl is None:
            return self.config.default_kv_soft_pin_ttl_ms
        ttl = _require_int("soft_pin_ttl_ms", ttl, 0, MAX_TTL_MS)
        if ttl > self.config.max_kv_soft_pin_ttl_ms:
            raise InvalidParams(f"soft_pin_ttl_ms {ttl} exceeds max_kv_soft_pin_ttl_ms")
        return ttl

    def put_start(self, key: str, size: int, *, client_id: str,
                  config: ReplicateConfig = ReplicateConfig()) -> list[ReplicaDescriptor]:
        """Allocate PROCESSING replicas for a new object; returns their descriptors."""
        if type(key) is str:  # a put that crosses a growth threshold grows in steps first
            grow_if_short(self, 1, 4 * len(key))
        return self._put_start_one(key, size, client_id, config)

    @_locked
    def _put_start_one(self, key: str, size: int, client_id: str,
                       config: ReplicateConfig) -> list[ReplicaDescriptor]:
        offsets, data = _single_key(key)
        size = _require_int("size", size, 1)
        codes, rows = self._put_start(offsets, data, np.array([size], np.int64),
                                      self._require_client(client_id), config)
        _raise_code(int(codes[0]), f"put_start {key!r}")
        return self._descriptors(int(rows[0]), readable_only=False)

    def batch_put_start(self, keys, sizes, *, client_id: str,
                        config: ReplicateConfig = ReplicateConfig()) -> BatchResult:
        """Vectorized put_start with one config for every key; per-key codes and replica table.
        Like every batch call, runs in chunks of keys in order, the lock released in between
        (batching.py): the same result as the chunks' calls made one after another."""
        arr = self._key_array(keys)
        offsets, data = string_buffers(arr)
        sizes = np.asarray(sizes)
        if sizes.shape != (len(arr),) or not np.issubdtype(sizes.dtype, np.integer):
            raise InvalidParams("sizes must be an integer array with one size per key")
        sizes = sizes.astype(np.int64)
        client = self._require_client(client_id)

        def chunk(lo: int, hi: int) -> tuple[np.ndarray, ReplicaColumns]:
            codes, rows = self._put_start(offsets[lo:hi + 1], data, sizes[lo:hi], client, config)
            return codes, self._replica_columns(np.flatnonzero(codes == 0), rows, readable_only=False)

        return joined_results(run_in_chunks(
            self._lock, len(arr), chunk,
            before=lambda lo, hi: grow_ahead(self, hi - lo, int(offsets[hi] - offsets[lo]))))

    def _put_start(self, offsets: np.ndarray, data: np.ndarray, sizes: np.ndarray, client: str,
                   config: ReplicateConfig) -> tuple[np.ndarray, np.ndarray]:
        tenant, flags, pending_ttl_ns = self._resolve_put_config(config)
        now_ms = self.clocks.system_ns() // NS_PER_MS
        o = self.objects
        n = offsets.size - 1
        codes = np.zeros(n, np.int32)
        rows_out = np.full(n, -1, np.int64)
        lengths = np.diff(offsets)
        codes[(lengths == 0) | (lengths > MAX_KEY_BYTES) | (sizes <= 0)] = ErrorCode.INVALID_PARAMS
        self._finish_durable_removals()
        self._release_discarded(now_ms)

        discard_ms = self.config.put_start_discard_timeout_s * 1000
        if self.inflight.any_started_before(now_ms - discard_ms):
            # some in-flight put may be abandoned: find existing keys first and discard those
            found = self.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))
            exists = (found >= 0) & (codes == 0)
            rows = found[exists]
            # complete, recently started, or removed but not yet durable (journal): all block
            chains = o.chains(rows)
            status = o.replica_status[chains.rows]
            held = chains.any((status == _COMPLETE) | (status == int(ReplicaStatus.REMOVED)))
            blocked = held | (self._put_start_time_ms(rows) + discard_ms >= now_ms)
            codes[np.flatnonzero(exists)[blocked]] = ErrorCode.OBJECT_ALREADY_EXISTS
            self._discard_puts(np.unique(rows[~blocked]), now_ms)
        # otherwise every existing key is complete or recent: the insert kernel reports it

        picks = np.flatnonzero(codes == 0)
        if self._ledger_on and picks.size:
            picks = self._admit_quota(tenant, config, sizes, picks, codes)
        if picks.size == 0:
            return codes, rows_out
        width = self._replica_width(config.replica_num, offsets, data, picks, tenant)
        preferred = np.array([self.segments.code(s) for s in config.preferred_segments], np.int64)
        free_rows = o.take_rows(picks.size)
        self.keys.reserve(picks.size, int((offsets[picks + 1] - offsets[picks]).sum()))
        seg = self.segments
        extra = np.empty((4, picks.size * max(0, width - o.slots)), np.int64)  # a wide put's other replicas
        used, arena_used, self.next_replica_id, n_extra = ok.insert_new_puts(
            picks, offsets, data, tenant, sizes, width, preferred, free_rows,
            self.keys.table, self.keys.arena, self.keys.arena_used, o.key_ref, o.tenant,
            seg.allocatable, seg.capacity, seg.unit_bits, seg.used,
            seg.extent_starts, seg.extent_lengths, seg.extent_counts,
            o.replica_segment, o.replica_offset, o.replica_status, o.replica_kind, o.replica_id,
            self.next_replica_id, codes, rows_out, *extra)
        o.release_rows(free_rows[used:])
        self.keys.note_inserted(int(used), int(arena_used))
        new = free_rows[:used]
        o.size_bytes[new] = sizes[picks[codes[picks] == 0]]
        if n_extra:
            self._place_extra_replicas(extra[:, :n_extra])
        o.client[new] = self.clients.code(client)
        slots = self.inflight.take(new)
        o.inflight[new] = slots
        self.inflight.started(slots, now_ms)
        o.set_put_start(new, now_ms)
        self.inflight.pending_soft_pin_ttl_ns[slots] = pending_ttl_ns
        o.flags[new] = flags
        o.data_type[new] = int(config.data_type)
        if config.group_id and used:
            gcode = self._group_code(config.tenant_id, config.group_id)
            ok.link_group_members(new, gcode, self.group_head, o.group_next, o.group, o.flags)
        self._charge(new, +1)
        if (codes == ErrorCode.NO_AVAILABLE_HANDLE).any():
            self.metrics.inc("put_start_alloc_failures", int((codes == ErrorCode.NO_AVAILABLE_HANDLE).sum()))
            # PR #3141: arm eviction only when eviction could fix it (enough memory segments)
            if int(self.segments.allocatable.sum()) >= config.replica_num:
                self.eviction_armed = True
        return codes, rows_out

    def _replica_width(self, replica_num: int, offsets: np.ndarray, data: np.ndarray, picks: np.ndarray,
                       tenant: int) -> int:
        """Replicas a put may place: at most one per allocatable segment (as upstream). The
        (rows x slots) replica columns widen to at most ``hot_slots_max``, and only when a new
        key may really need more slots than they have (a call whose keys all exist already
        widens nothing); a wider put keeps its other replicas in continuation rows."""
        o = self.objects
        width = max(1, min(replica_num, int(self.segments.allocatable.sum())))
        if o.slots < width <= o.hot_slots_max:
            n = offsets.size - 1
            if (self.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))[picks] < 0).any():
                o.ensure_slots(width)
        return width

    def _place_extra_replicas(self, extra: np.ndarray) -> None:
        """Write the replicas a wide put placed beyond its row's slots into continuation rows;
        ``extra`` rows: object row, segment, offset, replica id (grouped by object, in order)."""
        o = self.objects
        owners, counts = np.unique(extra[0], return_counts=True)
        order = np.argsort(extra[0], kind="stable")
        rows, slots = o.extra_slots(owners, counts)
        o.replica_segment[rows, slots] = extra[1, order]
        o.replica_offset[rows, slots] = extra[2, order]
        o.replica_id[rows, slots] = extra[3, order].astype(np.uint64)
        o.replica_status[rows, slots] = int(ST_PROCESSING)
        o.replica_kind[rows, slots] = int(ReplicaKind.MEMORY)

    @property
    def _ledger_on(self) -> bool:
        return self.config.enable_multi_tenants

    def _charge(self, rows: np.ndarray, sign: int) -> None:
        if self._ledger_on:
            self.ledger.charge(self.objects, rows, sign)

    def _admit_quota(self, tenant: int, config: ReplicateConfig, sizes: np.ndarray, picks: np.ndarray,
                     codes: np.ndarray) -> np.ndarray:
        """Multi-tenant admission: keys past the tenant's quota get TENANT_QUOTA_EXCEEDED after
        up to two rounds of evicting that tenant's expired objects (upstream retries)."""
        quota = self.config.tenant_quota_bytes.get(config.tenant_id)
        if quota is None:
            codes[picks] = ErrorCode.TENANT_NOT_REGISTERED
            return picks[:0]
        need = np.cumsum(sizes[picks] * config.replica_num)
        for _ in range(2):
            deficit = int(need[-1]) - (quota - self.ledger.used(tenant))
            if deficit <= 0:
                break
            if ev.evict_tenant_for_quota(self, tenant, deficit) == 0:
                break
        over = need > quota - self.ledger.used(tenant)
        codes[picks[over]] = ErrorCode.TENANT_QUOTA_EXCEEDED
        if over.any():
            self.metrics.inc("tenant_quota_rejects", int(over.sum()), tenant=config.tenant_id)
        return picks[~over]

    def _group_code(self, tenant: str, group: str) -> int:
        code = self.groups.code(f"{tenant}\0{group}")
        if code == len(self._group_names):
            self._group_names.append(group)
        if code >= self.group_head.size:
            grown = np.full(2 * self.group_head.size, -1, np.int64)
            grown[: self.group_head.size] = self.group_head
            self.group_head = grown
        return code

    @_locked
    def put_end(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """Mark the object's PROCESSING replicas COMPLETE (idempotent once complete)."""
        offsets, data = _single_key(key)
        codes = self._put_end(offsets, data, _require_str("client_id", client_id), tenant_id)
        _raise_code(int(codes[0]), f"put_end {key!r}")

    def batch_put_end(self, keys, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        client = _require_str("client_id", client_id)
        parts = run_in_chunks(self._lock, offsets.size - 1,
                              lambda lo, hi: self._put_end(offsets[lo:hi + 1], data, client, tenant_id))
        return BatchResult(joined_codes(parts))

    def _put_end(self, offsets: np.ndarray, data: np.ndarray, client: str, tenant_id: str) -> np.ndarray:
        rows = self._lookup(offsets, data, tenant_id)
        codes = np.where(rows < 0, np.int32(ErrorCode.OBJECT_NOT_FOUND), np.int32(0)).astype(np.int32)
        client_code = self.clients.find(client)
        if self.journal is None:
            self._complete_puts(rows, client_code, codes)
            return codes
        # Journaled: a range of keys completes only once the PUT_END entries of the puts it
        # completes hold window space, so no object is ever visible without its entry; ranges
        # cut at every window's worth of completions (a loop per window, not per key).
        o = self.objects
        pos = np.flatnonzero(rows >= 0)
        completes = (o.client[rows[pos]] == client_code) & ((o.flags[rows[pos]] & FLAG_PROCESSING) != 0)
        pos = pos[completes]
        if pos.size > 1:  # a key named twice completes at its first position
            _, first = np.unique(rows[pos], return_index=True)
            pos = np.sort(pos[first])
        w = self.journal.window
        bounds = np.concatenate(([0], pos[w::w], [rows.size]))
        for i in range(bounds.size - 1):
            lo, hi = int(bounds[i]), int(bounds[i + 1])
            done = rows[pos[i * w:(i + 1) * w]]
            res = self.journal.reserve(int(done.size)) if done.size else None
            if done.size and res is None:  # window stayed full: these keys stay PROCESSING
                rest = codes[lo:]
                refused = rest == 0
                rest[refused] = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
                self.metrics.inc("put_end_oplog_backpressure", int(refused.sum()))
                break
            self._complete_puts(rows[lo:hi], client_code, codes[lo:hi])
            if res is not None:
                self.journal.submit_put_ends(self, res, done)
        return codes

    def _complete_puts(self, rows: np.ndarray, client_code: int, codes: np.ndarray) -> None:
        """PROCESSING -> COMPLETE for ``rows`` (codes pre-filled, written in place)."""
        o = self.objects
        released = np.full(rows.size, -1, np.int64)
        found = rows[rows >= 0]
        self._charge(found, -1)
        ok.complete_puts(rows, client_code, self.clocks.steady_ns(), codes, o.flags, o.client,
                         o.lease_deadline_ns, o.soft_pin_deadline_ns, o.replica_status,
                         o.inflight, self.inflight.pending_soft_pin_ttl_ns, released, o.replica_more)
        self.inflight.release(released)
        self._charge(found, +1)

    @_locked
    def put_revoke(self, key: str, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> None:
        """Abort an in-progress put: its PROCESSING replicas are freed and the object removed."""
        offsets, data = _single_key(key)
        client = _require_str("client_id", client_id)
        row = int(self._lookup(offsets, data, tenant_id)[0])
        o = self.objects
        if row < 0:
            _raise_code(ErrorCode.OBJECT_NOT_FOUND, f"put_revoke {key!r}")
        if o.client[row] != self.clients.find(client):
            _raise_code(ErrorCode.ILLEGAL_CLIENT, f"put_revoke {key!r}")
        st = o.replica_status[o.chains(np.array([row], np.int64)).rows]
        in_use = st != int(ReplicaStatus.UNDEFINED)
        if not (o.flags[row] & FLAG_PROCESSING) or (st[in_use] != int(ST_PROCESSING)).any():
            _raise_code(ErrorCode.INVALID_WRITE, f"put_revoke {key!r}: not an in-progress put")
        self._erase_rows(np.array([row], np.int64))

    # ================================================================================ reads
    @_locked_reading
    def get_replica_list(self, key: str, tenant_id: str = DEFAULT_TENANT) -> list[ReplicaDescriptor]:
        """Readable replicas of the object; grants the read lease (group rule)."""
        k = key if type(key) is str and key and key.isascii() else _require_str("key", key)
        tenant = self.tenants.find(tenant_id if type(tenant_id) is str else _require_str("tenant_id", tenant_id))
        o = self.objects
        code, row = ok.find_and_classify_read(
            self.keys.table, self.keys.arena, o.key_ref, o.tenant,
            np.frombuffer(k.encode(), np.uint8), tenant, self.clocks.steady_ns(), self.lease_ttl_ns,
            o.flags, o.lease_deadline_ns, o.group_next, o.replica_status, o.replica_kind,
            o.replica_segment, self.segments.readable, o.replica_more)
        _raise_code(int(code), f"get_replica_list {key!r}")
        return self._descriptors(int(row), readable_only=True)

    def batch_get_replica_list(self, keys, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        return joined_results(read_in_chunks(self, offsets, data, tenant_id, lambda rows, codes: (
            codes, self._replica_columns(np.arange(rows.size), rows, codes=codes, readable_only=True))))

    @_locked_reading
    def exist_key(self, key: str, tenant_id: str = DEFAULT_TENANT) -> bool:
        """True when a readable replica exists (and then the read lease is granted)."""
        offsets, data = _single_key(key)
        return bool(self._classify_reads(offsets, data, tenant_id)[1][0] == 0)

    def batch_exist_key(self, keys, tenant_id: str = DEFAULT_TENANT) -> np.ndarray:
        offsets, data = string_buffers(self._key_array(keys))
        return joined_codes(read_in_chunks(self, offsets, data, tenant_id, lambda rows, codes: codes == 0))

    def _classify_reads(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str):
        rows = self._lookup(offsets, data, tenant_id)
        codes = np.empty(rows.size, np.int32)
        o = self.objects
        ok.classify_reads(rows, self.clocks.steady_ns(), self.lease_ttl_ns, codes, o.flags,
                          o.lease_deadline_ns, o.group_next, o.replica_status, o.replica_kind,
                          o.replica_segment, self.segments.readable, o.replica_more)
        return rows, codes

    # ================================================================================ removal
    @_locked
    def remove(self, key: str, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> None:
        """Remove one object: OBJECT_HAS_LEASE unless force; REPLICA_IS_NOT_READY while incomplete."""
        offsets, data = _single_key(key)
        _raise_code(int(self._remove(offsets, data, tenant_id, force)[0]), f"remove {key!r}")

    def batch_remove(self, keys, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> np.ndarray:
        """Per-key codes; in chunks (see batch_put_start): an oplog window that fills up refuses
        the chunk it happens in (UNAVAILABLE_IN_CURRENT_STATUS), earlier chunks are removed."""
        offsets, data = string_buffers(self._key_array(keys))
        force = _require_bool("force", force)
        parts = run_in_chunks(self._lock, offsets.size - 1,
                              lambda lo, hi: self._remove(offsets[lo:hi + 1], data, tenant_id, force))
        return joined_codes(parts)

    def _remove(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str, force: bool) -> np.ndarray:
        force = _require_bool("force", force)
        rows = self._lookup(offsets, data, tenant_id)
        codes = np.empty(rows.size, np.int32)
        ok.classify_removals(rows, self.clocks.steady_ns(), force, self.objects.lease_deadline_ns,
                             self.objects.replica_status, codes, self.objects.replica_more)
        removed = np.flatnonzero(codes == 0)
        doomed, first = np.unique(rows[removed], return_index=True)
        repeat = np.ones(removed.size, np.bool_)
        repeat[first] = False
        codes[removed[repeat]] = ErrorCode.OBJECT_NOT_FOUND  # a repeated key: gone by its turn
        done = self._remove_objects(doomed)
        if done < doomed.size:  # oplog window stayed full: those objects were not touched
            codes[removed[np.isin(rows[removed], doomed[done:]) & ~repeat]] = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
        return codes

    def _remove_objects(self, rows: np.ndarray) -> int:
        """Explicit removal: erase now, or with an oplog hide now and free once durable, in
        window-sized reservations. Returns how many of ``rows`` (a prefix) were removed; the
        rest are untouched (the oplog window stayed full)."""
        if self.journal is None:
            self._erase_rows(rows)
            return int(rows.size)
        done = self.journal.hide_then_free(self, rows)
        if done < rows.size:
            self.metrics.inc("remove_oplog_backpressure", int(rows.size - done))
        return done

    def _drop_slots(self, rows: np.ndarray, slots: np.ndarray) -> int:
        """Free the memory extents of replica slots (rows[i], slots[i]) and clear them; returns bytes."""
        if rows.size == 0:
            return 0
        touched = np.unique(self.objects.owners(rows)) if self._ledger_on else rows[:0]  # only the ledger needs them
        self._charge(touched, -1)
        dropped = self._clear_slots(rows, slots)
        self._charge(touched, +1)
        return dropped

    def _clear_slots(self, rows: np.ndarray, slots: np.ndarray) -> int:
        """Clear replica slots and free their memory extents in one merged pass; returns bytes."""
        o, seg = self.objects, self.segments
        segs, offs, lens, dropped = ok.clear_slots(rows, slots, seg.allocatable, o.size_bytes, o.replica_status,
                                                   o.replica_kind, o.replica_segment, o.replica_offset)
        ak.free_extent_list(segs, offs, lens, seg.extent_starts, seg.extent_lengths, seg.extent_counts, seg.used,
                            seg.unit_bits, seg.capacity)
        return int(dropped)

    def _finalize_removed(self, rows: np.ndarray, replica_ids: np.ndarray) -> None:
        """Durable-callback of journaled removals (the writer's thread): free what is still
        REMOVED. It never waits for the master lock, whose holder may be waiting for the very
        window space this durability frees: when the lock is busy the work is queued, and the
        next tick or put_start does it."""
        if not self._lock.acquire(blocking=False):
            self._durable_removals.append((rows, replica_ids))
            return
        try:
            self._finish_durable_removals()
            finalize_removed(self, rows, replica_ids)
        finally:
            self._lock.release()

    def _finish_durable_removals(self) -> None:
        while self._durable_removals:
            finalize_removed(self, *self._durable_removals.popleft())

    @_locked
    def remove_all(self, *, force: bool = False, tenant_id: str | None = None) -> int:
        """Remove every unleased (or, with force, every) complete object; returns the count."""
        rows = self._tenant_rows(tenant_id)
        return self._remove_rows_where_allowed(rows, _require_bool("force", force))

    @_locked
    def remove_by_regex(self, pattern: str, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> int:
        """Remove objects of the tenant whose key matches ``pattern`` (search semantics)."""
        _require_str("pattern", pattern)
        force = _require_bool("force", force)
        rows = self._tenant_rows(_validate_tenant(tenant_id))
        try:
            hit = pc.match_substring_regex(self.keys.keys_of(rows), pattern).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InvalidParams(f"bad regex {pattern!r}: {e}") from None
        return self._remove_rows_where_allowed(rows[hit.astype(bool)], force)

    def _remove_rows_where_allowed(self, rows: np.ndarray, force: bool) -> int:
        codes = np.empty(rows.size, np.int32)
        ok.classify_removals(rows, self.clocks.steady_ns(), force, self.objects.lease_deadline_ns,
                             self.objects.replica_status, codes, self.objects.replica_more)
        doomed = rows[codes == 0]
        done = self._remove_objects(doomed)
        if done < doomed.size:
            raise error_for_code(ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS,
                                 f"oplog window full: {done} of {doomed.size} objects removed, retry for the rest")
        return int(doomed.size)

    def _erase_rows(self, rows: np.ndarray, *, charged: bool = True, slots_cleared: bool = False) -> None:
        """The one erase primitive: every path that drops objects comes here. Refuses (typed,
        nothing changed) a row that is not live or is named twice; then frees the memory
        extents, unlinks groups and keys, cancels offloads, frees in-flight slots and recycles
        the rows. ``charged=False``: the caller already took them off the tenant ledger;
        ``slots_cleared``: the rows hold no replica any more (nothing to free)."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        bad = int(first_not_erasable(rows, self.objects.flags))
        if bad >= 0:  # refuse before anything changes: a stale or repeated row handle
            raise EngineInvariantError("erase_not_live", f"row {int(rows[bad])} is not a distinct live object")
        if charged:
            self._charge(rows, -1)
        if len(self.offloads):
            self.offloads.keep(~np.isin(self.offloads.rows, rows))
        o = self.objects
        if not slots_cleared:
            chain = o.chains(rows).rows
            r_idx, slot = np.nonzero(o.replica_status[chain] != int(ReplicaStatus.UNDEFINED))
            self._clear_slots(chain[r_idx], slot)
        ok.unlink_group_members(rows, self.group_head, o.group_next, o.group, o.flags)
        self.inflight.release(o.inflight[rows])
        self.keys.remove(rows)
        o.release_rows(rows)

    # ================================================================================ helpers
    def _key_array(self, keys) -> pa.Array:
        try:
            arr = as_string_array(keys)
        except (TypeError, UnicodeEncodeError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
            raise InvalidParams(f"keys must be a list of str or a string array: {e}") from None
        if arr.null_count:
            raise InvalidParams("keys must not contain nulls")
        return arr

    def _lookup(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str) -> np.ndarray:
        tenant = self.tenants.find(_require_str("tenant_id", tenant_id))
        n = offsets.size - 1
        if tenant < 0:
            return np.full(n, -1, np.int64)
        return self.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))

    def _put_start_time_ms(self, rows: np.ndarray) -> np.ndarray:
        """System-clock put start of ``rows`` (kept after the put completed, as upstream does:
        it is the version epoch of dynamic replication; 0 where not known)."""
        return self.objects.put_start_ms(rows)

    def _tenant_rows(self, tenant_id: str | None) -> np.ndarray:
        rows = self.objects.live_rows()
        if tenant_id is None:
            return rows
        return rows[self.objects.tenant[rows] == self.tenants.find(_require_str("tenant_id", tenant_id))]

