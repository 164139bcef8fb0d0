"""Failover of ``serve --enable_ha`` under the real upstream client, beside upstream's own HA master.

For each master kind an HA cluster (testing/ha_cluster.py: one etcd, ``masters`` candidates, the
wheel's standalone metadata server) serves a writer client (it owns the segment) and a reader
client (no segment), both reaching the leader through ``etcd://``. Each round runs the same
workload (failover_round): put ``objects`` seeded values, remove 10%, keep writing single puts,
stop the leader (kill -9, or SIGTERM), then time the first successful get of an acknowledged
object sent after the old leader's port closed, and read everything back: kept, lost, corrupt
(neither whole nor absent), resurrected (removed, readable again). The stopped candidate is
restarted, follows again and goes idle (caught up) before the next round.

Figures: ``serve_*`` for ``mooncake-columnar serve``; ``baseline_upstream_*`` for the wheel's
``mooncake_master --enable_ha=true --enable_oplog=true``; ``baseline_upstream_nooplog_*`` for it
without the oplog (its standby promotes with no objects, so it times the first answer instead);
``*_ratio_to_baseline`` = serve / upstream; ``*_sigterm_fresh_standby_*`` hand over to a standby
that has only just restarted. Seconds are medians over the trials (``_max``: the worst), object
counts are sums over them.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from ..testing.client_driver import RealClient
from ..testing.etcd_server import EtcdServer
from ..testing.ha_cluster import (
    FailoverOutcome,
    HaCluster,
    StopHow,
    failover_round,
    scrape_value,
    wait_standby_ready,
)
from ..testing.upstream_wheel import MasterKind, skip_reason

LEASE_TTL_MS = 2000
RECOVERY_TTL_MS = 5000
STANDBY_WAIT_S = 120.0


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def _max(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return max(finite) if finite else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not (math.isnan(a) or math.isnan(b)) else math.nan


class _Bench:
    """One kind's cluster and its two clients for a series of rounds."""

    def __init__(self, kind: MasterKind, masters: int, flags: Sequence[str], log_dir: Path, label: str) -> None:
        self.label = label
        self.etcd = EtcdServer().start()
        self.cluster = HaCluster(kind, masters, self.etcd.endpoint, f"bench-{label}", log_dir / label, flags,
                                 etcd=self.etcd)
        self.clients: list[RealClient] = []
        try:
            self.cluster.start()
            common: dict[str, Any] = dict(env=self.cluster.client_env(), buffer_bytes=32 << 20,
                                          log_dir=log_dir / label)
            self.writer = RealClient(self.cluster.master_address(), self.cluster.metadata_url, name="writer",
                                     segment_bytes=128 << 20, **common)
            self.clients.append(self.writer.start())
            self.reader = RealClient(self.cluster.master_address(), self.cluster.metadata_url, name="reader",
                                     segment_bytes=0, memcpy=False, **common)
            self.clients.append(self.reader.start())
        except BaseException:
            self.close()
            raise
        self.rounds = 0

    def round(self, how: StopHow, objects: int, seed: int, *, probe_answer: bool = False,
              settle: bool = True) -> FailoverOutcome:
        # settle: caught up too (idle), as a standby that has followed for a while is; without it the
        # stop lands on a standby that has just restarted and may still be replaying the oplog
        wait_standby_ready(self.cluster, len(self.cluster.masters) - 1, STANDBY_WAIT_S, settle=settle)
        self.rounds += 1
        return failover_round(self.cluster, self.writer, self.reader, how=how, seed=seed,
                              prefix=f"{self.label}-{self.rounds}", objects=objects, probe_answer=probe_answer,
                              timeout_s=90.0)

    def close(self) -> None:
        for c in self.clients:
            c.close(unmount=False)
        self.cluster.stop()
        self.etcd.stop()


def _figures(prefix: str, how: str, outcomes: list[FailoverOutcome], errors: list[str]) -> dict[str, Any]:
    p = f"{prefix}_{how}"
    first = [o.first_get_seconds for o in outcomes]
    return {
        f"{p}_rounds": len(outcomes),
        f"{p}_failed_rounds": len(errors),
        **({f"{p}_error": errors[-1][:500]} if errors else {}),
        f"{p}_first_get_seconds": _median(first),
        f"{p}_first_get_seconds_max": _max(first),
        f"{p}_new_leader_seconds": _median([o.new_leader_seconds for o in outcomes]),
        f"{p}_objects_acknowledged": sum(o.acknowledged - o.removed for o in outcomes),
        f"{p}_objects_kept": sum(o.verdict.kept for o in outcomes),
        f"{p}_objects_lost": sum(len(o.verdict.lost) for o in outcomes),
        # the oldest acknowledgement a lost put had before the stop: how far back the loss reaches
        f"{p}_lost_acknowledged_before_stop_seconds_max": _max([o.lost_acknowledged_before_stop_seconds()
                                                                for o in outcomes]),
        f"{p}_objects_corrupt": sum(len(o.verdict.corrupt) for o in outcomes),
        f"{p}_objects_removed": sum(o.removed for o in outcomes),
        f"{p}_objects_resurrected": sum(len(o.verdict.resurrected) for o in outcomes),
        f"{p}_unacknowledged_puts": sum(len(o.expected.unacknowledged) for o in outcomes),
        f"{p}_unacknowledged_whole": sum(o.verdict.unacknowledged_whole for o in outcomes),
    }


