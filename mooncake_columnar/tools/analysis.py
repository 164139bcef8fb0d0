"""Recovery-window analysis: how much of the recovery TTL survives a remount at a given scale, what
stays protected while unreadable, and what complete-snapshot restores leave of historical leases.

Everything here drives the real engine (promotion, remount, eviction planning, snapshot write and
restore with the real clock conversion) at the requested scale and returns Arrow tables
(``.to_pandas()`` works where pandas is installed). Measured work runs on real time; waits between
events (remount spacing, downtime, skew) are simulated on injected clocks, so nothing sleeps.
"""
from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ..clock import NS_PER_MS, ManualClocks
from ..config import MasterConfig
from ..kernels.predicates import lease_expired_mask, readable_replica_mask, stranded_memory_replica_mask
from ..master import MasterService
from ..schema import FLAG_LIVE
from ..snapshots.complete import write_snapshot
from ..snapshots.manager import restore_master
from ..snapshots.repository import SnapshotRepository
from .synthetic import build_master, promoted_master, segment_request

# A steady epoch unrelated to the writer's: raw steady values must never carry across processes.
RESTORE_STEADY_EPOCH_NS = 5_000_000 * NS_PER_MS
_WARMUP_OBJECTS = 1024


class MeasuredClocks(ManualClocks):
    """ManualClocks that follow the real monotonic clock inside :meth:`measuring` only.

    A remount measured this way consumes its real duration from the recovery lease it grants, while
    everything outside (waits between remounts, eviction censuses of the analysis itself) takes
    exactly the simulated time given to :meth:`advance`.
    """

    def __init__(self, **start_ns: int) -> None:
        super().__init__(**start_ns)
        self._started: int | None = None

    def _running_ns(self) -> int:
        return 0 if self._started is None else time.monotonic_ns() - self._started

    def steady_ns(self) -> int:
        return super().steady_ns() + self._running_ns()

    def system_ns(self) -> int:
        return super().system_ns() + self._running_ns()

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        """Let real time flow for the enclosed work, then keep what elapsed on the clocks."""
        if self._started is not None:
            raise RuntimeError("already measuring")
        self._started = time.monotonic_ns()
        try:
            yield
        finally:
            elapsed = self._running_ns()
            self._started = None
            self.advance(ns=elapsed)


@dataclass(frozen=True)
class FailoverResult:
    """``segments``: one row per remount (in remount order); ``protection``: the census at every
    sample point; ``summary``: the headline figures (JSON-ready, unit-named)."""

    segments: pa.Table
    protection: pa.Table
    summary: dict[str, Any]


@dataclass(frozen=True)
class RestoreDistribution:
    """``table``: one row per object; ``summary``: counts and the measured restore time."""

    table: pa.Table
    summary: dict[str, Any]


def recovery_ttl_for_visible_window(target_visible_ms: float, measured_overhead_ms: float) -> int:
    """The ``recovery_kv_lease_ttl_ms`` that leaves ``target_visible_ms`` after publication, given the
    TTL a remount consumed before publication (effective TTL minus visible TTL, measured)."""
    if target_visible_ms <= 0 or measured_overhead_ms < 0:
        raise ValueError("target_visible_ms must be > 0 and measured_overhead_ms >= 0")
    return math.ceil(target_visible_ms + measured_overhead_ms)


def _order(remount_order: Sequence[int] | Literal["random"] | None, segments: int, seed: int) -> list[int]:
    if remount_order is None:
        return list(range(segments))
    if isinstance(remount_order, str):
        if remount_order != "random":
            raise ValueError("remount_order must be a sequence of segment indices, None or 'random'")
        return [int(i) for i in np.random.default_rng(seed).permutation(segments)]
    order = [int(i) for i in remount_order]
    if len(set(order)) != len(order) or any(not 0 <= i < segments for i in order):
        raise ValueError(f"remount_order must list distinct segment indices in [0, {segments})")
    return order  # a segment left out never remounts: its objects stay protected throughout


