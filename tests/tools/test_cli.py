"""The command line: demo runs, bench prints one JSON object with unit-named figures."""
from __future__ import annotations

import json

import pytest

from mooncake_columnar.tools.cli import main


def test_demo_runs_a_failover_on_embedded_defaults(capsys):
    assert main(["demo", "--objects", "20000"]) == 0
    out = capsys.readouterr().out
    assert "standby promoted" in out and "REPLICA_IS_NOT_READY" in out
    assert "durably removed objects present after promotion: 0 of 100" in out
    assert "an hour later, eviction at 100%: 0 evicted" in out
    assert out.count("got ONE recovery lease") == 4


def test_bench_core_json_has_figures_with_baselines(capsys):
    assert main(["bench", "core", "--objects", "20000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["objects"] == 20000
    for name in ("batch_put_keys_per_s", "batch_get_keys_per_s", "single_get_median_us", "bytes_per_object",
                 "baseline_copy_seconds", "baseline_dict_lookup_keys_per_s", "peak_rss_bytes",
                 "baseline_gather_keys_per_s", "batch_get_ratio_to_gather_floor",
                 "single_get_best_round_median_us", "baseline_single_call_floor_best_round_median_us"):
        assert result[name] > 0, name
    # the best round is one of the rounds the overall median covers
    assert result["single_get_best_round_median_us"] <= result["single_get_p99_us"]


def test_bench_evict_json_has_both_cycles_and_the_read_floor(capsys):
    assert main(["bench", "evict", "--objects", "20000", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["evicted_objects"] == 1000 and result["next_cycle_evicted_objects"] == 950  # 5% of what is left
    for name in ("evict_seconds", "census_seconds", "apply_seconds", "baseline_copy_seconds", "ratio_to_baseline",
                 "next_cycle_evict_seconds", "next_cycle_census_seconds", "next_cycle_apply_seconds",
                 "floor_read_seconds", "ratio_to_floor", "next_cycle_ratio_to_floor"):
        assert result[name] > 0, name
    # the floor reads what a cycle must read, nothing more: a cycle cannot beat it
    assert result["floor_read_seconds"] < min(result["evict_seconds"], result["next_cycle_evict_seconds"])
    # and its parts, each read alone, set beside the passes that must read them
    assert 0 < result["floor_census_read_seconds"] < result["evict_seconds"]
    assert 0 < result["floor_index_read_seconds"] < result["evict_seconds"]
    assert result["census_ratio_to_census_floor"] == result["census_seconds"] / result["floor_census_read_seconds"]


def test_gather_floor_refuses_keys_that_are_not_stored():
    """The floor reads each key's row: a missing key has none, so it cannot stand for a lookup."""
    from mooncake_columnar.tools.memory_floor import gather_keys_per_s
    from mooncake_columnar.tools.synthetic import build_master, synthetic_keys

    m = build_master(1000)
    assert gather_keys_per_s(m, synthetic_keys(0, 1000)) > 0
    with pytest.raises(ValueError, match="present"):
        gather_keys_per_s(m, synthetic_keys(999, 2))


def test_engine_verify_with_progress_keeps_stdout_one_json_object(capsys, tmp_path) -> None:
    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.snapshots.manager import SnapshotManager
    from mooncake_columnar.snapshots.repository import SnapshotRepository
    from mooncake_columnar.testing.builders import make_master, put_objects
    m = make_master(ManualClocks())
    put_objects(m, ["a", "b"])
    SnapshotManager(m, SnapshotRepository(tmp_path)).snapshot_now()
    assert main(["verify", str(tmp_path), "--json", "--progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["objects"] == 2


@pytest.mark.slow
def test_bench_endtoend_runs_every_step_with_its_peak_rss(capsys):
    """Build, evict 5%, two snapshots, a restore and a bootstrap + remount in fresh processes."""
    assert main(["bench", "endtoend", "--objects", "20000", "--json", "--progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    for step in ("build", "evict", "snapshot", "periodic_snapshot", "restore", "bootstrap_remount_bootstrap",
                 "bootstrap_remount_remount"):
        assert result[f"{step}_seconds"] > 0 and result[f"{step}_peak_rss_bytes"] > 0, step
    assert result["evicted_objects"] == 1_000 and result["restore_objects"] == 19_000
    assert result["bootstrap_remount_matched_objects"] > 0
    for baseline in ("baseline_lease_copy_seconds", "baseline_fresh_memory_seconds",
                     "bootstrap_remount_baseline_lease_copy_seconds"):
        assert result[baseline] > 0, baseline


def test_bench_endtoend_records_a_failed_fresh_process_instead_of_losing_the_run(tmp_path):
    """A restore killed for memory at a size this machine cannot hold must not cost the figures
    of the steps before it: the failed step reports its error and exit status."""
    from mooncake_columnar.tools.bench_endtoend import _fresh_process
    failed = _fresh_process("restore", str(tmp_path / "no-snapshots"), 0)
    assert failed["exit_status"] != 0 and "NoUsableSnapshot" in failed["error"]
