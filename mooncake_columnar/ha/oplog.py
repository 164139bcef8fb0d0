"""OpLog entries and the batch wire codec of the standby path.

An entry carries only what a standby needs to rebuild object metadata and replicas (lease-recovery
RFC, "Standby metadata wire model"): tenant, key, client, size, replica descriptors, data type,
group, hard_pinned, soft_pin_enabled. Leases, soft-pin deadlines, remaining TTLs and read times are
runtime state of the serving primary and are never logged; a promoted primary grants fresh leases.

Wire format of one batch (msgpack map, strict on decode)::

    {"version": STANDBY_WIRE_VERSION, "first_sequence_id": int, "count": int,
     "entries": bin(msgpack list of entry maps), "checksum": crc32}

The entries travel as an opaque byte string so that the checksum covers the exact stored bytes
(upstream re-serializes its JSON to re-check it; that needs a canonical encoder, this does not).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Callable, Union

import msgpack

from ..errors import InvalidParams, OpLogChecksumError, OpLogCorrupt, OpLogGap
from ..schema import MAX_KEY_BYTES, ObjectDataType, ReplicaKind, ReplicaStatus

# The standby wire version is independent of the complete-snapshot versions ("1.0.0", "2.0.0"):
# the RFC forbids the standby path from consuming the snapshot's clock mapping.
STANDBY_WIRE_VERSION = "mooncake-columnar-standby/1"

_U64_MAX = 2**64 - 1
_SEQ_MAX = 2**63 - 1  # sequence ids never wrap here; int64 keeps them exact in every consumer


class OpType(IntEnum):
    """Logged operations; numbers are upstream's ``OpType`` values (those the primary emits)."""

    PUT_END = 1
    REMOVE = 3
    SEGMENT_MOUNT = 5
    SEGMENT_UNMOUNT = 6


# --- field checks shared by constructors (InvalidParams) and the decoder (OpLogCorrupt) ---------

_Check = Callable[[Any], Union[str, None]]


def _u64(v: Any) -> str | None:
    if type(v) is not int:  # bool is an int subclass: reject it explicitly
        return f"expected an integer, got {type(v).__name__}"
    if not 0 <= v <= _U64_MAX:
        return f"{v} is outside [0, 2**64)"
    return None


def _seq(v: Any) -> str | None:
    if type(v) is not int:
        return f"expected an integer, got {type(v).__name__}"
    if not 1 <= v <= _SEQ_MAX:
        return f"sequence id {v} is outside [1, 2**63)"
    return None


def _str(v: Any) -> str | None:
    if type(v) is not str:
        return f"expected a string, got {type(v).__name__}"
    if not v.isascii():
        try:
            v.encode("utf-8")  # lone surrogates cannot travel as msgpack str
        except UnicodeEncodeError:
            return "not encodable as UTF-8"
    return None


def _nonempty_str(v: Any) -> str | None:
    return _str(v) or (None if v else "must not be empty")


def _key(v: Any) -> str | None:
    problem = _nonempty_str(v)
    if problem is None and len(v.encode("utf-8")) > MAX_KEY_BYTES:
        problem = f"longer than {MAX_KEY_BYTES} bytes"
    return problem


def _bool(v: Any) -> str | None:
    return None if type(v) is bool else f"expected a bool, got {type(v).__name__}"


def _enum(cls: type[IntEnum]) -> _Check:
    values = frozenset(int(member) for member in cls)  # membership test: no enum instance per check

    def check(v: Any) -> str | None:
        if type(v) is not int and not isinstance(v, cls):
            return f"expected an integer {cls.__name__}, got {type(v).__name__}"
        if v not in values:
            return f"{v} is not a {cls.__name__}"
        return None

    return check


def _trusted(cls: type, fields: dict[str, Any]) -> Any:
    """Build a frozen dataclass from fields the decoder already checked (skips re-validation)."""
    obj = object.__new__(cls)
    obj.__dict__.update(fields)  # frozen dataclasses keep their fields in __dict__
    return obj


def _require(obj: object, checks: dict[str, _Check]) -> None:
    """Constructor-side validation: the first bad field raises InvalidParams naming it."""
    for name, check in checks.items():
        problem = check(getattr(obj, name))
        if problem is not None:
            raise InvalidParams(f"{type(obj).__name__}.{name}: {problem}")


# --- the data model ------------------------------------------------------------------------------

