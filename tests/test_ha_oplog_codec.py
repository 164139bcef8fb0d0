"""OpLog entry model and batch codec: round trips, strict decoding, the RFC's no-lease wire rule."""
from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_columnar.errors import InvalidParams, OpLogChecksumError, OpLogCorrupt, OpLogGap
from mooncake_columnar.ha import oplog
from mooncake_columnar.ha.oplog import (
    STANDBY_WIRE_VERSION,
    OpLogBatch,
    OpLogEntry,
    OpLogOp,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    SegmentPayload,
    decode_batch,
    encode_batch,
)
from mooncake_columnar.schema import MAX_KEY_BYTES, ObjectDataType, ReplicaKind, ReplicaStatus

u64 = st.integers(0, 2**64 - 1)
text = st.text(max_size=12)
replicas = st.builds(
    ReplicaDescriptor, replica_id=u64, kind=st.sampled_from(ReplicaKind), segment=text, offset=u64, size=u64,
    status=st.sampled_from(ReplicaStatus), endpoint=text,
)
put_end = st.builds(
    PutEndPayload, client=text, size=u64, replicas=st.lists(replicas, max_size=3).map(tuple),
    data_type=st.sampled_from(ObjectDataType), group_id=text, hard_pinned=st.booleans(),
    soft_pin_enabled=st.booleans(),
)
segment = st.builds(SegmentPayload, name=text, endpoint=text, capacity=u64, client=text)
ops = st.one_of(
    st.builds(OpLogOp, op=st.just(OpType.PUT_END), tenant=st.text(min_size=1, max_size=8),
              key=st.text(min_size=1, max_size=16), payload=put_end),
    st.builds(OpLogOp, op=st.just(OpType.REMOVE), tenant=st.text(min_size=1, max_size=8),
              key=st.text(min_size=1, max_size=16)),
    st.builds(OpLogOp, op=st.sampled_from([OpType.SEGMENT_MOUNT, OpType.SEGMENT_UNMOUNT]),
              tenant=st.just("default"), key=st.text(min_size=1, max_size=16), payload=segment),
)


@st.composite
def batches(draw: st.DrawFn) -> OpLogBatch:
    first = draw(st.integers(1, 2**63 - 100))
    body = draw(st.lists(ops, min_size=1, max_size=6))
    return OpLogBatch(first, tuple(o.at(first + i) for i, o in enumerate(body)))


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def sample_batch(first: int = 7) -> OpLogBatch:
    ep = "10.0.0.1:1"
    rep = ReplicaDescriptor(11, ReplicaKind.MEMORY, "seg-a", 4096, 100, ReplicaStatus.COMPLETE, ep)
    put = PutEndPayload("c1", 100, (rep,), ObjectDataType.KVCACHE, "g1", hard_pinned=True, soft_pin_enabled=True)
    return OpLogBatch(first, (
        OpLogEntry(first, OpType.SEGMENT_MOUNT, "default", ep, SegmentPayload("seg-a", ep, 1 << 30, "c1")),
        OpLogEntry(first + 1, OpType.PUT_END, "default", "k1", put),
        OpLogEntry(first + 2, OpType.REMOVE, "t2", "k2"),
        OpLogEntry(first + 3, OpType.SEGMENT_UNMOUNT, "default", ep, SegmentPayload("seg-a", ep, 0, "c1")),
    ))


def wire_maps(batch: OpLogBatch) -> tuple[dict, list]:
    top = msgpack.unpackb(encode_batch(batch), raw=False)
    return top, msgpack.unpackb(top["entries"], raw=False)


def reencode(top: dict, entries: list, *, fix_checksum: bool = True) -> bytes:
    """Re-pack (possibly tampered) wire maps, recomputing a valid checksum unless told not to."""
    top = dict(top)
    top["entries"] = msgpack.packb(entries, use_bin_type=True)
    if fix_checksum:
        top["checksum"] = oplog._checksum(top["first_sequence_id"], top["count"], top["entries"])
    return msgpack.packb(top, use_bin_type=True)


@FAST
@given(batches())
def test_round_trip(batch: OpLogBatch) -> None:
    data = encode_batch(batch)
    back = decode_batch(data)
    assert back == batch
    assert back.checksum == batch.checksum
    assert encode_batch(back) == data


@FAST
@given(batches(), st.data())
def test_any_single_byte_corruption_is_detected(batch: OpLogBatch, data: st.DataObject) -> None:
    raw = bytearray(encode_batch(batch))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(OpLogCorrupt):
        decode_batch(bytes(raw))


