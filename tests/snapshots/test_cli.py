"""`mooncake-columnar snapshot ls|inspect|verify` and `bench snapshot`."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from mooncake_columnar.tools.bench_snapshot import bench_snapshot
from mooncake_columnar.tools.cli import main
from mooncake_columnar.clock import NS_PER_MS, NS_PER_S, ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig, SoftPinAction
from mooncake_columnar.tools.snapshot_cli import remaining_distribution
from mooncake_columnar.snapshots.manager import SnapshotManager
from mooncake_columnar.snapshots.repository import SnapshotRepository
from tests.fixtures import MOONCAKE_V1 as FIXTURES

WRITER = "3001-3002"


def _master() -> tuple[MasterService, ManualClocks]:
    clocks = ManualClocks(steady_ns=500 * NS_PER_S, system_ns=1_796_000_000 * NS_PER_S)
    m = MasterService(MasterConfig(default_kv_lease_ttl_ms=10_000), clocks=clocks)
    m.mount_segment("seg_a", endpoint="seg_a:1", client_id="1001-1002", base=1 << 32, size=1 << 20)
    for i in range(10):
        cfg = ReplicateConfig(hard_pin=i == 0,
                              soft_pin_action=SoftPinAction.ENABLE if i == 1 else SoftPinAction.PRESERVE)
        m.put_start(f"k{i}", 100, client_id=WRITER, config=cfg)
        m.put_end(f"k{i}", client_id=WRITER)
    for i in range(2, 8):      # leases of 10 s granted at t, t+1, ..., t+5
        m.get_replica_list(f"k{i}")
        clocks.advance(s=1)
    return m, clocks


@pytest.fixture()
def two_snapshots(tmp_path: Path) -> tuple[Path, list[str], ManualClocks]:
    m, clocks = _master()
    manager = SnapshotManager(m, SnapshotRepository(tmp_path), retention=5)
    a = manager.snapshot_now()
    clocks.advance(s=1)
    b = manager.snapshot_now()
    return tmp_path, [a, b], clocks


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["snapshot", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ls_marks_latest_and_format(capsys, two_snapshots) -> None:
    root, (a, b), _ = two_snapshots
    code, out, _ = _run(capsys, "ls", str(root))
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith(b) and "arrow-ipc|2.0.0" in lines[0] and "(latest)" in lines[0]
    assert lines[1].startswith(a) and "(latest)" not in lines[1]
    code, out, _ = _run(capsys, "ls", str(root), "--json")
    data = json.loads(out)
    assert [s["snapshot_id"] for s in data["snapshots"]] == [b, a] and data["latest"] == b
    assert all(s["format"] == "arrow-ipc|2.0.0" for s in data["snapshots"])
    # an unpublished directory (no manifest) is listed as such
    (root / "mooncake_cluster" / "20990101_000000_000").mkdir()
    code, out, _ = _run(capsys, "ls", str(root))
    assert "no manifest" in out.splitlines()[0]


def test_ls_v1_fixture_and_cluster_id(capsys) -> None:
    code, out, _ = _run(capsys, "ls", str(FIXTURES / "small_6" / "mooncake_master_snapshot"),
                        "--cluster-id", "mooncake_cluster")
    assert code == 0 and "messagepack|1.0.0" in out and "(latest)" in out
    code, out, _ = _run(capsys, "ls", str(FIXTURES / "small_6" / "mooncake_master_snapshot"),
                        "--cluster-id", "other")
    assert code == 0 and "no snapshots" in out


def test_inspect_v2_remaining_lease_at_given_time(capsys, two_snapshots) -> None:
    root, (a, b), clocks = two_snapshots
    at = clocks.system_ns() + 2 * NS_PER_S  # two seconds after the newest snapshot
    code, out, _ = _run(capsys, "inspect", str(root), "--at-system-ns", str(at), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["snapshot_id"] == b and info["latest"] and info["format"] == "arrow-ipc|2.0.0"
    assert info["manifest"] == f"arrow-ipc|2.0.0|{b}|{clocks.system_ns()}|{clocks.steady_ns()}"
    assert (info["system_now_ns"], info["steady_now_ns"]) == (clocks.system_ns(), clocks.steady_ns())
    assert (info["objects"], info["replicas"], info["segments"]) == (10, 10, 1)
    assert info["hard_pinned"] == 1 and info["soft_pin_enabled"] == 1 and info["soft_pin_active"] == 1
    d = info["remaining_lease"]
    # snapshot at t0+7 s; leases end at t0+10..t0+15 s; at t0+9 s: 1..6 s left; the rest expired
    assert d["active"] == 6 and d["expired"] == 4 and d["never_leased"] == 0
    assert d["quantiles_s"]["p100"] == pytest.approx(6.0) and d["quantiles_s"]["p0"] <= 0
    assert d["histogram_s"]["<= 0"] == 4 and d["histogram_s"]["(0, 1]"] == 1
    assert d["histogram_s"]["(1, 5]"] == 4 and d["histogram_s"]["(5, 10]"] == 1
    # hard pin and soft pin keep 2 of the 4 expired
    assert info["dropped_by_default_cleanup"] == 2
    # human output names the same things; an explicit older snapshot works too
    code, out, _ = _run(capsys, "inspect", str(root), "--snapshot-id", a, "--at-system-ns", str(at))
    assert code == 0
    for text in (f"snapshot      {a}", "clock pair    system_now_ns=", "objects       10",
                 "quantiles (s):", "histogram (s):", "active 6"):
        assert text in out, text


def test_inspect_v1_fixture_uses_the_legacy_adapter(capsys) -> None:
    case = FIXTURES / "small_6"
    expected = json.loads((case / "expected.json").read_text())
    s1_ms = expected["restore_observations"]["default_restore"]["restore_started_wall_clock_ms"]
    code, out, _ = _run(capsys, "inspect", str(case / "mooncake_master_snapshot"),
                        "--at-system-ns", str(s1_ms * NS_PER_MS), "--json")
    assert code == 0
    info = json.loads(out)
    assert info["format"] == "messagepack|1.0.0" and info["system_now_ns"] is None
    assert info["objects"] == 6 and info["segments"] == 2
    d = info["remaining_lease"]
    want = np.array([(o["lease_timeout_ms"] - s1_ms) * NS_PER_MS for o in expected["objects"]])
    assert d["active"] == int((want > 0).sum()) == 1 and d["expired"] == 5
    assert d["quantiles_s"]["p100"] == pytest.approx(want.max() / NS_PER_S)


def test_inspect_and_verify_report_a_corrupt_snapshot(capsys, two_snapshots) -> None:
    root, (a, b), _ = two_snapshots
    code, out, _ = _run(capsys, "verify", str(root))
    assert code == 0 and f"OK    {b}" in out and f"OK    {a}" in out and "2 of 2" in out
    path = root / "mooncake_cluster" / b / "replicas.arrow"
    path.write_bytes(path.read_bytes()[:-20])  # truncated upload
    code, out, _ = _run(capsys, "verify", str(root))
    assert code == 1
    assert f"FAIL  {b}: SnapshotDigestError" in out and f"OK    {a}" in out and "1 FAILED" in out
    code, out, _ = _run(capsys, "verify", str(root), "--snapshot-id", a, "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    code, _, err = _run(capsys, "inspect", str(root))
    assert code == 1 and "cannot inspect snapshot" in err and "SnapshotDigestError" in err


def test_verify_detects_bad_manifest_and_schema(capsys, two_snapshots) -> None:
    root, (a, b), _ = two_snapshots
    (root / "mooncake_cluster" / b / "manifest.txt").write_text(f"arrow-ipc|2.0.0|{b}|12")
    code, out, _ = _run(capsys, "verify", str(root), "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False
    bad = {r["snapshot_id"]: r for r in data["results"]}
    assert "ManifestError" in bad[b]["error"] and bad[a]["ok"]
    # a payload replaced by another one (digest recomputed): schema mismatch, not a crash
    from mooncake_columnar.snapshots.arrow_codec import digest_of
    d = root / "mooncake_cluster" / a
    payloads = {n: (d / n).read_bytes() for n in ("objects.arrow", "replicas.arrow", "segments.arrow")}
    payloads["objects.arrow"] = payloads["segments.arrow"]
    (d / "objects.arrow").write_bytes(payloads["objects.arrow"])
    (d / "digest.json").write_bytes(digest_of(payloads))
    code, out, _ = _run(capsys, "verify", str(root), "--snapshot-id", a)
    assert code == 1 and "SnapshotSchemaError" in out


def test_v1_fixtures_verify(capsys) -> None:
    for case in ("small_6", "many_1000"):
        code, out, _ = _run(capsys, "verify", str(FIXTURES / case / "mooncake_master_snapshot"))
        assert code == 0 and "1 of 1 snapshots verified" in out


def test_usage_errors_exit_2(capsys, tmp_path: Path) -> None:
    code, _, err = _run(capsys, "verify", str(tmp_path))
    assert code == 2 and "no snapshots to verify" in err
    code, _, err = _run(capsys, "inspect", str(tmp_path))
    assert code == 2 and "no snapshots" in err
    code, _, err = _run(capsys, "ls", "nosuchscheme://bucket/x")
    assert code == 2 and "cannot open" in err
    with pytest.raises(SystemExit):
        main(["snapshot", "frobnicate", str(tmp_path)])


def test_remaining_distribution_buckets() -> None:
    d = remaining_distribution(np.array([-(2**63), -5, 0, 1, NS_PER_S, 2 * NS_PER_S, 7200 * NS_PER_S]))
    assert (d["never_leased"], d["expired"], d["active"]) == (1, 2, 4)
    assert d["histogram_s"]["<= 0"] == 2 and d["histogram_s"]["(0, 1]"] == 2
    assert d["histogram_s"]["(1, 5]"] == 1 and d["histogram_s"]["> 3600"] == 1
    assert remaining_distribution(np.array([], np.int64))["quantiles_s"] == {}


# ---- bench ----------------------------------------------------------------------------------------
def test_bench_snapshot_20k_objects() -> None:
    r = bench_snapshot(20_000)
    assert r["area"] == "snapshot" and r["objects"] == 20_000
    for name in ("snapshot_write_seconds", "snapshot_restore_seconds", "snapshot_bytes",
                 "bytes_per_object", "baseline_copy_seconds", "write_ratio_to_baseline",
                 "restore_ratio_to_baseline", "peak_rss_bytes", "snapshot_lock_held_seconds"):
        assert r[name] > 0, name
    assert r["restored_objects"] == 20_000
    phases = [r[f"snapshot_restore_{p}_seconds"] for p in ("decode", "cleanup", "engine", "verify")]
    assert min(phases) >= 0 and sum(phases) <= r["snapshot_restore_seconds"]


def test_bench_snapshot_cli_json(capsys) -> None:
    assert main(["bench", "snapshot", "--objects", "5000", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["objects"] == 5000 and r["snapshot_write_seconds"] > 0


def test_snapshot_cli_works_on_a_copy_of_a_fixture(capsys, tmp_path: Path) -> None:
    root = tmp_path / "copy"
    shutil.copytree(FIXTURES / "small_6" / "mooncake_master_snapshot", root)
    (root / "mooncake_cluster" / "latest.txt").unlink()  # no pointer: every id is a candidate
    code, out, _ = _run(capsys, "verify", str(root))
    assert code == 0 and "1 of 1" in out


def test_verify_with_progress_keeps_stdout_one_json_object(capsys, two_snapshots) -> None:
    root, ids, _ = two_snapshots
    code, out, _ = _run(capsys, "verify", str(root), "--json", "--progress")
    assert code == 0 and json.loads(out)["results"] == [{"snapshot_id": sid, "ok": True, "error": None}
                                                        for sid in reversed(ids)]
