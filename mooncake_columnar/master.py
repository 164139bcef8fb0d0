"""MasterService: validates requests, takes the one lock, reads the clock once, calls kernels.

Upstream semantics (Mooncake Store master) with steady-clock int64-ns leases (RFC Phase 2).
Single-key calls raise the typed error of their code; batch calls return int32 codes.
"""
from __future__ import annotations

import functools
import re
import threading
from typing import TYPE_CHECKING, Callable, Iterable, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .clock import NS_PER_MS, NS_PER_S, Clocks, MonotonicClocks
from .config import MAX_TTL_MS, MasterConfig
from .errors import (ErrorCode, InvalidParams, SegmentAlreadyExists, UnavailableInCurrentStatus,
                     error_for_code)
from .kernels import allocation as ak
from .kernels import objects as ok
from .metrics import Metrics
from .messages import (DEFAULT_TENANT, BatchResult, ObjectInfo, ReplicaDescriptor, ReplicateConfig)
from .schema import (FLAG_GROUPED, FLAG_HARD_PINNED, FLAG_LIVE, FLAG_PENDING_SOFT_PIN,
                     FLAG_PROCESSING, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY, MAX_KEY_BYTES,
                     OBJECTS_ARROW_SCHEMA, ST_PROCESSING, ObjectDataType, PingStatus,
                     ReplicaKind, ReplicaStatus, SoftPinAction)
from .store.keys import KeyIndex, as_string_array, string_buffers
from .store.inflight import InflightTable
from .store.objects import ObjectTable
from .store.arrow_io import export_tables, load_tables
from .store.segments import Segment, SegmentTable
from .store.strings import StringDictionary

if TYPE_CHECKING:
    from .snapshots.state import SnapshotState

T = TypeVar("T")
_KINDS = {int(k): k for k in ReplicaKind}
_STATUSES = {int(s): s for s in ReplicaStatus}
_COMPLETE = int(ReplicaStatus.COMPLETE)
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")


