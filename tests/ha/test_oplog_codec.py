"""OpLog entry model and columnar batch codec: round trips, slicing/concatenation, strict
vectorized decoding (typed errors naming the column), the RFC's no-lease wire rule."""
from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_columnar.errors import InvalidParams, OpLogChecksumError, OpLogCorrupt, OpLogGap
from mooncake_columnar.ha import oplog
from mooncake_columnar.ha.oplog import (
    STANDBY_WIRE_VERSION,
    OpLogBatch,
    OpLogColumns,
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
    disk = ReplicaDescriptor(12, ReplicaKind.DISK, "", 0, 100, ReplicaStatus.COMPLETE, "")
    put = PutEndPayload("c1", 100, (rep,), ObjectDataType.KVCACHE, "g1", hard_pinned=True, soft_pin_enabled=True,
                        put_start_time_ms=1_796_019_911_534)
    put2 = PutEndPayload("c2", 100, (rep, disk), ObjectDataType.UNKNOWN, "")
    return OpLogBatch(first, (
        OpLogEntry(first, OpType.SEGMENT_MOUNT, "default", ep,
                   SegmentPayload("seg-a", ep, 1 << 30, "c1", "2904354663345825683-17963832344043922323", "host-1")),
        OpLogEntry(first + 1, OpType.PUT_END, "default", "k1", put),
        OpLogEntry(first + 2, OpType.REMOVE, "t2", "k2"),
        OpLogEntry(first + 3, OpType.PUT_END, "t2", "k3", put2),
        OpLogEntry(first + 4, OpType.SEGMENT_UNMOUNT, "default", ep, SegmentPayload("seg-a", ep, 0, "c1")),
    ))


def wire_maps(batch: OpLogBatch) -> tuple[dict, dict]:
    top = msgpack.unpackb(encode_batch(batch), raw=False)
    return top, msgpack.unpackb(top["columns"], raw=False)


def reencode(top: dict, columns: dict, *, fix_checksum: bool = True) -> bytes:
    """Re-pack (possibly tampered) wire maps, recomputing a valid checksum unless told not to."""
    top = dict(top)
    top["columns"] = msgpack.packb(columns, use_bin_type=True)
    if fix_checksum:
        top["checksum"] = oplog._checksum(top["first_sequence_id"], top["count"], top["columns"])
    return msgpack.packb(top, use_bin_type=True)


def column(columns: dict, name: str, dtype: str) -> np.ndarray:
    return np.frombuffer(columns[name], dtype).copy()


def set_value(columns: dict, name: str, dtype: str, index: int, value: int) -> None:
    a = column(columns, name, dtype)
    a[index] = value
    columns[name] = a.tobytes()


# --- round trips ---------------------------------------------------------------------------------


@FAST
@given(batches())
def test_round_trip(batch: OpLogBatch) -> None:
    data = encode_batch(batch)
    back = decode_batch(data)
    assert back == batch
    assert back.checksum == batch.checksum
    assert back.entries == batch.entries
    assert encode_batch(back) == data


@FAST
@given(st.lists(st.lists(ops, min_size=1, max_size=5), min_size=1, max_size=4), st.data())
def test_random_columnar_batches_round_trip_through_concat_and_slice(bodies: list, data: st.DataObject) -> None:
    """Columns built per body, concatenated and sliced as the writer does, then encoded and
    decoded, hold exactly the ops of the same slice of the plain list."""
    flat = [o for body in bodies for o in body]
    joined = OpLogColumns.concat([OpLogColumns.from_ops(body) for body in bodies])
    start = data.draw(st.integers(0, len(flat) - 1))
    stop = data.draw(st.integers(start + 1, len(flat)))
    part = OpLogColumns.concat([joined.slice(start, stop)])
    assert part.ops() == flat[start:stop]
    # the compacted table holds each used string once
    names = part.strings.to_pylist()
    assert len(names) == len(set(names))
    first = data.draw(st.integers(1, 2**40))
    batch = OpLogBatch(first, part)
    back = decode_batch(encode_batch(batch))
    assert back == batch
    assert [(e.op, e.tenant, e.key, e.payload) for e in back.entries] == [
        (o.op, o.tenant, o.key, o.payload) for o in flat[start:stop]]
    assert list(back.sequence_ids) == list(range(first, first + stop - start))


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


# --- the envelope --------------------------------------------------------------------------------


def test_wire_version_is_the_standby_ones() -> None:
    assert STANDBY_WIRE_VERSION not in ("1.0.0", "2.0.0")
    top, _ = wire_maps(sample_batch())
    assert top["version"] == STANDBY_WIRE_VERSION == "mooncake-columnar-standby/2"


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0", "mooncake-columnar-standby/1", 1])
def test_wrong_version_rejected(version: object) -> None:
    top, columns = wire_maps(sample_batch())
    top["version"] = version
    with pytest.raises(OpLogCorrupt) as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.version"


def test_bad_checksum_rejected() -> None:
    top, columns = wire_maps(sample_batch())
    columns["key_bytes"] = columns["key_bytes"].replace(b"k2", b"k4")
    with pytest.raises(OpLogChecksumError, match="batch.checksum"):
        decode_batch(reencode(top, columns, fix_checksum=False))


def test_relabelled_batch_fails_checksum() -> None:
    # Moving a batch to another position (first id) is caught even though the columns are intact.
    top, columns = wire_maps(sample_batch())
    top["first_sequence_id"] += 1
    with pytest.raises(OpLogChecksumError):
        decode_batch(reencode(top, columns, fix_checksum=False))


def test_count_mismatch_rejected() -> None:
    top, columns = wire_maps(sample_batch())
    top["count"] = 6
    with pytest.raises(OpLogCorrupt, match="5 values, expected 6") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.columns.op"


def test_extra_top_level_field_rejected() -> None:
    top, columns = wire_maps(sample_batch())
    top["producer_view"] = 3
    with pytest.raises(OpLogCorrupt, match="unknown field") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch"


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"not msgpack at all", msgpack.packb([1, 2]), msgpack.packb({1: 2})])
def test_garbage_rejected(blob: bytes) -> None:
    with pytest.raises(OpLogCorrupt):
        decode_batch(blob)


