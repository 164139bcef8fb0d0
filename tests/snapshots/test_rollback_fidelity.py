"""Issue #14: what a v1 rollback hands the real upstream master is exact and loadable.

Segment ids and host ids, put start times of every object, upstream client ids, refusal of
segments awaiting remount, and the two segment-usage figures; carried through the engine, the
oplog, v2 and standby snapshots and the v1 writer. The v1 files written here are decoded
independently (msgpack + zstandard, not the project's decoder) and compared with the fixtures'
``expected.json`` (what the real upstream master held).
"""
from __future__ import annotations

import json
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zstandard

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig, errors
from mooncake_columnar.ha import oplog
from mooncake_columnar.ha.apply import apply_batch
from mooncake_columnar.ha.standby import master_of_standby, standby_snapshot_of
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.schema import SEGMENTS_LEGACY_SCHEMA, ReplicaStatus
from mooncake_columnar.snapshots.arrow_codec import DIGEST_FILE, SEGMENTS_FILE, decode_state, digest_of, encode_state
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.snapshots.standby import OBJECTS_FILE, decode_standby, encode_standby
from mooncake_columnar.snapshots.state import SnapshotState
from mooncake_columnar.store.objects import PUT_START_SPAN, ObjectTable
from mooncake_columnar.testing.fuzz_mutate import write_ipc
from mooncake_columnar.store.upstream_ids import is_upstream_uuid
from tests.fixtures import MOONCAKE_V1 as FIXTURES

MB, GIB = 1 << 20, 1 << 30
NOW_MS = 1_796_019_927_000
CLIENT = "7512713196436145955-365396099538825118"
SEG_ID = "2904354663345825683-17963832344043922323"


def clocks_at(ms: int = NOW_MS) -> ManualClocks:
    return ManualClocks(steady_ns=5_000_000_000_000, system_ns=ms * 1_000_000)


def master(clocks: ManualClocks | None = None, journal: OpLogWriter | None = None, **cfg) -> MasterService:
    return MasterService(MasterConfig(default_kv_lease_ttl_ms=1_000, **cfg), clocks=clocks or clocks_at(),
                         journal=journal)


def put(m: MasterService, key: str, size: int = 4096, client: str = CLIENT, **cfg) -> None:
    m.put_start(key, size, client_id=client, config=ReplicateConfig(**cfg))
    m.put_end(key, client_id=client)


# ---- the written v1 files, decoded independently ----------------------------------------------------
def _unzstd(blob: bytes):
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(blob), raw=False, strict_map_key=False)


def read_v1(root: Path, sid: str | None = None) -> tuple[dict, dict]:
    """(segments payload, {(tenant, key): metadata array}) of the latest (or ``sid``) snapshot."""
    base = root / "mooncake_cluster"
    sid = sid or (base / "latest.txt").read_text().strip()
    segments = _unzstd((base / sid / "segments").read_bytes())
    top = msgpack.unpackb((base / sid / "metadata").read_bytes(), raw=False, strict_map_key=False)
    objects = {(t, k): meta for blob in top["shards"].values() for t, k, meta in _unzstd(blob)["metadata"]}
    return segments, objects


def write_rollback(m: MasterService, root: Path) -> str:
    with SnapshotManager(m, SnapshotRepository(root), write_v1=True) as sm:
        return sm.snapshot_now()


@pytest.mark.parametrize("case", ["small_6", "many_1000"])
def test_fixture_to_engine_to_v1_keeps_upstream_segment_ids_client_ids_and_put_starts(case: str, tmp_path: Path):
    expected = json.loads((FIXTURES / case / "expected.json").read_text())
    m, _ = restore_master(SnapshotRepository(FIXTURES / case / "mooncake_master_snapshot"),
                          clocks=clocks_at(expected["snapshot"]["snapshot_wall_clock_ms"] + 5),
                          drop_expired=False)
    write_rollback(m, tmp_path)
    segments, objects = read_v1(tmp_path)

    by_name = {v[1]: v for v in segments["ms"].values()}
    owners = {sid: client for client, sids in segments["cs"].items() for sid in sids}
    for seg in expected["segments"]:
        written = by_name[seg["name"]]
        assert written[0] == seg["segment_id"]                   # upstream's id, not a derived one
        assert owners[seg["segment_id"]] == seg["owner_client_id"]
        assert (written[2], written[3], written[4]) == (seg["base"], seg["size"], seg["te_endpoint"])
        assert written[5] == 1 and written[8] == ""              # status OK; host_id as upstream wrote it
    assert set(segments["ms"]) == {seg["segment_id"] for seg in expected["segments"]}
    assert len(objects) == len(expected["objects"])
    for o in expected["objects"]:
        meta = objects[(o["tenant_id"], o["key"])]
        assert (meta[0], meta[1]) == (o["client_id"], o["put_start_time_ms"])
        replica_segments = [r[3][2] for r in meta[8:8 + meta[6]]]
        assert replica_segments == [next(s["segment_id"] for s in expected["segments"]
                                         if s["name"] == r["transport_endpoint"]) for r in o["replicas"]]


