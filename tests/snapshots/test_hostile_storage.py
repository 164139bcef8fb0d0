"""Snapshot storage that buggy writers or people with write access changed: restore and retention
fail closed (a typed error, or a fallback to a good snapshot), nothing outside the repository root
is read, written or deleted, and an unreachable S3 endpoint raises a typed error quickly.

S3 cases run against their own moto server (module scope) and issue few requests.
"""
from __future__ import annotations

import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_columnar.tools.cli import main
from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.errors import (
    InvalidParams,
    ManifestError,
    NoUsableSnapshot,
    SnapshotError,
    SnapshotPublishError,
    SnapshotStorageUnavailable,
)
from mooncake_columnar.snapshots import mooncake_v1
from mooncake_columnar.snapshots.arrow_codec import DIGEST_FILE, PAYLOAD_FILES
from mooncake_columnar.snapshots.manager import MasterRestoreStats, SnapshotManager, restore_master
from mooncake_columnar.snapshots.manifest import (
    MANIFEST_FILE,
    manifest_checksum,
    parse_manifest,
    snapshot_id_ms,
    v2_manifest,
)
from mooncake_columnar.snapshots.repository import (
    LATEST_FILE,
    SNAPSHOT_FILES,
    V1_DESCRIPTOR_FILE,
    V1_PAYLOAD_FILES,
    SnapshotRepository,
    check_path_part,
)
from mooncake_columnar.testing.builders import SERIES_CONFIG, leased_put, restore_later, series_master, snapshot_series
from mooncake_columnar.testing.s3_server import moto_s3, s3_uri

TTL_NS = 10 * NS_PER_S  # SERIES_CONFIG's lease TTL


# ---- helpers ------------------------------------------------------------------------------------
def _cluster(root: Path) -> Path:
    return root / "mooncake_cluster"


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused


@pytest.fixture(scope="module")
def s3_root() -> Iterator[str]:
    with moto_s3() as uri:  # its own server: few requests, so its unread log pipe never fills
        yield uri


def _s3_repo(uri: str, **kw) -> SnapshotRepository:
    return SnapshotRepository(uri, cluster_id=f"c{uuid.uuid4().hex}", **kw)


# ---- 1. latest.txt --------------------------------------------------------------------------------
@pytest.mark.parametrize("pointer", ["missing_old", "missing_future", "unpublished", "damaged",
                                     "garbage", "huge"])