def _warm_up(replicas: int, segments: int) -> None:
    """Compile the remount and eviction kernels outside the measured remounts."""
    m = promoted_master(_WARMUP_OBJECTS, segments=segments, replicas=replicas)
    m.remount_segments("client-0", [segment_request(m, 0)])
    m.eviction_plan(1.0)


def _replica_state(m: MasterService) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(live rows, complete memory slots on unreadable segments (of every row, continuation
    rows included), rows with a readable replica)."""
    o, hw = m.objects, m.objects.high_water
    status, kind, seg = o.replica_status[:hw], o.replica_kind[:hw], o.replica_segment[:hw]
    live = (o.flags[:hw] & FLAG_LIVE) != 0
    stranded = stranded_memory_replica_mask(status, kind, seg, m.segments.readable)
    unreadable_slots = (live | _continuation_rows(m))[:, None] & stranded
    readable_slots = readable_replica_mask(status, kind, seg, m.segments.readable)
    readable = _per_object(m, readable_slots.any(axis=1))  # type: ignore[arg-type]  # 2-D: an array, not a scalar
    return live, unreadable_slots, readable


def _continuation_rows(m: MasterService) -> np.ndarray:
    rows = np.arange(m.objects.high_water)
    return m.objects.owners(rows) != rows


def _per_object(m: MasterService, per_row: np.ndarray) -> np.ndarray:
    """A per-row flag with each continuation row's folded into its object's row (kernels/chains.py)."""
    if not m.objects.cont_count:
        return per_row
    rows = np.arange(per_row.size)
    owners = m.objects.owners(rows)
    out = per_row & (owners == rows)
    np.logical_or.at(out, owners[per_row], True)
    return out


def simulate_failover(objects: int, *, segments: int = 4, replicas: int = 1,
                      recovery_ttl_ms: int | None = None,
                      remount_order: Sequence[int] | Literal["random"] | None = None,
                      remount_spacing_ms: int = 0, clock_skew_ms: int = 0, downtime_ms: int = 0,
                      seed: int = 0, evict_expired: bool = False) -> FailoverResult:
    """Promote a standby holding ``objects`` objects and remount its segments one by one.

    Time 0 is the primary's loss; promotion happens ``downtime_ms`` later and remount k is due
    ``k * remount_spacing_ms`` after promotion (or when remount k-1 finishes, if later). Remounts
    themselves run on real time, so ``visible_ttl_ms`` is measured. ``clock_skew_ms`` offsets the
    promoted master's system clock: recovery leases are steady-clock deadlines, so it must change
    nothing (the figure is reported so that this shows). ``remount_order='random'`` shuffles the
    segments with ``seed``. With ``evict_expired`` a full eviction cycle (target 1.0) runs at every
    sample point, as on a master under memory pressure; otherwise eviction is only planned.

    At every sample point the census records objects without a readable replica, objects protected
    by the unreadable-replica guard, how many of those have an expired lease, and how many replicas
    on unreadable segments the eviction plan chose (the guard makes this 0).
    """
    if objects < 1 or segments < 1 or replicas < 1 or min(remount_spacing_ms, downtime_ms) < 0:
        raise ValueError("objects, segments and replicas must be >= 1; spacing and downtime >= 0")
    order = _order(remount_order, segments, seed)
    config = MasterConfig(recovery_kv_lease_ttl_ms=recovery_ttl_ms)
    _warm_up(replicas, segments)
    m = promoted_master(objects, segments=segments, replicas=replicas, config=config)
    clocks = MeasuredClocks()
    clocks.jump_system(ms=clock_skew_ms)
    m.clocks = clocks  # the promoted master reads time only through this attribute
    origin_ns = clocks.steady_ns()
    clocks.advance(ms=downtime_ms)

    _, unreadable_slots, _ = _replica_state(m)
    seg_codes = np.array([m.segments.code(f"segment-{i}") for i in range(segments)], np.int64)
    # objects holding a replica on each segment at promotion (each object once per segment)
    seg = m.objects.replica_segment[: m.objects.high_water]
    on_segment = [int(_per_object(m, (unreadable_slots & (seg == c)).any(axis=1)).sum()) for c in seg_codes]

    samples: list[dict[str, float | int | str]] = []

    def now_ms() -> float:
        return (clocks.steady_ns() - origin_ns) / NS_PER_MS

    def census(event: str) -> None:
        t_ms, now = now_ms(), clocks.steady_ns()
        live, unreadable, readable = _replica_state(m)
        protected = _per_object(m, unreadable.any(axis=1))  # type: ignore[arg-type]  # 2-D: an array, not a scalar
        expired = lease_expired_mask(m.objects.lease_deadline_ns[: m.objects.high_water], now)
        plan = m.eviction_plan(1.0)
        chosen = int((plan.removed & unreadable[plan.chains.rows]).sum())
        evicted = 0
        if evict_expired:
            report = m.evict(target=1.0)
            evicted = report.evicted_objects if report is not None else 0
        samples.append({"time_ms": t_ms, "event": event,
                        "unreadable_objects": int((live & ~readable).sum()),
                        "protected_objects": int(protected.sum()),
                        "protected_expired_objects": int((protected & expired).sum()),
                        "evictable_objects": int(plan.rows.size),
                        "protected_chosen_for_eviction": chosen,
                        "evicted_objects": evicted})

    census("promotion")
    rows: list[dict[str, float | int]] = []
    for k, i in enumerate(order):
        wait_ms = downtime_ms + k * remount_spacing_ms - now_ms()
        if wait_ms > 0:  # simulated: nothing happens on this master while the client is away
            clocks.advance(ns=round(wait_ms * NS_PER_MS))
        census(f"before remount of segment-{i}")
        at_ms = now_ms()
        with clocks.measuring():
            report = m.remount_segments(f"client-{i}", [segment_request(m, i)])
        rows.append({"segment": i, "objects_on_segment": on_segment[i],
                     "matched_objects": report.matched_objects, "locate_s": report.locate_seconds,
                     "rebuild_s": report.rebuild_seconds, "assignment_s": report.assignment_seconds,
                     "total_s": report.total_seconds, "effective_ttl_ms": report.effective_recovery_ttl_ms,
                     "visible_ttl_ms": report.visible_ttl_ms,
                     "overhead_ms": report.effective_recovery_ttl_ms - report.visible_ttl_ms,
                     "remount_at_ms": at_ms, "published_at_ms": now_ms(),
                     "protected_ms": now_ms() - downtime_ms})
        census(f"after remount of segment-{i}")
    ttl_ms = config.effective_recovery_kv_lease_ttl_ms
    clocks.advance(ms=ttl_ms + 1)  # every recovery lease has run out: only the guard protects now
    census("recovery leases expired")

    seg_table = pa.Table.from_pylist(rows) if rows else pa.table({"segment": pa.array([], pa.int64())})
    protection = pa.Table.from_pylist(samples)
    visible = [r["visible_ttl_ms"] for r in rows]
    summary: dict[str, Any] = {
        "objects": objects, "segments": segments, "replicas": replicas,
        "remount_order": order, "remount_spacing_ms": remount_spacing_ms,
        "downtime_ms": downtime_ms, "clock_skew_ms": clock_skew_ms,
        "recovery_ttl_ms": ttl_ms,
        "visible_ttl_ms": visible,
        "min_visible_ttl_ms": min(visible, default=None),
        "matched_objects": [r["matched_objects"] for r in rows],
        "protected_ms": [r["protected_ms"] for r in rows],
        "max_assignment_seconds": max((r["assignment_s"] for r in rows), default=None),
        "max_remount_seconds": max((r["total_s"] for r in rows), default=None),
        "max_overhead_ms": max((r["overhead_ms"] for r in rows), default=None),
        "never_remounted_objects": sum(on_segment[i] for i in range(segments) if i not in order),
        "protected_chosen_for_eviction": sum(int(s["protected_chosen_for_eviction"]) for s in samples),
        "evicted_objects": sum(int(s["evicted_objects"]) for s in samples),
    }
    return FailoverResult(seg_table, protection, summary)


def restore_lease_distribution(objects: int, *, downtime_ms: int, skew_ms: int, lease_ttl_ms: int = 10_000,
                               seed: int = 0, segments: int = 4) -> RestoreDistribution:
    """Remaining leases after a complete-snapshot (v2) restore, through the real write and restore.

    Leases at snapshot time are seeded as ``lease_ttl_ms - age`` with exponential ages (mean one
    TTL), so about a third are already expired. The restoring master starts ``downtime_ms`` after the
    snapshot; ``skew_ms`` is the writer's system clock minus the restorer's: positive (restorer
    behind) makes leases last exactly ``skew_ms`` longer, negative makes them expire earlier (RFC
    "Clock trust and skew"). The restore (decode, convert, rebuild) is timed on real time and that
    time is consumed too: ``remaining_at_publication = original - downtime + skew - restore``.
    Expired objects are kept (``drop_expired=False``) so that they can be counted.
    """
    if objects < 1 or downtime_ms < 0 or lease_ttl_ms < 1:
        raise ValueError("objects and lease_ttl_ms must be >= 1, downtime_ms >= 0")
    writer = ManualClocks()
    m = build_master(objects, segments=segments, clocks=writer)
    o, hw = m.objects, m.objects.high_water
    rng = np.random.default_rng(seed)
    age_ns = (rng.exponential(lease_ttl_ms, hw) * NS_PER_MS).astype(np.int64)
    c0, s0 = writer.steady_ns(), writer.system_ns()
    o.lease_deadline_ns[:hw] = c0 + lease_ttl_ms * NS_PER_MS - age_ns
    state = m.export_state()
    before = state.objects.select(["key", "lease_deadline_ns"])
    del m  # the restore below holds a second copy of everything: keep only the compared columns

    restorer = ManualClocks(steady_ns=RESTORE_STEADY_EPOCH_NS, system_ns=s0 + (downtime_ms - skew_ms) * NS_PER_MS)
    c1 = restorer.steady_ns()  # frozen during the restore: C1 is exact, the restore is timed
    with tempfile.TemporaryDirectory(prefix="mooncake-restore-analysis-") as root:
        repo = SnapshotRepository(root)
        write_snapshot(repo, state, s0, c0)
        del state
        t0 = time.perf_counter()
        restored, stats = restore_master(repo, clocks=restorer, drop_expired=False)
        restore_s = time.perf_counter() - t0
    restorer.advance(ns=round(restore_s * 1e9))  # publication: the restore's duration has passed
    after = restored.export_state().objects.select(["key", "lease_deadline_ns"])
    joined = before.join(after, "key", left_suffix="_snapshot", right_suffix="_restored",
                         use_threads=False)  # (state.py)
    original = joined.column("lease_deadline_ns_snapshot").to_numpy() - c0
    converted = joined.column("lease_deadline_ns_restored").to_numpy() - c1
    published = converted - (restorer.steady_ns() - c1)
    table = pa.table({
        "original_remaining_ns": original,
        "converted_remaining_ns": converted,           # at (S1, C1), before decoding
        "remaining_at_publication_ns": published,
        "remaining_ms": published / NS_PER_MS,
        "expired_at_snapshot": original <= 0,
        "expired_after_restore": published <= 0,
    })
    was, now = original <= 0, published <= 0
    summary = {
        "objects": int(joined.num_rows), "downtime_ms": downtime_ms, "skew_ms": skew_ms,
        "lease_ttl_ms": lease_ttl_ms, "restore_seconds": restore_s,
        "snapshot_format_version": stats.format_version,
        "expired_at_snapshot": int(was.sum()),
        "stayed_expired": int((was & now).sum()),
        "newly_expired": int((~was & now).sum()),
        "revived_by_skew": int((was & ~now).sum()),   # only when skew_ms exceeds downtime + restore
        "live_after_restore": int((~now).sum()),
        "median_remaining_live_ms": float(np.median(published[~now]) / NS_PER_MS) if (~now).any() else None,
    }
    return RestoreDistribution(table, summary)