def test_columns_blob_that_is_not_a_map_rejected() -> None:
    top, _ = wire_maps(sample_batch())
    top["columns"] = msgpack.packb([1, 2])
    top["checksum"] = oplog._checksum(top["first_sequence_id"], top["count"], top["columns"])
    with pytest.raises(OpLogCorrupt, match="expected a map") as ei:
        decode_batch(msgpack.packb(top, use_bin_type=True))
    assert ei.value.field == "batch.columns"


# --- vectorized column checks --------------------------------------------------------------------


@pytest.mark.parametrize("op", [0, 2, 4, 7, 99])  # PUT_REVOKE, LEASE_RENEW, SEGMENT_UPDATE are never logged
def test_unknown_op_rejected(op: int) -> None:
    top, columns = wire_maps(sample_batch())
    set_value(columns, "op", "u1", 2, op)
    with pytest.raises(OpLogCorrupt, match=f"{op} is not a OpType") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.columns.op"


def _decreasing_offsets(columns: dict) -> None:
    set_value(columns, "key_offsets", "<i8", 2, 1)  # row 1 ends before it starts


def _empty_key(columns: dict) -> None:
    set_value(columns, "key_offsets", "<i8", 2, column(columns, "key_offsets", "<i8")[1])


@pytest.mark.parametrize("tamper, message, field", [
    (lambda c: c.update(size=c["size"][:-1]), "not a whole number", "size"),
    (lambda c: c.update(size=c["size"][:8]), "1 values, expected 2", "size"),
    (lambda c: c.update(size=[1, 2]), "expected bytes", "size"),
    (lambda c: set_value(c, "hard_pinned", "u1", 0, 2), "expected a bool", "hard_pinned"),
    (lambda c: set_value(c, "data_type", "u1", 1, 200), "200 is not a ObjectDataType", "data_type"),
    (lambda c: set_value(c, "replica_kind", "u1", 0, 17), "not a ReplicaKind", "replica_kind"),
    (lambda c: set_value(c, "replica_status", "u1", 2, 9), "not a ReplicaStatus", "replica_status"),
    (lambda c: set_value(c, "replica_count", "<u4", 1, 3), "3 values, expected 4", "replica_id"),
    (lambda c: set_value(c, "client", "<i4", 0, 99), "outside the table", "client"),
    (lambda c: set_value(c, "replica_segment", "<i4", 0, -1), "outside the table", "replica_segment"),
    (_decreasing_offsets, "offsets decrease", "key_offsets"),
    (_empty_key, "must not be empty", "key_offsets"),
    (lambda c: set_value(c, "string_offsets", "<i8", 1, 1_000), "offsets decrease", "string_offsets"),
    (lambda c: set_value(c, "key_offsets", "<i8", 5, 10_000), "must run from 0", "key_offsets"),
    (lambda c: c.update(key_bytes=c["key_bytes"].replace(b"k1", b"\xff1")), "UTF-8", "key_bytes"),
    (lambda c: c.update(string_bytes=b"\xc3" + c["string_bytes"][1:]), "UTF-8", "string_bytes"),
    (lambda c: set_value(c, "string_offsets", "<i8", 0, 1), "must run from 0", "string_offsets"),
    (lambda c: c["segments"].pop(), "1 payloads for 2 segment rows", "segments"),
    (lambda c: c["segments"][0].update(capacity=1.5), "expected an integer", "segments[0].capacity"),
    (lambda c: c.update(segments={}), "expected a list", "segments"),
])
def test_bad_column_rejected(tamper, message: str, field: str) -> None:
    top, columns = wire_maps(sample_batch())
    tamper(columns)
    with pytest.raises(OpLogCorrupt, match=message) as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == f"batch.columns.{field}"