def test_bad_or_dangling_latest_txt_falls_back_to_listed_snapshots(tmp_path: Path, pointer: str) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (first, second) = snapshot_series(repo, 2)
    cluster = _cluster(tmp_path)
    latest = cluster / LATEST_FILE
    expected_note = "latest.txt"
    if pointer == "missing_old":  # older than every snapshot: upstream had no candidate left
        latest.write_text("20000101_000000_000")
        expected_note = "names 20000101_000000_000, which does not exist"
    elif pointer == "missing_future":
        latest.write_text("29990101_000000_000")
        expected_note = "which does not exist"
    elif pointer == "unpublished":  # a crashed writer's directory: partial payload, no manifest
        (cluster / "20000101_000000_000").mkdir()
        (cluster / "20000101_000000_000" / "objects.arrow").write_bytes(b"partial")
        latest.write_text("20000101_000000_000")
        expected_note = None  # followed, fails as a candidate, which the failures record
    elif pointer == "damaged":  # names the OLDER snapshot, whose payload is damaged
        data = bytearray((cluster / first / "objects.arrow").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (cluster / first / "objects.arrow").write_bytes(bytes(data))
        latest.write_text(first)
        expected_note = None
    elif pointer == "garbage":
        latest.write_bytes(b"\xff\xfe../../etc/passwd")
        expected_note = "latest.txt is not ASCII"
    else:
        latest.write_bytes(b"2" * 10_000)
        expected_note = "more than 4096"
    r, stats = restore_later(repo, clocks)
    assert isinstance(stats, MasterRestoreStats)
    assert stats.snapshot_id == second and r.exist_key("k1")  # the newest valid snapshot
    if expected_note is None:
        assert stats.notes == [] and stats.fallbacks == 1
        assert stats.failures[0][0] == latest.read_text()
    else:
        assert stats.fallbacks == 0 and len(stats.notes) == 1
        assert expected_note in stats.notes[0] and "newest first" in stats.notes[0]


def test_dangling_latest_txt_on_s3_falls_back(s3_root: str) -> None:
    repo = _s3_repo(s3_root)
    _, clocks, (only,) = snapshot_series(repo, 1)
    repo._put(repo._path(LATEST_FILE), b"20000101_000000_000")
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == only and "does not exist" in stats.notes[0]


def test_no_usable_snapshot_still_records_the_latest_txt_note(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    (_cluster(tmp_path) / "20260101_000000_000").mkdir(parents=True)  # unpublished only
    (_cluster(tmp_path) / LATEST_FILE).write_text("20990101_000000_000")
    with pytest.raises(NoUsableSnapshot) as info:
        restore_later(repo, ManualClocks())
    assert "does not exist" in info.value.stats.notes[0] and info.value.stats.candidates_tried == 1


# ---- 2. retention ---------------------------------------------------------------------------------
def _crash_writers(repo: SnapshotRepository, good: str, ids: list[str]) -> None:
    """Directories a crashed or buggy writer leaves: partial payloads without a manifest; a
    manifest that does not verify; a manifest over missing payloads."""
    no_manifest, bad_manifest, missing_payload = ids
    repo._put(repo._path(no_manifest, "objects.arrow"), b"partial upload")
    for sid in (bad_manifest, missing_payload):
        for name in (*PAYLOAD_FILES, DIGEST_FILE):
            if not (sid == missing_payload and name == "replicas.arrow"):
                repo._put(repo._path(sid, name), repo.read_payloads(good, (name,))[name])
    fields, checksum = repo.read_manifest(good).decode().rsplit("|", 1)
    # good's manifest under another id, its checksum left as it was: it no longer verifies
    repo._put(repo._path(bad_manifest, MANIFEST_FILE),
              f"{fields.replace(good, bad_manifest)}|{checksum}".encode())
    # a valid manifest, but replicas.arrow never arrived
    m = parse_manifest(repo.read_manifest(good))
    repo._put(repo._path(missing_payload, MANIFEST_FILE),
              v2_manifest(missing_payload, m.system_now_ns, m.steady_now_ns).encode().encode())


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_retention_survives_crashed_writers(tmp_path: Path, storage: str, request) -> None:
    repo = SnapshotRepository(tmp_path) if storage == "local" else _s3_repo(request.getfixturevalue("s3_root"))
    m, clocks = series_master()
    manager = SnapshotManager(m, repo, retention=2, prefault=False)
    leased_put(m, "k_good")
    good = manager.snapshot_now()
    crashed = ["20261130_010000_001", "20261130_010000_002", "20261130_010000_003"]
    assert all(c > good for c in crashed)
    _crash_writers(repo, good, crashed)
    for sid in crashed:
        assert repo.unpublished_reason(sid) is not None
    assert repo.unpublished_reason(good) is None
    clocks.jump_system(s=86_400)  # the next snapshot is newer than the crashed directories
    leased_put(m, "k_new")
    newest = manager.snapshot_now()
    # retention=2 counts only published snapshots: the last good older one survives, and the
    # crashed directories stay (their files are fresh: within the grace period)
    assert repo.published() == [newest, good]
    assert set(repo.list()) == {newest, good, *crashed}
    # the newest is damaged later: the survivor is still there to restore
    repo._put(repo._path(newest, "objects.arrow"), b"damaged")
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == good and r.exist_key("k_good") and not r.exist_key("k_new")
    # once idle past the grace period the crashed directories go; published ones follow count
    later_ms = max(time.time() * 1000, *map(snapshot_id_ms, crashed)) + 3600 * 1000 + 60_000
    assert repo.retain(2, now_ms=later_ms) == sorted(crashed, reverse=True)
    assert repo.list() == [newest, good]


def test_unpublished_directory_is_judged_by_its_newest_time(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path, unpublished_grace_s=60)
    _, _, (good,) = snapshot_series(repo, 1)
    old_id, future_id = "20200101_000000_000", "20990101_000000_000"
    for sid in (old_id, future_id):
        repo._put(repo._path(sid, "objects.arrow"), b"partial")
    now_ms = time.time() * 1000
    # the old id's files were written just now: a slow writer may still be uploading it
    assert repo.retain(1, now_ms=now_ms) == []
    # files idle for an hour: the old id goes; the future id (clock skew) waits for its time
    for path in (_cluster(tmp_path) / old_id, _cluster(tmp_path) / future_id):
        for p in (path, *path.iterdir()):
            os.utime(p, (now_ms / 1000 - 3600, now_ms / 1000 - 3600))
    assert repo.retain(1, now_ms=now_ms) == [old_id]
    assert repo.list() == [future_id, good]
    assert snapshot_id_ms(future_id) > now_ms


def test_retention_parameters_are_checked(tmp_path: Path) -> None:
    with pytest.raises(InvalidParams):
        SnapshotRepository(tmp_path, unpublished_grace_s=-1)
    with pytest.raises(InvalidParams):
        SnapshotRepository(tmp_path, timeout_s=0)
    with pytest.raises(InvalidParams):
        SnapshotRepository(tmp_path).retain(True)  # type: ignore[arg-type]
    m, _ = series_master()
    with pytest.raises(InvalidParams):
        SnapshotManager(m, SnapshotRepository(tmp_path), unpublished_grace_s=float("nan"))


# ---- 3. paths ---------------------------------------------------------------------------------------
BAD_CLUSTER_IDS = ["..", ".", "../x", "a/b", "", "x" * 129, "a\n", "ä", "a b", "/abs", "a\\b"]
BAD_SNAPSHOT_IDS = ["../x", "../../etc", "20260101_000000_000/..", "/20260101_000000_000",
                    "2026", "20260101_000000_00\n", "２0260101_000000_000", None, 20260101]
BAD_FILE_NAMES = ["../latest.txt", "x", ".tmp", "objects.arrow/../../y", "", "latest.txt",
                  "manifest.txt.tmp-1", "/etc/passwd"]


@pytest.mark.parametrize("cluster_id", BAD_CLUSTER_IDS)
def test_cluster_id_is_checked_local_and_s3(tmp_path: Path, cluster_id: str) -> None:
    with pytest.raises(InvalidParams):
        SnapshotRepository(tmp_path / "root", cluster_id=cluster_id)
    unreachable = s3_uri("bucket", "prefix", f"127.0.0.1:{_closed_port()}")
    with pytest.raises(InvalidParams):  # checked before any request
        SnapshotRepository(unreachable, cluster_id=cluster_id)
    assert not (tmp_path / "root").exists()
    for good in ("mooncake_cluster", "a.b-c_D9", "...", "x" * 128):
        assert check_path_part("cluster_id", good) == good


def test_cluster_id_dotdot_cannot_write_or_delete_siblings(tmp_path: Path) -> None:
    """Before: cluster_id='..' put snapshots and latest.txt beside the root, and retention there
    deleted sibling directories named like snapshot ids."""
    sibling = tmp_path / "20200101_000000_000"
    sibling.mkdir()
    (sibling / "precious").write_text("keep")
    with pytest.raises(InvalidParams):
        SnapshotRepository(tmp_path / "root", cluster_id="..")
    assert (sibling / "precious").read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20200101_000000_000"]


@pytest.mark.parametrize("storage", ["local", "s3"])
def test_snapshot_ids_and_file_names_checked_at_every_entry_point(tmp_path: Path, storage: str,
                                                                   request) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / MANIFEST_FILE).write_text("messagepack|1.0.0|20260101_000000_000")
    repo = SnapshotRepository(tmp_path / "root") if storage == "local" else \
        _s3_repo(request.getfixturevalue("s3_root"))
    good = "20260101_000000_000"
    for sid in BAD_SNAPSHOT_IDS:
        for call in (lambda: repo.read_manifest(sid), lambda: repo.read_payloads(sid, ("metadata",)),
                     lambda: repo.stored_bytes(sid), lambda: repo.read(sid),
                     lambda: repo.unpublished_reason(sid), lambda: repo._path(sid),
                     lambda: repo.publish(sid, {"metadata": b"x"}, f"messagepack|1.0.0|{sid}")):
            with pytest.raises(InvalidParams):
                call()
    for name in BAD_FILE_NAMES:
        with pytest.raises(InvalidParams):
            repo.read_payloads(good, (name,))
        with pytest.raises(InvalidParams):
            repo.publish(good, {name: b"x"}, f"messagepack|1.0.0|{good}")
    with pytest.raises(InvalidParams):  # a manifest must name the snapshot it is published as
        repo.publish(good, {"metadata": b"x"}, "messagepack|1.0.0|20990101_000000_000")
    assert repo.list() == [] and repo.latest() is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["outside"]  # nothing written anywhere


def test_path_check_names_match_the_formats() -> None:
    assert set(V1_PAYLOAD_FILES) == set(mooncake_v1.V1_FILES)
    assert V1_DESCRIPTOR_FILE == mooncake_v1.DESCRIPTOR_FILE
    assert {*PAYLOAD_FILES, DIGEST_FILE, MANIFEST_FILE} <= SNAPSHOT_FILES
    assert LATEST_FILE not in SNAPSHOT_FILES  # only at the cluster level


def test_local_symlink_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path / "root")
    _, clocks, (good,) = snapshot_series(repo, 1)
    cluster, link = _cluster(tmp_path / "root"), "20270101_000000_000"
    victim = tmp_path / "victim"
    shutil.copytree(cluster / good, victim)  # a snapshot outside the root
    os.symlink(victim, cluster / link)
    (cluster / LATEST_FILE).write_text(link)
    with pytest.raises(SnapshotError, match="outside the repository root"):
        repo.read_manifest(link)
    r, stats = restore_later(repo, clocks)  # the symlinked candidate fails; the real one restores
    assert stats.snapshot_id == good and "outside the repository root" in stats.failures[0][1]
    assert repo.unpublished_reason(link) is not None
    (cluster / LATEST_FILE).write_text(good)
    later_ms = max(time.time() * 1000, snapshot_id_ms(link)) + 3600 * 1000 + 60_000
    assert repo.retain(1, now_ms=later_ms) == [link]  # the link goes, not what it points to
    assert repo.list() == [good]
    assert sorted(p.name for p in victim.iterdir()) == sorted([*PAYLOAD_FILES, DIGEST_FILE, MANIFEST_FILE])


