"""Forged but well-formed decoded values: every loader (v2 and v1 restore, standby oplog apply)
refuses them with a typed error naming table, field and row, falls back to the older good
snapshot where there is one, leaves a standby as it was on a refused apply, and whatever loads
passes the engine's self-check and keeps serving puts.

Forgeries are made the way someone with write access to the storage would: values changed in
the Arrow payloads and the digest (or the manifest checksum) recomputed."""
from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import (
    ManifestClockError,
    NoUsableSnapshot,
    OpLogInvalidEntry,
    SnapshotDecodeError,
    SnapshotError,
    SnapshotExtentError,
    SnapshotFieldError,
    SnapshotIntegrityError,
)
from mooncake_columnar.ha.apply import apply_batch
from mooncake_columnar.ha.oplog import (
    OpLogBatch,
    OpLogEntry,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    SegmentPayload,
)
from mooncake_columnar.ha.standby import StandbyFailed, StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig, SoftPinAction
from mooncake_columnar.schema import ReplicaStatus
from mooncake_columnar.snapshots.arrow_codec import (
    DIGEST_FILE,
    PAYLOAD_FILES,
    digest_of,
)
from mooncake_columnar.snapshots.complete import as_snapshot_error
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.manifest import (
    MANIFEST_FILE,
    v2_manifest,
)
from mooncake_columnar.snapshots.mooncake_v1 import METADATA_FILE
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.states import NEXT_ID_METADATA_KEY as _NEXT_ID_KEY

CFG = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10)
SEG_SIZE = 1 << 20
WRITER = "11-22"
TOO_BIG = 2**63  # the first value outside int64


# ---- a primary with two snapshots: the older stays good, the newer gets forged ---------------------
def _primary() -> tuple[MasterService, ManualClocks]:
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(CFG, clocks=clocks)
    m.mount_segment("seg_a", endpoint="seg_a:1", client_id="1-1", base=1 << 32, size=SEG_SIZE)
    for i in range(4):  # one segment: every extent can collide with another
        m.put_start(f"k{i}", 1000 + i, client_id=WRITER,
                    config=ReplicateConfig(soft_pin_action=SoftPinAction.ENABLE if i == 0 else SoftPinAction.PRESERVE))
        m.put_end(f"k{i}", client_id=WRITER)
    m.get_replica_list("k1")  # a live lease: now + 10 s
    return m, clocks


def _two_snapshots(tmp_path: Path, *, write_v1: bool = False) -> tuple[SnapshotRepository, str, str, ManualClocks]:
    m, clocks = _primary()
    repo = SnapshotRepository(tmp_path / "snapshots")
    manager = SnapshotManager(m, repo, retention=5, write_v1=write_v1, prefault=False)
    older = manager.snapshot_now()
    clocks.advance(s=1)
    m.put_start("newer_only", 500, client_id=WRITER)
    m.put_end("newer_only", client_id=WRITER)
    newer = manager.snapshot_now()
    manager.stop()
    return repo, older, newer, clocks


def _dir(repo: SnapshotRepository, tmp_path: Path, sid: str) -> Path:
    return tmp_path / "snapshots" / repo.cluster_id / sid


def _forge(repo: SnapshotRepository, tmp_path: Path, sid: str, *, next_id: int | None = None,
           **changes: dict[str, dict[int, int]]) -> None:
    """Rewrite v2 payloads with values changed (``objects={"size_bytes": {row: value}}``...) and
    digest.json recomputed: a well-formed forgery only the values give away."""
    d = _dir(repo, tmp_path, sid)
    payloads = {}
    for name in PAYLOAD_FILES:
        table = pa.ipc.open_file(pa.py_buffer((d / name).read_bytes())).read_all()
        for column, rows in changes.get(name.split(".")[0], {}).items():
            i = table.schema.get_field_index(column)
            values = table.column(column).to_numpy().copy()
            for row, value in rows.items():
                values[row] = value
            table = table.set_column(i, table.schema.field(column), pa.array(values, table.schema.field(column).type))
        if next_id is not None and name == "replicas.arrow":
            table = table.replace_schema_metadata({_NEXT_ID_KEY: str(next_id).encode()})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
        payloads[name] = sink.getvalue().to_pybytes()
        (d / name).write_bytes(payloads[name])
    (d / DIGEST_FILE).write_bytes(digest_of(payloads))


