"""The per-entry model of the standby oplog: op types, payloads, entries and their field checks.

Entries carry only what a standby needs to rebuild object metadata (lease-recovery RFC, "Standby
metadata wire model"); no lease, soft-pin deadline, remaining TTL or read time. Batches never hold
one of these per entry (see :mod:`.oplog`): they serve hand-built small batches (tests, segment
ops) and the ``OpLogBatch.entries`` view. The checks are shared by the constructors
(InvalidParams) and the wire decoder (OpLogCorrupt).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Callable, Union

from ..errors import InvalidParams
from ..schema import MAX_KEY_BYTES, ObjectDataType, ReplicaKind, ReplicaStatus
from ..store.upstream_ids import is_upstream_uuid

_U64_MAX = 2**64 - 1
_SEQ_MAX = 2**63 - 1  # sequence ids never wrap here; int64 keeps them exact in every consumer


class OpType(IntEnum):
    """Logged operations; numbers are upstream's ``OpType`` values (those the primary emits)."""

    PUT_END = 1
    REMOVE = 3
    SEGMENT_MOUNT = 5
    SEGMENT_UNMOUNT = 6


# --- field checks shared by constructors (InvalidParams) and the decoder (OpLogCorrupt) ---------

FieldCheck = Callable[[Any], Union[str, None]]


def _u64(v: Any) -> str | None:
    if type(v) is not int:  # bool is an int subclass: reject it explicitly
        return f"expected an integer, got {type(v).__name__}"
    if not 0 <= v <= _U64_MAX:
        return f"{v} is outside [0, 2**64)"
    return None


def check_seq(v: Any) -> str | None:
    if type(v) is not int:
        return f"expected an integer, got {type(v).__name__}"
    if not 1 <= v <= _SEQ_MAX:
        return f"sequence id {v} is outside [1, 2**63)"
    return None


def check_str(v: Any) -> str | None:
    if type(v) is not str:
        return f"expected a string, got {type(v).__name__}"
    if not v.isascii():
        try:
            v.encode("utf-8")  # lone surrogates cannot travel as msgpack str
        except UnicodeEncodeError:
            return "not encodable as UTF-8"
    return None


def _nonempty_str(v: Any) -> str | None:
    return check_str(v) or (None if v else "must not be empty")


def _key(v: Any) -> str | None:
    problem = _nonempty_str(v)
    if problem is None and len(v.encode("utf-8")) > MAX_KEY_BYTES:
        problem = f"longer than {MAX_KEY_BYTES} bytes"
    return problem


def _segment_id(v: Any) -> str | None:
    """Upstream's segment UUID string, or "" (a record from before segment ids were logged)."""
    problem = check_str(v)
    if problem is None and v and not is_upstream_uuid(v):
        problem = f"{v!r} is not an upstream UUID string"
    return problem


def _bool(v: Any) -> str | None:
    return None if type(v) is bool else f"expected a bool, got {type(v).__name__}"


def _enum(cls: type[IntEnum]) -> FieldCheck:
    values = frozenset(int(member) for member in cls)  # membership test: no enum instance per check

    def check(v: Any) -> str | None:
        if type(v) is not int and not isinstance(v, cls):
            return f"expected an integer {cls.__name__}, got {type(v).__name__}"
        if v not in values:
            return f"{v} is not a {cls.__name__}"
        return None

    return check


def trusted(cls: type, fields: dict[str, Any]) -> Any:
    """Build a frozen dataclass from fields the decoder already checked (skips re-validation)."""
    obj: Any = object.__new__(cls)
    obj.__dict__.update(fields)  # frozen dataclasses keep their fields in __dict__
    return obj


def _require(obj: object, checks: dict[str, FieldCheck]) -> None:
    """Constructor-side validation: the first bad field raises InvalidParams naming it."""
    for name, check in checks.items():
        problem = check(getattr(obj, name))
        if problem is not None:
            raise InvalidParams(f"{type(obj).__name__}.{name}: {problem}")


# --- the data model ------------------------------------------------------------------------------

_REPLICA_CHECKS: dict[str, FieldCheck] = {
    "replica_id": _u64, "kind": _enum(ReplicaKind), "segment": check_str, "offset": _u64,
    "size": _u64, "status": _enum(ReplicaStatus), "endpoint": check_str,
}
_PUT_END_CHECKS: dict[str, FieldCheck] = {
    "client": check_str, "size": _u64,
    "replicas": lambda v: None if isinstance(v, tuple) else f"expected a tuple, got {type(v).__name__}",
    "data_type": _enum(ObjectDataType), "group_id": check_str, "hard_pinned": _bool, "soft_pin_enabled": _bool,
    "put_start_time_ms": _u64,
}
_SEGMENT_CHECKS: dict[str, FieldCheck] = {"name": check_str, "endpoint": check_str, "capacity": _u64,
                                          "client": check_str, "segment_id": _segment_id,
                                          "host_id": check_str}
# fields a SEGMENT_MOUNT/UNMOUNT written before they existed lacks (decoded as "")
SEGMENT_OPTIONAL = frozenset({"segment_id", "host_id"})


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
    put_start_time_ms: int = 0  # system ms (upstream's version epoch); 0: not recorded

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
    segment_id: str = ""  # upstream segment UUID string ("" in records written before it)
    host_id: str = ""

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
        problem = check_seq(sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogEntry.sequence_id: {problem}")
        # the body was validated when this op was built: only the id is new
        return trusted(OpLogEntry, dict(sequence_id=sequence_id, op=self.op, tenant=self.tenant, key=self.key,
                                         payload=self.payload))


@dataclass(frozen=True)
class OpLogEntry:
    sequence_id: int
    op: OpType
    tenant: str
    key: str
    payload: Payload = None

    def __post_init__(self) -> None:
        problem = check_seq(self.sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogEntry.sequence_id: {problem}")
        _validate_body("OpLogEntry", self.op, self.tenant, self.key, self.payload)
        object.__setattr__(self, "op", OpType(self.op))
