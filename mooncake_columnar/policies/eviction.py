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

from ..clock import INT64_MAX
from ..kernels import eviction as ek
from ..store.eviction_plan import EvictionPlan  # lives in the store, which drops plans; still importable here
from .offload import offload_instead

if TYPE_CHECKING:
    from .service import Service


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
    # where the cycle's time went: the census (with its sample), choosing and re-validating the
    # plan, and applying it (frees, key index, rows; with a journal, hiding the rows)
    census_s: float = 0.0
    plan_s: float = 0.0
    apply_s: float = 0.0


def memory_used_ratio(m: "Service") -> float:
    seg = m.store.segments
    cap = int(seg.capacity[seg.allocatable].sum())
    return float(seg.used[seg.allocatable].sum()) / cap if cap else 0.0


def eviction_targets(m: "Service") -> tuple[float, float] | None:
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
    """Accumulates one cycle's planned rows across passes (a row is planned at most once).

    Candidates are census codes (NO_PIN_CANDIDATE, SOFT_PINNED_CANDIDATE); a planned row's code
    becomes PLANNED (or PLANNED_SOFT, by the fallback), so later passes skip it. A census that
    lists the first pass's candidates writes no codes: the usual cycle plans from that listing
    alone and writes none either (the planned rows' sparse codes touched every cache line of
    them). A pass that needs them (a second pass, the soft-pinned fallback, groups, a short
    listing) has the census write them first, then the marks so far: the same ``now`` under the
    same lock classifies every row the same.
    """

    def __init__(self, m: "Service", now: int, tenant: int = -1, first_ratio: float | None = None) -> None:
        """``first_ratio``: the first pass takes that share of the base, so the census also
        lists the candidates that pass is likely to need (no second pass over every row)."""
        self.m = m
        self.now = now
        o = m.store.objects
        columns = (now, o.high_water, o.tenant, tenant, o.flags, o.lease_deadline_ns, m.store.soft_pins.parts(),
                   o.replica_status, o.replica_kind, o.replica_segment, o.replica_refcnt,
                   m.store.segments.readable, o.replica_more)
        bound = None if first_ratio is None else ek.listing_bound(first_ratio, *columns)
        self.listed: ek.Listed | None = None
        self.columns = columns
        scratch = m.store.scratch  # buffers used up within the cycle
        self.codes = scratch.array("census codes", o.high_water, np.uint8)
        self.coded = bound is None  # every row's code is in self.codes
        self.marked: list[tuple[np.ndarray, int]] = []  # what _mark left unwritten while not coded
        if bound is None:
            _, self.counts, skipped = ek.census(*columns, out=self.codes)
        else:
            entries = ek.listing_entries(o.high_water, bound.share)
            listing = (scratch.array("census listed rows", entries, np.uint32),
                       scratch.array("census listed deadlines", entries, np.int64))
            self.counts, skipped, self.listed = ek.census_listing(*columns, *bound, listing_out=listing)
        self.skipped = int(skipped)
        self.base = int(self.counts[ek.IN_BASE] + self.counts[ek.NO_PIN_CANDIDATE]
                        + self.counts[ek.SOFT_PINNED_CANDIDATE])
        self.picked: list[np.ndarray] | None = []  # ascending row sets, while no pass had to walk groups
        self.count = 0
        self.freed_bytes = 0

    def take(self, code: int, want: int, allow_soft: bool, want_bytes: int = INT64_MAX) -> int:
        """Plan up to ``want`` candidates of ``code`` (or ``want_bytes``), earliest lease first."""
        count = int(self.counts[code])
        if want <= 0 or count == 0:
            return 0
        o = self.m.store.objects
        mark = ek.PLANNED_SOFT if allow_soft else ek.PLANNED
        if want_bytes == INT64_MAX and self.picked is not None:
            # usual case: no group among the earliest candidates, so the plan is exactly that
            # set, found without listing every candidate or sorting (plan() orders by row)
            listed = self._listed(code)
            if listed is None or listed.rows.size < want:  # (earliest_coded lists from the codes)
                self._code_every_row()
            chosen = ek.earliest_coded(self.codes, code, count, o.lease_deadline_ns, want, listed)
            if not ek.any_grouped(chosen, o.flags):
                return self._mark(chosen, code, mark)
        self._code_every_row()
        self.picked = None  # from here on plan() lists the rows coded PLANNED*
        candidates = ek.rows_coded(self.codes, code, o.lease_deadline_ns, None)
        planned = 0
        # order a bounded prefix first (upstream's reserve), everything only if churn ate it
        for k in (want + max(1024, want // 10), candidates.size):
            ordered = ek.earliest_first(candidates, o.lease_deadline_ns, k)
            n, freed = ek.plan(ordered, want - planned, want_bytes - self.freed_bytes, self.now, allow_soft,
                               self.codes, o.flags, o.lease_deadline_ns, self.m.store.soft_pins.parts(),
                               self.m.store.group_of.links(),
                               o.size_bytes, o.replica_status, o.replica_kind, o.replica_segment,
                               o.replica_refcnt, self.m.store.segments.readable, o.replica_more)
            planned += n
            self.freed_bytes += freed
            if planned >= want or self.freed_bytes >= want_bytes or k >= candidates.size:
                break
        self.count += planned
        return planned

    def _listed(self, code: int) -> ek.Listed | None:
        """The census's listed rows still coded ``code`` (rows planned since then are not)."""
        if code != ek.NO_PIN_CANDIDATE or self.listed is None:
            return None
        if self.count == 0:  # nothing planned since the census
            return self.listed
        self._code_every_row()
        keep = self.codes[self.listed.rows] == code
        return ek.Listed(self.listed.rows[keep], self.listed.deadlines[keep])

    def _code_every_row(self) -> None:
        """Have the census write every row's code, then the marks of the rows planned so far."""
        if self.coded:
            return
        ek.census(*self.columns, out=self.codes)
        for rows, mark in self.marked:
            self.codes[rows] = mark
        self.coded = True

    def _mark(self, rows: np.ndarray, code: int, mark: int) -> int:
        if self.coded:
            self.codes[rows] = mark
        else:
            self.marked.append((rows, mark))
        self.counts[code] -= rows.size
        assert self.picked is not None  # only the usual case marks here, while picked is kept
        self.picked.append(rows)
        self.count += rows.size
        return int(rows.size)

    def plan(self) -> EvictionPlan:
        """Planned rows in row order, re-validated, with the replicas to drop and to keep."""
        o = self.m.store.objects
        if self.picked is None:
            rows = np.flatnonzero(self.codes >= ek.PLANNED)
        else:
            rows = np.sort(np.concatenate(self.picked)) if len(self.picked) > 1 else (
                self.picked[0] if self.picked else np.zeros(0, np.int64))
        keep = np.empty(rows.size, np.bool_)
        chains = o.chains(rows)
        removed = np.empty((chains.rows.size, o.slots), np.bool_)
        remaining = np.empty((chains.rows.size, o.slots), np.bool_)
        ek.finalize(rows, self.codes, self.coded, self.now, o.flags, o.lease_deadline_ns,
                    self.m.store.soft_pins.parts(), o.replica_status, o.replica_kind, o.replica_segment,
                    o.replica_refcnt, self.m.store.segments.readable, o.replica_more, keep, chains.owner, chains.rows,
                    removed, remaining)
        return EvictionPlan(rows, chains, removed, remaining).subset(keep)


def first_pass_plan(m: "Service", target: float) -> EvictionPlan:
    """What a first pass at ``target`` would remove, without removing it."""
    planner = _Planner(m, m.clocks.steady_ns(), first_ratio=target)
    planner.take(ek.NO_PIN_CANDIDATE, math.ceil(planner.base * target), allow_soft=False)
    return planner.plan()


def batch_evict(m: "Service", target: float, lower: float) -> EvictionReport:
    """Upstream BatchEvict(target, lower) with one ``now``; the caller holds the master lock."""
    t0 = time.perf_counter()
    lower = min(lower, target)
    now = m.clocks.steady_ns()
    allow_soft = m.config.allow_evict_soft_pinned_objects
    planner = _Planner(m, now, first_ratio=target)
    t_census = time.perf_counter()
    base, skipped = planner.base, planner.skipped
    m.metrics.inc("eviction_attempts")
    m.metrics.inc("eviction_skipped_unreadable_replicas", skipped)
    if base == 0:
        m.eviction_armed = False
        return EvictionReport(target, lower, 0, 0, 0, 0, skipped, 0, time.perf_counter() - t0, t_census - t0)
    nopin, soft = ek.NO_PIN_CANDIDATE, ek.SOFT_PINNED_CANDIDATE
    planner.take(nopin, math.ceil(base * target), allow_soft=False)          # first pass
    released = m.store.release_discarded(m.clocks.system_ns() // 1_000_000)
    second = math.ceil(base * lower) - planner.count - released
    if second > 0:                                                            # fill to the lower bound
        got = planner.take(nopin, second, allow_soft=False)
        if got < second and allow_soft:
            planner.take(soft, second - got, allow_soft=True)                 # soft-pinned fallback
    plan = planner.plan()
    t_plan = time.perf_counter()
    evicted, freed, queued = apply_eviction(m, plan)
    t_apply = time.perf_counter()
    if evicted or released or queued:
        m.eviction_armed = False
        m.metrics.inc("eviction_success")
    else:
        m.metrics.inc("eviction_failure")
    report = EvictionReport(target, lower, int(base), evicted, freed, released, int(skipped), queued,
                            time.perf_counter() - t0, t_census - t0, t_plan - t_census, t_apply - t_plan)
    m.metrics.inc("evicted_objects", evicted)
    m.metrics.inc("evicted_bytes", freed)
    m.metrics.set("eviction_duration_seconds", report.duration_s)
    return report


def evict_tenant_for_quota(m: "Service", tenant: int, deficit_bytes: int) -> int:
    """Free at least ``deficit_bytes`` of one tenant's expired objects; returns bytes freed."""
    now = m.clocks.steady_ns()
    allow_soft = m.config.allow_evict_soft_pinned_objects
    planner = _Planner(m, now, tenant)
    m.metrics.inc("eviction_skipped_unreadable_replicas", planner.skipped)
    for code, soft in ((ek.NO_PIN_CANDIDATE, False), (ek.SOFT_PINNED_CANDIDATE, True)):
        if planner.freed_bytes < deficit_bytes and (allow_soft or not soft):
            planner.take(code, int(planner.counts[code]), allow_soft=soft, want_bytes=deficit_bytes)
    _, freed, _ = apply_eviction(m, planner.plan())
    m.metrics.inc("tenant_evicted_bytes", freed, tenant=m.store.tenants.name(tenant))
    return freed


def apply_eviction(m: "Service", plan: EvictionPlan) -> tuple[int, int, int]:
    """Drop planned replicas (offloading instead where configured; with a journal: hidden now,
    freed once durable, a full window stopping the cycle); returns (objects evicted, bytes
    freed, offloads queued)."""
    queued = 0
    if m.config.enable_offload and m.config.offload_on_evict and plan.rows.size:
        plan, queued = offload_instead(m, plan)
    hit = plan.chains.any(plan.removed)
    if not hit.any():
        return 0, 0, queued
    plan = plan.subset(hit)
    if m.journal is not None:
        done = m.journal.hide_then_free(plan.rows, plan)
        if done < plan.rows.size:
            m.metrics.inc("eviction_oplog_backpressure")
            plan = plan.part(0, done)
        o = m.store.objects
        return int(plan.rows.size), int((o.size_bytes[plan.rows] * plan.chains.count(plan.removed)).sum()), queued
    return int(plan.rows.size), m.store.drop_planned(plan), queued