def test_empty_tenant_rejected() -> None:
    top, columns = wire_maps(sample_batch())
    empty = OpLogColumns.from_wire(top["columns"], top["count"], "x").strings.to_pylist().index("")
    set_value(columns, "tenant", "<i4", 2, empty)
    with pytest.raises(OpLogCorrupt, match="must not be empty") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.columns.tenant"


def test_key_longer_than_the_limit_rejected() -> None:
    op = OpLogOp(OpType.REMOVE, "t", "k")
    top, columns = wire_maps(OpLogBatch(1, (op.at(1),)))
    columns["key_bytes"] = b"k" * (MAX_KEY_BYTES + 1)
    columns["key_offsets"] = np.array([0, MAX_KEY_BYTES + 1], "<i8").tobytes()
    with pytest.raises(OpLogCorrupt, match="longer than") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.columns.key_offsets"


@pytest.mark.parametrize("name", ["client", "replica_endpoint", "tenant", "key_bytes", "string_offsets", "segments"])
def test_missing_column_rejected(name: str) -> None:
    top, columns = wire_maps(sample_batch())
    del columns[name]
    with pytest.raises(OpLogCorrupt, match="missing field") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == f"batch.columns.{name}"


def test_missing_segment_field_rejected() -> None:
    top, columns = wire_maps(sample_batch())
    del columns["segments"][0]["capacity"]
    with pytest.raises(OpLogCorrupt, match="missing field") as ei:
        decode_batch(reencode(top, columns))
    assert ei.value.field == "batch.columns.segments[0].capacity"


@pytest.mark.parametrize("where, name", [("columns", "lease_timeout"), ("segment", "timestamp_ms")])
def test_extra_field_rejected(where: str, name: str) -> None:
    top, columns = wire_maps(sample_batch())
    (columns if where == "columns" else columns["segments"][0])[name] = b""
    with pytest.raises(OpLogCorrupt, match=f"unknown field.*{name}"):
        decode_batch(reencode(top, columns))


def test_older_payload_without_pin_flags_defaults_to_false() -> None:
    top, columns = wire_maps(sample_batch())
    del columns["hard_pinned"]
    del columns["soft_pin_enabled"]
    payload = decode_batch(reencode(top, columns)).entries[1].payload
    assert isinstance(payload, PutEndPayload)
    assert payload.hard_pinned is False and payload.soft_pin_enabled is False


def test_a_rejected_batch_builds_nothing() -> None:
    # decode is all or nothing: the error comes before any batch object exists
    top, columns = wire_maps(sample_batch())
    set_value(columns, "replica_kind", "u1", 2, 200)
    with pytest.raises(OpLogCorrupt):
        decode_batch(reencode(top, columns))
    assert decode_batch(encode_batch(sample_batch())) == sample_batch()


# --- the RFC's wire rule -------------------------------------------------------------------------

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
    top, columns = wire_maps(batch)
    names = _all_keys(top) | _all_keys(columns)
    assert not [n for n in names if any(bad in n.lower() for bad in FORBIDDEN)], names


def test_exact_wire_field_names() -> None:
    # Pins the wire model to the RFC's list; adding a field is a deliberate change (an optional
    # one, so older records stay decodable: put_start_time_ms, segment_id and host_id).
    top, columns = wire_maps(sample_batch())
    assert set(top) == {"version", "first_sequence_id", "count", "columns", "checksum"}
    assert set(columns) == {
        "op", "tenant", "key_offsets", "key_bytes",
        "client", "size", "data_type", "group", "hard_pinned", "soft_pin_enabled", "replica_count",
        "put_start_time_ms",
        "replica_id", "replica_kind", "replica_segment", "replica_offset", "replica_size", "replica_status",
        "replica_endpoint", "string_offsets", "string_bytes", "segments"}
    assert set(columns["segments"][0]) == {"name", "endpoint", "capacity", "client", "segment_id", "host_id"}
    assert set(columns["segments"][1]) == {"name", "endpoint", "capacity", "client"}  # no id: not sent
    assert len(columns["segments"]) == 2
    assert column(columns, "replica_count", "<u4").tolist() == [1, 2]


# --- constructors --------------------------------------------------------------------------------


def test_constructor_validation() -> None:
    with pytest.raises(OpLogGap):
        OpLogBatch(1, (OpLogEntry(1, OpType.REMOVE, "t", "a"), OpLogEntry(3, OpType.REMOVE, "t", "b")))
    with pytest.raises(InvalidParams, match="at least one"):
        OpLogBatch(1, ())
    with pytest.raises(InvalidParams, match="not an OpLogEntry"):
        OpLogBatch(1, (OpLogOp(OpType.REMOVE, "t", "a"),))  # type: ignore[arg-type]
    with pytest.raises(InvalidParams, match="first_sequence_id"):
        OpLogBatch(0, (OpLogEntry(1, OpType.REMOVE, "t", "a"),))
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
    b = sample_batch(first=3)
    assert (b.count, b.last_sequence_id, list(b.sequence_ids)) == (5, 7, [3, 4, 5, 6, 7])
    assert [e.sequence_id for e in b.entries] == [3, 4, 5, 6, 7]
