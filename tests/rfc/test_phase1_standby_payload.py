"""RFC Phase 1: the standby snapshot wire format (no deadlines, own version, strict decode)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import (
    ManifestError,
    SnapshotDigestError,
    SnapshotError,
    SnapshotPayloadError,
    SnapshotSchemaError,
)
from mooncake_columnar.ha.oplog import (
    OpLogBatch,
    OpLogEntry,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    decode_batch,
    encode_batch,
)
from mooncake_columnar.ha.standby import standby_snapshot_of, state_of_standby
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig, SoftPinAction
from mooncake_columnar.schema import NEVER_LEASED, NO_DEADLINE
from mooncake_columnar.snapshots.arrow_codec import DIGEST_FILE, OBJECTS_FILE, digest_of
from mooncake_columnar.snapshots.manifest import parse_manifest, v2_manifest
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.snapshots.standby import (
    STANDBY_SNAPSHOT_VERSION,
    StandbySnapshot,
    StandbySnapshotError,
    StandbySnapshotStore,
    decode_standby,
    encode_standby,
    parse_standby_manifest,
    standby_manifest,
)

FORBIDDEN = ("deadline", "lease", "ttl", "read")
PINS = [(False, False), (True, False), (False, True), (True, True)]


def primary_with_pins() -> tuple[MasterService, ManualClocks]:
    """Objects in every (hard_pinned, soft_pin_enabled) combination, each with a live lease and
    soft-pin interval: the deadlines exist on the primary and must not travel."""
    clocks = ManualClocks()
    m = MasterService(MasterConfig(), clocks=clocks)
    m.mount_segment("seg0", endpoint="10.0.0.1:1", client_id="c0", base=1 << 20, size=1 << 24)
    for i, (hard, soft) in enumerate(PINS):
        cfg = ReplicateConfig(hard_pin=hard, soft_pin_action=SoftPinAction.ENABLE if soft else SoftPinAction.PRESERVE,
                              group_id="g" if i == 3 else "")
        m.put_start(f"k{i}", 100 + i, client_id="c0", config=cfg)
        m.put_end(f"k{i}", client_id="c0")
        m.get_replica_list(f"k{i}")  # grants a read lease (and the soft-pin interval when enabled)
    return m, clocks


def test_phase1_standby_payload_round_trip_preserves_hard_pin_and_soft_pin_enabled_without_deadlines(
        tmp_path: Path) -> None:
    primary, clocks = primary_with_pins()
    assert all(primary.object_info(f"k{i}").lease_deadline_ns > 0 for i in range(4))
    store = StandbySnapshotStore.open(str(tmp_path), "cluster")
    sid = store.publish(standby_snapshot_of(primary, 42), clocks)
    loaded = store.load(sid)
    assert loaded.last_sequence_id == 42

    # No column of any table, and nothing in the manifest, names a deadline, lease, TTL or read time.
    for table in (loaded.objects, loaded.replicas, loaded.segments):
        for name in table.column_names:
            assert not any(word in name for word in FORBIDDEN), name
    manifest = (tmp_path / "cluster-standby" / sid / "manifest.txt").read_text()
    assert STANDBY_SNAPSHOT_VERSION in manifest and "1.0.0" not in manifest and "2.0.0" not in manifest
    assert manifest.split("|")[-1] == "42"

    by_key = dict(zip(loaded.objects.column("key").to_pylist(),
                      zip(loaded.objects.column("hard_pinned").to_pylist(),
                          loaded.objects.column("soft_pin_enabled").to_pylist())))
    assert by_key == {f"k{i}": pin for i, pin in enumerate(PINS)}

    # Rebuilt as an engine state: pins kept, every deadline is a sentinel, never a historical one.
    restored = MasterService.from_state(state_of_standby(loaded), clocks=clocks, segments_readable=False)
    for i, (hard, soft) in enumerate(PINS):
        info = restored.object_info(f"k{i}")
        assert (info.hard_pinned, info.soft_pin_enabled) == (hard, soft)
        assert info.lease_deadline_ns == NEVER_LEASED and info.soft_pin_deadline_ns == NO_DEADLINE
        assert info.group_id == ("g" if i == 3 else "") and info.size == 100 + i
        assert not any(r.readable for r in info.replicas)


def test_oplog_put_end_payload_has_no_deadline_field() -> None:
    payload = PutEndPayload("c0", 10, (ReplicaDescriptor(1, 0, "seg0", 0, 10, 3),), 0, "", True, True)
    batch = OpLogBatch(1, (OpLogEntry(1, OpType.PUT_END, "t", "k", payload),))
    raw = msgpack.unpackb(encode_batch(batch))
    columns = msgpack.unpackb(raw["columns"])
    names = set(raw) | set(columns)
    assert not [n for n in names if any(word in n for word in FORBIDDEN)]
    assert columns["hard_pinned"] == b"\x01" and columns["soft_pin_enabled"] == b"\x01"
    back = decode_batch(encode_batch(batch)).entries[0].payload
    assert back.hard_pinned is True and back.soft_pin_enabled is True


def _old_payloads(snap: StandbySnapshot) -> dict[str, bytes]:
    """Payloads as a writer from before the pin flags would have produced them."""
    payloads = {k: bytes(v) for k, v in encode_standby(snap).items() if k != DIGEST_FILE}
    old = snap.objects.drop_columns(["hard_pinned", "soft_pin_enabled"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, old.schema) as w:
        w.write_table(old)
    payloads[OBJECTS_FILE] = sink.getvalue().to_pybytes()
    payloads[DIGEST_FILE] = digest_of(payloads)
    return payloads


def test_missing_pin_columns_default_to_false() -> None:
    primary, _ = primary_with_pins()
    snap = decode_standby(_old_payloads(standby_snapshot_of(primary, 3)), 3)
    assert snap.objects.column("hard_pinned").to_pylist() == [False] * 4
    assert snap.objects.column("soft_pin_enabled").to_pylist() == [False] * 4
    assert snap.objects.column_names == standby_snapshot_of(primary, 3).objects.column_names


def _tamper(payloads: dict[str, bytes], name: str, table: pa.Table) -> dict[str, bytes]:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    out = {k: bytes(v) for k, v in payloads.items() if k != DIGEST_FILE}
    out[name] = sink.getvalue().to_pybytes()
    out[DIGEST_FILE] = digest_of(out)
    return out


def test_strict_decode_rejects_deviations_with_typed_errors() -> None:
    primary, _ = primary_with_pins()
    snap = standby_snapshot_of(primary, 5)
    good = {k: bytes(v) for k, v in encode_standby(snap).items()}
    assert decode_standby(good, 5).objects.equals(snap.objects)

    flipped = dict(good)
    flipped[OBJECTS_FILE] = good[OBJECTS_FILE][:-9] + bytes([good[OBJECTS_FILE][-9] ^ 1]) + good[OBJECTS_FILE][-8:]
    with pytest.raises(SnapshotDigestError):
        decode_standby(flipped, 5)
    torn = dict(good, **{OBJECTS_FILE: good[OBJECTS_FILE][:50]})
    torn[DIGEST_FILE] = digest_of({k: v for k, v in torn.items() if k != DIGEST_FILE})
    with pytest.raises(SnapshotPayloadError):
        decode_standby(torn, 5)
    with_deadline = snap.objects.append_column("lease_deadline_ns", pa.array(np.zeros(4, np.int64)))
    with pytest.raises(SnapshotSchemaError):
        decode_standby(_tamper(good, OBJECTS_FILE, with_deadline), 5)
    wrong_type = snap.objects.set_column(3, "size", pa.array(np.arange(4, dtype=np.int32)))
    with pytest.raises(SnapshotSchemaError):
        decode_standby(_tamper(good, OBJECTS_FILE, wrong_type), 5)
    nulls = snap.objects.set_column(0, pa.field("tenant", pa.string()), pa.array(["a", None, "b", "c"]))
    with pytest.raises(SnapshotSchemaError):
        decode_standby(_tamper(good, OBJECTS_FILE, nulls), 5)
    missing = {k: v for k, v in good.items() if k != OBJECTS_FILE}
    with pytest.raises(SnapshotDigestError):
        decode_standby(missing, 5)
    bad_index = snap.replicas.set_column(0, snap.replicas.schema.field(0), pa.array(np.full(4, 9, np.int64)))
    with pytest.raises(SnapshotError):
        decode_standby(_tamper(good, "replicas.arrow", bad_index), 5)


def test_manifest_is_its_own_version_and_strict() -> None:
    sid = "20260101_000000_000"
    assert parse_standby_manifest(standby_manifest(sid, 7).encode()) == (sid, 7)
    for raw in (v2_manifest(sid, 1, 2).encode().encode(), b"messagepack|1.0.0|" + sid.encode(),
                f"standby-arrow-ipc|mooncake-columnar-standby-snapshot/2|{sid}|7".encode(),
                f"standby-arrow-ipc|{STANDBY_SNAPSHOT_VERSION}|{sid}|07".encode(),
                f"standby-arrow-ipc|{STANDBY_SNAPSHOT_VERSION}|{sid}|-1".encode(),
                f"standby-arrow-ipc|{STANDBY_SNAPSHOT_VERSION}|{sid}|{2**63}".encode(),
                f"standby-arrow-ipc|{STANDBY_SNAPSHOT_VERSION}|bad|7".encode(), b"\xff"):
        with pytest.raises(ManifestError):
            parse_standby_manifest(raw)
    with pytest.raises(ManifestError):  # and the complete-snapshot parser refuses a standby manifest
        parse_manifest(standby_manifest(sid, 7).encode())


def test_load_latest_falls_back_and_fails_loudly_when_nothing_loads(tmp_path: Path) -> None:
    primary, clocks = primary_with_pins()
    store = StandbySnapshotStore(SnapshotRepository(str(tmp_path), "c-standby"))
    assert store.load_latest() is None
    old = store.publish(standby_snapshot_of(primary, 3), clocks)
    new = store.publish(standby_snapshot_of(primary, 4), clocks)  # same ms: the id is bumped
    assert new > old
    assert store.load_latest()[0] == new
    (tmp_path / "c-standby" / new / "objects.arrow").write_bytes(b"garbage")
    sid, snap = store.load_latest()
    assert (sid, snap.last_sequence_id) == (old, 3)
    (tmp_path / "c-standby" / old / "manifest.txt").write_text("arrow-ipc|2.0.0|x|1|2")
    with pytest.raises(StandbySnapshotError):
        store.load_latest()


def test_digest_covers_every_payload() -> None:
    primary, _ = primary_with_pins()
    payloads = encode_standby(standby_snapshot_of(primary, 1))
    assert set(payloads) == {"objects.arrow", "replicas.arrow", "segments.arrow", "digest.json"}
    assert hashlib.sha256(payloads["objects.arrow"]).hexdigest() in payloads["digest.json"].decode()
