"""The RPC handlers: each converts a decoded request into a MasterService call and the call's
result into the response value. No lease, allocation or eviction rule lives here; what is here
is upstream's RPC layer (WrappedMasterService): its tenant resolution, its wire enums, its
version string, and the answers of RPCs that have no engine state (FetchTasks, GetFsdir).

Batch calls pass the request's key column to the engine as one Arrow array and encode the
per-key results with kernels/wire.py (:class:`RawBody`).
"""
from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from ..errors import ErrorCode, InvalidParams, MooncakeError
from ..ha.writer import OpLogWriter
from ..kernels import wire as wk
from ..master import MasterService
from ..messages import DEFAULT_TENANT, ReplicateConfig
from ..policies.views import ReplicaColumns
from ..schema import ObjectDataType, PingStatus, ReplicaStatus, SoftPinAction
from ..store.segments import Segment
from .rpc_types import MEMORY_DESCRIPTOR, RPCS, Rpc
from .struct_pack import Err, Expected, KeyColumn, MetaColumn, Vec, width_for

log = logging.getLogger(__name__)

# the client's GetMooncakeStoreVersion(); ServiceReady must answer exactly this or Connect fails
STORE_VERSION = "2.0.0"
_CLIENT_STATUS = {PingStatus.OK: 1, PingStatus.NEED_REMOUNT: 2}  # upstream ClientStatus
_REPLICA_TYPE_MEMORY, _REPLICA_TYPE_ALL = 0, 4  # upstream ReplicaType: the types a memory put ends
_U63 = (1 << 63) - 1
_COMPLETE, _PROCESSING = int(ReplicaStatus.COMPLETE), int(ReplicaStatus.PROCESSING)
_NO_BOOLS = np.zeros(0, np.bool_)


@dataclass(frozen=True)
class RawBody:
    """A response payload encoded here or by a kernel (counts included), sent after the type's
    prologue for ``width``-byte sizes."""

    width: int
    payload: np.ndarray | bytes


_EXISTS = {True: RawBody(1, b"\x01\x01"), False: RawBody(1, b"\x01\x00")}  # expected<bool>: ok, then the bool
_DESCRIPTOR_HEAD = struct.Struct("<QBQQ")  # replica id, variant index (memory), buffer size, buffer address
_I32 = struct.Struct("<i")
_LEASE_TAIL = struct.Struct("<QB")  # lease_ttl_ms, absent checksum


def uuid_text(uuid: tuple[int, int]) -> str:
    """Upstream's UUID (a pair of u64) as the engine's id string ``"<u64>-<u64>"``."""
    return f"{uuid[0]}-{uuid[1]}"


def key_array(keys: KeyColumn) -> pa.Array:
    """A decoded key column as an Arrow large_string array over the same buffers (UTF-8 checked)."""
    arr = pa.Array.from_buffers(pa.large_string(), len(keys), [None, pa.py_buffer(keys.offsets),
                                                               pa.py_buffer(keys.data)])
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise InvalidParams(f"keys are not UTF-8 strings: {e}") from None
    return arr