_REPLICA_CHECKS: dict[str, _Check] = {
    "replica_id": _u64, "kind": _enum(ReplicaKind), "segment": _str, "offset": _u64,
    "size": _u64, "status": _enum(ReplicaStatus), "endpoint": _str,
}
_PUT_END_CHECKS: dict[str, _Check] = {
    "client": _str, "size": _u64,
    "replicas": lambda v: None if isinstance(v, tuple) else f"expected a tuple, got {type(v).__name__}",
    "data_type": _enum(ObjectDataType), "group_id": _str, "hard_pinned": _bool, "soft_pin_enabled": _bool,
}
_SEGMENT_CHECKS: dict[str, _Check] = {"name": _str, "endpoint": _str, "capacity": _u64, "client": _str}


@dataclass(frozen=True)
class ReplicaDescriptor:
    replica_id: int
    kind: int  # ReplicaKind
    segment: str
    offset: int
    size: int
    status: int  # ReplicaStatus
    endpoint: str = ""

    def __post_init__(self) -> None:
        _require(self, _REPLICA_CHECKS)




@dataclass(frozen=True)
class PutEndPayload:
    client: str
    size: int
    replicas: tuple[ReplicaDescriptor, ...]
    data_type: int  # ObjectDataType
    group_id: str
    hard_pinned: bool = False
    soft_pin_enabled: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.replicas, list):  # accept a list, store the hashable tuple
            object.__setattr__(self, "replicas", tuple(self.replicas))
        _require(self, _PUT_END_CHECKS)
        for r in self.replicas:
            if not isinstance(r, ReplicaDescriptor):
                raise InvalidParams(f"PutEndPayload.replicas: {type(r).__name__} is not a ReplicaDescriptor")




@dataclass(frozen=True)
class SegmentPayload:
    name: str
    endpoint: str
    capacity: int
    client: str

    def __post_init__(self) -> None:
        _require(self, _SEGMENT_CHECKS)



Payload = Union[PutEndPayload, SegmentPayload, None]
_OP_CHECK = _enum(OpType)

# Which payload type each op carries (REMOVE carries none, as upstream).
_PAYLOAD_TYPE: dict[OpType, type | None] = {
    OpType.PUT_END: PutEndPayload,
    OpType.REMOVE: None,
    OpType.SEGMENT_MOUNT: SegmentPayload,
    OpType.SEGMENT_UNMOUNT: SegmentPayload,
}


def _validate_body(owner: str, op: Any, tenant: Any, key: Any, payload: Any) -> None:
    for name, check, value in (("op", _OP_CHECK, op), ("tenant", _nonempty_str, tenant), ("key", _key, key)):
        problem = check(value)
        if problem is not None:
            raise InvalidParams(f"{owner}.{name}: {problem}")
    want = _PAYLOAD_TYPE[OpType(op)]
    if (payload is None) != (want is None) or (want is not None and not isinstance(payload, want)):
        expected = "no payload" if want is None else want.__name__
        raise InvalidParams(f"{owner}.payload: {OpType(op).name} carries {expected}, got {type(payload).__name__}")