def _locked(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(self: "MasterService", *args, **kwargs):
        with self._lock:
            return fn(self, *args, **kwargs)
    return wrapper


def _require_str(name: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidParams(f"{name} must be a str, got {type(value).__name__}")
    if not allow_empty and value == "":
        raise InvalidParams(f"{name} must not be empty")
    return value


def _require_int(name: str, value: object, lo: int, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParams(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise InvalidParams(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def _require_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParams(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def _validate_tenant(tenant: object) -> str:
    """Upstream TenantId validity: non-empty, no leading '_', printable ASCII."""
    t = _require_str("tenant_id", tenant)
    if t.startswith("_") or not _PRINTABLE.match(t):
        raise InvalidParams(f"invalid tenant_id {t!r}")
    return t


def _single_key(key: object) -> tuple[np.ndarray, np.ndarray]:
    """One key as (offsets, data) arrays, the shape every batch kernel takes."""
    k = _require_str("key", key)
    data = np.frombuffer(k.encode(), np.uint8)
    if data.size > MAX_KEY_BYTES:
        raise InvalidParams(f"key longer than {MAX_KEY_BYTES} bytes")
    return np.array([0, data.size], np.int64), data


def _raise_code(code: int, what: str) -> None:
    if code != 0:
        raise error_for_code(code, what)


class MasterService:
    """Object metadata of a Mooncake Store master, as columns."""

    def __init__(self, config: MasterConfig | None = None, *, clocks: Clocks | None = None,
                 initial_capacity: int = 1024) -> None:
        if config is None:
            config = MasterConfig()
        if not isinstance(config, MasterConfig):
            raise InvalidParams("config must be a MasterConfig")
        self.config = config
        self.clocks: Clocks = clocks if clocks is not None else MonotonicClocks()
        self._lock = threading.RLock()
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
        self.metrics = Metrics()
        self._ok_clients: set[str] = set()
        self._client_deadline_ns: dict[str, int] = {}
        # Replicas of abandoned puts: space stays allocated until release_at (system ms), as upstream.
        self._discarded_seg = np.empty(0, np.int64)
        self._discarded_off = np.empty(0, np.int64)
        self._discarded_size = np.empty(0, np.int64)
        self._discarded_release_ms = np.empty(0, np.int64)

    # ---- derived config ---------------------------------------------------------------------
    @property
    def lease_ttl_ns(self) -> int:
        return self.config.default_kv_lease_ttl_ms * NS_PER_MS

    # ================================================================================ segments
    @_locked
    def mount_segment(self, name: str, *, endpoint: str, client_id: str, base: int, size: int) -> None:
        """Mount a memory segment. Re-mounting an identical segment is a no-op."""
        seg = Segment(_require_str("name", name), _require_str("endpoint", endpoint),
                      _require_str("client_id", client_id), _require_int("base", base, 1),
                      _require_int("size", size, 1))
        now = self.clocks.steady_ns()
        self._touch_client(seg.client, now)
        existing = self.segments.get(seg.name)
        if existing is not None:
            if existing == seg:
                return
            raise SegmentAlreadyExists(f"segment {seg.name!r} is mounted with different parameters")
        self.segments.mount(seg)

    @_locked
    def unmount_segment(self, name: str) -> None:
        """Unmount: its replicas are dropped at once; objects left without replicas are removed."""
        code = self.segments.code(_require_str("name", name))
        if code < 0:
            return  # idempotent, as upstream
        self._unmount_codes([code])

    def _unmount_codes(self, codes: Iterable[int]) -> None:
        o = self.objects
        for code in codes:
            self.segments.allocatable[code] = False  # allocator dropped: nothing on it is freed
            emptied = ok.drop_slots_on_segment(code, o.high_water, o.flags, o.replica_segment,
                                               o.replica_status, o.replica_kind)
            self._erase_rows(emptied)
            keep = self._discarded_seg != code
            self._drop_discarded(keep)
            self.segments.unmount(code)

    @_locked
    def ping(self, client_id: str) -> PingStatus:
        """OK for a client that has remounted; NEED_REMOUNT otherwise (upstream Ping)."""
        client = _require_str("client_id", client_id)
        self._touch_client(client, self.clocks.steady_ns())
        return PingStatus.OK if client in self._ok_clients else PingStatus.NEED_REMOUNT

    @_locked
    def remount_segments(self, client_id: str, segments: Sequence[Segment | dict]) -> int:
        """The client's answer to NEED_REMOUNT: mount its segments (idempotent) and mark it OK.

        Returns the number of segments newly mounted. All segments are validated first; a bad
        one raises and mounts nothing.
        """
        client = _require_str("client_id", client_id)
        parsed = []
        for s in segments:
            seg = s if isinstance(s, Segment) else Segment(**s) if isinstance(s, dict) else None
            if seg is None:
                raise InvalidParams("segments must be Segment or dict items")
            seg = Segment(_require_str("name", seg.name), _require_str("endpoint", seg.endpoint),
                          _require_str("client", seg.client), _require_int("base", seg.base, 1),
                          _require_int("size", seg.size, 1))
            if seg.client != client:
                raise InvalidParams(f"segment {seg.name!r} belongs to client {seg.client!r}, not {client!r}")
            existing = self.segments.get(seg.name)
            if existing is not None and existing != seg:
                raise InvalidParams(f"segment {seg.name!r} is mounted with a different identity")
            parsed.append(seg)
        now = self.clocks.steady_ns()
        self._touch_client(client, now)
        mounted = 0
        for seg in parsed:
            if self.segments.get(seg.name) is None:
                self.segments.mount(seg)
                mounted += 1
        self._ok_clients.add(client)
        return mounted

    def _touch_client(self, client: str, now: int) -> None:
        self._client_deadline_ns[client] = now + self.config.client_live_ttl_s * NS_PER_S

    @_locked
    def expire_clients(self) -> list[str]:
        """Clients silent for client_live_ttl_s: forget them and unmount their segments."""
        now = self.clocks.steady_ns()
        expired = [c for c, d in self._client_deadline_ns.items() if d < now]
        for client in expired:
            del self._client_deadline_ns[client]
            self._ok_clients.discard(client)
            self._unmount_codes(self.segments.codes_of_client(client))
        return expired

    @_locked
    def tick(self) -> None:
        """One round of background work (the engine's threads call this; tests call it directly)."""
        self.expire_clients()
        self._release_discarded(self.clocks.system_ns() // NS_PER_MS)

    # ================================================================================ puts
    def _resolve_put_config(self, config: ReplicateConfig) -> tuple[int, int, int]:
        """Validate a ReplicateConfig; returns (tenant code, flags, pending soft-pin ttl ns)."""
        if not isinstance(config, ReplicateConfig):
            raise InvalidParams("config must be a ReplicateConfig")
        _require_int("replica_num", config.replica_num, 1, 64)
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

    @_locked
    def put_start(self, key: str, size: int, *, client_id: str,
                  config: ReplicateConfig = ReplicateConfig()) -> list[ReplicaDescriptor]:
        """Allocate PROCESSING replicas for a new object; returns their descriptors."""
        offsets, data = _single_key(key)
        size = _require_int("size", size, 1)
        codes, rows = self._put_start(offsets, data, np.array([size], np.int64),
                                      _require_str("client_id", client_id), config)
        _raise_code(int(codes[0]), f"put_start {key!r}")
        return self._descriptors(int(rows[0]), readable_only=False)

    @_locked
    def batch_put_start(self, keys, sizes, *, client_id: str,
                        config: ReplicateConfig = ReplicateConfig()) -> BatchResult:
        """Vectorized put_start with one config for every key; per-key codes and replica table."""
        arr = self._key_array(keys)
        offsets, data = string_buffers(arr)
        sizes = np.asarray(sizes)
        if sizes.shape != (len(arr),) or not np.issubdtype(sizes.dtype, np.integer):
            raise InvalidParams("sizes must be an integer array with one size per key")
        codes, rows = self._put_start(offsets, data, sizes.astype(np.int64),
                                      _require_str("client_id", client_id), config)
        return BatchResult(codes, self._replica_table(np.flatnonzero(codes == 0), rows, readable_only=False))

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
        self._release_discarded(now_ms)

        discard_ms = self.config.put_start_discard_timeout_s * 1000
        oldest = self.inflight.oldest_put_start_ms()
        if oldest is not None and oldest + discard_ms < now_ms:
            # some in-flight put may be abandoned: find existing keys first and discard those
            found = self.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))
            exists = (found >= 0) & (codes == 0)
            rows = found[exists]
            has_complete = (o.replica_status[rows] == _COMPLETE).any(axis=1)
            blocked = has_complete | (self._put_start_time_ms(rows) + discard_ms >= now_ms)
            codes[np.flatnonzero(exists)[blocked]] = ErrorCode.OBJECT_ALREADY_EXISTS
            self._discard_puts(np.unique(rows[~blocked]), now_ms)
        # otherwise every existing key is complete or recent: the insert kernel reports it

        picks = np.flatnonzero(codes == 0)
        if picks.size == 0:
            return codes, rows_out
        o.ensure_slots(config.replica_num)
        preferred = np.array([self.segments.code(s) for s in config.preferred_segments], np.int64)
        free_rows = o.take_rows(picks.size)
        self.keys.reserve(picks.size, int((offsets[picks + 1] - offsets[picks]).sum()))
        seg = self.segments
        used, arena_used, self.next_replica_id = ok.insert_new_puts(
            picks, offsets, data, tenant, sizes, config.replica_num, preferred, free_rows,
            self.keys.table, self.keys.arena, self.keys.arena_used, o.key_ref, o.tenant,
            seg.allocatable, seg.capacity, seg.used, seg.extent_starts, seg.extent_lengths, seg.extent_counts,
            o.replica_segment, o.replica_offset, o.replica_status, o.replica_kind, o.replica_id,
            self.next_replica_id, codes, rows_out)
        o.release_rows(free_rows[used:])
        self.keys.note_inserted(int(used), int(arena_used))
        new = free_rows[:used]
        o.size_bytes[new] = sizes[picks[codes[picks] == 0]]
        o.client[new] = self.clients.code(client)
        slots = self.inflight.take(new.size)
        o.inflight[new] = slots
        self.inflight.put_start_time_ms[slots] = now_ms
        self.inflight.pending_soft_pin_ttl_ns[slots] = pending_ttl_ns
        o.flags[new] = flags
        o.data_type[new] = int(config.data_type)
        if config.group_id and used:
            gcode = self._group_code(config.tenant_id, config.group_id)
            ok.link_group_members(new, gcode, self.group_head, o.group_next, o.group, o.flags)
        return codes, rows_out

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

    @_locked
    def batch_put_end(self, keys, *, client_id: str, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        return BatchResult(self._put_end(offsets, data, _require_str("client_id", client_id), tenant_id))

    def _put_end(self, offsets: np.ndarray, data: np.ndarray, client: str, tenant_id: str) -> np.ndarray:
        rows = self._lookup(offsets, data, tenant_id)
        now = self.clocks.steady_ns()
        o = self.objects
        codes = np.where(rows < 0, np.int32(ErrorCode.OBJECT_NOT_FOUND), np.int32(0)).astype(np.int32)
        released = np.full(rows.size, -1, np.int64)
        ok.complete_puts(rows, self.clients.find(client), now, codes, o.flags, o.client,
                         o.lease_deadline_ns, o.soft_pin_deadline_ns, o.replica_status,
                         o.inflight, self.inflight.pending_soft_pin_ttl_ns, released)
        self.inflight.release(released)
        return codes

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
        st = o.replica_status[row]
        in_use = st != int(ReplicaStatus.UNDEFINED)
        if not (o.flags[row] & FLAG_PROCESSING) or (st[in_use] != int(ST_PROCESSING)).any():
            _raise_code(ErrorCode.INVALID_WRITE, f"put_revoke {key!r}: not an in-progress put")
        self._erase_rows(np.array([row], np.int64))

    def _discard_puts(self, rows: np.ndarray, now_ms: int) -> None:
        """Abandoned puts: PROCESSING replicas keep their space until put_start + release timeout."""
        if rows.size == 0:
            return
        o = self.objects
        st = o.replica_status[rows]
        r_idx, slot = np.nonzero((st == int(ST_PROCESSING)) & (o.replica_kind[rows] == int(KIND_MEMORY)))
        held = rows[r_idx]
        release = self._put_start_time_ms(held) + self.config.put_start_release_timeout_s * 1000
        self._discarded_seg = np.concatenate((self._discarded_seg, o.replica_segment[held, slot].astype(np.int64)))
        self._discarded_off = np.concatenate((self._discarded_off, o.replica_offset[held, slot]))
        self._discarded_size = np.concatenate((self._discarded_size, o.size_bytes[held]))
        self._discarded_release_ms = np.concatenate((self._discarded_release_ms, release))
        o.replica_status[held, slot] = int(ReplicaStatus.UNDEFINED)  # not freed by the erase below
        self._erase_rows(rows)

    def _release_discarded(self, now_ms: int) -> None:
        due = self._discarded_release_ms <= now_ms
        if not due.any():
            return
        seg = self.segments
        ak.free_extent_list(self._discarded_seg[due], self._discarded_off[due], self._discarded_size[due],
                            seg.extent_starts, seg.extent_lengths, seg.extent_counts, seg.used)
        self._drop_discarded(~due)

    def _drop_discarded(self, keep: np.ndarray) -> None:
        self._discarded_seg = self._discarded_seg[keep]
        self._discarded_off = self._discarded_off[keep]
        self._discarded_size = self._discarded_size[keep]
        self._discarded_release_ms = self._discarded_release_ms[keep]

    # ================================================================================ reads
    @_locked
    def get_replica_list(self, key: str, tenant_id: str = DEFAULT_TENANT) -> list[ReplicaDescriptor]:
        """Readable replicas of the object; grants the read lease (group rule)."""
        k = key if type(key) is str and key else _require_str("key", key)
        tenant = self.tenants.find(tenant_id if type(tenant_id) is str else _require_str("tenant_id", tenant_id))
        o = self.objects
        code, row = ok.find_and_classify_read(
            self.keys.table, self.keys.arena, o.key_ref, o.tenant,
            np.frombuffer(k.encode(), np.uint8), tenant, self.clocks.steady_ns(), self.lease_ttl_ns,
            o.flags, o.lease_deadline_ns, o.group_next, o.replica_status, o.replica_kind,
            o.replica_segment, self.segments.readable)
        _raise_code(int(code), f"get_replica_list {key!r}")
        return self._descriptors(int(row), readable_only=True)

    @_locked
    def batch_get_replica_list(self, keys, tenant_id: str = DEFAULT_TENANT) -> BatchResult:
        offsets, data = string_buffers(self._key_array(keys))
        rows, codes = self._classify_reads(offsets, data, tenant_id)
        return BatchResult(codes, self._replica_table(np.arange(rows.size), rows, codes=codes, readable_only=True))

    @_locked
    def exist_key(self, key: str, tenant_id: str = DEFAULT_TENANT) -> bool:
        """True when a readable replica exists (and then the read lease is granted)."""
        offsets, data = _single_key(key)
        return bool(self._classify_reads(offsets, data, tenant_id)[1][0] == 0)

    @_locked
    def batch_exist_key(self, keys, tenant_id: str = DEFAULT_TENANT) -> np.ndarray:
        offsets, data = string_buffers(self._key_array(keys))
        return self._classify_reads(offsets, data, tenant_id)[1] == 0

    def _classify_reads(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str):
        rows = self._lookup(offsets, data, tenant_id)
        codes = np.empty(rows.size, np.int32)
        o = self.objects
        ok.classify_reads(rows, self.clocks.steady_ns(), self.lease_ttl_ns, codes, o.flags,
                          o.lease_deadline_ns, o.group_next, o.replica_status, o.replica_kind,
                          o.replica_segment, self.segments.readable)
        return rows, codes

    # ================================================================================ removal
    @_locked
    def remove(self, key: str, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> None:
        """Remove one object: OBJECT_HAS_LEASE unless force; REPLICA_IS_NOT_READY while incomplete."""
        offsets, data = _single_key(key)
        _raise_code(int(self._remove(offsets, data, tenant_id, force)[0]), f"remove {key!r}")

    @_locked
    def batch_remove(self, keys, *, tenant_id: str = DEFAULT_TENANT, force: bool = False) -> np.ndarray:
        offsets, data = string_buffers(self._key_array(keys))
        return self._remove(offsets, data, tenant_id, force)

    def _remove(self, offsets: np.ndarray, data: np.ndarray, tenant_id: str, force: bool) -> np.ndarray:
        force = _require_bool("force", force)
        rows = self._lookup(offsets, data, tenant_id)
        codes = np.empty(rows.size, np.int32)
        ok.classify_removals(rows, self.clocks.steady_ns(), force, self.objects.lease_deadline_ns,
                             self.objects.replica_status, codes)
        self._erase_rows(np.unique(rows[codes == 0]))
        return codes

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
                             self.objects.replica_status, codes)
        doomed = rows[codes == 0]
        self._erase_rows(doomed)
        return int(doomed.size)

    def _erase_rows(self, rows: np.ndarray) -> None:
        """Drop objects: free their memory extents, unlink groups and keys, recycle rows."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        o = self.objects
        seg = self.segments
        st = o.replica_status[rows]
        segs = o.replica_segment[rows]
        live_mem = (st != int(ReplicaStatus.UNDEFINED)) & (o.replica_kind[rows] == int(KIND_MEMORY)) & (segs >= 0)
        live_mem &= seg.allocatable[np.where(segs >= 0, segs, 0)]
        r_idx, slot = np.nonzero(live_mem)
        ak.free_extent_list(segs[r_idx, slot].astype(np.int64), o.replica_offset[rows[r_idx], slot],
                            o.size_bytes[rows[r_idx]], seg.extent_starts, seg.extent_lengths,
                            seg.extent_counts, seg.used)
        ok.unlink_group_members(rows, self.group_head, o.group_next, o.group, o.flags)
        self.inflight.release(o.inflight[rows])
        self.keys.remove(rows)
        o.release_rows(rows)

    # ================================================================================ inspection
    @_locked
    def object_info(self, key: str, tenant_id: str = DEFAULT_TENANT) -> ObjectInfo:
        """Deadlines (steady ns), flags and every replica with its readability."""
        offsets, data = _single_key(key)
        row = int(self._lookup(offsets, data, tenant_id)[0])
        if row < 0:
            _raise_code(ErrorCode.OBJECT_NOT_FOUND, f"object_info {key!r}")
        o = self.objects
        f = int(o.flags[row])
        return ObjectInfo(
            tenant=self.tenants.name(int(o.tenant[row])), key=key,
            client=self.clients.name(int(o.client[row])), size=int(o.size_bytes[row]),
            data_type=int(o.data_type[row]),
            group_id=self._group_names[int(o.group[row])] if f & FLAG_GROUPED else "",
            hard_pinned=bool(f & FLAG_HARD_PINNED), soft_pin_enabled=bool(f & FLAG_SOFT_PIN_ENABLED),
            lease_deadline_ns=int(o.lease_deadline_ns[row]),
            soft_pin_deadline_ns=int(o.soft_pin_deadline_ns[row]),
            processing=bool(f & FLAG_PROCESSING),
            put_start_time_ms=int(self._put_start_time_ms(np.array([row]))[0]),
            replicas=tuple(self._descriptors(row, readable_only=False)))

    @_locked
    def to_arrow(self) -> pa.Table:
        """The object table (one row per object, ordered by row) as a pyarrow Table."""
        return self._objects_table()

    @_locked
    def export_state(self) -> "SnapshotState":
        """The whole state as Arrow tables (steady-ns deadlines of this process)."""
        from .snapshots.state import SnapshotState
        objects, replicas, segments = export_tables(self)
        return SnapshotState(objects, replicas, segments, self.next_replica_id)

    @classmethod
    def from_state(cls, state: "SnapshotState", *, config: MasterConfig | None = None,
                   clocks: Clocks | None = None, segments_readable: bool = True) -> "MasterService":
        """A master rebuilt from a validated SnapshotState whose deadlines are already in this
        process's steady domain. ``segments_readable=False`` restores every segment with an
        invalid endpoint (standby promotion: unreadable until its client remounts)."""
        state.validate()
        m = cls(config, clocks=clocks, initial_capacity=max(1024, state.objects.num_rows))
        load_tables(m, state.objects, state.replicas, state.segments, segments_readable=segments_readable)
        m.next_replica_id = max(m.next_replica_id, int(state.replica_next_id))
        now = m.clocks.steady_ns()
        for client in set(state.segments.column("client").to_pylist()):
            m._touch_client(client, now)  # restored clients must ping within client_live_ttl_s
        return m

    def _objects_table(self) -> pa.Table:
        o = self.objects
        rows = o.live_rows()
        f = o.flags[rows]
        group = np.where((f & FLAG_GROUPED) != 0, o.group[rows], -1)
        cols = {
            "tenant": self.tenants.decode(o.tenant[rows]),
            "key": self.keys.keys_of(rows).cast(pa.string()),
            "client": self.clients.decode(o.client[rows]),
            "size_bytes": o.size_bytes[rows],
            "data_type": o.data_type[rows],
            "group": pa.array(self._group_names + [""], pa.string()).take(
                pa.array(np.where(group < 0, len(self._group_names), group).astype(np.int32))),
            "hard_pinned": (f & FLAG_HARD_PINNED) != 0,
            "soft_pin_enabled": (f & FLAG_SOFT_PIN_ENABLED) != 0,
            "lease_deadline_ns": o.lease_deadline_ns[rows],
            "soft_pin_deadline_ns": o.soft_pin_deadline_ns[rows],
            "put_start_time_ms": self._put_start_time_ms(rows),
            "processing": (f & FLAG_PROCESSING) != 0,
            "replica_count": (o.replica_status[rows] != 0).sum(axis=1).astype(np.int32),
        }
        return pa.table(cols, schema=OBJECTS_ARROW_SCHEMA)

    @_locked
    def object_count(self) -> int:
        return self.objects.live_count

    @_locked
    def segment_usage(self) -> dict[str, tuple[int, int]]:
        """name -> (used bytes, capacity bytes)."""
        s = self.segments
        return {info.name: (int(s.used[c]), int(s.capacity[c])) for c, info in enumerate(s.info) if info}

    @_locked
    def metadata_bytes(self) -> dict[str, int]:
        """Resident bytes of the metadata (columns, index, dictionaries), key bytes separately."""
        return {"columns": self.objects.resident_bytes(), "index": self.keys.resident_bytes(),
                "inflight": self.inflight.resident_bytes(), "key_bytes": int(self.keys.arena_used)}

    # ================================================================================ helpers
    def _key_array(self, keys) -> pa.Array:
        try:
            arr = as_string_array(keys)
        except (TypeError, pa.ArrowInvalid, pa.ArrowTypeError) as e:
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
        """System-clock put start of in-flight rows; 0 once the put completed (not kept)."""
        slots = self.objects.inflight[rows]
        return np.where(slots >= 0, self.inflight.put_start_time_ms[np.maximum(slots, 0)], 0)

    def _tenant_rows(self, tenant_id: str | None) -> np.ndarray:
        rows = self.objects.live_rows()
        if tenant_id is None:
            return rows
        return rows[self.objects.tenant[rows] == self.tenants.find(_require_str("tenant_id", tenant_id))]

    def _descriptors(self, row: int, *, readable_only: bool) -> list[ReplicaDescriptor]:
        # on the single-key read path: plain lists and tuple lookups, no per-slot NumPy scalars
        o = self.objects
        statuses = o.replica_status[row].tolist()
        seg_codes = o.replica_segment[row].tolist()
        readable_mask = self.segments.readable
        out = []
        for j, st in enumerate(statuses):
            if st == 0:
                continue
            code = seg_codes[j]
            readable = st == _COMPLETE and code >= 0 and bool(readable_mask[code])
            if readable_only and not readable:
                continue
            seg = self.segments.info[code]
            out.append(ReplicaDescriptor(int(o.replica_id[row, j]), _KINDS[o.replica_kind[row, j]],
                                         _STATUSES[st], seg.name, seg.endpoint,
                                         seg.base + int(o.replica_offset[row, j]), int(o.size_bytes[row]),
                                         readable))
        return out

    def _replica_table(self, batch_idx: np.ndarray, rows: np.ndarray, *, readable_only: bool,
                       codes: np.ndarray | None = None) -> pa.Table:
        """Flat replica descriptors of rows[batch_idx] (readable ones only, or all slots in use)."""
        o = self.objects
        if codes is None:
            codes = np.zeros(rows.size, np.int32)
        sel = np.zeros(rows.size, np.int32) - 1
        sel[batch_idx] = codes[batch_idx]
        if readable_only:
            ki, r, j = ok.readable_slots(rows, sel, o.replica_status, o.replica_kind, o.replica_segment,
                                         self.segments.readable)
        else:
            chosen = rows[batch_idx]
            ri, j = np.nonzero(o.replica_status[chosen] != 0)
            ki, r = batch_idx[ri], chosen[ri]
        seg_codes = o.replica_segment[r, j]
        names = [s.name if s else "" for s in self.segments.info]
        endpoints = [s.endpoint if s else "" for s in self.segments.info]
        bases = np.array([s.base if s else 0 for s in self.segments.info], np.int64)
        return pa.table({
            "key_index": ki,
            "replica_id": o.replica_id[r, j],
            "segment": pa.array(names, pa.string()).take(pa.array(seg_codes)),
            "endpoint": pa.array(endpoints, pa.string()).take(pa.array(seg_codes)),
            "address": (bases[seg_codes] if bases.size else np.zeros(0, np.int64)) + o.replica_offset[r, j],
            "size": o.size_bytes[r],
        })