def _series(bench: _Bench, prefix: str, hows: Sequence[StopHow], trials: int, objects: int, seed0: int, *,
            probe_answer: bool = False, scrape_ttl: bool = False, fresh_trials: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ttl_ratios: list[float] = []
    plan: list[tuple[str, StopHow, int, bool]] = [(how, how, trials, True) for how in hows]
    if fresh_trials:
        plan.append(("sigterm_fresh_standby", "sigterm", fresh_trials, False))
    for h, (name, how, n, settle) in enumerate(plan):
        outcomes: list[FailoverOutcome] = []
        errors: list[str] = []
        for t in range(n):
            try:
                o = bench.round(how, objects, seed0 + 100 * h + t, probe_answer=probe_answer, settle=settle)
            except Exception as exc:  # one failed round is a figure too; the series goes on
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            outcomes.append(o)
            print(f"{prefix} {name} {o.summary()}", file=sys.stderr)
            if scrape_ttl:
                visible = scrape_value(bench.cluster.named(o.new_leader).scrape(), "mooncake_remount_visible_ttl_ms")
                ttl_ratios.append(visible / RECOVERY_TTL_MS if visible is not None else math.nan)
        out.update(_figures(prefix, name, outcomes, errors))
    for suffix in ("objects_lost", "objects_corrupt", "objects_resurrected"):
        out[f"{prefix}_{suffix}"] = sum(out.get(f"{prefix}_{name}_{suffix}", 0) for name, *_ in plan)
    if scrape_ttl:
        out[f"{prefix}_visible_recovery_ttl_ratio"] = min(ttl_ratios) if ttl_ratios else math.nan
    return out


def bench_failover(trials: int = 2, objects: int = 200, *, masters: int = 2, nooplog_trials: int = 1,
                   fresh_trials: int = 1, log_dir: str | None = None, seed: int = 1) -> dict[str, Any]:
    """``trials`` kill -9 failovers and ``trials`` SIGTERM hand-overs of ``objects`` objects against
    serve, then against upstream's HA master with the oplog, and ``nooplog_trials`` kill -9 rounds
    against it without; ``fresh_trials`` more SIGTERM hand-overs (``*_sigterm_fresh_standby_*``) to a
    standby that has only just restarted and followed. One flat dict of figures (module docstring)."""
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(f"the real client cannot run here: {reason}")
    root = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="bench-failover-"))
    t0 = time.perf_counter()
    out: dict[str, Any] = {"trials": trials, "objects": objects, "masters": masters, "lease_ttl_ms": LEASE_TTL_MS,
                           "recovery_kv_lease_ttl_ms": RECOVERY_TTL_MS, "log_dir": str(root)}
    lease = f"--default_kv_lease_ttl={LEASE_TTL_MS}"
    runs: list[tuple[MasterKind, str, list[str], Sequence[StopHow], int, bool]] = [
        ("serve", "serve", [lease, f"--recovery_kv_lease_ttl={RECOVERY_TTL_MS}"], ("kill9", "sigterm"), trials, False),
        ("upstream", "baseline_upstream", [lease], ("kill9", "sigterm"), trials, False),
        ("upstream", "baseline_upstream_nooplog", [lease, "--enable_oplog=false"], ("kill9",), nooplog_trials, True),
    ]
    for kind, prefix, flags, hows, n, no_data in runs:
        if n <= 0:
            continue
        bench = _Bench(kind, masters, flags, root, prefix.replace("_", "-"))
        try:
            out.update(_series(bench, prefix, hows, n, objects, seed, probe_answer=no_data,
                               scrape_ttl=kind == "serve", fresh_trials=0 if no_data else fresh_trials))
        finally:
            bench.close()
    for how in ("kill9", "sigterm", "sigterm_fresh_standby"):
        for figure in ("first_get_seconds", "new_leader_seconds"):
            out[f"serve_{how}_{figure.removesuffix('_seconds')}_ratio_to_baseline"] = _ratio(
                out.get(f"serve_{how}_{figure}", math.nan), out.get(f"baseline_upstream_{how}_{figure}", math.nan))
    out["wall_seconds"] = time.perf_counter() - t0
    return out


def bench_failover_area(objects: int, *, segments: int = 1, replicas: int = 1, show_progress: bool = False,
                        trials: int = 2) -> dict[str, Any]:
    """`mooncake-columnar bench failover --objects N [--trials T]`: :func:`bench_failover` with
    the bench command's arguments (segments and replicas do not apply: each client mounts one)."""
    return bench_failover(trials, objects)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=2)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--masters", type=int, default=2)
    parser.add_argument("--nooplog-trials", type=int, default=1)
    parser.add_argument("--fresh-trials", type=int, default=1)
    parser.add_argument("--log-dir", default=None)
    args = parser.parse_args(argv)
    result = bench_failover(args.trials, args.objects, masters=args.masters, nooplog_trials=args.nooplog_trials,
                            fresh_trials=args.fresh_trials, log_dir=args.log_dir)
    print(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