@FAST
@given(batches(), st.data())
def test_truncation_is_detected(batch: OpLogBatch, data: st.DataObject) -> None:
    raw = encode_batch(batch)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(OpLogCorrupt):
        decode_batch(raw[:cut])


def test_wire_version_is_the_standby_ones() -> None:
    assert STANDBY_WIRE_VERSION not in ("1.0.0", "2.0.0")
    top, _ = wire_maps(sample_batch())
    assert top["version"] == STANDBY_WIRE_VERSION


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0", "mooncake-columnar-standby/2", 1])
def test_wrong_version_rejected(version: object) -> None:
    top, entries = wire_maps(sample_batch())
    top["version"] = version
    with pytest.raises(OpLogCorrupt) as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == "batch.version"


def test_bad_checksum_rejected() -> None:
    top, entries = wire_maps(sample_batch())
    entries[2]["key"] = "k3"
    with pytest.raises(OpLogChecksumError, match="batch.checksum"):
        decode_batch(reencode(top, entries, fix_checksum=False))


def test_relabelled_batch_fails_checksum() -> None:
    # Moving a batch to another position (first id) is caught even though the entries are intact.
    top, entries = wire_maps(sample_batch())
    top["first_sequence_id"] += 1
    with pytest.raises(OpLogChecksumError):
        decode_batch(reencode(top, entries, fix_checksum=False))


def test_non_contiguous_ids_rejected() -> None:
    top, entries = wire_maps(sample_batch(first=7))
    entries[2]["seq"] = 10
    with pytest.raises(OpLogCorrupt, match="non-contiguous") as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == "batch.entries[2].seq"


def test_count_mismatch_rejected() -> None:
    top, entries = wire_maps(sample_batch())
    top["count"] = 5
    with pytest.raises(OpLogCorrupt) as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == "batch.entries"


@pytest.mark.parametrize("op", [0, 2, 4, 7, 99])  # PUT_REVOKE, LEASE_RENEW, SEGMENT_UPDATE are never logged
def test_unknown_op_rejected(op: int) -> None:
    top, entries = wire_maps(sample_batch())
    entries[2]["op"] = op
    with pytest.raises(OpLogCorrupt, match="not a OpType") as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == "batch.entries[2].op"


def _at(entries: list, path: tuple) -> object:
    for step in path:
        entries = entries[step]
    return entries


@pytest.mark.parametrize("path, value, message, field", [
    ((1, "payload", "size"), True, "expected an integer, got bool", "batch.entries[1].payload.size"),
    ((1, "payload", "size"), -1, "outside", "batch.entries[1].payload.size"),
    ((1, "payload", "client"), 5, "expected a string", "batch.entries[1].payload.client"),
    ((1, "payload", "hard_pinned"), 1, "expected a bool", "batch.entries[1].payload.hard_pinned"),
    ((1, "payload", "replicas", 0, "kind"), 17, "not a ReplicaKind", "batch.entries[1].payload.replicas[0].kind"),
    ((1, "payload", "replicas", 0, "status"), "COMPLETE", "expected an integer",
     "batch.entries[1].payload.replicas[0].status"),
    ((1, "payload", "replicas"), {}, "expected a list", "batch.entries[1].payload.replicas"),
    ((0, "payload", "capacity"), 1.5, "expected an integer", "batch.entries[0].payload.capacity"),
    ((0, "tenant"), "", "must not be empty", "batch.entries[0].tenant"),
    ((1, "payload"), None, "expected a map", "batch.entries[1].payload"),
    ((2, "payload"), {}, "REMOVE carries no payload", "batch.entries[2].payload"),
])
def test_wrong_typed_field_rejected(path: tuple, value: object, message: str, field: str) -> None:
    top, entries = wire_maps(sample_batch())
    _at(entries, path[:-1])[path[-1]] = value  # type: ignore[index]
    with pytest.raises(OpLogCorrupt, match=message) as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == field


@pytest.mark.parametrize("path, name", [
    ((1, "payload"), "client"),
    ((1, "payload", "replicas", 0), "endpoint"),
    ((0, "payload"), "capacity"),
    ((0,), "tenant"),
])
def test_missing_field_rejected(path: tuple, name: str) -> None:
    top, entries = wire_maps(sample_batch())
    del _at(entries, path)[name]  # type: ignore[attr-defined]
    with pytest.raises(OpLogCorrupt, match="missing field") as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field.endswith("." + name)


