"""Recovery-window analysis (issue 6): simulated failover, restore lease distribution, `simulate` CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mooncake_columnar.tools.analysis import (
    recovery_ttl_for_visible_window,
    restore_lease_distribution,
    simulate_failover,
)
from mooncake_columnar.tools.cli import main
from mooncake_columnar.clock import NS_PER_MS

OBJECTS = 6_000


def test_visible_ttl_is_positive_and_within_the_recovery_ttl():
    r = simulate_failover(OBJECTS, segments=3, recovery_ttl_ms=4_000)
    seg = r.segments.to_pylist()
    assert [s["segment"] for s in seg] == [0, 1, 2]
    for s in seg:
        assert 0 < s["visible_ttl_ms"] <= s["effective_ttl_ms"] == 4_000
        assert s["matched_objects"] == s["objects_on_segment"] > 0
        assert s["overhead_ms"] == pytest.approx(4_000 - s["visible_ttl_ms"])
    assert sum(s["matched_objects"] for s in seg) == OBJECTS
    assert r.summary["recovery_ttl_ms"] == 4_000
    assert r.summary["min_visible_ttl_ms"] == min(s["visible_ttl_ms"] for s in seg)


def test_later_segments_stay_protected_while_unreadable_even_under_eviction():
    # Spacing far beyond the TTL: segment 0's recovery leases run out long before segment 2
    # remounts, and segment 2's objects hold NEVER_LEASED (the most expired lease there is).
    r = simulate_failover(OBJECTS, segments=3, recovery_ttl_ms=1_000, remount_spacing_ms=60_000,
                          evict_expired=True)
    seg = r.segments.to_pylist()
    # every later segment still has all of its objects when it remounts: none was evicted
    assert all(s["matched_objects"] == s["objects_on_segment"] > 0 for s in seg)
    assert [round(s["remount_at_ms"]) for s in seg] == [0, 60_000, 120_000]
    assert seg[2]["protected_ms"] >= 120_000
    prot = r.protection.to_pylist()
    assert all(p["protected_chosen_for_eviction"] == 0 for p in prot)
    before_last = next(p for p in prot if p["event"] == "before remount of segment-2")
    assert before_last["protected_objects"] == before_last["protected_expired_objects"] == seg[2]["matched_objects"]
    assert before_last["unreadable_objects"] == seg[2]["matched_objects"]
    assert before_last["evicted_objects"] == seg[1]["matched_objects"]  # expired AND readable: evicted
    assert r.summary["protected_chosen_for_eviction"] == 0
    assert r.summary["evicted_objects"] == OBJECTS  # eventually, once each was readable and expired


def test_a_segment_that_never_remounts_stays_protected_to_the_end():
    r = simulate_failover(OBJECTS, segments=2, recovery_ttl_ms=1_000, remount_order=[1],
                          remount_spacing_ms=5_000, evict_expired=True)
    last = r.protection.to_pylist()[-1]
    assert last["event"] == "recovery leases expired"
    assert last["protected_objects"] == r.summary["never_remounted_objects"] > 0
    assert last["protected_chosen_for_eviction"] == 0
    assert r.summary["evicted_objects"] == OBJECTS - r.summary["never_remounted_objects"]


def test_random_order_is_seeded_and_bad_orders_are_rejected():
    a = simulate_failover(2_000, segments=4, remount_order="random", seed=3)
    b = simulate_failover(2_000, segments=4, remount_order="random", seed=3)
    assert a.summary["remount_order"] == b.summary["remount_order"]
    assert sorted(a.summary["remount_order"]) == [0, 1, 2, 3]
    for bad in ([0, 0], [4], "sorted"):
        with pytest.raises(ValueError):
            simulate_failover(100, segments=4, remount_order=bad)


def test_recovery_ttl_for_visible_window():
    assert recovery_ttl_for_visible_window(8_000, 2_500.2) == 10_501
    assert recovery_ttl_for_visible_window(8_000, 0) == 8_000
    with pytest.raises(ValueError):
        recovery_ttl_for_visible_window(0, 1)


def _dist(downtime_ms: int, skew_ms: int):
    return restore_lease_distribution(4_000, downtime_ms=downtime_ms, skew_ms=skew_ms, seed=5)


def test_restore_consumes_downtime_and_restore_time_exactly():
    d = _dist(3_000, 0)
    t = d.table
    original = t.column("original_remaining_ns").to_numpy()
    converted = t.column("converted_remaining_ns").to_numpy()
    published = t.column("remaining_at_publication_ns").to_numpy()
    restore_ns = round(d.summary["restore_seconds"] * 1e9)
    assert restore_ns > 0
    assert np.array_equal(converted, original - 3_000 * NS_PER_MS)     # the v2 formula, at (S1, C1)
    assert np.array_equal(published, original - 3_000 * NS_PER_MS - restore_ns)
    assert d.summary["snapshot_format_version"] == "2.0.0"
    assert d.summary["objects"] == 4_000
    assert 0 < d.summary["expired_at_snapshot"] < 4_000  # the seeded mix has both


def test_skew_moves_remaining_leases_by_exactly_the_skew():
    base = _dist(3_000, 0).table.column("converted_remaining_ns").to_numpy()
    behind = _dist(3_000, 700).table.column("converted_remaining_ns").to_numpy()   # restorer behind
    ahead = _dist(3_000, -700).table.column("converted_remaining_ns").to_numpy()   # restorer ahead
    assert np.array_equal(behind - base, np.full(base.size, 700 * NS_PER_MS))
    assert np.array_equal(ahead - base, np.full(base.size, -700 * NS_PER_MS))


@pytest.mark.parametrize("skew_ms", [0, -2_000, 1_000])
def test_expired_leases_stay_expired(skew_ms):
    d = _dist(3_000, skew_ms)  # skew below the downtime: nothing can be revived
    t = d.table
    was = t.column("expired_at_snapshot").to_numpy(zero_copy_only=False)
    now = t.column("expired_after_restore").to_numpy(zero_copy_only=False)
    assert was.any() and not (was & ~now).any()
    assert d.summary["stayed_expired"] == was.sum() == d.summary["expired_at_snapshot"]
    assert d.summary["revived_by_skew"] == 0
    assert d.summary["live_after_restore"] == (~now).sum()


def test_simulate_cli_prints_one_json_object_with_unit_named_figures(capsys, tmp_path):
    png = tmp_path / "failover.png"
    assert main(["simulate", "--objects", "4000", "--segments", "2", "--recovery-ttl-ms", "5000",
                 "--remount-spacing-ms", "1000", "--json", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    result = json.loads(out)  # exactly one JSON document
    assert result["objects"] == 4000 and result["recovery_ttl_ms"] == 5000
    assert len(result["visible_ttl_ms"]) == len(result["assignment_seconds"]) == 2
    assert all(0 < v <= 5000 for v in result["visible_ttl_ms"])
    assert sum(result["matched_objects"]) == 4000
    assert result["protected_ms"][1] >= 1000
    assert result["protected_chosen_for_eviction"] == 0
    assert result["recovery_ttl_ms_for_8s_visible"] >= 8000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_cli_prints_a_table(capsys):
    assert main(["simulate", "--objects", "2000", "--segments", "2"]) == 0
    out = capsys.readouterr().out
    assert "visible ms" in out and "protected replicas chosen for eviction: 0" in out