def _restore(repo: SnapshotRepository, clocks: ManualClocks):
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + 2 * NS_PER_S)
    return restore_master(repo, config=CFG, clocks=new, prefault=False)


def _assert_fell_back(repo, clocks, older: str, newer: str, error_type: type[SnapshotError], table: str,
                      field: str) -> SnapshotError:
    """The newer candidate is refused with ``error_type`` naming table.field; the older one is
    restored, passes the self-check and still takes puts."""
    r, stats = _restore(repo, clocks)
    assert stats.snapshot_id == older and stats.fallbacks == 1
    (sid, error), = stats.rejections
    assert sid == newer and isinstance(error, error_type), error
    assert stats.failures == [(newer, f"{type(error).__name__}: {error}")]
    if isinstance(error, SnapshotFieldError):
        assert (error.table, error.field) == (table, field)
    assert f"{table}.{field}" in str(error)
    r.verify()
    assert r.exist_key("k1") and not r.exist_key("newer_only")
    r.put_start("after_restore", 4096, client_id=WRITER)  # no OverflowError, no broken allocator
    r.put_end("after_restore", client_id=WRITER)
    r.verify()
    return error


# ---- v2 restore ------------------------------------------------------------------------------------
def test_v2_object_size_near_2_63_is_refused_and_the_older_snapshot_restores(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    size = TOO_BIG - 8  # object and replica agree: only the segment bound gives it away
    _forge(repo, tmp_path, newer, objects={"size_bytes": {0: size}}, replicas={"size": {0: size}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "replicas", "offset")
    assert error.row == 0 and "beyond segment capacity" in str(error)


def test_v2_object_size_alone_forged_is_refused_as_differing_from_its_replica(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, objects={"size_bytes": {2: TOO_BIG - 8}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "replicas", "size")
    assert error.row == 2


@pytest.mark.parametrize("next_id", [TOO_BIG, TOO_BIG - 1, 2**62 + 1], ids=["2**63", "2**63-1", "2**62+1"])
def test_v2_replica_next_id_at_2_63_is_refused(tmp_path: Path, next_id: int) -> None:
    """Past 2**62 the engine's int64 id counter could wrap on later puts (2**63-1 did)."""
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, next_id=next_id)
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "state", "replica_next_id")
    assert error.row is None


def test_v2_replica_id_at_2_63_is_refused_even_with_a_consistent_next_id(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, replicas={"replica_id": {1: TOO_BIG + 5}}, next_id=TOO_BIG + 6)
    _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "state", "replica_next_id")


def test_v2_replica_id_past_replica_next_id_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, replicas={"replica_id": {1: TOO_BIG + 5}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "replicas", "replica_id")
    assert error.row == 1


def test_v2_segment_base_at_2_63_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, segments={"base": {0: TOO_BIG}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "segments", "base")
    assert error.row == 0


def test_v2_segment_base_plus_size_past_int64_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, segments={"base": {0: TOO_BIG - SEG_SIZE + 1}})
    _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "segments", "base")


def test_v2_overlapping_extents_are_refused(tmp_path: Path) -> None:
    """k1 (leased) moved onto k0 (soft-pinned): both survive the restore cleanup, so the
    allocator rebuild meets the overlap (extents of objects the cleanup drops are never loaded)."""
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, replicas={"offset": {1: 0}})
    _assert_fell_back(repo, clocks, older, newer, SnapshotExtentError, "replicas", "offset")


def test_v2_zero_size_extent_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    _forge(repo, tmp_path, newer, objects={"size_bytes": {3: 0}}, replicas={"size": {3: 0}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "objects", "size_bytes")
    assert error.row == 3


def test_v2_extent_off_its_allocation_unit_is_refused(tmp_path: Path) -> None:
    """A 16 GiB segment has 8-byte units (held_end): an extent starting inside one is refused."""
    m, clocks = _primary()
    m.mount_segment("big", endpoint="big:1", client_id="1-2", base=1 << 40, size=1 << 34)
    repo = SnapshotRepository(tmp_path / "snapshots")
    older = SnapshotManager(m, repo, prefault=False).snapshot_now()
    clocks.advance(s=1)
    m.put_start("on_big", 64, client_id=WRITER, config=ReplicateConfig(preferred_segments=("big",)))
    m.put_end("on_big", client_id=WRITER)
    newer = SnapshotManager(m, repo, prefault=False).snapshot_now()
    row = m.export_state().objects.num_rows - 1
    _forge(repo, tmp_path, newer, replicas={"offset": {row: 8 * 1000 + 3}})
    error = _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "replicas", "offset")
    assert "allocation unit" in str(error)


