"""Upstream v1 complete snapshots: the real fixtures, the Phase 2 adapter, and rollback writes."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest
import zstandard

from mooncake_columnar.clock import NS_PER_MS, NS_PER_S, ManualClocks
from mooncake_columnar.errors import (
    SerializeFail,
    SnapshotError,
    SnapshotFieldError,
    SnapshotPayloadError,
)
from mooncake_columnar.schema import NO_DEADLINE, ReplicaKind
from mooncake_columnar.snapshots.complete import restore_latest
from mooncake_columnar.snapshots.manifest import parse_manifest
from mooncake_columnar.snapshots.mooncake_v1 import (
    METADATA_FILE,
    SEGMENTS_FILE,
    decode_v1,
    shard_index,
    write_v1,
)
from mooncake_columnar.snapshots.repository import SnapshotRepository

from mooncake_columnar.testing.states import make_state
from tests.fixtures import MOONCAKE_V1 as FIXTURES
from tests.fixtures import V1_CASES as CASES

C1 = 123 * NS_PER_S  # restoring process's steady clock: unrelated to the writer's


def _load(case: str) -> tuple[dict, SnapshotRepository]:
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    return expected, SnapshotRepository(FIXTURES / case / "mooncake_master_snapshot")


def _decode(repo: SnapshotRepository, s1_ms: int):
    files = repo.read(repo.latest())
    return decode_v1(files.payloads, restore_system_ns=s1_ms * NS_PER_MS, restore_steady_ns=C1)


@pytest.mark.parametrize("case", CASES)
def test_fixture_layout_and_manifest(case: str) -> None:
    expected, repo = _load(case)
    snap = expected["snapshot"]
    assert repo.latest() == snap["latest_txt"] == snap["snapshot_id"]
    assert repo.candidates() == [snap["snapshot_id"]]
    files = repo.read(snap["snapshot_id"])
    assert files.manifest.decode() == snap["manifest_txt"]
    m = parse_manifest(files.manifest)
    assert (m.tag, m.version, m.snapshot_id, m.is_v2) == ("messagepack", "1.0.0", snap["snapshot_id"], False)
    assert files.payloads["descriptor.txt"].decode() == snap["descriptor_txt"]
    for rel, info in snap["files"].items():
        name = rel.rsplit("/", 1)[1]
        data = files.manifest if name == "manifest.txt" else (
            snap["latest_txt"].encode() if name == "latest.txt" else files.payloads[name])
        assert (len(data), hashlib.sha256(data).hexdigest()) == (info["bytes"], info["sha256"])


@pytest.mark.parametrize("case", CASES)
def test_fixture_restores_every_expected_field(case: str) -> None:
    expected, repo = _load(case)
    s1_ms = expected["restore_observations"]["default_restore"]["restore_started_wall_clock_ms"]
    state = _decode(repo, s1_ms)

    segs = {row["name"]: row for row in state.segments.to_pylist()}
    assert set(segs) == {s["name"] for s in expected["segments"]}
    for s in expected["segments"]:
        row = segs[s["name"]]
        assert (row["base"], row["size"], row["endpoint"], row["client"], row["readable"]) == (
            s["base"], s["size"], s["te_endpoint"], s["owner_client_id"], True)

    objs = state.objects.to_pylist()
    by_key = {(o["tenant"], o["key"]): i for i, o in enumerate(objs)}
    assert len(by_key) == len(objs) == len(expected["objects"])
    reps = state.replicas.to_pylist()
    reps_of: dict[int, list[dict]] = {}
    for r in reps:
        reps_of.setdefault(r["object_index"], []).append(r)
    for e in expected["objects"]:
        i = by_key[(e["tenant_id"], e["key"])]
        o = objs[i]
        assert (o["size_bytes"], o["client"], o["put_start_time_ms"], o["hard_pinned"], o["group"],
                o["data_type"], o["replica_count"], o["processing"]) == (
            e["size"], e["client_id"], e["put_start_time_ms"], e["hard_pinned"], e["group_id"],
            e["data_type"], len(e["replicas"]), False)
        # Phase 2 adapter: remaining = D_sys - S1, new = C1 + remaining.
        assert o["lease_deadline_ns"] == C1 + (e["lease_timeout_ms"] - s1_ms) * NS_PER_MS
        assert (o["soft_pin_enabled"], o["soft_pin_deadline_ns"]) == (False, NO_DEADLINE)
        got = sorted(reps_of[i], key=lambda r: r["replica_id"])
        want = sorted(e["replicas"], key=lambda r: r["id"])
        for g, w in zip(got, want, strict=True):
            seg = segs[g["segment"]]
            assert w["type"] == "MEMORY" and g["kind"] == ReplicaKind.MEMORY
            assert (g["replica_id"], g["status"], g["size"], g["offset"], seg["endpoint"], seg["base"]) == (
                w["id"], w["status"], w["size"], w["offset_in_segment"], w["transport_endpoint"],
                w["segment_base"])
            assert seg["base"] + g["offset"] == w["buffer_address"]
            assert g["readable"] is True
    max_id = max(r["id"] for e in expected["objects"] for r in e["replicas"])
    assert state.replica_next_id == max_id + 1
    used = {s["name"]: 0 for s in expected["segments"]}
    for e in expected["objects"]:
        for r in e["replicas"]:
            used[r["transport_endpoint"]] += r["size"]
    assert {k: v["used"] for k, v in segs.items()} == used


@pytest.mark.parametrize("case", CASES)
def test_fixture_restore_cleanup_matches_upstream_plus_hard_pin(case: str) -> None:
    expected, repo = _load(case)
    obs = expected["restore_observations"]
    s1_ms = obs["default_restore"]["restore_started_wall_clock_ms"]
    clocks = ManualClocks(steady_ns=C1, system_ns=s1_ms * NS_PER_MS)
    state, manifest, stats = restore_latest(repo, clocks)
    hard = {e["key"] for e in expected["objects"] if e["hard_pinned"]}
    # Upstream erases every expired object; the RFC keeps hard-pinned complete objects.
    assert set(state.objects.column("key").to_pylist()) == set(obs["default_restore"]["surviving_keys"]) | hard
    assert stats.format_version == "1.0.0" and stats.fallbacks == 0
    assert stats.objects_restored + stats.objects_dropped == len(expected["objects"])
    state.validate()
    kept, _, _ = restore_latest(repo, clocks, drop_expired=False)
    assert kept.objects.num_rows == obs["skip_cleanup_restore"]["key_count"]


def test_phase2_v1_system_ms_converts_to_steady() -> None:
    expected, repo = _load("small_6")
    state = _decode(repo, 1_796_019_911_546)
    lease = dict(zip(state.objects.column("key").to_pylist(),
                     state.objects.column("lease_deadline_ns").to_pylist()))
    assert lease["obj_leased"] == C1 + 4_989 * NS_PER_MS    # granted 5 s, 11 ms before restore
    assert lease["obj_plain"] == C1 - 11 * NS_PER_MS        # expired stays expired


@pytest.mark.parametrize("case", CASES)
def test_shard_index_matches_upstream(case: str) -> None:
    _, repo = _load(case)
    meta = msgpack.unpackb(repo.read(repo.latest()).payloads[METADATA_FILE], strict_map_key=False)
    for idx, blob in meta["shards"].items():
        shard = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(blob))
        for tenant, key, m in shard["metadata"]:
            assert shard_index(m[-1] or key) == idx  # grouped objects route by group id


# ---- corrupt v1 candidates fail as a whole ---------------------------------------------------------
def _fixture_copy(tmp_path: Path) -> tuple[SnapshotRepository, Path]:
    src = FIXTURES / "small_6" / "mooncake_master_snapshot"
    shutil.copytree(src, tmp_path / "root")
    for p in (tmp_path / "root").rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    sid = (src / "mooncake_cluster" / "latest.txt").read_text().strip()
    return SnapshotRepository(tmp_path / "root"), tmp_path / "root" / "mooncake_cluster" / sid


def _rewrite_one_object(meta_path: Path, mutate) -> None:
    top = msgpack.unpackb(meta_path.read_bytes(), strict_map_key=False)
    idx = sorted(top["shards"])[0]
    shard = msgpack.unpackb(zstandard.ZstdDecompressor().decompress(top["shards"][idx]))
    mutate(shard["metadata"][0][2])
    top["shards"][idx] = zstandard.ZstdCompressor(level=3).compress(msgpack.packb(shard))
    meta_path.write_bytes(msgpack.packb(top))


@pytest.mark.parametrize("mutation", ["bad_uuid", "lease_as_string", "unsupported_replica",
                                      "unknown_segment", "extra_field", "truncated_shard"])
def test_one_bad_object_fails_the_candidate(tmp_path: Path, mutation: str) -> None:
    repo, snap_dir = _fixture_copy(tmp_path)
    meta_path = snap_dir / METADATA_FILE
    if mutation == "truncated_shard":
        top = msgpack.unpackb(meta_path.read_bytes(), strict_map_key=False)
        idx = sorted(top["shards"])[0]
        top["shards"][idx] = top["shards"][idx][:-3]
        meta_path.write_bytes(msgpack.packb(top))
    else:
        def mutate(m: list) -> None:
            if mutation == "bad_uuid":
                m[0] = "not-a-uuid"
            elif mutation == "lease_as_string":
                m[3] = "1796019916535"
            elif mutation == "unsupported_replica":
                m[8][2] = 1  # DISK
            elif mutation == "unknown_segment":
                m[8][3][2] = "1-2"
            elif mutation == "extra_field":
                m.extend([1, 2])
        _rewrite_one_object(meta_path, mutate)
    with pytest.raises(SnapshotPayloadError):
        decode_v1(repo.read(repo.latest()).payloads, restore_system_ns=0, restore_steady_ns=0)
    clocks = ManualClocks()
    with pytest.raises(SnapshotError) as info:  # the only candidate fails: nothing is restored
        restore_latest(repo, clocks)
    assert info.value.stats.fallbacks == 1


def test_corrupt_segments_payload_rejected(tmp_path: Path) -> None:
    repo, snap_dir = _fixture_copy(tmp_path)
    (snap_dir / SEGMENTS_FILE).write_bytes(b"\x28\xb5\x2f\xfd garbage")
    with pytest.raises(SnapshotPayloadError):
        decode_v1(repo.read(repo.latest()).payloads, restore_system_ns=0, restore_steady_ns=0)


@pytest.mark.parametrize("allocator_fields", [(1, None), (True, None), (True, 5)])
def test_malformed_allocator_slot_fails_the_candidate(tmp_path: Path, allocator_fields) -> None:
    """The reader ignores the allocator state itself but not a malformed has_allocator slot."""
    repo, snap_dir = _fixture_copy(tmp_path)
    top = msgpack.unpackb(zstandard.ZstdDecompressor().decompress((snap_dir / SEGMENTS_FILE).read_bytes()),
                          strict_map_key=False)
    next(iter(top["ms"].values()))[6:8] = allocator_fields
    (snap_dir / SEGMENTS_FILE).write_bytes(zstandard.ZstdCompressor().compress(msgpack.packb(top)))
    with pytest.raises(SnapshotPayloadError, match="malformed MountedSegment"):
        decode_v1(repo.read(repo.latest()).payloads, restore_system_ns=0, restore_steady_ns=0)


# ---- rollback writer ------------------------------------------------------------------------------
def test_write_v1_round_trips(tmp_path: Path) -> None:
    system_now, steady_now = 1_796_019_927_073 * NS_PER_MS + 456, 40 * NS_PER_S
    n = 300
    lease = steady_now + (np.arange(n) - 100) * 7 * NS_PER_MS
    state = make_state(n, replicas_per_object=2, lease=lease, hard=np.arange(n) % 5 == 0,
                       soft=steady_now + NS_PER_S, soft_enabled=True)
    repo = SnapshotRepository(tmp_path)
    sid = write_v1(repo, state, system_now, steady_now)
    files = repo.read(sid)
    assert files.manifest.decode() == f"messagepack|1.0.0|{sid}"
    assert files.payloads["descriptor.txt"] == f"0|0|{system_now // NS_PER_MS}".encode()
    back = decode_v1(files.payloads, restore_system_ns=system_now, restore_steady_ns=steady_now)
    order = np.argsort(back.objects.column("key").to_numpy(zero_copy_only=False))
    objs = back.objects.take(order)
    for name in ("tenant", "key", "client", "size_bytes", "data_type", "group", "hard_pinned",
                 "put_start_time_ms", "replica_count"):
        assert objs.column(name).equals(state.objects.column(name)), name
    got = objs.column("lease_deadline_ns").to_numpy()
    assert ((lease - got >= 0) & (lease - got < NS_PER_MS)).all()  # ms precision, never extended
    assert not any(objs.column("soft_pin_enabled").to_pylist())   # v1 has no soft-pin slot
    remap = np.empty(n, np.int64)
    remap[order] = np.arange(n)
    reps = back.replicas
    def key(t, idx):
        return sorted(zip(idx, t.column("replica_id").to_pylist(), t.column("segment").to_pylist(),
                           t.column("offset").to_pylist(), t.column("size").to_pylist(),
                           t.column("status").to_pylist()))
    assert key(reps, remap[reps.column("object_index").to_numpy()].tolist()) == \
        key(state.replicas, state.replicas.column("object_index").to_pylist())
    def by_name(t):
        return t.sort_by("name")  # v1 keys segments by UUID, so row order differs
    assert by_name(back.segments).equals(by_name(state.segments))
    assert back.replica_next_id == state.replica_next_id


def test_write_v1_rejects_non_uuid_clients(tmp_path: Path) -> None:
    state = make_state(2)
    objects = state.objects.set_column(2, state.objects.schema.field("client"), pa.array(["c1", "c2"]))
    with pytest.raises(SerializeFail):
        write_v1(SnapshotRepository(tmp_path), dataclasses.replace(state, objects=objects), 0, 0)
    assert SnapshotRepository(tmp_path).list() == []  # nothing was published


def test_write_v1_refuses_extents_sharing_an_upstream_allocation_unit(tmp_path: Path) -> None:
    """In a 16 GiB segment upstream's allocator counts 8-byte units; byte-packed extents that
    share one have no upstream representation (nor an engine one: the state's validation rejects
    the extent off its unit), so the rollback write fails and publishes nothing."""
    state = make_state(2, segments=("seg_a",))
    reps, objs = state.replicas, state.objects
    for name, values in (("offset", [0, 1001]), ("size", [1001, 1000])):
        i = reps.schema.get_field_index(name)
        reps = reps.set_column(i, reps.schema.field(name), pa.array(values, pa.int64()))
    objs = objs.set_column(objs.schema.get_field_index("size_bytes"), objs.schema.field("size_bytes"),
                           pa.array([1001, 1000], pa.int64()))
    with pytest.raises(SnapshotFieldError, match="replicas.offset row 1: .*allocation unit"):
        write_v1(SnapshotRepository(tmp_path), dataclasses.replace(state, objects=objs, replicas=reps), 0, 0)
    assert SnapshotRepository(tmp_path).list() == []


def _shape(x, prefix: str = "", out: set | None = None) -> set:
    """Paths and leaf types of a decoded v1 payload: map keys (shard numbers and UUIDs generic),
    record positions, zstd-msgpack blobs opened (zstd blobs of raw bytes, like the allocator's
    node arrays, are a ``zstd:bytes`` leaf)."""
    out = set() if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            generic = isinstance(k, int) or (isinstance(k, str) and k.replace("-", "").isdigit())
            _shape(v, f"{prefix}/{'*' if generic else k}", out)
    elif isinstance(x, list):
        for i, e in enumerate(x):
            _shape(e, f"{prefix}[{i if len(x) <= 12 else '*'}]", out)
    elif isinstance(x, bytes):
        raw = zstandard.ZstdDecompressor().decompress(x, max_output_size=1 << 30)
        try:
            _shape(msgpack.unpackb(raw, strict_map_key=False), prefix + "/zstd", out)
        except msgpack.ExtraData:
            out.add(f"{prefix}/zstd:bytes")
    else:
        out.add(f"{prefix}:{type(x).__name__}")
    return out


@pytest.mark.parametrize("case", CASES)
def test_write_v1_payloads_have_upstream_structure(case: str, tmp_path: Path) -> None:
    """Rollback: a fixture written by upstream, restored and written back, has upstream's layout."""
    _, repo = _load(case)
    files = repo.read(repo.latest())
    s0 = int(files.payloads["descriptor.txt"].split(b"|")[-1]) * NS_PER_MS
    state = decode_v1(files.payloads, restore_system_ns=s0, restore_steady_ns=C1)
    out = SnapshotRepository(tmp_path)
    ours = out.read(write_v1(out, state, s0, C1)).payloads
    for name in (METADATA_FILE, SEGMENTS_FILE):
        theirs_raw, ours_raw = files.payloads[name], ours[name]
        if name == SEGMENTS_FILE:  # the whole payload is one zstd blob
            theirs_raw, ours_raw = (zstandard.ZstdDecompressor().decompress(b, max_output_size=1 << 30)
                                    for b in (theirs_raw, ours_raw))
        assert _shape(msgpack.unpackb(ours_raw, strict_map_key=False)) == \
            _shape(msgpack.unpackb(theirs_raw, strict_map_key=False)), name
