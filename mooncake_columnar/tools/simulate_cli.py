"""`mooncake-columnar simulate`: a simulated failover at a chosen scale (analysis.simulate_failover).

Prints per-segment visible recovery TTL at publication, matched objects and time protected while
unreadable, plus the recovery TTL that would leave 8 s visible; ``--plot`` writes a PNG of the
protected objects over time and the visible window per segment (matplotlib, imported lazily).
"""
from __future__ import annotations

import argparse
import json
from typing import Any

TARGET_VISIBLE_MS = 8_000  # RFC: the default TTL is accepted if ~8 s stay visible after publication


def _figures(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    from .analysis import recovery_ttl_for_visible_window, simulate_failover
    result = simulate_failover(args.objects, segments=args.segments, replicas=args.replicas,
                               recovery_ttl_ms=args.recovery_ttl_ms, remount_spacing_ms=args.remount_spacing_ms,
                               clock_skew_ms=args.skew_ms, downtime_ms=args.downtime_ms)
    seg = result.segments
    out = dict(result.summary)
    out.update({
        "assignment_seconds": seg.column("assignment_s").to_pylist(),
        "locate_seconds": seg.column("locate_s").to_pylist(),
        "remount_seconds": seg.column("total_s").to_pylist(),
        "recovery_ttl_ms_for_8s_visible": recovery_ttl_for_visible_window(TARGET_VISIBLE_MS,
                                                                          out["max_overhead_ms"]),
    })
    return out, result


def _plot(result: Any, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on servers or in CI
    import matplotlib.pyplot as plt
    prot, seg = result.protection, result.segments
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    t_s = [t / 1000 for t in prot.column("time_ms").to_pylist()]
    left.step(t_s, prot.column("protected_objects").to_pylist(), where="post", label="protected (unreadable)")
    left.step(t_s, prot.column("evictable_objects").to_pylist(), where="post", label="evictable")
    left.set(xlabel="time since primary loss (s)", ylabel="objects", title="Protected while unreadable")
    left.legend()
    names = [f"segment-{i}" for i in seg.column("segment").to_pylist()]
    right.bar(names, [v / 1000 for v in seg.column("visible_ttl_ms").to_pylist()], label="visible at publication")
    right.axhline(result.summary["recovery_ttl_ms"] / 1000, color="gray", ls="--", label="recovery TTL")
    right.set(ylabel="seconds", title="Visible recovery window")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _cmd_simulate(args: argparse.Namespace) -> int:
    out, result = _figures(args)
    if args.plot:
        _plot(result, args.plot)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.objects:,} objects on {args.segments} segment(s), {args.replicas} replica(s), "
          f"recovery TTL {out['recovery_ttl_ms']} ms")
    print(f"{'segment':>8} {'matched':>12} {'assign s':>10} {'remount s':>10} {'visible ms':>12} {'protected ms':>13}")
    for row in result.segments.to_pylist():
        print(f"{row['segment']:>8} {row['matched_objects']:>12,} {row['assignment_s']:>10.4f} "
              f"{row['total_s']:>10.4f} {row['visible_ttl_ms']:>12.1f} {row['protected_ms']:>13.1f}")
    print(f"protected replicas chosen for eviction: {out['protected_chosen_for_eviction']}")
    print(f"recovery TTL for {TARGET_VISIBLE_MS} ms visible: {out['recovery_ttl_ms_for_8s_visible']} ms")
    if args.plot:
        print(f"plot written to {args.plot}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``simulate`` on the top-level subparsers."""
    s = sub.add_parser("simulate", help="simulated failover: visible recovery window, protected objects")
    s.add_argument("--objects", type=int, required=True)
    s.add_argument("--segments", type=int, default=4)
    s.add_argument("--replicas", type=int, default=1)
    s.add_argument("--recovery-ttl-ms", type=int, default=None, help="default: the normal read lease TTL")
    s.add_argument("--remount-spacing-ms", type=int, default=0, help="simulated wait between remounts")
    s.add_argument("--downtime-ms", type=int, default=0, help="simulated time from primary loss to promotion")
    s.add_argument("--skew-ms", type=int, default=0, help="promoted master's system clock offset")
    s.add_argument("--plot", metavar="PNG", help="write a plot to this file")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_cmd_simulate)
    return s
