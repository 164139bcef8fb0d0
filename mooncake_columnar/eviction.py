"""Eviction policy: watermarks, the two passes, soft-pin fallback, tenant quota, offload hooks.

Upstream BatchEvict semantics with deterministic output: candidates are taken earliest lease
first (ties by row). Every decision is the shared predicate of ``kernels/predicates.py``; the
plan is re-validated with it at mutation time and one ``now`` is sampled per cycle.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .kernels import eviction as ek

if TYPE_CHECKING:
    from .master import MasterService

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class EvictionPlan:
    """What one eviction decision removes, before anything is freed (the oplog hook).

    ``removed[i, j]`` marks replica slot j of object ``rows[i]`` that eviction drops;
    ``remaining[i, j]`` the slots that stay (PUT_END(remaining) or, when none, REMOVE).
    """

    rows: np.ndarray
    removed: np.ndarray
    remaining: np.ndarray

    @property
    def erased(self) -> np.ndarray:
        """Rows left without any replica: the whole object goes."""
        return self.rows[~self.remaining.any(axis=1)]


@dataclass(frozen=True)
class EvictionReport:
    target: float
    lower: float
    base: int
    evicted_objects: int
    evicted_bytes: int
    released_discarded: int
    skipped_unreadable: int
    offloads_queued: int
    duration_s: float


def memory_used_ratio(m: "MasterService") -> float:
    seg = m.segments
    cap = int(seg.capacity[seg.allocatable].sum())
    return float(seg.used[seg.allocatable].sum()) / cap if cap else 0.0


def eviction_targets(m: "MasterService") -> tuple[float, float] | None:
    """Upstream trigger: (target, lower) when above the high watermark or armed, else None."""
    cfg = m.config
    used = memory_used_ratio(m)
    high = cfg.eviction_high_watermark_ratio
    if used > high or (m.eviction_armed and cfg.eviction_ratio > 0):
        target = max(cfg.eviction_ratio, used - high + cfg.eviction_ratio)
        lower = max(target * 0.5, used - high)
        return target, lower
    return None


class _Planner:
    """Accumulates one cycle's planned rows across passes (a row is planned at most once)."""

    def __init__(self, m: "MasterService", now: int) -> None:
        self.m = m
        self.now = now
        o = m.objects
        self.taken = np.zeros(o.high_water, np.uint8)  # 0 free, 1 no-pin pass, 2 soft fallback
        self.count = 0
        self.freed_bytes = 0

    def take(self, candidates: np.ndarray, want: int, allow_soft: bool, want_bytes: int = INT64_MAX) -> int:
        """Plan up to ``want`` objects (or ``want_bytes``) from candidates, earliest lease first."""
        if want <= 0 or candidates.size == 0:
            return 0
        o = self.m.objects
        planned = 0
        # order a bounded prefix first (upstream's reserve), everything only if churn ate it
        for k in (self.count + want + max(1024, want // 10), candidates.size):
            ordered = ek.earliest_first(candidates, o.lease_deadline_ns, k)
            n, freed = ek.plan(ordered, want - planned, want_bytes - self.freed_bytes, self.now, allow_soft,
                               self.taken, o.flags, o.lease_deadline_ns, o.soft_pin_deadline_ns, o.group_next,
                               o.size_bytes, o.replica_status, o.replica_kind, o.replica_segment,
                               o.replica_refcnt, self.m.segments.readable)
            planned += n
            self.freed_bytes += freed
            if planned >= want or self.freed_bytes >= want_bytes or k >= candidates.size:
                break
        self.count += planned
        return planned

    def plan(self) -> EvictionPlan:
        """Planned rows in row order, re-validated, with the replicas to drop and to keep."""
        o = self.m.objects
        rows = np.flatnonzero(self.taken)
        keep = np.empty(rows.size, np.bool_)
        removed = np.empty((rows.size, o.slots), np.bool_)
        remaining = np.empty((rows.size, o.slots), np.bool_)
        ek.finalize(rows, self.taken, self.now, o.flags, o.lease_deadline_ns, o.soft_pin_deadline_ns,
                    o.replica_status, o.replica_kind, o.replica_segment, o.replica_refcnt,
                    self.m.segments.readable, keep, removed, remaining)
        return EvictionPlan(rows[keep], removed[keep], remaining[keep])


def _census(m: "MasterService", now: int, allow_soft: bool, tenant: int = -1):
    o = m.objects
    return ek.census(now, allow_soft, o.high_water, o.tenant, tenant, o.flags, o.lease_deadline_ns,
                     o.soft_pin_deadline_ns, o.replica_status, o.replica_kind, o.replica_segment,
                     o.replica_refcnt, m.segments.readable)


def batch_evict(m: "MasterService", target: float, lower: float) -> EvictionReport:
    """Upstream BatchEvict(target, lower) with one ``now``; the caller holds the master lock."""
    t0 = time.perf_counter()
    lower = min(lower, target)
    now = m.clocks.steady_ns()
    allow_soft = m.config.allow_evict_soft_pinned_objects
    base, nopin, soft, skipped = _census(m, now, allow_soft)
    m.metrics.inc("eviction_attempts")
    m.metrics.inc("eviction_skipped_unreadable_replicas", skipped)
    if base == 0:
        m.eviction_armed = False
        return EvictionReport(target, lower, 0, 0, 0, 0, skipped, 0, time.perf_counter() - t0)
    planner = _Planner(m, now)
    planner.take(nopin, math.ceil(base * target), allow_soft=False)          # first pass
    released = m._release_discarded(m.clocks.system_ns() // 1_000_000)
    second = math.ceil(base * lower) - planner.count - released
    if second > 0:                                                            # fill to the lower bound
        got = planner.take(nopin, second, allow_soft=False)
        if got < second and allow_soft:
            planner.take(soft, second - got, allow_soft=True)                 # soft-pinned fallback
    plan = planner.plan()
    evicted, freed, queued = m._apply_eviction(plan)
    if evicted or released or queued:
        m.eviction_armed = False
        m.metrics.inc("eviction_success")
    else:
        m.metrics.inc("eviction_failure")
    report = EvictionReport(target, lower, int(base), evicted, freed, released, int(skipped), queued,
                            time.perf_counter() - t0)
    m.metrics.inc("evicted_objects", evicted)
    m.metrics.inc("evicted_bytes", freed)
    m.metrics.set("eviction_duration_seconds", report.duration_s)
    return report


def evict_tenant_for_quota(m: "MasterService", tenant: int, deficit_bytes: int) -> int:
    """Free at least ``deficit_bytes`` of one tenant's expired objects; returns bytes freed."""
    now = m.clocks.steady_ns()
    allow_soft = m.config.allow_evict_soft_pinned_objects
    _, nopin, soft, skipped = _census(m, now, allow_soft, tenant)
    m.metrics.inc("eviction_skipped_unreadable_replicas", skipped)
    planner = _Planner(m, now)
    planner.take(nopin, nopin.size, allow_soft=False, want_bytes=deficit_bytes)
    if planner.freed_bytes < deficit_bytes and allow_soft:
        planner.take(soft, soft.size, allow_soft=True, want_bytes=deficit_bytes)
    _, freed, _ = m._apply_eviction(planner.plan())
    m.metrics.inc("tenant_evicted_bytes", freed, tenant=m.tenants.name(tenant))
    return freed