def test_fixture_restore_keeps_segment_ids_and_host_ids_in_the_engine():
    expected = json.loads((FIXTURES / "small_6" / "expected.json").read_text())
    m, _ = restore_master(SnapshotRepository(FIXTURES / "small_6" / "mooncake_master_snapshot"),
                          clocks=clocks_at(), drop_expired=False)
    info = m.segment_info()
    assert {n: i.segment_id for n, i in info.items()} == {s["name"]: s["segment_id"] for s in expected["segments"]}
    assert {i.host_id for i in info.values()} == {""}
    plain = next(o for o in expected["objects"] if o["key"] == "obj_plain")
    assert m.object_info("obj_plain").put_start_time_ms == plain["put_start_time_ms"]


# ---- segment identity in the engine ----------------------------------------------------------------
def test_mount_without_a_segment_id_generates_an_upstream_uuid_and_keeps_it():
    m = master()
    sid = m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    assert is_upstream_uuid(sid) and m.segment_info()["a"].segment_id == sid
    # remounting the same segment (with or without its id) is a no-op returning the same id
    assert m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB) == sid
    assert m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id=sid) == sid
    assert m.export_state().segments.column("segment_id").to_pylist() == [sid]


def test_mount_with_a_segment_id_keeps_it_and_refuses_that_id_for_another_segment():
    m = master()
    assert m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id=SEG_ID,
                           host_id="host-7") == SEG_ID
    assert (m.segment_info()["a"].segment_id, m.segment_info()["a"].host_id) == (SEG_ID, "host-7")
    with pytest.raises(errors.SegmentAlreadyExists):  # the same id again would be a second segment over its memory
        m.mount_segment("b", endpoint="e:2", client_id=CLIENT, base=1 << 33, size=MB, segment_id=SEG_ID)
    with pytest.raises(errors.SegmentAlreadyExists):  # same name, another id
        m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id="1-2")
    for bad in ("seg-a", "1-2-3", "18446744073709551616-1", ""):
        with pytest.raises(errors.InvalidParams, match="segment_id"):
            m.mount_segment("c", endpoint="e:3", client_id=CLIENT, base=1 << 34, size=MB, segment_id=bad)
    assert sorted(m.segment_info()) == ["a"]


def promoted_from_v2(src: MasterService) -> MasterService:
    """A master restored from ``src``'s state with every segment awaiting its client's remount."""
    return MasterService.from_state(src.export_state(), config=src.config, clocks=src.clocks,
                                    segments_readable=False)


def test_remount_after_promotion_adopts_the_clients_segment_id_and_refuses_a_taken_one():
    src = master()
    src.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    src.mount_segment("b", endpoint="e:2", client_id=CLIENT, base=1 << 33, size=MB, segment_id="5-6")
    put(src, "k", preferred_segments=("a",))
    m = promoted_from_v2(src)
    seg = dict(name="a", endpoint="e:1", client=CLIENT, base=1 << 40, size=MB)
    with pytest.raises(errors.InvalidParams, match="already mounted"):
        m.remount_segments(CLIENT, [dict(seg, segment_id="5-6")])  # b's id: refused, nothing changes
    assert m.segment_info()["a"].segment_id == src.segment_info()["a"].segment_id
    m.remount_segments(CLIENT, [dict(seg, segment_id=SEG_ID, host_id="h1")])
    info = m.segment_info()["a"]
    assert (info.segment_id, info.host_id, info.base, info.readable) == (SEG_ID, "h1", 1 << 40, True)
    assert m.get_replica_list("k")[0].address == 1 << 40
    m.verify()


