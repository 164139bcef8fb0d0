"""Retention keeps the payload files it deletes for the next snapshot to overwrite in place
(their page cache stays resident), and never writes through anything planted there."""
from __future__ import annotations

import os
from pathlib import Path

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.snapshots.arrow_codec import OBJECTS_FILE, PAYLOAD_FILES
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.recycle import RECYCLE_DIR
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.builders import canonical, make_master, put_objects


def _setup(tmp_path: Path, n: int = 200):
    clocks = ManualClocks(steady_ns=1_000 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = make_master(clocks, segments=1)
    put_objects(m, [f"k{i}" for i in range(n)])
    repo = SnapshotRepository(tmp_path / "repo")
    return m, clocks, repo, SnapshotManager(m, repo, retention=1, freeze="copy")


def _restored(repo: SnapshotRepository, clocks: ManualClocks):
    new = ManualClocks(steady_ns=7 * NS_PER_S, system_ns=clocks.system_ns() + NS_PER_S)
    return restore_master(repo, clocks=new, snapshot_restore_drop_expired=False, prefault=False)[0]


def test_next_snapshot_overwrites_the_deleted_ones_files_in_place_and_restores(tmp_path: Path) -> None:
    m, clocks, repo, manager = _setup(tmp_path)
    first = manager.snapshot_now()
    clocks.advance(s=1)
    second = manager.snapshot_now()  # retention deletes the first: its payloads wait in RECYCLE_DIR
    recycle = repo.root + f"/{repo.cluster_id}/{RECYCLE_DIR}"
    inodes = {name: os.stat(f"{recycle}/{name}").st_ino for name in PAYLOAD_FILES}
    assert repo.list() == [second] and repo.recycled_bytes() > 0 and first not in repo.list()
    m.batch_remove([f"k{i}" for i in range(150)], force=True)  # a smaller state: files are cut to size
    clocks.advance(s=1)
    third = manager.snapshot_now()
    manager.stop()
    third_dir = Path(repo.root) / repo.cluster_id / third
    assert {name: (third_dir / name).stat().st_ino for name in PAYLOAD_FILES} == inodes
    assert repo.list() == [third]
    assert canonical(_restored(repo, clocks)) == canonical(m)


def test_planted_links_in_the_recycle_directory_are_never_written_through(tmp_path: Path) -> None:
    m, clocks, repo, manager = _setup(tmp_path)
    manager.snapshot_now()
    recycle = Path(repo.root) / repo.cluster_id / RECYCLE_DIR
    recycle.mkdir()
    victim_a, victim_b = tmp_path / "victim_a", tmp_path / "victim_b"
    victim_a.write_bytes(b"keep me")
    victim_b.write_bytes(b"keep me too")
    (recycle / OBJECTS_FILE).symlink_to(victim_a)
    os.link(victim_b, recycle / PAYLOAD_FILES[1])  # a hard link: the same file under another name
    clocks.advance(s=1)
    manager.snapshot_now()
    manager.stop()
    assert victim_a.read_bytes() == b"keep me" and victim_b.read_bytes() == b"keep me too"
    assert canonical(_restored(repo, clocks)) == canonical(m)


def test_a_symlinked_snapshot_directory_is_deleted_without_moving_its_targets_files(tmp_path: Path) -> None:
    m, clocks, repo, manager = _setup(tmp_path)
    sid = manager.snapshot_now()
    outside = tmp_path / "outside"
    snapshot_dir = Path(repo.root) / repo.cluster_id / sid
    snapshot_dir.rename(outside)
    snapshot_dir.symlink_to(outside, target_is_directory=True)
    clocks.advance(s=1)
    manager.snapshot_now()  # retention deletes the linked directory: the link only
    manager.stop()
    assert all((outside / name).is_file() for name in PAYLOAD_FILES)