def test_local_latest_txt_symlink_is_neither_read_nor_written_through(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path / "root")
    m, clocks, (first,) = snapshot_series(repo, 1)
    outside = tmp_path / "outside.txt"
    outside.write_text("20990101_000000_000")
    latest = _cluster(tmp_path / "root") / LATEST_FILE
    latest.unlink()
    os.symlink(outside, latest)
    assert repo.latest() is None and "outside the repository root" in repo.read_latest()[1]
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == first and "outside the repository root" in stats.notes[0]
    second = SnapshotManager(m, repo, prefault=False).snapshot_now()  # the rename replaces the link
    assert not latest.is_symlink() and repo.latest() == second
    assert outside.read_text() == "20990101_000000_000"


def test_cli_rejects_ids_that_leave_the_cluster_directory(tmp_path: Path, capsys) -> None:
    repo = SnapshotRepository(tmp_path)
    snapshot_series(repo, 1)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / MANIFEST_FILE).write_text("messagepack|1.0.0|x")
    for argv in (["snapshot", "inspect", str(tmp_path), "--snapshot-id", "../x"],
                 ["snapshot", "verify", str(tmp_path), "--snapshot-id", "../x"],
                 ["verify", str(tmp_path), "--snapshot", "../x"],
                 ["snapshot", "ls", str(tmp_path), "--cluster-id", ".."],
                 ["verify", str(tmp_path), "--cluster-id", "../mooncake_cluster"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "invalid snapshot_id '../x'" in err or "invalid cluster_id" in err, err


def test_cli_default_snapshot_skips_unpublished_when_latest_txt_dangles(tmp_path: Path, capsys) -> None:
    repo = SnapshotRepository(tmp_path)
    _, _, (good,) = snapshot_series(repo, 1)
    repo._put(repo._path("20270101_000000_000", "objects.arrow"), b"partial")  # crashed writer
    (_cluster(tmp_path) / LATEST_FILE).write_text("20000101_000000_000")
    assert main(["snapshot", "inspect", str(tmp_path), "--json"]) == 0
    out = capsys.readouterr()
    assert f'"snapshot_id": "{good}"' in out.out and "which does not exist" in out.err
    assert main(["verify", str(tmp_path)]) == 0
    assert f"snapshot {good}:" in capsys.readouterr().out


# ---- 4. manifest checksum ------------------------------------------------------------------------------
def test_edited_clock_pair_rejects_the_candidate_and_falls_back(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (older, newer) = snapshot_series(repo, 2)
    path = _cluster(tmp_path) / newer / MANIFEST_FILE
    m = parse_manifest(path.read_bytes())
    # before: accepted, and every restored lease became ~11.6 days long
    path.write_text(path.read_text().replace(f"|{m.steady_now_ns}|", f"|{m.steady_now_ns - 10**15}|"))
    with pytest.raises(ManifestError, match="checksum mismatch"):
        repo.read_manifest(newer)
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == older and "ManifestError" in stats.failures[0][1]
    lease = r.object_info("k0").lease_deadline_ns - r.clocks.steady_ns()
    assert lease <= TTL_NS  # the older candidate's lease: never longer than its TTL


def test_stripped_checksum_is_refused_once_an_older_manifest_has_one(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (older, newer) = snapshot_series(repo, 2)
    path = _cluster(tmp_path) / newer / MANIFEST_FILE
    m = parse_manifest(path.read_bytes())
    head = path.read_text().rsplit("|", 2)[0]  # without the steady field and the checksum
    assert m.steady_now_ns is not None
    path.write_text(f"{head}|{m.steady_now_ns - 10**15}")
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == older and "checksum stripped or truncated" in stats.failures[0][1]


def _strip_checksums(root: Path) -> None:
    """Rewrite every v2 manifest as the previous version wrote it (five fields)."""
    for path in _cluster(root).glob(f"*/{MANIFEST_FILE}"):
        path.write_text(path.read_text().rsplit("|", 1)[0])


def test_pre_checksum_manifests_restore_with_a_recorded_warning(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (older, newer) = snapshot_series(repo, 2)
    _strip_checksums(tmp_path)
    r, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == newer and stats.fallbacks == 0
    assert len(stats.notes) == 1 and "without a checksum" in stats.notes[0] and newer in stats.notes[0]
    assert r.metrics.get("restore_unchecked_manifest_total") == 1
    assert repo.published() == [newer, older]  # retention counts them
    # strict mode refuses them
    strict = SnapshotRepository(tmp_path, require_manifest_checksum=True)
    with pytest.raises(NoUsableSnapshot) as info:
        restore_later(strict, clocks)
    assert all("require_manifest_checksum" in f for _, f in info.value.stats.failures)
    assert strict.published() == []


def test_checksummed_manifest_restores_without_notes(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (only,) = snapshot_series(repo, 1)
    text = (_cluster(tmp_path) / only / MANIFEST_FILE).read_text()
    fields, checksum = text.rsplit("|", 1)
    assert checksum == manifest_checksum(fields)
    r, stats = restore_later(repo, clocks)
    assert stats.notes == [] and r.metrics.get("restore_unchecked_manifest_total") == 0


def test_upstream_v1_snapshots_stay_readable(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path, require_manifest_checksum=True)  # v1 carries no clock pair
    _, clocks, (only,) = snapshot_series(repo, 1, write_v1=True)
    assert (_cluster(tmp_path) / only / MANIFEST_FILE).read_text() == f"messagepack|1.0.0|{only}"
    r, stats = restore_later(repo, clocks)
    assert stats.format_version == "1.0.0" and stats.notes == [] and r.exist_key("k0")
    assert repo.published() == [only]


# ---- 5. unreachable storage ------------------------------------------------------------------------------
def test_unreachable_s3_raises_a_typed_error_within_the_timeout() -> None:
    uri = s3_uri("bucket", "prefix", f"127.0.0.1:{_closed_port()}")
    repo = SnapshotRepository(uri, timeout_s=1.0)
    for call in (repo.list, repo.latest, repo.candidates, lambda: repo.retain(2),
                 lambda: repo.read_manifest("20260101_000000_000"),
                 lambda: restore_master(repo, config=SERIES_CONFIG, clocks=ManualClocks())):
        t0 = time.monotonic()
        with pytest.raises(SnapshotStorageUnavailable) as info:
            call()
        assert time.monotonic() - t0 < 3.0  # before: a raw OSError after about 6 s
        assert isinstance(info.value, SnapshotError) and not isinstance(info.value, OSError)


def test_hung_s3_endpoint_raises_a_typed_error_within_the_configured_timeout() -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # the kernel accepts connections; nothing ever answers
    try:
        uri = s3_uri("bucket", "prefix", f"127.0.0.1:{server.getsockname()[1]}")
        repo = SnapshotRepository(uri, timeout_s=1.0, max_attempts=1)
        t0 = time.monotonic()
        with pytest.raises(SnapshotStorageUnavailable, match="Timeout"):
            repo.list()
        assert time.monotonic() - t0 < 4.0  # about 2 * timeout_s
    finally:
        server.close()


def test_cli_unreachable_s3_exits_2(capsys) -> None:
    uri = s3_uri("bucket", "prefix", f"127.0.0.1:{_closed_port()}")
    for argv in (["snapshot", "ls", uri, "--timeout-s", "1"], ["snapshot", "verify", uri],
                 ["verify", uri, "--timeout-s", "1"]):
        assert main(argv) == 2, argv
        assert "SnapshotStorageUnavailable" in capsys.readouterr().err


def test_storage_error_on_a_newer_candidate_does_not_restore_an_older_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (older, newer) = snapshot_series(repo, 2)
    real = repo.read_payloads

    def flaky(snapshot_id: str, names: tuple[str, ...]):
        if snapshot_id == newer:
            raise SnapshotStorageUnavailable("injected: connection reset")
        return real(snapshot_id, names)

    monkeypatch.setattr(repo, "read_payloads", flaky)
    with pytest.raises(SnapshotStorageUnavailable, match=f"not restoring the older {older}"):
        restore_later(repo, clocks)


def test_planted_far_future_directory_still_sorts_below_the_next_complete_snapshot(tmp_path: Path) -> None:
    """Complete snapshots take their ids from the same allocator as standby snapshots: the next
    one sorts above a directory someone planted after the writer last listed, so a restart
    restores what was written last, not the planted directory's neighbour."""
    repo = SnapshotRepository(tmp_path)
    _, clocks, (first,) = snapshot_series(repo, 1)
    m = restore_master(repo, clocks=clocks, config=SERIES_CONFIG)[0]
    planted = "20991231_235959_999"
    (_cluster(tmp_path) / planted).mkdir()
    second = SnapshotManager(m, repo, prefault=False).snapshot_now()
    assert second > planted > first
    assert restore_master(repo, clocks=clocks, config=SERIES_CONFIG)[1].snapshot_id == second


@pytest.mark.parametrize("planted", ["99991231_235959_999",   # a calendar time past int64 ns
                                     "99999999_999999_998"])  # not a calendar time at all
def test_planted_directory_above_every_calendar_id_refuses_the_next_snapshot(tmp_path: Path, planted: str) -> None:
    """Nothing restore would accept sorts above it: the write is refused, naming it."""
    repo = SnapshotRepository(tmp_path)
    m, _, _ = snapshot_series(repo, 1)
    (_cluster(tmp_path) / planted).mkdir()
    with pytest.raises(SnapshotPublishError, match=planted):
        SnapshotManager(m, repo, prefault=False).snapshot_now()