# ---- oplog ------------------------------------------------------------------------------------------
def test_oplog_carries_segment_ids_and_put_starts_to_the_standby(tmp_path: Path):
    clocks = clocks_at()
    writer = OpLogWriter(FileOpLogStore(tmp_path), window=64, clocks=clocks)
    m = master(clocks, journal=writer)
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id=SEG_ID, host_id="h")
    put(m, "k1")
    clocks.advance(ms=250)
    put(m, "k2")
    writer.flush()
    standby = MasterService(m.config, clocks=clocks)
    for batch in FileOpLogStore(tmp_path).read_batches(0):
        apply_batch(standby, batch)
    assert (standby.segment_info()["a"].segment_id, standby.segment_info()["a"].host_id) == (SEG_ID, "h")
    assert [standby.object_info(k).put_start_time_ms for k in ("k1", "k2")] == [NOW_MS, NOW_MS + 250]


def _old_wire(batch: oplog.OpLogBatch, drop_put: tuple[str, ...] = (), drop_segment: tuple[str, ...] = ()) -> bytes:
    """The batch as a writer from before the dropped fields existed wrote it."""
    top = msgpack.unpackb(oplog.encode_batch(batch), raw=False)
    columns = msgpack.unpackb(top["columns"], raw=False)
    for name in drop_put:
        del columns[name]
    for seg in columns["segments"]:
        for name in drop_segment:
            seg.pop(name, None)
    top["columns"] = msgpack.packb(columns, use_bin_type=True)
    top["checksum"] = oplog._checksum(top["first_sequence_id"], top["count"], top["columns"])
    return msgpack.packb(top, use_bin_type=True)


def test_oplog_records_written_before_segment_ids_and_put_starts_still_decode_and_apply():
    rep = oplog.ReplicaDescriptor(1, 0, "a", 0, 100, int(ReplicaStatus.COMPLETE))
    batch = oplog.OpLogBatch(1, (
        oplog.OpLogEntry(1, oplog.OpType.SEGMENT_MOUNT, "default", "a",
                         oplog.SegmentPayload("a", "e:1", MB, CLIENT, SEG_ID, "h")),
        oplog.OpLogEntry(2, oplog.OpType.PUT_END, "default", "k",
                         oplog.PutEndPayload(CLIENT, 100, (rep,), 0, "", put_start_time_ms=7)),
    ))
    old = oplog.decode_batch(_old_wire(batch, ("put_start_time_ms",), ("segment_id", "host_id")))
    seg, put_end = old.entries[0].payload, old.entries[1].payload
    assert (seg.segment_id, seg.host_id, put_end.put_start_time_ms) == ("", "", 0)
    standby = MasterService(clocks=clocks_at())
    apply_batch(standby, old)
    assert is_upstream_uuid(standby.segment_info()["a"].segment_id)  # generated: the record named none
    assert standby.object_info("k").put_start_time_ms == 0
    assert oplog.decode_batch(oplog.encode_batch(batch)).entries == batch.entries  # the new fields round-trip


def test_standby_refuses_a_segment_mount_naming_another_segments_id():
    standby = MasterService(clocks=clocks_at())
    apply_batch(standby, oplog.OpLogBatch(1, (oplog.OpLogEntry(1, oplog.OpType.SEGMENT_MOUNT, "default", "a",
                                                   oplog.SegmentPayload("a", "e:1", MB, CLIENT, SEG_ID)),)))
    with pytest.raises(errors.OpLogInvalidEntry, match="segment id"):
        apply_batch(standby, oplog.OpLogBatch(2, (oplog.OpLogEntry(2, oplog.OpType.SEGMENT_MOUNT, "default", "b",
                                                       oplog.SegmentPayload("b", "e:2", MB, CLIENT, SEG_ID)),)))