@dataclass(frozen=True)
class OpLogOp:
    """An entry before the writer assigns its sequence id."""

    op: OpType
    tenant: str
    key: str
    payload: Payload = None

    def __post_init__(self) -> None:
        _validate_body("OpLogOp", self.op, self.tenant, self.key, self.payload)
        object.__setattr__(self, "op", OpType(self.op))

    def at(self, sequence_id: int) -> OpLogEntry:
        problem = _seq(sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogEntry.sequence_id: {problem}")
        # the body was validated when this op was built: only the id is new
        return _trusted(OpLogEntry, dict(sequence_id=sequence_id, op=self.op, tenant=self.tenant, key=self.key,
                                         payload=self.payload))


@dataclass(frozen=True)
class OpLogEntry:
    sequence_id: int
    op: OpType
    tenant: str
    key: str
    payload: Payload = None

    def __post_init__(self) -> None:
        problem = _seq(self.sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogEntry.sequence_id: {problem}")
        _validate_body("OpLogEntry", self.op, self.tenant, self.key, self.payload)
        object.__setattr__(self, "op", OpType(self.op))


@dataclass(frozen=True)
class OpLogBatch:
    """Entries with contiguous sequence ids starting at ``first_sequence_id`` (never empty)."""

    first_sequence_id: int
    entries: tuple[OpLogEntry, ...]
    checksum: int = field(init=False)
    # Encoded entries, computed once; the checksum and encode_batch() both use them.
    _blob: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.entries, list):
            object.__setattr__(self, "entries", tuple(self.entries))
        problem = _seq(self.first_sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogBatch.first_sequence_id: {problem}")
        if not self.entries:
            raise InvalidParams("OpLogBatch.entries: a batch holds at least one entry")
        for i, e in enumerate(self.entries):
            if not isinstance(e, OpLogEntry):
                raise InvalidParams(f"OpLogBatch.entries[{i}]: {type(e).__name__} is not an OpLogEntry")
            if e.sequence_id != self.first_sequence_id + i:
                raise OpLogGap(
                    f"OpLogBatch.entries[{i}]: sequence id {e.sequence_id}, expected {self.first_sequence_id + i}"
                )
        blob = msgpack.packb([_entry_to_wire(e) for e in self.entries], use_bin_type=True)
        object.__setattr__(self, "_blob", blob)
        object.__setattr__(self, "checksum", _checksum(self.first_sequence_id, len(self.entries), blob))

    @property
    def last_sequence_id(self) -> int:
        return self.first_sequence_id + len(self.entries) - 1


def _checksum(first: int, count: int, blob: bytes) -> int:
    # The header ids are covered too: a batch re-labelled to another position must not verify.
    return zlib.crc32(blob, zlib.crc32(struct.pack(">QQ", first, count)))


# --- encode ---------------------------------------------------------------------------------------


def _replica_to_wire(r: ReplicaDescriptor) -> dict[str, Any]:
    return {"replica_id": r.replica_id, "kind": int(r.kind), "segment": r.segment, "offset": r.offset,
            "size": r.size, "status": int(r.status), "endpoint": r.endpoint}


def _payload_to_wire(p: Payload) -> dict[str, Any] | None:
    if p is None:
        return None
    if isinstance(p, PutEndPayload):
        return {"client": p.client, "size": p.size, "replicas": [_replica_to_wire(r) for r in p.replicas],
                "data_type": int(p.data_type), "group_id": p.group_id, "hard_pinned": p.hard_pinned,
                "soft_pin_enabled": p.soft_pin_enabled}
    return {"name": p.name, "endpoint": p.endpoint, "capacity": p.capacity, "client": p.client}


def _entry_to_wire(e: OpLogEntry) -> dict[str, Any]:
    return {"seq": e.sequence_id, "op": int(e.op), "tenant": e.tenant, "key": e.key,
            "payload": _payload_to_wire(e.payload)}


def encode_batch(batch: OpLogBatch) -> bytes:
    return msgpack.packb(
        {"version": STANDBY_WIRE_VERSION, "first_sequence_id": batch.first_sequence_id,
         "count": len(batch.entries), "entries": batch._blob, "checksum": batch.checksum},
        use_bin_type=True,
    )


# --- decode (strict) ------------------------------------------------------------------------------


def _bin(v: Any) -> str | None:
    return None if type(v) is bytes else f"expected bytes, got {type(v).__name__}"


def _fields(m: Any, where: str, checks: dict[str, _Check], defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checked fields of wire map ``m``; missing (without default), extra or ill-typed -> OpLogCorrupt."""
    if type(m) is not dict:
        raise OpLogCorrupt(where, f"expected a map, got {type(m).__name__}")
    extra = sorted(map(repr, set(m) - set(checks)))
    if extra:
        raise OpLogCorrupt(where, f"unknown field(s) {', '.join(extra)}")
    out: dict[str, Any] = {}
    for name, check in checks.items():
        if name not in m:
            if defaults is None or name not in defaults:
                raise OpLogCorrupt(f"{where}.{name}", "missing field")
            out[name] = defaults[name]
            continue
        problem = check(m[name])
        if problem is not None:
            raise OpLogCorrupt(f"{where}.{name}", problem)
        out[name] = m[name]
    return out


def _list(v: Any) -> str | None:
    return None if type(v) is list else f"expected a list, got {type(v).__name__}"


def _any(v: Any) -> None:
    return None


# Payloads written before these flags existed decode with them off (RFC compatibility rule).
_PUT_END_DEFAULTS = {"hard_pinned": False, "soft_pin_enabled": False}
_PUT_END_WIRE = dict(_PUT_END_CHECKS, replicas=_list)
_ENTRY_WIRE: dict[str, _Check] = {"seq": _seq, "op": _enum(OpType), "tenant": _nonempty_str, "key": _key,
                                  "payload": _any}
_BATCH_WIRE: dict[str, _Check] = {"version": _str, "first_sequence_id": _seq, "count": _seq, "entries": _bin,
                                  "checksum": lambda v: _u64(v) or (None if v <= 0xFFFFFFFF else "not a crc32")}


def _payload_from_wire(op: OpType, m: Any, where: str) -> Payload:
    if op is OpType.REMOVE:
        if m is not None:
            raise OpLogCorrupt(where, "REMOVE carries no payload")
        return None
    if op is OpType.PUT_END:
        f = _fields(m, where, _PUT_END_WIRE, _PUT_END_DEFAULTS)
        f["replicas"] = tuple(
            _trusted(ReplicaDescriptor, _fields(r, f"{where}.replicas[{i}]", _REPLICA_CHECKS))
            for i, r in enumerate(f["replicas"])
        )
        return _trusted(PutEndPayload, f)
    return _trusted(SegmentPayload, _fields(m, where, _SEGMENT_CHECKS))


_OPS = {int(op): op for op in OpType}


def decode_batch(data: bytes) -> OpLogBatch:
    """Decode and verify one batch; any deviation raises a subclass of OpLogCorrupt naming it."""
    try:
        top = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise OpLogCorrupt("batch", f"not a msgpack document ({type(exc).__name__}: {exc})") from None
    if type(top) is dict and "version" in top and top["version"] != STANDBY_WIRE_VERSION:
        raise OpLogCorrupt("batch.version", f"{top['version']!r} is not {STANDBY_WIRE_VERSION!r}")
    f = _fields(top, "batch", _BATCH_WIRE)
    first, count, blob = f["first_sequence_id"], f["count"], f["entries"]
    if first + count - 1 > _SEQ_MAX:
        raise OpLogCorrupt("batch.count", f"{count} entries from {first} overflow the sequence space")
    actual = _checksum(first, count, blob)
    if actual != f["checksum"]:
        raise OpLogChecksumError("batch.checksum", f"stored {f['checksum']:#010x}, computed {actual:#010x}")
    try:
        raw_entries = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except Exception as exc:
        raise OpLogCorrupt("batch.entries", f"not a msgpack list ({type(exc).__name__}: {exc})") from None
    if type(raw_entries) is not list or len(raw_entries) != count:
        got = len(raw_entries) if type(raw_entries) is list else type(raw_entries).__name__
        raise OpLogCorrupt("batch.entries", f"expected a list of {count} entries, got {got}")
    entries = []
    for i, m in enumerate(raw_entries):
        where = f"batch.entries[{i}]"
        e = _fields(m, where, _ENTRY_WIRE)
        if e["seq"] != first + i:
            raise OpLogCorrupt(f"{where}.seq", f"sequence id {e['seq']}, expected {first + i} (non-contiguous)")
        op = _OPS[e["op"]]
        payload = _payload_from_wire(op, e["payload"], f"{where}.payload")
        entries.append(_trusted(OpLogEntry, dict(sequence_id=e["seq"], op=op, tenant=e["tenant"], key=e["key"],
                                                 payload=payload)))
    # every field and the contiguity were checked above; keep the verified bytes (no re-encode)
    return _trusted(OpLogBatch, dict(first_sequence_id=first, entries=tuple(entries), checksum=actual, _blob=blob))


def trusted_replica(replica_id: int, kind: int, segment: str, offset: int, size: int, status: int,
                    endpoint: str = "") -> ReplicaDescriptor:
    """A descriptor built from engine columns, which are valid by construction (no re-check:
    the primary's journal builds one per journaled object)."""
    return _trusted(ReplicaDescriptor, dict(replica_id=replica_id, kind=kind, segment=segment, offset=offset,
                                            size=size, status=status, endpoint=endpoint))


def trusted_put_end(client: str, size: int, replicas: tuple[ReplicaDescriptor, ...], data_type: int,
                    group_id: str, hard_pinned: bool, soft_pin_enabled: bool) -> PutEndPayload:
    return _trusted(PutEndPayload, dict(client=client, size=size, replicas=replicas, data_type=data_type,
                                        group_id=group_id, hard_pinned=hard_pinned, soft_pin_enabled=soft_pin_enabled))


def trusted_op(op: OpType, tenant: str, key: str, payload: Payload) -> OpLogOp:
    return _trusted(OpLogOp, dict(op=op, tenant=tenant, key=key, payload=payload))