# ---- the manifest's clock pair ---------------------------------------------------------------------
def _rewrite_manifest(repo, tmp_path, sid: str, system_ns: int, steady_ns: int, *, legacy: bool = False) -> None:
    text = v2_manifest(sid, system_ns, steady_ns).encode()  # checksum recomputed
    if legacy:  # the five fields our versions before manifest checksums wrote
        text = text.rsplit("|", 1)[0]
    (_dir(repo, tmp_path, sid) / MANIFEST_FILE).write_text(text)


def _manifest_pair(repo, tmp_path, sid: str) -> tuple[int, int]:
    fields = (_dir(repo, tmp_path, sid) / MANIFEST_FILE).read_text().split("|")
    return int(fields[3]), int(fields[4])


def test_steady_now_moved_back_by_1e15_is_refused_with_a_recomputed_checksum(tmp_path: Path) -> None:
    """Without the cross-check every lease would restore about 11.6 days long."""
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    s0, c0 = _manifest_pair(repo, tmp_path, newer)
    _rewrite_manifest(repo, tmp_path, newer, s0, c0 - 10**15)
    error = _assert_fell_back(repo, clocks, older, newer, ManifestClockError, "objects", "lease_deadline_ns")
    assert "steady_now_ns" in str(error)


def test_steady_now_moved_back_in_a_legacy_manifest_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    s0, c0 = _manifest_pair(repo, tmp_path, newer)
    for sid in (older, newer):  # both written before checksums: no checksummed older one to compare with
        _rewrite_manifest(repo, tmp_path, sid, *_manifest_pair(repo, tmp_path, sid), legacy=True)
    _rewrite_manifest(repo, tmp_path, newer, s0, c0 - 10**15, legacy=True)
    _assert_fell_back(repo, clocks, older, newer, ManifestClockError, "objects", "lease_deadline_ns")


def test_a_verifiable_legacy_manifest_still_restores(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    for sid in (older, newer):
        _rewrite_manifest(repo, tmp_path, sid, *_manifest_pair(repo, tmp_path, sid), legacy=True)
    r, stats = _restore(repo, clocks)
    assert stats.snapshot_id == newer and not stats.rejections
    assert any("without a checksum" in note for note in stats.notes)
    r.verify()


def test_system_now_later_than_the_snapshot_id_is_refused(tmp_path: Path) -> None:
    """A later system time would lengthen every lease; the writer never names a snapshot before it."""
    repo, older, newer, clocks = _two_snapshots(tmp_path)
    s0, c0 = _manifest_pair(repo, tmp_path, newer)
    _rewrite_manifest(repo, tmp_path, newer, s0 + 10**15, c0)
    r, stats = _restore(repo, clocks)
    assert stats.snapshot_id == older
    (sid, error), = stats.rejections
    assert sid == newer
    assert isinstance(error, ManifestClockError) and "system_now_ns" in str(error)
    r.verify()


def test_the_deadline_cross_check_allows_what_the_restoring_config_grants(tmp_path: Path) -> None:
    """A 3-day soft pin is genuine under a config allowing 7 days; restored with the default
    config (1 day at most) it cannot be told from a steady time moved back, and is refused."""
    week = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10, max_kv_soft_pin_ttl_ms=7 * 86_400_000)
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(week, clocks=clocks)
    m.mount_segment("seg_a", endpoint="seg_a:1", client_id="1-1", base=1 << 32, size=SEG_SIZE)
    m.put_start("pinned", 100, client_id=WRITER, config=ReplicateConfig(
        soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=3 * 86_400_000))
    m.put_end("pinned", client_id=WRITER)
    repo = SnapshotRepository(tmp_path / "snapshots")
    sid = SnapshotManager(m, repo, prefault=False).snapshot_now()
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
    r, stats = restore_master(repo, config=week, clocks=new, prefault=False)
    assert stats.snapshot_id == sid and r.exist_key("pinned")
    r.verify()
    with pytest.raises(NoUsableSnapshot) as info:
        restore_master(repo, clocks=new, prefault=False)
    (_, error), = info.value.stats.rejections
    assert isinstance(error, ManifestClockError) and "soft_pin_deadline_ns row 0" in str(error)