@pytest.mark.parametrize("path, name", [
    ((1, "payload"), "lease_timeout"),
    ((1, "payload", "replicas", 0), "object_checksum"),
    ((2,), "timestamp_ms"),
])
def test_extra_field_rejected(path: tuple, name: str) -> None:
    top, entries = wire_maps(sample_batch())
    _at(entries, path)[name] = 0  # type: ignore[index]
    with pytest.raises(OpLogCorrupt, match=f"unknown field.*{name}"):
        decode_batch(reencode(top, entries))


def test_extra_top_level_field_rejected() -> None:
    top, entries = wire_maps(sample_batch())
    top["producer_view"] = 3
    with pytest.raises(OpLogCorrupt, match="unknown field") as ei:
        decode_batch(reencode(top, entries))
    assert ei.value.field == "batch"


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"not msgpack at all", msgpack.packb([1, 2]), msgpack.packb({1: 2})])
def test_garbage_rejected(blob: bytes) -> None:
    with pytest.raises(OpLogCorrupt):
        decode_batch(blob)


def test_older_payload_without_pin_flags_defaults_to_false() -> None:
    top, entries = wire_maps(sample_batch())
    del entries[1]["payload"]["hard_pinned"]
    del entries[1]["payload"]["soft_pin_enabled"]
    payload = decode_batch(reencode(top, entries)).entries[1].payload
    assert isinstance(payload, PutEndPayload)
    assert payload.hard_pinned is False and payload.soft_pin_enabled is False


FORBIDDEN = ("lease", "deadline", "ttl", "timeout", "read_time", "last_read", "remaining", "expire")


def _all_keys(node: object) -> set[str]:
    if isinstance(node, dict):
        return set(node) | set().union(*(_all_keys(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_all_keys(v) for v in node))
    return set()


@settings(max_examples=60, deadline=None)
@given(batches())
def test_no_lease_or_deadline_fields_on_the_wire(batch: OpLogBatch) -> None:
    top, entries = wire_maps(batch)
    names = _all_keys(top) | _all_keys(entries)
    assert not [n for n in names if any(bad in n.lower() for bad in FORBIDDEN)], names


def test_exact_wire_field_names() -> None:
    # Pins the wire model to the RFC's list; adding a field is a deliberate, versioned change.
    top, entries = wire_maps(sample_batch())
    assert set(top) == {"version", "first_sequence_id", "count", "entries", "checksum"}
    assert set(entries[0]) == {"seq", "op", "tenant", "key", "payload"}
    assert set(entries[0]["payload"]) == {"name", "endpoint", "capacity", "client"}
    assert set(entries[1]["payload"]) == {"client", "size", "replicas", "data_type", "group_id",
                                          "hard_pinned", "soft_pin_enabled"}
    assert set(entries[1]["payload"]["replicas"][0]) == {"replica_id", "kind", "segment", "offset", "size",
                                                         "status", "endpoint"}
    assert entries[2]["payload"] is None


def test_constructor_validation() -> None:
    with pytest.raises(OpLogGap):
        OpLogBatch(1, (OpLogEntry(1, OpType.REMOVE, "t", "a"), OpLogEntry(3, OpType.REMOVE, "t", "b")))
    with pytest.raises(InvalidParams, match="at least one"):
        OpLogBatch(1, ())
    with pytest.raises(InvalidParams, match="PUT_END carries PutEndPayload"):
        OpLogEntry(1, OpType.PUT_END, "t", "k")
    with pytest.raises(InvalidParams, match="REMOVE carries no payload"):
        OpLogOp(OpType.REMOVE, "t", "k", SegmentPayload("s", "e", 1, "c"))
    with pytest.raises(InvalidParams, match="sequence_id"):
        OpLogEntry(0, OpType.REMOVE, "t", "k")
    with pytest.raises(InvalidParams, match="tenant"):
        OpLogOp(OpType.REMOVE, "", "k")
    with pytest.raises(InvalidParams, match="UTF-8"):
        OpLogOp(OpType.REMOVE, "t", "bad\udc80key")
    with pytest.raises(InvalidParams, match="longer than"):
        OpLogOp(OpType.REMOVE, "t", "k" * (MAX_KEY_BYTES + 1))
    with pytest.raises(InvalidParams, match="not a OpType"):
        OpLogOp(4, "t", "k")  # type: ignore[arg-type]
    with pytest.raises(InvalidParams, match="data_type"):
        PutEndPayload("c", 1, (), 200, "")
    assert PutEndPayload("c", 1, [], 0, "").replicas == ()


def test_op_at_assigns_the_sequence_id() -> None:
    e = OpLogOp(OpType.REMOVE, "t", "k").at(42)
    assert e == OpLogEntry(42, OpType.REMOVE, "t", "k")
    assert sample_batch(first=3).last_sequence_id == 6
