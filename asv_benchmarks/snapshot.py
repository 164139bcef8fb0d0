"""v2 complete snapshots: Arrow codec, and write/restore through a local SnapshotRepository.

``setup_cache`` writes one snapshot per object count once per asv run; benchmarks read it back
instead of rebuilding a master (restoring 1e7 objects from disk is several times cheaper).
Budget at 1e7 objects: write <= 2 s, restore <= 1 s, lock held <= 0.2 s (ARCHITECTURE.md section 7,
issue #5). Ratios divide by a same-run copy (codec, freeze) or raw file write/read (repository) of
the same bytes.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mooncake_columnar.tools.synthetic import build_master
from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.master import MasterService
from mooncake_columnar.snapshots.arrow_codec import (
    DIGEST_FILE,
    PAYLOAD_FILES,
    decode_state,
    encode_state,
)
from mooncake_columnar.snapshots.complete import restore_latest_with, write_snapshot
from mooncake_columnar.snapshots.manager import SnapshotManager
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.snapshots.state import SnapshotState

from ._common import OBJECT_COUNTS, SEGMENTS, TIMEOUT_S, best_seconds

FILES = (*PAYLOAD_FILES, DIGEST_FILE)
Cache = dict[int, str]  # object count -> local repository path holding one published snapshot
WARMUP_OBJECTS = 1024  # a tiny snapshot, restored in setup to compile the kernels from_state uses

_PAYLOADS: dict[int, dict[str, bytes]] = {}
_STATES: dict[int, SnapshotState] = {}


def write_repositories() -> Cache:
    """One published snapshot per object count, in the asv cache directory (the cwd)."""
    repos: Cache = {}
    for objects in sorted({WARMUP_OBJECTS, *OBJECT_COUNTS}):
        path = os.path.abspath(f"snapshot-repo-{objects}")
        clocks = ManualClocks()
        # Not cached_master: this process would otherwise hold every size at once.
        write_snapshot(SnapshotRepository(path), build_master(objects, segments=SEGMENTS).export_state(),
                       clocks.system_ns(), clocks.steady_ns())
        repos[objects] = path
    return repos


def payloads(cache: Cache, objects: int) -> dict[str, bytes]:
    if objects not in _PAYLOADS:
        repo = SnapshotRepository(cache[objects])
        _PAYLOADS[objects] = repo.read_payloads(repo.latest(), FILES)
    return _PAYLOADS[objects]


def state(cache: Cache, objects: int) -> SnapshotState:
    if objects not in _STATES:
        _STATES[objects] = decode_state(payloads(cache, objects))
    return _STATES[objects]


def restore(path: str) -> MasterService:
    """What a restarting master does: newest candidate, convert, clean up, rebuild the engine.

    drop_expired=False keeps every object: the worst case, as if every lease were still live.
    """
    clocks = ManualClocks()
    master, _, _ = restore_latest_with(SnapshotRepository(path), clocks,
                                       lambda s: MasterService.from_state(s, clocks=clocks, validated=True),
                                       drop_expired=False, build_checks_unique_keys=True)
    return master


class _Snapshot:
    params = OBJECT_COUNTS
    param_names = ["objects"]
    timeout = TIMEOUT_S

    def setup_cache(self) -> Cache:
        return write_repositories()

    setup_cache.timeout = TIMEOUT_S


class Codec(_Snapshot):
    def setup(self, cache: Cache, objects: int) -> None:
        self.payloads = payloads(cache, objects)
        self.state = state(cache, objects)

    def time_encode_state(self, cache: Cache, objects: int) -> None:
        encode_state(self.state)

    def time_decode_state(self, cache: Cache, objects: int) -> None:
        decode_state(self.payloads)

    def _copy_s(self) -> float:
        return best_seconds(lambda: [bytearray(data) for data in self.payloads.values()])

    def track_encode_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        return best_seconds(lambda: encode_state(self.state)) / self._copy_s()

    track_encode_ratio_to_baseline.unit = "ratio"

    def track_decode_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        return best_seconds(lambda: decode_state(self.payloads)) / self._copy_s()

    track_decode_ratio_to_baseline.unit = "ratio"

    def track_snapshot_bytes_per_object(self, cache: Cache, objects: int) -> float:
        return sum(len(data) for data in self.payloads.values()) / objects

    track_snapshot_bytes_per_object.unit = "bytes"


class Write(_Snapshot):
    """write_snapshot (encode + digest + publish) into an empty local repository."""

    def setup(self, cache: Cache, objects: int) -> None:
        self.state = state(cache, objects)
        self.payloads = payloads(cache, objects)
        self.clocks = ManualClocks()
        self.dir = tempfile.mkdtemp(prefix="mooncake-asv-snapshot-")

    def teardown(self, cache: Cache, objects: int) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)  # 1e7 objects: ~1.5 GB per written snapshot

    def _write(self) -> None:
        self.clocks.advance(s=1)  # a new snapshot id per write
        write_snapshot(SnapshotRepository(self.dir), self.state, self.clocks.system_ns(),
                       self.clocks.steady_ns())

    def time_write_snapshot(self, cache: Cache, objects: int) -> None:
        self._write()

    def track_write_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        raw = Path(self.dir, "raw")
        raw.mkdir()

        def write_raw() -> None:
            for name, data in self.payloads.items():
                (raw / name).write_bytes(data)

        return best_seconds(self._write) / best_seconds(write_raw)

    track_write_ratio_to_baseline.unit = "ratio"


class LockHeld(_Snapshot):
    """What a snapshot holds the master's lock for: the column memcpy into the manager's reused
    buffers (budget at 1e7 objects: <= 0.2 s), beside a same-run copy of the lease column."""

    def setup(self, cache: Cache, objects: int) -> None:
        self.master = restore(cache[objects])
        self.clocks = self.master.clocks
        self.dir = tempfile.mkdtemp(prefix="mooncake-asv-lock-")
        self.manager = SnapshotManager(self.master, SnapshotRepository(self.dir), retention=1)
        self.manager.snapshot_now()  # buffers faulted in, as in the periodic steady state

    def teardown(self, cache: Cache, objects: int) -> None:
        self.manager.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def track_lock_held_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        lease = self.master.objects.lease_deadline_ns[:self.master.objects.high_water]
        held = []
        for _ in range(3):  # the lock time alone, as the manager measures it; the least noisy
            self.clocks.advance(ms=1)  # a new snapshot id each time
            self.manager.snapshot_now()
            held.append(self.master.metrics.get("snapshot_lock_held_seconds"))
        return min(held) / best_seconds(lease.copy)

    track_lock_held_ratio_to_baseline.unit = "ratio"


class ForkedWrite(_Snapshot):
    """The periodic snapshot with the forked writer (freeze="fork"): the lock covers the fork,
    and the writer overwrites the payload files retention recycled (retention=1: every write
    recycles the previous snapshot's)."""

    def setup(self, cache: Cache, objects: int) -> None:
        self.master = restore(cache[objects])
        self.clocks = self.master.clocks
        self.dir = tempfile.mkdtemp(prefix="mooncake-asv-forked-")
        self.manager = SnapshotManager(self.master, SnapshotRepository(self.dir), retention=1, freeze="fork")
        self.manager.snapshot_now()  # kernels loaded in this process, as MasterService.start leaves them

    def teardown(self, cache: Cache, objects: int) -> None:
        self.manager.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _write(self) -> None:
        self.clocks.advance(ms=1)  # a new snapshot id per write
        self.manager.snapshot_now()

    def time_periodic_forked_write(self, cache: Cache, objects: int) -> None:
        self._write()

    def track_fork_lock_held_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        lease = self.master.objects.lease_deadline_ns[:self.master.objects.high_water]
        held = []
        for _ in range(3):
            self._write()
            held.append(self.master.metrics.get("snapshot_lock_held_seconds"))
        return min(held) / best_seconds(lease.copy)

    track_fork_lock_held_ratio_to_baseline.unit = "ratio"


class Restore(_Snapshot):
    """restore_latest + MasterService.from_state from the cached repository (nothing else held)."""

    def setup(self, cache: Cache, objects: int) -> None:
        restore(cache[WARMUP_OBJECTS])

    def time_restore(self, cache: Cache, objects: int) -> None:
        restore(cache[objects])

    def peakmem_restore(self, cache: Cache, objects: int) -> None:
        restore(cache[objects])

    def track_restore_ratio_to_baseline(self, cache: Cache, objects: int) -> float:
        repo = SnapshotRepository(cache[objects])
        snapshot_dir = Path(cache[objects], repo.cluster_id, repo.latest())

        def read_raw() -> None:
            for name in FILES:
                (snapshot_dir / name).read_bytes()

        return best_seconds(lambda: restore(cache[objects])) / best_seconds(read_raw)

    track_restore_ratio_to_baseline.unit = "ratio"