# ---- v2 and standby snapshots ----------------------------------------------------------------------
def test_v2_snapshot_keeps_segment_ids_host_ids_and_put_starts_of_completed_objects():
    clocks = clocks_at()
    m = master(clocks)
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id=SEG_ID, host_id="h")
    put(m, "done")
    clocks.advance(ms=10)
    m.put_start("inflight", 100, client_id=CLIENT)
    back = decode_state(encode_state(m.export_state()))
    assert back.segments.select(["segment_id", "host_id"]).to_pylist() == [{"segment_id": SEG_ID, "host_id": "h"}]
    starts = dict(zip(back.objects.column("key").to_pylist(), back.objects.column("put_start_time_ms").to_pylist()))
    assert starts == {"done": NOW_MS, "inflight": NOW_MS + 10}
    restored = MasterService.from_state(back, clocks=clocks)
    assert restored.object_info("done").put_start_time_ms == NOW_MS
    assert restored.segment_info()["a"].segment_id == SEG_ID


def test_v2_snapshot_written_before_segment_ids_restores_with_generated_ids():
    m = master()
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    put(m, "k")
    state = m.export_state()
    old = state.segments.select(SEGMENTS_LEGACY_SCHEMA.names).cast(SEGMENTS_LEGACY_SCHEMA)
    payloads = encode_state(state)
    payloads[SEGMENTS_FILE] = write_ipc(old)
    payloads = {k: v for k, v in payloads.items() if k != DIGEST_FILE}
    payloads[DIGEST_FILE] = digest_of(payloads)
    back = decode_state(payloads)
    assert back.segments.column("segment_id").to_pylist() == [""]
    restored = MasterService.from_state(back, clocks=m.clocks)
    assert is_upstream_uuid(restored.segment_info()["a"].segment_id)
    restored.verify()


def test_standby_snapshot_carries_put_starts_and_segment_ids_and_older_ones_decode():
    m = master()
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB, segment_id=SEG_ID, host_id="h")
    put(m, "k")
    snap = standby_snapshot_of(m, 3)
    payloads = {k: bytes(v) for k, v in encode_standby(snap).items()}
    again = master_of_standby(decode_standby(payloads, 3), clocks=m.clocks)
    assert again.object_info("k").put_start_time_ms == NOW_MS
    assert (again.segment_info()["a"].segment_id, again.segment_info()["a"].host_id) == (SEG_ID, "h")
    # a writer from before these columns: put start 0, segment id generated
    for name, table, drop in ((OBJECTS_FILE, snap.objects, ["put_start_time_ms"]),
                              (SEGMENTS_FILE, snap.segments, ["segment_id", "host_id"])):
        payloads[name] = write_ipc(table.drop_columns(drop))
    payloads = {k: v for k, v in payloads.items() if k != DIGEST_FILE}
    payloads[DIGEST_FILE] = digest_of(payloads, version=1)
    old = master_of_standby(decode_standby(payloads, 3), clocks=m.clocks)
    assert old.object_info("k").put_start_time_ms == 0
    assert is_upstream_uuid(old.segment_info()["a"].segment_id)


# ---- put start times ------------------------------------------------------------------------------
def test_put_start_time_is_kept_after_put_end():
    clocks = clocks_at()
    m = master(clocks)
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    put(m, "k")
    clocks.advance(ms=5_000)
    assert m.object_info("k").put_start_time_ms == NOW_MS
    assert m.to_arrow().column("put_start_time_ms").to_pylist() == [NOW_MS]


def test_put_start_storage_is_exact_within_its_window_and_saturates_older_values_beyond_it():
    t = ObjectTable(16)
    rows = t.take_rows(6)
    t.set_put_start(rows[:3], np.array([NOW_MS, NOW_MS - 5, 0]))
    assert t.put_start_ms(rows[:3]).tolist() == [NOW_MS, NOW_MS - 5, 0]
    t.set_put_start(rows[3:4], NOW_MS - 20 * 86_400_000)  # below the base: the base moves, all stay exact
    t.set_put_start(rows[4:5], NOW_MS + 20 * 86_400_000)  # 40 days spread: within the ~49.7-day window
    assert t.put_start_ms(rows[:5]).tolist() == [NOW_MS, NOW_MS - 5, 0, NOW_MS - 20 * 86_400_000,
                                                 NOW_MS + 20 * 86_400_000]
    late = NOW_MS + 60 * 86_400_000  # 80 days spread: the newest stay exact, the oldest saturate
    t.set_put_start(rows[5:6], late)
    got = t.put_start_ms(rows[:6]).tolist()
    oldest = late - PUT_START_SPAN + (1 << 31)  # the window keeps ~24.8 days of room above the newest
    want = [NOW_MS, NOW_MS - 5, 0, NOW_MS - 20 * 86_400_000, NOW_MS + 20 * 86_400_000, late]
    assert got == [w and max(w, oldest) for w in want]  # saturated: later than it was, never earlier
    assert got[0] == got[4] == oldest > NOW_MS + 20 * 86_400_000
    assert t.put_start_rel.dtype == np.uint32