# ---- v1 restore ------------------------------------------------------------------------------------
def test_v1_replica_next_id_at_2_63_is_refused(tmp_path: Path) -> None:
    repo, older, newer, clocks = _two_snapshots(tmp_path, write_v1=True)
    path = _dir(repo, tmp_path, newer) / METADATA_FILE
    top = msgpack.unpackb(path.read_bytes(), strict_map_key=False)
    top["replica_next_id"] = TOO_BIG
    path.write_bytes(msgpack.packb(top))
    _assert_fell_back(repo, clocks, older, newer, SnapshotFieldError, "state", "replica_next_id")


# ---- rejection reasons are typed -------------------------------------------------------------------
@pytest.mark.parametrize("raw", [
    ValueError("extents overlap"),
    pa.ArrowNotImplementedError("no kernel"),
    pa.ArrowKeyError("no field"),
    UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
    OverflowError("Python int too large to convert to C long"),
], ids=lambda e: type(e).__name__)
def test_untyped_rejection_reasons_are_mapped_to_snapshot_errors(raw: Exception) -> None:
    typed = as_snapshot_error(raw)
    assert isinstance(typed, SnapshotDecodeError) and typed.__cause__ is raw
    assert type(raw).__name__ in str(typed)


def test_an_engine_refusal_is_mapped_to_an_integrity_error_and_typed_errors_pass_through() -> None:
    from mooncake_columnar.errors import EngineInvariantError
    raw = EngineInvariantError("extent_overlap", "two held extents overlap")
    typed = as_snapshot_error(raw)
    assert isinstance(typed, SnapshotIntegrityError) and typed.__cause__ is raw
    already = SnapshotFieldError("objects", "size_bytes", 3, "0 outside [1, 2**63)")
    assert as_snapshot_error(already) is already


# ---- standby oplog apply ---------------------------------------------------------------------------
SEG = SegmentPayload("seg0", "10.0.0.1:1", SEG_SIZE, "c0")


def _put_entry(seq: int, key: str, offset: int, *, size: int = 100, replica_id: int | None = None,
               status: int = int(ReplicaStatus.COMPLETE)) -> OpLogEntry:
    rep = ReplicaDescriptor(seq if replica_id is None else replica_id, 0, "seg0", offset, size, status)
    return OpLogEntry(seq, OpType.PUT_END, "default", key, PutEndPayload("c0", size, (rep,), 0, "", False, False))


def _standby() -> MasterService:
    m = MasterService(CFG, clocks=ManualClocks())
    apply_batch(m, OpLogBatch(1, (OpLogEntry(1, OpType.SEGMENT_MOUNT, "default", "seg0", SEG),
                                  _put_entry(2, "held", 0, size=1000))))
    return m


def _fingerprint(m: MasterService) -> tuple:
    state = m.export_state().plain()
    s = m.segments
    free = [(*(a.tolist() for a in s.extents.of(c)), int(s.used[c])) for c in range(len(s.info))]
    return (state.objects.to_pylist(), state.replicas.to_pylist(), state.segments.to_pylist(),
            m.next_replica_id, free)


def _refused(m: MasterService, *entries: OpLogEntry) -> OpLogInvalidEntry:
    before = _fingerprint(m)
    with pytest.raises(OpLogInvalidEntry) as info:
        apply_batch(m, OpLogBatch(entries[0].sequence_id, entries))
    assert _fingerprint(m) == before  # nothing applied
    m.verify()
    return info.value


def _still_applies(m: MasterService) -> None:
    """After a refusal the standby still applies genuine entries and promotes into a master
    that passes its self-check."""
    apply_batch(m, OpLogBatch(20, (_put_entry(20, "later", 4096, size=100),)))
    m.verify()
    MasterService.from_state(m.export_state(), config=CFG, clocks=ManualClocks(), segments_readable=False).verify()


def test_apply_object_size_near_2_63_is_refused_and_the_standby_is_unchanged() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "huge", 4096, size=TOO_BIG - 8))
    assert error.sequence_id == 3 and "beyond segment capacity" in str(error)
    _still_applies(m)


def test_apply_size_past_int64_is_refused() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "huge", 4096, size=TOO_BIG))
    assert error.field == "size" and error.sequence_id == 3
    _still_applies(m)


