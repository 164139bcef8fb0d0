"""SnapshotState validation, the v2 Arrow codec, and complete-snapshot cleanup."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.clock import NS_PER_S
from mooncake_columnar.errors import (
    SnapshotDigestError,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotPayloadError,
    SnapshotSchemaError,
)
from mooncake_columnar.schema import (
    NEVER_LEASED,
    NO_DEADLINE,
    OBJECTS_ARROW_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    ReplicaKind,
    ReplicaStatus,
)
from mooncake_columnar.snapshots.arrow_codec import (
    DIGEST_FILE,
    OBJECTS_FILE,
    REPLICAS_FILE,
    SEGMENTS_FILE,
    decode_state,
    digest_of,
    encode_state,
)
from mooncake_columnar.snapshots.complete import cleanup_state
from mooncake_columnar.testing.fuzz_mutate import write_ipc
from mooncake_columnar.testing.states import make_state

def _set(table: pa.Table, name: str, values) -> pa.Table:
    idx = table.schema.get_field_index(name)
    return table.set_column(idx, table.schema.field(name), pa.array(values, table.schema.field(name).type))


# ---- validation ---------------------------------------------------------------------------------
def test_valid_state_passes_and_counts_usage() -> None:
    s = make_state(10, replicas_per_object=2)
    assert s.segments.column("used").to_pylist() == [
        int(s.replicas.column("size").to_numpy().sum() // 2)] * 2


def test_validate_schema_mismatch() -> None:
    s = make_state()
    with pytest.raises(SnapshotSchemaError):
        dataclasses.replace(s, objects=s.objects.drop_columns(["group"])).validate()
    with pytest.raises(SnapshotSchemaError):  # wrong type
        dataclasses.replace(s, replicas=s.replicas.set_column(
            5, "offset", pa.array(s.replicas.column("offset").to_numpy().astype(np.int32)))).validate()
    with pytest.raises(SnapshotSchemaError):  # nullable field where non-null is required
        dataclasses.replace(s, segments=s.segments.cast(pa.schema(
            [f.with_nullable(True) for f in SEGMENTS_ARROW_SCHEMA]))).validate()


def test_validate_rejects_nulls() -> None:
    s = make_state()
    leases = pa.array([None] + [1] * 5, pa.int64())
    # Arrow lets a table declare a field non-null yet carry a null: what a careless exporter makes.
    objects = pa.Table.from_arrays(
        [leases if f.name == "lease_deadline_ns" else s.objects.column(f.name)
         for f in OBJECTS_ARROW_SCHEMA], schema=OBJECTS_ARROW_SCHEMA)
    with pytest.raises(SnapshotSchemaError, match="nulls"):
        dataclasses.replace(s, objects=objects).validate()


@pytest.mark.parametrize("case", ["index_high", "index_negative", "unknown_segment", "beyond_capacity",
                                  "overlap", "duplicate_key", "replica_count", "next_id",
                                  "negative_offset"])
def test_validate_integrity_errors(case: str) -> None:
    s = make_state(6, replicas_per_object=2)
    reps, objs = s.replicas, s.objects
    if case == "index_high":
        s = dataclasses.replace(s, replicas=_set(reps, "object_index", [0] * 11 + [6]))
    elif case == "index_negative":
        s = dataclasses.replace(s, replicas=_set(reps, "object_index", [-1] + [0] * 11))
    elif case == "unknown_segment":
        s = dataclasses.replace(s, replicas=_set(reps, "segment", ["seg_zz"] + ["seg_a"] * 11))
    elif case == "beyond_capacity":
        off = reps.column("offset").to_numpy().copy()
        off[3] = (1 << 34) - 100
        s = dataclasses.replace(s, replicas=_set(reps, "offset", off))
    elif case == "overlap":
        off = reps.column("offset").to_numpy().copy()
        off[4] = off[0] + 10  # object 2 replica 0 lands on seg_a inside object 0's extent
        s = dataclasses.replace(s, replicas=_set(reps, "offset", off))
    elif case == "duplicate_key":
        s = dataclasses.replace(s, objects=_set(objs, "key", ["k"] * 6))
    elif case == "replica_count":
        s = dataclasses.replace(s, objects=_set(objs, "replica_count", [1] * 6))
    elif case == "next_id":
        s = dataclasses.replace(s, replica_next_id=12)
    elif case == "negative_offset":
        s = dataclasses.replace(s, replicas=_set(reps, "offset", [-1] + [0] * 11))
    with pytest.raises(SnapshotIntegrityError):
        s.validate()


@pytest.mark.parametrize("offset, valid", [((1 << 32) - 1, True), (1 << 32, False)])
def test_a_replica_not_in_memory_has_an_offset_below_2_to_the_32(offset: int, valid: bool) -> None:
    """The engine keeps a non-memory replica's offset in bytes in a 32-bit column: a snapshot
    with a larger one is refused as a field error, never truncated."""
    s = make_state(6, replicas_per_object=2)
    kind = s.replicas.column("kind").to_numpy().copy()
    off = s.replicas.column("offset").to_numpy().copy()
    kind[0], off[0] = ReplicaKind.LOCAL_DISK, offset
    s = dataclasses.replace(s, replicas=_set(_set(s.replicas, "kind", kind), "offset", off))
    if valid:
        s.validate()
    else:
        with pytest.raises(SnapshotIntegrityError, match="2\\*\\*32"):
            s.validate()


def test_removed_replica_does_not_hold_its_extent() -> None:
    s = make_state(4, replicas_per_object=1, segments=("seg_a",))
    off = s.replicas.column("offset").to_numpy().copy()
    off[1] = off[0]
    st = s.replicas.column("status").to_numpy().copy()
    st[1] = ReplicaStatus.REMOVED
    reps = _set(_set(s.replicas, "offset", off), "status", st)
    dataclasses.replace(s, replicas=reps).validate()  # no overlap error


# ---- Arrow codec --------------------------------------------------------------------------------
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_arrow_round_trip(compression: str | None) -> None:
    s = make_state(50, replicas_per_object=2, lease=np.arange(50) * NS_PER_S, hard=np.arange(50) % 3 == 0)
    payloads = encode_state(s, compression)
    assert set(payloads) == {OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE, DIGEST_FILE}
    back = decode_state(payloads)
    # stored in the encoded layout (dictionary name columns); the same content as plain strings
    assert pa.types.is_dictionary(back.objects.schema.field("tenant").type)
    assert pa.types.is_dictionary(back.replicas.schema.field("segment").type)
    plain = back.plain()
    assert plain.objects.equals(s.objects) and plain.replicas.equals(s.replicas)
    assert back.segments.equals(s.segments) and back.replica_next_id == s.replica_next_id


def test_arrow_large_state_is_vectorized() -> None:
    s = make_state(200_000)
    back = decode_state(encode_state(s, "zstd"))
    assert back.objects.num_rows == 200_000


def _with_fixed_digest(payloads: dict[str, bytes]) -> dict[str, bytes]:
    body = {k: v for k, v in payloads.items() if k != DIGEST_FILE}
    return {**body, DIGEST_FILE: digest_of(body)}


def test_arrow_digest_mismatch_rejected() -> None:
    p = encode_state(make_state())
    flipped = bytearray(p[OBJECTS_FILE])
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(SnapshotDigestError):
        decode_state({**p, OBJECTS_FILE: bytes(flipped)})
    with pytest.raises(SnapshotDigestError):
        decode_state({k: v for k, v in p.items() if k != SEGMENTS_FILE})
    with pytest.raises(SnapshotDigestError):
        decode_state({k: v for k, v in p.items() if k != DIGEST_FILE})
    digest = json.loads(p[DIGEST_FILE])
    digest["files"]["extra.arrow"] = digest["files"][OBJECTS_FILE]
    with pytest.raises(SnapshotDigestError):
        decode_state({**p, DIGEST_FILE: json.dumps(digest).encode()})
    with pytest.raises(SnapshotDigestError):
        decode_state({**p, DIGEST_FILE: b"not json"})


def test_arrow_truncated_file_rejected() -> None:
    p = encode_state(make_state(), "zstd")
    for cut in (0, 8, len(p[REPLICAS_FILE]) // 2, len(p[REPLICAS_FILE]) - 1):
        with pytest.raises(SnapshotPayloadError):
            decode_state(_with_fixed_digest({**p, REPLICAS_FILE: p[REPLICAS_FILE][:cut]}))


def test_arrow_schema_mismatch_rejected() -> None:
    s = make_state()
    p = encode_state(s)
    sink = pa.BufferOutputStream()
    table = s.segments.drop_columns(["used"])
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    with pytest.raises(SnapshotSchemaError):
        decode_state(_with_fixed_digest({**p, SEGMENTS_FILE: sink.getvalue().to_pybytes()}))
    # replica_next_id lives in the replicas file metadata; without it the file is not ours.
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, s.replicas.schema) as w:
        w.write_table(s.replicas)
    with pytest.raises(SnapshotSchemaError):
        decode_state(_with_fixed_digest({**p, REPLICAS_FILE: sink.getvalue().to_pybytes()}))


def test_arrow_inconsistent_payload_is_a_snapshot_error() -> None:
    s = make_state()
    bad = dataclasses.replace(s, objects=_set(s.objects, "replica_count", [2] * 6))
    payloads = dict(encode_state(s))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, bad.objects.schema) as w:
        w.write_table(bad.objects)
    payloads[OBJECTS_FILE] = sink.getvalue().to_pybytes()
    with pytest.raises(SnapshotError):
        decode_state(_with_fixed_digest(payloads))


# ---- cleanup ------------------------------------------------------------------------------------
NOW = 1_000 * NS_PER_S


def test_phase3_hard_pinned_retained() -> None:
    s = make_state(4, lease=NOW - 1, hard=[True, False, True, False])
    out, dropped = cleanup_state(s, NOW)
    assert out.objects.column("key").to_pylist() == ["key_000000", "key_000002"]
    assert dropped == 2
    assert out.objects.column("hard_pinned").to_pylist() == [True, True]
    out.validate()


def test_phase3_expired_non_hard_pinned_dropped() -> None:
    lease = [NOW - 1, NOW, NOW + 1, NEVER_LEASED, NOW - 5, NOW - 5]
    soft = [NO_DEADLINE, NO_DEADLINE, NO_DEADLINE, NO_DEADLINE, NOW + 10, NOW]
    s = make_state(6, lease=lease, soft=soft, soft_enabled=[False] * 4 + [True, True])
    out, dropped = cleanup_state(s, NOW)
    # Expired means now >= deadline (upstream); an active soft pin alone keeps an object.
    assert out.objects.column("key").to_pylist() == ["key_000002", "key_000004"]
    assert dropped == 4
    kept, _ = cleanup_state(s, NOW, drop_expired=False)
    assert kept.objects.num_rows == 6


def test_incomplete_replicas_dropped_and_indexes_remapped() -> None:
    st = np.full(10, ReplicaStatus.COMPLETE, np.uint8)
    st[[0, 1]] = ReplicaStatus.PROCESSING      # object 0: no complete replica -> dropped
    st[4] = ReplicaStatus.PROCESSING           # object 2: keeps one complete replica
    s = make_state(5, replicas_per_object=2, status=st, hard=[True] * 5, lease=NOW + NS_PER_S)
    out, dropped = cleanup_state(s, NOW)
    assert dropped == 1  # hard pin does not retain an object without a complete replica
    assert out.objects.column("key").to_pylist() == [f"key_{k:06d}" for k in (1, 2, 3, 4)]
    assert out.objects.column("replica_count").to_pylist() == [2, 1, 2, 2]
    assert out.replicas.column("object_index").to_pylist() == [0, 0, 1, 2, 2, 3, 3]
    assert out.replicas.column("replica_id").to_pylist() == [3, 4, 6, 7, 8, 9, 10]
    assert not any(out.objects.column("processing").to_pylist())
    assert out.segments.column("used").to_numpy().sum() == out.replicas.column("size").to_numpy().sum()
    out.validate()


# ---- v2 payload layout: dictionary name columns, xxh3 digest -------------------------------------
def test_dictionary_layout_round_trip_and_either_layout_validates() -> None:
    s = make_state(300, replicas_per_object=2, segments=("seg_a", "seg_b", "seg_c"))
    enc = s.encoded()
    for table, names in ((enc.objects, ("tenant", "client", "group")), (enc.replicas, ("segment",))):
        for name in names:  # few distinct names: the narrowest index type
            assert table.schema.field(name).type == pa.dictionary(pa.int8(), pa.string())
    assert enc.objects.schema.field("key").type == pa.large_string()
    enc.validate()
    assert enc.plain().objects.equals(s.objects) and enc.plain().replicas.equals(s.replicas)
    # a dictionary may repeat a value: its codes still mean the same name
    seg = enc.replicas.column("segment").chunk(0)
    repeated = pa.DictionaryArray.from_arrays(
        pa.array(np.where(seg.indices.to_numpy() == 0, 3, seg.indices.to_numpy()).astype(np.int8)),
        pa.array([*seg.dictionary.to_pylist(), seg.dictionary[0].as_py()]))
    idx = enc.replicas.schema.get_field_index("segment")
    reps = enc.replicas.set_column(idx, enc.replicas.schema.field(idx).with_type(repeated.type), repeated)
    again = dataclasses.replace(enc, replicas=reps).validate()
    assert again.plain().replicas.equals(s.replicas)


def test_payload_is_the_encoded_layout_and_smaller() -> None:
    s = make_state(2000)
    encoded = encode_state(s)
    table = pa.ipc.open_file(pa.py_buffer(encoded[OBJECTS_FILE])).read_all()
    assert pa.types.is_dictionary(table.schema.field("client").type)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, s.objects.schema) as w:  # what plain strings would have cost
        w.write_table(s.objects)
    assert len(encoded[OBJECTS_FILE]) < 0.7 * sink.getvalue().size


def test_corrupted_dictionary_index_fails_the_candidate() -> None:
    s = make_state()
    p = encode_state(s)
    objects = s.encoded().objects
    tenant = objects.column("tenant").chunk(0)
    bad = pa.DictionaryArray.from_arrays(pa.array(np.full(len(tenant), 5, np.int8)), tenant.dictionary,
                                         safe=False)  # index 5 of a one-entry dictionary
    idx = objects.schema.get_field_index("tenant")
    objects = objects.set_column(idx, objects.schema.field(idx), bad)
    with pytest.raises(SnapshotPayloadError):
        decode_state(_with_fixed_digest({**p, OBJECTS_FILE: write_ipc(objects)}))


def test_corrupted_key_offsets_fail_the_candidate() -> None:
    s = make_state()
    p = encode_state(s)
    objects = s.encoded().objects
    keys = objects.column("key").chunk(0)
    _, off, data = keys.buffers()
    offsets = np.frombuffer(off, np.int64).copy()
    offsets[3] = offsets[-1] + 1000  # past the data: a kernel would read out of bounds
    bad = pa.LargeStringArray.from_buffers(len(keys), pa.py_buffer(offsets), data)
    objects = objects.set_column(1, objects.schema.field(1), bad)
    with pytest.raises(SnapshotPayloadError):
        decode_state(_with_fixed_digest({**p, OBJECTS_FILE: write_ipc(objects)}))


def test_digest_v2_is_xxh3_and_rejects_a_flipped_byte_in_every_payload() -> None:
    p = encode_state(make_state())
    digest = json.loads(bytes(p[DIGEST_FILE]))
    assert digest["version"] == 2 and set(digest["files"][OBJECTS_FILE]) == {"size", "xxh3_128"}
    for name in (OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE):
        data = bytearray(p[name])
        for at in (0, len(data) // 3, len(data) - 1):
            flipped = bytearray(data)
            flipped[at] ^= 0x01
            with pytest.raises(SnapshotDigestError):
                decode_state({**p, name: bytes(flipped)})


def test_digest_v1_sha256_still_verifies() -> None:
    s = make_state()
    body = {k: bytes(v) for k, v in encode_state(s).items() if k != DIGEST_FILE}
    v1 = {**body, DIGEST_FILE: digest_of(body, version=1)}
    assert json.loads(v1[DIGEST_FILE])["version"] == 1
    assert decode_state(v1).plain().objects.equals(s.objects)
    flipped = bytearray(body[REPLICAS_FILE])
    flipped[len(flipped) // 2] ^= 0xFF
    with pytest.raises(SnapshotDigestError, match="sha256"):
        decode_state({**v1, REPLICAS_FILE: bytes(flipped)})
    bad_version = json.loads(v1[DIGEST_FILE])
    bad_version["version"] = 3
    with pytest.raises(SnapshotDigestError):
        decode_state({**v1, DIGEST_FILE: json.dumps(bad_version).encode()})


def test_streamed_payloads_match_in_memory_bytes_and_digest_without_a_prior_write() -> None:
    from mooncake_columnar.snapshots.arrow_codec import state_payloads
    s = make_state(40)
    streamed = state_payloads(s)
    # digest first (as after an upload that failed before its payloads completed)
    digest = streamed[DIGEST_FILE].to_buffer()
    rendered = {name: p.to_buffer() for name, p in streamed.items() if name != DIGEST_FILE}
    assert digest == digest_of(rendered)
    assert decode_state({**rendered, DIGEST_FILE: digest}).plain().objects.equals(s.objects)