# ---- refusals ------------------------------------------------------------------------------------
def test_v1_rollback_refuses_segments_awaiting_remount_and_publishes_nothing(tmp_path: Path):
    src = master()
    src.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    put(src, "k")
    m = promoted_from_v2(src)
    with pytest.raises(errors.RollbackSegmentsAwaitingRemount) as err:
        write_rollback(m, tmp_path / "v1")
    assert err.value.segments == ("a",) and isinstance(err.value, errors.SerializeFail)
    assert SnapshotRepository(tmp_path / "v1").list() == []
    assert m.metrics.get("snapshot_v1_refused") == 1


def test_snapshot_manager_v1_refusal_keeps_the_last_v1_latest_and_writes_v2_to_the_fallback(tmp_path: Path):
    src = master()
    src.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    put(src, "k")
    v1, fallback = SnapshotRepository(tmp_path / "v1"), SnapshotRepository(tmp_path / "v2")
    with SnapshotManager(src, v1, write_v1=True, v2_fallback_repo=fallback) as sm:
        good = sm.snapshot_now()
    m = promoted_from_v2(src)
    src.clocks.advance(ms=1_000)
    with SnapshotManager(m, v1, write_v1=True, v2_fallback_repo=fallback) as sm:
        with pytest.raises(errors.RollbackSegmentsAwaitingRemount) as err:
            sm.snapshot_now()
        assert sm.last_v1_refusal is err.value
        assert v1.latest() == good  # upstream restores latest.txt only: it still names a v1 it can load
        assert err.value.fallback_snapshot_id == fallback.latest()
        m.remount_segments(CLIENT, [dict(name="a", endpoint="e:1", client=CLIENT, base=1 << 32, size=MB)])
        assert sm.snapshot_now() != good and sm.last_v1_refusal is None
    restored, _ = restore_master(fallback, clocks=m.clocks, drop_expired=False)
    assert restored.object_info("k").put_start_time_ms == NOW_MS


def test_require_upstream_client_ids_refuses_other_ids_at_mount_remount_and_put_start():
    m = master(require_upstream_client_ids=True)
    with pytest.raises(errors.InvalidParams, match="require_upstream_client_ids"):
        m.mount_segment("a", endpoint="e:1", client_id="client-a", base=1 << 32, size=MB)
    with pytest.raises(errors.InvalidParams, match="require_upstream_client_ids"):
        m.remount_segments("client-a", [])
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    with pytest.raises(errors.InvalidParams, match="require_upstream_client_ids"):
        m.put_start("k", 10, client_id="writer")
    with pytest.raises(errors.InvalidParams, match="require_upstream_client_ids"):
        m.batch_put_start(["k"], [10], client_id="writer")
    put(m, "k")
    assert m.object_count() == 1


def test_v1_writer_refuses_non_uuid_client_ids_typed_and_names_the_first(tmp_path: Path):
    m = master()
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    put(m, "k", client="writer-1")
    with pytest.raises(errors.RollbackClientIdsNotUpstream) as err:
        write_rollback(m, tmp_path)
    assert (err.value.field, err.value.client) == ("objects.client", "writer-1")