def test_apply_replica_id_at_2_63_is_refused() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "ok", 4096), _put_entry(4, "big_id", 8192, replica_id=TOO_BIG))
    assert error.field == "replica_id" and error.sequence_id == 4
    assert m.next_replica_id < TOO_BIG
    _still_applies(m)


def test_apply_replica_id_zero_and_duplicate_ids_are_refused() -> None:
    m = _standby()
    assert _refused(m, _put_entry(3, "zero", 4096, replica_id=0)).sequence_id == 3
    assert _refused(m, _put_entry(3, "a", 4096, replica_id=9), _put_entry(4, "b", 8192, replica_id=9)).field \
        == "replica_id"
    _still_applies(m)


def _wide_put(seq: int, key: str, replicas: list[tuple[int, str, int]], *, size: int = 100) -> OpLogEntry:
    """A PUT_END with several replicas (replica id, segment, offset): past the engine's one slot
    per row they live in continuation rows."""
    reps = tuple(ReplicaDescriptor(rid, 0, seg, off, size, int(ReplicaStatus.COMPLETE)) for rid, seg, off in replicas)
    return OpLogEntry(seq, OpType.PUT_END, "default", key, PutEndPayload("c0", size, reps, 0, "", False, False))


def _apply(m: MasterService, *entries: OpLogEntry) -> None:
    apply_batch(m, OpLogBatch(entries[0].sequence_id, entries))
    m.verify()  # the engine self-check, the standby's replica-id index against the columns included


def test_apply_replica_id_held_by_another_object_is_refused() -> None:
    """"held" (entry 2) has replica id 2; another key's PUT_END reusing it would leave two
    replicas with one id (accepted, only verify() and promotion caught it)."""
    m = _standby()
    error = _refused(m, _put_entry(3, "fine", 4096), _put_entry(4, "steals", 8192, replica_id=2))
    assert error.field == "replica_id" and error.sequence_id == 4 and "held by another object" in str(error)
    _still_applies(m)


def test_apply_replica_id_held_in_a_continuation_row_is_refused() -> None:
    """A wide object's later replicas live in continuation rows: their ids are held all the same."""
    m = _standby()
    _apply(m, _wide_put(3, "wide", [(30, "seg0", 8192), (31, "seg0", 12288), (32, "seg0", 16384)]))
    error = _refused(m, _put_entry(4, "steals", 20480, replica_id=32))
    assert error.field == "replica_id" and error.sequence_id == 4
    _still_applies(m)


def test_apply_replica_id_shared_by_two_inserts_of_one_run_is_refused() -> None:
    """Even an id the run frees (the removed "held" had id 2) goes to one insert only."""
    m = _standby()
    error = _refused(m, OpLogEntry(3, OpType.REMOVE, "default", "held"), _put_entry(4, "a", 4096, replica_id=2),
                     _put_entry(5, "b", 8192, replica_id=2))
    assert error.field == "replica_id" and error.sequence_id in (4, 5)
    assert _refused(m, _put_entry(3, "a", 4096, replica_id=40), _put_entry(4, "b", 8192, replica_id=40)).field \
        == "replica_id"
    _still_applies(m)


def test_apply_accepts_fresh_ids_below_the_next_id() -> None:
    """PUT_ENDs arrive in the order puts end: a put that started earlier ends later, with an id
    below the standby's next id that nobody holds."""
    m = _standby()
    _apply(m, _put_entry(3, "late_start", 4096, replica_id=100), _put_entry(4, "early_start", 8192, replica_id=50))
    assert m.next_replica_id == 101
    _apply(m, _put_entry(5, "earliest_start", 12288, replica_id=7))
    assert m.object_count() == 4 and m.next_replica_id == 101


def test_apply_reuses_the_ids_of_a_key_it_replaces_or_removes() -> None:
    """The replaced or removed object's ids are free again: in the same run (the key itself or
    another key) and in a later batch."""
    m = _standby()
    _apply(m, _put_entry(3, "held", 0, size=1000, replica_id=2))  # the key replaced, its own id back
    _apply(m, OpLogEntry(4, OpType.REMOVE, "default", "held"), _put_entry(5, "other", 0, replica_id=2))
    _apply(m, _wide_put(6, "wide", [(60, "seg0", 4096), (61, "seg0", 8192)]))
    _apply(m, OpLogEntry(7, OpType.REMOVE, "default", "wide"))
    _apply(m, _put_entry(8, "later", 4096, replica_id=61), _put_entry(9, "later2", 8192, replica_id=60))
    _apply(m, _put_entry(10, "later", 0, replica_id=2), OpLogEntry(11, OpType.REMOVE, "default", "other"))
    assert sorted(m.to_arrow().column("key").to_pylist()) == ["later", "later2"]
    _still_applies(m)