class MasterHandlers:
    """Upstream's master RPCs over one MasterService; ``handler(function_id)`` finds them."""

    def __init__(self, master: MasterService, *, view_version: Callable[[], int] = lambda: 0,
                 storage_config: tuple[str, bool, int] = ("", True, 0)) -> None:
        self.master = master
        self.view_version = view_version
        self.storage_config = storage_config  # (fsdir, enable_disk_eviction, quota_bytes), upstream's flags
        self.journal_writer: OpLogWriter | None = None  # HA leader: the oplog every change goes to
        self.protocols: dict[str, str] = {}  # segment name -> transport protocol its client mounted it with
        self._by_id: dict[int, tuple[Rpc, Callable[[Any], Any]]] = {
            rpc.function_id: (rpc, getattr(self, "_" + name)) for name, rpc in RPCS.items()}

    def handler(self, function_id: int) -> tuple[Rpc, Callable[[Any], Any]] | None:
        return self._by_id.get(function_id)

    def call(self, rpc: Rpc, fn: Callable[[Any], Any], args: Any) -> Any:
        """Run one handler; an engine error becomes the response's error code (per key in a batch)."""
        try:
            return fn(args)
        except MooncakeError as e:
            return error_response(rpc, args, int(e.code))

    # ---------------------------------------------------------------------- tenants and configs
    def _tenant(self, raw: str) -> str:
        # upstream resolves every tenant to the default one unless multi-tenancy is on
        return raw if self.master.config.enable_multi_tenants else DEFAULT_TENANT

    def _replicate_config(self, rc: tuple, tenant: str) -> ReplicateConfig:
        (replica_num, nof_num, dfs_num, soft_pin_action, soft_pin_ttl_ms, hard_pin, preferred, preferred_one,
         _nof_preferred, _same_node, data_type, _host_id, group_ids) = rc
        if nof_num or dfs_num:
            raise InvalidParams("NoF and DFS replicas are not served by this master")
        if not 1 <= replica_num <= _U63:
            raise InvalidParams(f"replica_num {replica_num} out of range")
        if soft_pin_action not in SoftPinAction._value2member_map_:
            raise InvalidParams(f"unknown soft_pin_action {soft_pin_action}")
        if data_type not in ObjectDataType._value2member_map_:
            raise InvalidParams(f"unknown data_type {data_type}")
        if group_ids is not None and len(group_ids) > 1:
            raise InvalidParams("an object belongs to at most one group")
        segments = tuple(preferred) + ((preferred_one,) if preferred_one and preferred_one not in preferred else ())
        return ReplicateConfig(
            replica_num=int(replica_num), hard_pin=bool(hard_pin), soft_pin_action=SoftPinAction(soft_pin_action),
            soft_pin_ttl_ms=None if soft_pin_ttl_ms is None else int(soft_pin_ttl_ms),
            group_id=group_ids[0] if group_ids else "", tenant_id=tenant, preferred_segments=segments,
            data_type=ObjectDataType(data_type))

    def _descriptor(self, d: Any, status: int) -> tuple:
        protocol = self.protocols.get(d.segment, "tcp")
        return (d.replica_id, (MEMORY_DESCRIPTOR, ((d.size, d.address, protocol, d.endpoint),)), status)

    # ---------------------------------------------------------------------- service
    def _ServiceReady(self, args: None) -> str:
        return STORE_VERSION

    def _GetFsdir(self, args: None) -> str:
        return ""  # no DFS tier

    def _GetStorageConfig(self, args: None) -> tuple:
        return self.storage_config

    def _FetchTasks(self, args: tuple) -> list:
        return []  # the engine schedules no copy or move tasks

    # ---------------------------------------------------------------------- clients and segments
    def _Ping(self, client: tuple[int, int]) -> tuple[int, int]:
        return (self.view_version(), _CLIENT_STATUS[self.master.ping(uuid_text(client))])

    def _segment(self, seg: tuple, client: str) -> Segment:
        segment_id, name, base, size, endpoint, protocol, host_id = seg
        if not protocol or len(protocol) > 64:
            raise InvalidParams(f"bad transport protocol {protocol!r}")
        if base > _U63 or size > _U63 or base + size > 1 << 64:
            raise InvalidParams(f"segment {name!r} does not fit the address space")
        return Segment(name, endpoint, client, base, size, uuid_text(segment_id), host_id)

    def _MountSegment(self, args: tuple) -> None:
        seg_args, client = args
        seg = self._segment(seg_args, uuid_text(client))
        self.master.mount_segment(seg.name, endpoint=seg.endpoint, client_id=seg.client, base=seg.base,
                                  size=seg.size, segment_id=seg.segment_id, host_id=seg.host_id)
        self.protocols[seg.name] = seg_args[5]

    def _ReMountSegment(self, args: tuple) -> None:
        segs_args, client_uuid = args
        client = uuid_text(client_uuid)
        segs = [self._segment(s, client) for s in segs_args]
        report = self.master.remount_segments(client, segs)
        for s, raw in zip(segs, segs_args):
            self.protocols[s.name] = raw[5]
        if report.segments:
            log.info("client %s remounted %d recovered segment(s): %d objects, visible recovery TTL %.0f ms",
                     client, len(report.segments), report.matched_objects, report.visible_ttl_ms)

    def _UnmountSegment(self, args: tuple) -> None:
        segment_id, _client = args
        self.master.unmount_segment_by_id(uuid_text(segment_id))

    # ---------------------------------------------------------------------- puts
    def _PutStart(self, args: tuple) -> list | RawBody:
        client, key, size, rc, tenant = args
        if size > _U63:
            raise InvalidParams(f"size {size} out of range")
        descs = self.master.put_start(key, size, client_id=uuid_text(client),
                                      config=self._replicate_config(rc, self._tenant(tenant)))
        fast = self._replica_list_body(descs, _PROCESSING, None)
        return fast if fast is not None else [self._descriptor(d, _PROCESSING) for d in descs]

    def _check_replica_type(self, replica_type: int) -> None:
        if replica_type not in (_REPLICA_TYPE_MEMORY, _REPLICA_TYPE_ALL):
            raise InvalidParams(f"replica type {replica_type}: only memory replicas are served")

    def _PutEnd(self, args: tuple) -> None:
        client, (key, _checksum), replica_type, tenant = args
        self._check_replica_type(replica_type)
        self.master.put_end(key, client_id=uuid_text(client), tenant_id=self._tenant(tenant))

    def _PutRevoke(self, args: tuple) -> None:
        client, key, replica_type, tenant = args
        self._check_replica_type(replica_type)
        self.master.put_revoke(key, client_id=uuid_text(client), tenant_id=self._tenant(tenant))

    def _BatchPutStart(self, args: tuple) -> RawBody:
        client, keys, sizes, rc, tenant = args
        if len(sizes) != len(keys):
            raise InvalidParams(f"{len(keys)} keys but {len(sizes)} sizes")
        if sizes.size and int(sizes.max()) > _U63:
            raise InvalidParams("a size is out of range")
        codes, replicas = self.master.batch_put_start_columns(
            key_array(keys), sizes.astype(np.int64), client_id=uuid_text(client),
            config=self._replicate_config(rc, self._tenant(tenant)))
        return self._replica_lists(codes, replicas, int(ReplicaStatus.PROCESSING), None)

    def _BatchPutEnd(self, args: tuple) -> RawBody:
        client, metas, replica_type, tenant = args
        assert isinstance(metas, MetaColumn)
        self._check_replica_type(replica_type)
        codes = self.master.batch_put_end(key_array(metas.keys), client_id=uuid_text(client),
                                          tenant_id=self._tenant(tenant)).codes
        return _voids(codes)

    def _BatchPutRevoke(self, args: tuple) -> RawBody:
        client, keys, replica_type, tenant = args
        self._check_replica_type(replica_type)
        client_id, tenant_id = uuid_text(client), self._tenant(tenant)
        codes = np.zeros(len(keys), np.int32)
        # the failure path of a batch put: the engine revokes one key at a time
        for i, key in enumerate(key_array(keys).to_pylist()):
            try:
                self.master.put_revoke(key, client_id=client_id, tenant_id=tenant_id)
            except MooncakeError as e:
                codes[i] = int(e.code)
        return _voids(codes)

    # ---------------------------------------------------------------------- reads
    def _GetReplicaList(self, args: tuple) -> tuple | RawBody:
        key, tenant = args
        descs = self.master.get_replica_list(key, self._tenant(tenant))
        fast = self._replica_list_body(descs, _COMPLETE, self.master.config.default_kv_lease_ttl_ms)
        if fast is not None:
            return fast
        return ([self._descriptor(d, _COMPLETE) for d in descs], self.master.config.default_kv_lease_ttl_ms, None)

    def _replica_list_body(self, descs: list, status: int, lease_ttl_ms: int | None) -> RawBody | None:
        """A single key's replica list written directly (the hot get and put paths), when every
        size fits one byte; None otherwise (the generic encoder then picks the width)."""
        out = bytearray(b"\x01")  # expected: a value
        if len(descs) > 255:
            return None
        out.append(len(descs))
        for d in descs:
            protocol, endpoint = self.protocols.get(d.segment, "tcp").encode(), d.endpoint.encode()
            if len(protocol) > 255 or len(endpoint) > 255:
                return None
            out += _DESCRIPTOR_HEAD.pack(d.replica_id, MEMORY_DESCRIPTOR, d.size, d.address)
            out.append(len(protocol))
            out += protocol
            out.append(len(endpoint))
            out += endpoint
            out += _I32.pack(status)
        if lease_ttl_ms is not None:
            out += _LEASE_TAIL.pack(lease_ttl_ms, 0)
        return RawBody(1, bytes(out))

    def _BatchGetReplicaList(self, args: tuple) -> RawBody:
        keys, tenant = args
        codes, replicas = self.master.batch_get_replica_columns(key_array(keys), self._tenant(tenant))
        return self._replica_lists(codes, replicas, int(ReplicaStatus.COMPLETE),
                                   self.master.config.default_kv_lease_ttl_ms)

    def _ExistKey(self, args: tuple) -> RawBody:
        key, tenant = args
        return _EXISTS[self.master.exist_key(key, self._tenant(tenant))]

    def _BatchExistKey(self, args: tuple) -> RawBody:
        keys, tenant = args
        found = self.master.batch_exist_key(key_array(keys), self._tenant(tenant))
        width = width_for(len(keys))
        return RawBody(width, wk.encode_expected_results(np.zeros(len(keys), np.int32), found, True, width))

    # ---------------------------------------------------------------------- removal
    def _Remove(self, args: tuple) -> None:
        key, force, tenant = args
        self.master.remove(key, tenant_id=self._tenant(tenant), force=force)

    def _BatchRemove(self, args: tuple) -> RawBody:
        keys, force, tenant = args
        return _voids(self.master.batch_remove(key_array(keys), tenant_id=self._tenant(tenant), force=force))

    def _RemoveByRegex(self, args: tuple) -> int:
        pattern, force, tenant = args
        return self.master.remove_by_regex(pattern, tenant_id=self._tenant(tenant), force=force)

    def _RemoveAll(self, args: tuple) -> int:
        force, tenant = args
        # an empty tenant clears every tenant (upstream's legacy form); a tenant-less master has one
        scope = None if tenant == "" or not self.master.config.enable_multi_tenants else tenant
        return self.master.remove_all(force=force, tenant_id=scope)

    # ---------------------------------------------------------------------- batch encoding
    def _replica_lists(self, codes: np.ndarray, replicas: ReplicaColumns, status: int,
                       lease_ttl_ms: int | None) -> RawBody:
        """Encode a batch's per-key replica lists from the engine's replica columns."""
        protocols = [self.protocols.get(name, "tcp").encode() for name in replicas.names]  # per segment
        endpoints = [e.encode() for e in replicas.endpoints]
        key_index = replicas.key_index
        per_key = int(np.bincount(key_index).max()) if key_index.size else 0
        width = width_for(max(codes.size, per_key, *map(len, protocols), *map(len, endpoints)))
        strings = [len(p).to_bytes(width, "little") + p + len(e).to_bytes(width, "little") + e
                   for p, e in zip(protocols, endpoints)]
        offsets = np.zeros(len(strings) + 1, np.int64)
        np.cumsum([len(s) for s in strings], out=offsets[1:])
        blob = np.frombuffer(b"".join(strings), np.uint8) if strings else np.zeros(0, np.uint8)
        payload = wk.encode_replica_lists(
            codes.astype(np.int32, copy=False), key_index.astype(np.int64, copy=False),
            replicas.replica_id.astype(np.uint64, copy=False), replicas.segment_code.astype(np.int64),
            replicas.address.astype(np.int64, copy=False), replicas.size.astype(np.int64, copy=False), blob, offsets,
            status, 0 if lease_ttl_ms is None else lease_ttl_ms, lease_ttl_ms is not None, width)
        if payload.size == 0:
            raise MooncakeError("replica columns not in batch order", code=ErrorCode.INTERNAL_ERROR)
        return RawBody(width, payload)


def _voids(codes: np.ndarray) -> RawBody:
    width = width_for(codes.size)
    return RawBody(width, wk.encode_expected_results(np.asarray(codes, np.int32), _NO_BOOLS, False, width))


def error_response(rpc: Rpc, args: Any, code: int) -> Any:
    """The response of a call that failed as a whole: its error, for every key of a batch."""
    t = rpc.response.type
    if isinstance(t, Expected):
        return Err(code)
    if isinstance(t, Vec):  # a batch: the same error for each of its keys (five bytes whatever the value type)
        n = _batch_size(args)
        width = width_for(n)
        return RawBody(width, wk.encode_expected_results(np.full(n, code, np.int32), _NO_BOOLS, False, width))
    return 0  # RemoveAll: a bare count, no error on the wire


def _batch_size(args: Any) -> int:
    for a in args:
        if isinstance(a, KeyColumn):
            return len(a)
        if isinstance(a, MetaColumn):
            return len(a.keys)
    return 0