# ---- segment usage -------------------------------------------------------------------------------
def test_segment_info_reports_exact_and_allocation_unit_bytes_above_3_75_gib(tmp_path: Path):
    m = master()
    m.mount_segment("big", endpoint="e:1", client_id=CLIENT, base=1 << 40, size=16 * GIB)
    for i, size in enumerate((1001, 7, 4096)):
        put(m, f"k{i}", size=size)
    info = m.segment_info()["big"]
    assert info.allocation_unit == 8
    assert info.used_bytes == 1001 + 7 + 4096                      # as upstream's QuerySegments
    assert info.held_bytes == 1008 + 8 + 4096 == m.segment_usage()["big"][0]  # whole 8-byte units
    assert m.metrics.get("segment_used_bytes", segment="big") == info.used_bytes
    assert m.export_state().segments.column("used").to_pylist() == [info.used_bytes]
    write_rollback(m, tmp_path)
    segments, _ = read_v1(tmp_path)
    allocator = next(iter(segments["ms"].values()))[7]
    assert allocator[3] == info.used_bytes  # the allocator's cur_size, which upstream reports as used


def test_export_state_is_a_valid_state_with_segment_identity_columns():
    m = master()
    m.mount_segment("a", endpoint="e:1", client_id=CLIENT, base=1 << 32, size=MB)
    st = m.export_state()
    assert isinstance(st, SnapshotState) and st.segments.column_names[-2:] == ["segment_id", "host_id"]
    st.validate()


# ---- upstream object checksums (sparse) ------------------------------------------------------------
def fixture_with_checksums(tmp_path: Path, sums: dict[str, int]) -> SnapshotRepository:
    """small_6 with upstream object checksums on the objects named in ``sums`` (v5 layout:
    the checksum follows the group id)."""
    import shutil
    root = tmp_path / "fixture"
    shutil.copytree(FIXTURES / "small_6" / "mooncake_master_snapshot", root)
    snap = next(p for p in (root / "mooncake_cluster").iterdir() if p.is_dir())
    top = msgpack.unpackb((snap / "metadata").read_bytes(), raw=False, strict_map_key=False)
    for idx, blob in top["shards"].items():
        shard = _unzstd(blob)
        for _, key, meta in shard["metadata"]:
            if key in sums:
                meta.append(sums[key])
        top["shards"][idx] = zstandard.ZstdCompressor().compress(msgpack.packb(shard))
    (snap / "metadata").write_bytes(msgpack.packb(top))
    return SnapshotRepository(root)


def test_upstream_object_checksums_survive_engine_v2_and_v1_and_leave_with_their_object(tmp_path: Path):
    sums = {"obj_plain": 2**64 - 5, "obj_group": 7}
    m, _ = restore_master(fixture_with_checksums(tmp_path, sums), clocks=clocks_at(), drop_expired=False)
    got = {k: m.object_info(k).object_checksum for k in m.to_arrow().column("key").to_pylist()}
    assert {k: v for k, v in got.items() if v is not None} == sums
    # v2 (a checksums.arrow beside the three files) and back
    back = MasterService.from_state(decode_state(encode_state(m.export_state())), clocks=m.clocks)
    assert back.object_info("obj_plain").object_checksum == sums["obj_plain"]
    # v1: the checksum is the last field of the object's metadata, as upstream writes it
    write_rollback(back, tmp_path / "v1")
    _, objects = read_v1(tmp_path / "v1")
    for (_, key), meta in objects.items():
        assert (meta[-1] if key in sums else None) == sums.get(key), key
        assert len(meta) == 10 + meta[6] + (key in sums)
    # a removed object's row is recycled without its checksum
    back.remove("obj_plain", force=True)
    put(back, "new", preferred_segments=("seg_a",))
    assert back.object_info("new").object_checksum is None
    assert back.export_state().checksums.to_pylist() == [
        {"object_index": i, "checksum": 7} for i, k in enumerate(back.export_state().objects.column("key").to_pylist())
        if k == "obj_group"]


def test_restore_cleanup_keeps_checksums_with_their_objects(tmp_path: Path):
    expected = json.loads((FIXTURES / "small_6" / "expected.json").read_text())
    survivor = expected["restore_observations"]["default_restore"]["surviving_keys"][0]
    dropped = next(o["key"] for o in expected["objects"] if o["key"] != survivor and not o["hard_pinned"])
    sums = {survivor: 11, dropped: 22}
    s1 = expected["restore_observations"]["default_restore"]["restore_started_wall_clock_ms"]
    m, stats = restore_master(fixture_with_checksums(tmp_path, sums), clocks=clocks_at(s1))
    assert stats.objects_dropped > 0
    assert m.object_info(survivor).object_checksum == 11
    assert m.export_state().checksums.column("checksum").to_pylist() == [11]
