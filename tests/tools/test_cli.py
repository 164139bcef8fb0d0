"""The command line: demo runs, bench prints one JSON object with unit-named figures."""
from __future__ import annotations

import json

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
                 "baseline_copy_seconds", "baseline_dict_lookup_keys_per_s", "peak_rss_bytes"):
        assert result[name] > 0, name
