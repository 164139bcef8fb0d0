"""The snapshot store contract (local directory and a real moto S3 server), publication order,
backups, and v2/v1 restore with candidate fallback (RFC Phase 3)."""
from __future__ import annotations

import uuid
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from mooncake_columnar.clock import INT64_MAX, NS_PER_MS, NS_PER_S, ManualClocks
from mooncake_columnar.errors import (
    NoUsableSnapshot,
    SnapshotPublishError,
)
from mooncake_columnar.schema import NEVER_LEASED, NO_DEADLINE
from mooncake_columnar.snapshots.complete import restore_latest, write_snapshot
from mooncake_columnar.snapshots.manifest import MANIFEST_FILE, parse_manifest
from mooncake_columnar.snapshots.mooncake_v1 import write_v1
from mooncake_columnar.snapshots.repository import LATEST_FILE, SAVE_BACKUP_DIR, SnapshotRepository
from mooncake_columnar.testing.snapshot_store_contract import C, C0, S0, SnapshotStoreContract, restore_clocks
from mooncake_columnar.testing.states import make_state


class TestSnapshotStoreContract(SnapshotStoreContract):
    @pytest.fixture(params=["local", "s3"])
    def repo(self, request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotRepository:
        if request.param == "local":
            return SnapshotRepository(tmp_path / "root")
        # A fresh cluster id per test keeps tests independent inside one bucket.
        return SnapshotRepository(request.getfixturevalue("s3_uri"), cluster_id=f"c{uuid.uuid4().hex}")


def test_phase3_manifest_last_and_backup_identical(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    repo = SnapshotRepository(tmp_path / "root", backup_dir=tmp_path / "backup")
    order: list[str] = []
    real_put = repo._put

    def spy(path: str, data: bytes) -> None:
        order.append(path.rsplit("/", 1)[1])
        real_put(path, data)

    monkeypatch.setattr(repo, "_put", spy)
    state = make_state(8, lease=5 * NS_PER_S)
    sid = write_snapshot(repo, state, system_now_ns=1_796_019_911_535 * NS_PER_MS, steady_now_ns=7)
    assert order[-2:] == [MANIFEST_FILE, LATEST_FILE]
    assert set(order[:-2]) == {"objects.arrow", "replicas.arrow", "segments.arrow", "digest.json"}
    manifest = repo.read_manifest(sid)
    assert parse_manifest(manifest).steady_now_ns == 7

    # A failed upload publishes no manifest and saves every file, manifest byte-identical.
    def failing(path: str, data: bytes) -> None:
        if path.endswith("replicas.arrow"):
            raise OSError("injected upload failure")
        real_put(path, data)

    monkeypatch.setattr(repo, "_put", failing)
    payloads = {"objects.arrow": b"o", "replicas.arrow": b"r", "digest.json": b"d"}
    text = f"arrow-ipc|2.0.0|{C}|1796019911535000000|-5"
    with pytest.raises(SnapshotPublishError) as info:
        repo.publish(C, payloads, text)
    assert info.value.failed == ("replicas.arrow",)
    saved = tmp_path / "backup" / SAVE_BACKUP_DIR / C
    assert (saved / MANIFEST_FILE).read_bytes() == text.encode()
    assert {p.name: p.read_bytes() for p in saved.iterdir() if p.name not in (MANIFEST_FILE, LATEST_FILE)} \
        == payloads
    assert repo.latest() == sid  # latest.txt untouched by the failed publication
    assert not (tmp_path / "root" / "mooncake_cluster" / C / MANIFEST_FILE).exists()

    # Without a backup dir the first failure raises at once and nothing else is attempted.
    plain = SnapshotRepository(tmp_path / "root2")
    attempted: list[str] = []

    def fail_first(path: str, data: bytes) -> None:
        attempted.append(path)
        raise OSError("down")

    monkeypatch.setattr(plain, "_put", fail_first)
    with pytest.raises(SnapshotPublishError):
        plain.publish(C, payloads, text)
    assert len(attempted) == 1


# ---- restore --------------------------------------------------------------------------------------
def test_phase3_restore_time_reduces_remaining(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = SnapshotRepository(tmp_path)
    write_snapshot(repo, make_state(2, lease=C0 + 10 * NS_PER_S), S0, C0)
    clocks = restore_clocks(downtime_s=1)
    real_read = repo.read_payloads

    def slow_read(snapshot_id: str, names: tuple[str, ...]) -> dict[str, bytes]:
        clocks.advance(s=2.5)  # decoding takes 2.5 s after (S1, C1) was captured
        return real_read(snapshot_id, names)

    monkeypatch.setattr(repo, "read_payloads", slow_read)
    out, _, _ = restore_latest(repo, clocks)
    remaining = out.objects.column("lease_deadline_ns").to_numpy() - clocks.steady_ns()
    assert remaining.tolist() == [int(6.5 * NS_PER_S)] * 2  # 10 - 1 downtime - 2.5 decode


def test_phase3_expired_stays_expired(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    write_snapshot(repo, make_state(3, lease=[C0 - NS_PER_S, C0 + 2 * NS_PER_S, NEVER_LEASED]), S0, C0)
    clocks = restore_clocks(downtime_s=3)
    out, _, _ = restore_latest(repo, clocks, drop_expired=False)
    lease = out.objects.column("lease_deadline_ns").to_pylist()
    assert lease[0] < clocks.steady_ns() and lease[1] < clocks.steady_ns()
    assert lease[2] == NEVER_LEASED
    dropped, _, stats = restore_latest(repo, clocks)
    assert dropped.objects.num_rows == 0 and stats.objects_dropped == 3


def test_phase3_soft_pin_conversion(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    soft = [C0 + 30 * 60 * NS_PER_S, C0 - NS_PER_S, NO_DEADLINE]
    write_snapshot(repo, make_state(3, lease=C0 - NS_PER_S, soft=soft, soft_enabled=True), S0, C0)
    clocks = restore_clocks(downtime_s=60)
    c1 = clocks.steady_ns()
    out, _, stats = restore_latest(repo, clocks, drop_expired=False)
    assert out.objects.column("soft_pin_deadline_ns").to_pylist() == [
        c1 + 29 * 60 * NS_PER_S, c1 - 61 * NS_PER_S, NO_DEADLINE]
    assert out.objects.column("soft_pin_enabled").to_pylist() == [True] * 3  # stays enabled
    cleaned, _, _ = restore_latest(repo, clocks)
    assert cleaned.objects.column("key").to_pylist() == ["key_000000"]  # only the active soft pin


def test_phase3_hard_pinned_retained(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    write_snapshot(repo, make_state(4, lease=C0 - NS_PER_S, hard=[True, False, True, False]), S0, C0)
    out, _, stats = restore_latest(repo, restore_clocks(downtime_s=1))
    assert out.objects.column("key").to_pylist() == ["key_000000", "key_000002"]
    assert stats.objects_dropped == 2


def test_phase3_expired_non_hard_pinned_dropped(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    lease = [C0 + 5 * NS_PER_S, C0 + 20 * NS_PER_S, NEVER_LEASED]
    write_snapshot(repo, make_state(3, lease=lease), S0, C0)
    out, _, stats = restore_latest(repo, restore_clocks(downtime_s=10))
    assert out.objects.column("key").to_pylist() == ["key_000001"]
    assert stats.objects_restored == 1 and stats.objects_dropped == 2
    out.validate()


def test_phase3_positive_and_negative_skew(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    write_snapshot(repo, make_state(1, lease=C0 + 60 * NS_PER_S), S0, C0)
    for skew_s, expected_s in ((+20, 40), (-20, 80)):
        clocks = ManualClocks(steady_ns=9 * NS_PER_S, system_ns=S0 + skew_s * NS_PER_S)
        out, _, _ = restore_latest(repo, clocks)
        assert out.objects.column("lease_deadline_ns").to_pylist() == [(9 + expected_s) * NS_PER_S]


def test_phase3_overflow_is_a_conversion_failure_and_falls_back(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    write_snapshot(repo, make_state(1, lease=C0), S0, C0)
    # Valid manifest, but the mapping pushes a deadline past int64 in the new steady domain.
    write_snapshot(repo, make_state(1, lease=INT64_MAX - 10), S0 + NS_PER_S, -(10**18))
    out, manifest, stats = restore_latest(repo, restore_clocks(downtime_s=2), drop_expired=False)
    assert manifest.system_now_ns == S0 and stats.conversion_failures == 1 and stats.fallbacks == 1


def test_corrupt_payload_and_missing_files_fall_back(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    oldest = write_snapshot(repo, make_state(1, lease=C0 + 100 * NS_PER_S), S0, C0)
    mid = write_snapshot(repo, make_state(2), S0 + NS_PER_S, C0)
    newest = write_snapshot(repo, make_state(3), S0 + 2 * NS_PER_S, C0)
    path = tmp_path / "mooncake_cluster"
    data = (path / mid / "objects.arrow").read_bytes()
    (path / mid / "objects.arrow").write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    (path / newest / "digest.json").unlink()
    out, manifest, stats = restore_latest(repo, restore_clocks(downtime_s=1))
    assert manifest.snapshot_id == oldest and stats.fallbacks == 2 and out.objects.num_rows == 1
    for sid in (mid, oldest):
        (path / sid / MANIFEST_FILE).unlink()
    with pytest.raises(NoUsableSnapshot) as info:
        restore_latest(repo, restore_clocks(downtime_s=1))
    assert info.value.stats.candidates_tried == 3 and info.value.stats.fallbacks == 3


def test_no_candidates_raises(tmp_path: Path) -> None:
    with pytest.raises(NoUsableSnapshot):
        restore_latest(SnapshotRepository(tmp_path), ManualClocks())


def test_background_write_and_mixed_v1_v2_candidates(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    state = make_state(4, lease=C0 + 30 * NS_PER_S)
    v1_id = write_v1(repo, state, S0, C0)
    future = write_snapshot(repo, state, S0 + NS_PER_S, C0 + NS_PER_S, background=True)
    assert isinstance(future, Future)
    v2_id = future.result(timeout=30)
    assert repo.candidates() == [v2_id, v1_id]
    out, manifest, _ = restore_latest(repo, restore_clocks(downtime_s=1))
    assert manifest.is_v2 and out.objects.num_rows == 4
    repo._put(repo._path(v2_id, "digest.json"), b"{}")
    clocks = restore_clocks(downtime_s=1)
    out, manifest, stats = restore_latest(repo, clocks)
    assert not manifest.is_v2 and stats.format_version == "1.0.0" and stats.fallbacks == 1
    # v1 keeps system ms: 30 s at snapshot time, 1 s downtime -> 29 s left.
    assert out.objects.column("lease_deadline_ns").to_pylist() == [clocks.steady_ns() + 29 * NS_PER_S] * 4
    # v1 stores objects by shard: compare per key.
    keys = np.array(out.objects.column("key").to_pylist())[out.replicas.column("object_index").to_numpy()]
    assert dict(zip(keys, out.replicas.column("offset").to_pylist())) == dict(zip(
        state.objects.column("key").to_pylist(), state.replicas.column("offset").to_pylist()))