def test_apply_reuses_the_ids_a_segment_unmount_dropped() -> None:
    """Unmounting seg1 drops the replicas on it (an object left with none goes): their ids are
    free again, in the same batch after the unmount and later; the replica kept on seg0 keeps
    its id."""
    m = _standby()
    seg1 = SegmentPayload("seg1", "10.0.0.2:1", SEG_SIZE, "c1")
    _apply(m, OpLogEntry(3, OpType.SEGMENT_MOUNT, "default", "seg1", seg1),
           _wide_put(4, "both", [(40, "seg0", 16384), (41, "seg1", 0)]), _wide_put(5, "only1", [(50, "seg1", 8192)]))
    _apply(m, OpLogEntry(6, OpType.SEGMENT_UNMOUNT, "default", "seg1", seg1), _put_entry(7, "x", 8192, replica_id=41))
    assert _refused(m, _put_entry(8, "steals", 12288, replica_id=40)).sequence_id == 8  # still held by "both"
    _apply(m, _put_entry(8, "y", 12288, replica_id=50))
    assert sorted(m.to_arrow().column("key").to_pylist()) == ["both", "held", "x", "y"]
    _still_applies(m)


def test_apply_extent_overlapping_one_the_standby_holds_is_refused() -> None:
    """Accepted, it used to block promote() later with a plain ValueError."""
    m = _standby()
    error = _refused(m, _put_entry(3, "fine", 4096), _put_entry(4, "onto_held", 512))
    assert error.field == "replica_offset" and error.sequence_id == 4 and "standby holds" in str(error)
    _still_applies(m)


def test_apply_extents_overlapping_each_other_are_refused() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "a", 4096, size=1000), _put_entry(4, "b", 4096 + 500))
    assert error.field == "replica_offset" and error.sequence_id == 4 and "another one of this batch" in str(error)
    _still_applies(m)


def test_apply_reuses_the_extent_of_a_key_it_replaces_or_removes() -> None:
    """The primary frees a removed object's extent and may place the next put there."""
    m = _standby()
    apply_batch(m, OpLogBatch(3, (OpLogEntry(3, OpType.REMOVE, "default", "held"), _put_entry(4, "next", 0))))
    apply_batch(m, OpLogBatch(5, (_put_entry(5, "next", 2048, size=64), _put_entry(6, "again", 0, size=64))))
    m.verify()
    assert m.segments.used[m.segments.code("seg0")] == 128


def test_apply_zero_size_extent_is_refused() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "empty", 4096, size=0))
    assert isinstance(error.__cause__, SnapshotFieldError) and error.__cause__.field == "size_bytes"
    _still_applies(m)


def test_apply_replica_that_is_not_complete_is_refused() -> None:
    m = _standby()
    error = _refused(m, _put_entry(3, "removed", 4096, status=int(ReplicaStatus.REMOVED)))
    assert error.field == "replica_status"


def test_standby_service_fails_closed_on_a_forged_entry(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path / "oplog")
    for entries in ((OpLogEntry(1, OpType.SEGMENT_MOUNT, "default", "seg0", SEG), _put_entry(2, "held", 0)),
                    (_put_entry(3, "onto_held", 0),)):
        store.append_batch(OpLogBatch(entries[0].sequence_id, entries))
    standby = StandbyService(store, clocks=ManualClocks())
    with pytest.raises(StandbyFailed) as info:
        standby.poll()
    assert isinstance(info.value.__cause__, OpLogInvalidEntry) and info.value.__cause__.sequence_id == 3


def test_every_validated_state_loads_into_an_engine_that_passes_its_self_check(tmp_path: Path) -> None:
    repo, _, newer, clocks = _two_snapshots(tmp_path)
    r, stats = _restore(repo, clocks)
    assert stats.snapshot_id == newer and not stats.rejections
    r.verify()
    state = r.export_state()
    state.validate()
    MasterService.from_state(state, config=CFG, clocks=ManualClocks()).verify()
    assert np.array_equal(np.sort(state.replicas.column("replica_id").to_numpy()),
                          np.unique(state.replicas.column("replica_id").to_numpy()))
