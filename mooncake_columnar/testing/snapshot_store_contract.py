"""The behaviour a snapshot repository must have on its backing store, as a reusable pytest suite:
a local directory, an S3 bucket, or any store ``SnapshotRepository`` reaches through a URI.

Subclass :class:`SnapshotStoreContract` in a test module (the subclass's name must start with
``Test``) and give it a ``repo`` fixture that returns a :class:`SnapshotRepository` on a fresh,
empty location of the store (e.g. a new ``cluster_id`` per test)::

    class TestMyBucket(SnapshotStoreContract):
        @pytest.fixture
        def repo(self):
            return SnapshotRepository("s3://bucket/prefix?endpoint_override=...",
                                      cluster_id=f"c{uuid.uuid4().hex}")
"""
from __future__ import annotations

import pytest

from mooncake_columnar.clock import NS_PER_MS, NS_PER_S, ManualClocks
from mooncake_columnar.errors import InvalidParams, SnapshotPayloadError, SnapshotPublishError
from mooncake_columnar.snapshots.complete import restore_latest, write_snapshot
from mooncake_columnar.snapshots.manifest import MANIFEST_FILE
from mooncake_columnar.snapshots.repository import LATEST_FILE, SnapshotRepository
from mooncake_columnar.testing.states import make_state

A, B, C = "20260101_000000_000", "20260102_000000_000", "20260103_000000_000"
S0 = 1_796_019_911_535 * NS_PER_MS   # snapshot wall clock
C0 = 3_000 * NS_PER_S                # snapshot steady clock of the old process


def restore_clocks(downtime_s: float, steady_epoch_s: int = 50) -> ManualClocks:
    """A new process's clocks: steady from ``steady_epoch_s``, wall ``downtime_s`` after S0."""
    return ManualClocks(steady_ns=steady_epoch_s * NS_PER_S, system_ns=S0 + int(downtime_s * NS_PER_S))


def _v1m(sid: str) -> str:
    return f"messagepack|1.0.0|{sid}"


def _v1p(metadata: bytes = b"m") -> dict[str, bytes]:
    """Every upstream v1 payload: a v1 snapshot missing one is not published."""
    return {"metadata": metadata, "segments": b"", "task_manager": b"t"}


def _overwrite(repo: SnapshotRepository, name: str, data: bytes) -> None:
    """Write ``name`` (relative to the cluster directory) behind the repository's back."""
    with repo.fs.open_output_stream(f"{repo.base}/{name}") as out:
        out.write(data)


class SnapshotStoreContract:
    """Publish, list, read, retain, follow latest.txt, restore and fall back over the store."""

    def test_repository_contract(self, repo: SnapshotRepository) -> None:
        assert repo.list() == [] and repo.latest() is None and repo.candidates() == []
        repo.publish(A, _v1p(b"m" * 1000), _v1m(A))
        repo.publish(B, _v1p(b"n"), _v1m(B))
        assert repo.list() == [B, A] and repo.latest() == B and repo.candidates() == [B, A]
        files = repo.read(A)
        assert files.manifest == _v1m(A).encode()
        assert files.payloads == _v1p(b"m" * 1000)
        with pytest.raises(SnapshotPublishError):  # published snapshots are immutable
            repo.publish(A, {"metadata": b"x"}, _v1m(A))
        with pytest.raises(SnapshotPayloadError):  # a payload name A does not hold
            repo.read_payloads(A, ("digest.json",))
        with pytest.raises(InvalidParams):  # not a payload name at all
            repo.read_payloads(A, ("nope",))
        with pytest.raises(InvalidParams):
            repo.publish("2026", {"a": b""}, _v1m(A))
        with pytest.raises(InvalidParams):
            repo.publish(C, {MANIFEST_FILE: b""}, _v1m(C))
        repo.publish(C, _v1p(b"o"), _v1m(C))
        assert repo.retain(2) == [A] and repo.list() == [C, B]
        with pytest.raises(InvalidParams):
            repo.retain(0)

    def test_candidates_follow_latest(self, repo: SnapshotRepository) -> None:
        for sid in (A, B, C):
            repo.publish(sid, _v1p(), _v1m(sid))
        _overwrite(repo, LATEST_FILE, f"{B}\n".encode())  # trimmed on read, like upstream
        # C is newer than latest.txt but has its manifest, which is written after every payload: it
        # is complete (only its latest.txt upload failed), so it is tried right after B, before A.
        assert repo.latest() == B and repo.candidates() == [B, C, A]
        assert repo.retain(1) == [A]  # the newest (C) is kept by count and B because latest.txt names it
        _overwrite(repo, LATEST_FILE, b"garbage")
        assert repo.latest() is None and repo.candidates() == [C, B]

    def test_phase3_active_lease_conversion_with_downtime(self, repo: SnapshotRepository) -> None:
        state = make_state(3, lease=[C0 + 10 * NS_PER_S, C0 + 60 * NS_PER_S, C0 - NS_PER_S],
                           hard=[False, False, True])
        write_snapshot(repo, state, S0, C0, compression="zstd")
        clocks = restore_clocks(downtime_s=4)
        out, manifest, stats = restore_latest(repo, clocks)
        c1 = clocks.steady_ns()
        assert manifest.is_v2 and stats.format_version == "2.0.0" and stats.fallbacks == 0
        assert out.objects.column("lease_deadline_ns").to_pylist() == [
            c1 + 6 * NS_PER_S, c1 + 56 * NS_PER_S, c1 - 5 * NS_PER_S]
        assert stats.objects_restored == 3 and stats.objects_dropped == 0

    def test_phase3_candidate_fallback_after_malformed_mapping(self, repo: SnapshotRepository) -> None:
        write_snapshot(repo, make_state(2, lease=C0 + 100 * NS_PER_S), S0, C0)
        newer = write_snapshot(repo, make_state(5, lease=C0 + 100 * NS_PER_S), S0 + NS_PER_S, C0 + NS_PER_S)
        assert isinstance(newer, str)  # written in the foreground
        good = repo.read_manifest(newer).decode()
        for bad in (good.rsplit("|", 1)[0], good.replace("|3001", "|+3001"), good + "|1"):
            _overwrite(repo, f"{newer}/{MANIFEST_FILE}", bad.encode())
            out, manifest, stats = restore_latest(repo, restore_clocks(downtime_s=2))
            assert out.objects.num_rows == 2 and manifest.snapshot_id != newer
            assert stats.candidates_tried == 2 and stats.fallbacks == 1
            assert stats.failures[0][0] == newer and "ManifestError" in stats.failures[0][1]
