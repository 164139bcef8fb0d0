"""Remount recovery (RFC Phase 1): a promoted master's segment becomes serviceable only after its
client remounts it, and only then do its objects get ONE fresh recovery lease.

Exact ordering, under the master's lock: validate -> locate the replicas of the remounted segments
(one columnar pass, a bitset of object rows deduplicates without a hash table) -> rebuild each
allocator from the occupied extents -> replace buffers -> verify -> one recovery deadline and one
soft-pin deadline -> masked max-update of the lease (and soft-pin) columns -> clear invalid
endpoints -> publish readable. Any failure before publication grants nothing, publishes nothing,
rolls the allocators back and can be retried. Several segments publish all or none.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..clock import NS_PER_MS
from ..errors import EngineInvariantError
from ..errors import RecoveryFault  # noqa: F401 (tests import it from here)
from ..kernels import objects as ok
from ..kernels.leases import grant_recovery_masked
from ..store.rebuild import free_space
from ..store.segments import Segment

if TYPE_CHECKING:
    from .service import Service

log = logging.getLogger(__name__)
# warn when the deadline assignment eats this share of the recovery TTL (RFC observability)
MATERIAL_TTL_SHARE = 0.05


@dataclass(frozen=True)
class RemountReport:
    client_id: str
    segments: tuple[str, ...]        # segments recovered (standby-restored, now serviceable)
    newly_mounted: int               # segments that were not known at all (plain mounts)
    matched_objects: int
    effective_recovery_ttl_ms: int
    recovery_deadline_ns: int
    locate_seconds: float            # the columnar pass finding the remounted segments' objects
    rebuild_seconds: float           # allocators rebuilt from the occupied extents (sort by offset)
    assignment_seconds: float        # deadline computation + masked max-update
    total_seconds: float             # the whole remount under the lock
    visible_ttl_ms: float            # lease left on the recovered objects when the segment went live


@dataclass(frozen=True)
class _Recovered:
    bits: np.ndarray                 # the recovered objects (kernels.rowbits)
    matched: int
    deadline: int
    locate_seconds: float
    rebuild_seconds: float
    assignment_seconds: float
    visible_ttl_ms: float


def recover_segments(m: "Service", client: str, segments: list[tuple[int, Segment]],
                     fault: Callable[[str], None] | None = None) -> _Recovered:
    """Recover standby-restored segments ``(code, requested segment)``. Raises on any failure,
    with nothing granted or published and every allocator as it was."""
    step = fault or (lambda name: None)
    seg = m.store.segments
    codes = [c for c, _ in segments]
    step("locate")
    t_locate = time.perf_counter()
    o = m.store.objects
    hw = o.high_water
    on = np.zeros(max(1, len(seg.info)), np.bool_)
    on[codes] = True
    bits, matched = ok.objects_on_segments(on, hw, o.flags, o.replica_status, o.replica_kind, o.replica_segment,
                                           o.replica_more)
    locate_s = time.perf_counter() - t_locate

    step("rebuild_allocators")
    t_rebuild = time.perf_counter()
    rebuilt = free_space(o, seg, bits, int(matched), on)  # nothing installed until all rebuilt cleanly
    rebuild_s = time.perf_counter() - t_rebuild
    saved = {c: (seg.extents.of(c)[0].copy(), seg.extents.of(c)[1].copy(), int(seg.used[c]), seg.mounted(c))
             for c in codes}
    try:
        step("replace_buffers")
        rebuilt.install(seg, codes)
        for code, req in segments:
            # the client's base, and its segment id and host id where it tells them
            old = seg.mounted(code)
            seg.replace_info(code, Segment(req.name, req.endpoint, client, req.base, req.size,
                                           req.segment_id or old.segment_id, req.host_id or old.host_id))
        step("verify")
        for code in codes:
            free = int(seg.extents.of(code)[1].sum())
            if free + int(seg.used[code]) != int(seg.capacity[code]):
                raise EngineInvariantError("allocator_adds_up", f"segment {seg.mounted(code).name!r}: "
                                           "free and used bytes do not add up after the rebuild")
        step("assign")
    except BaseException:
        for c, (st, ln, used, info) in saved.items():  # roll back: as if never attempted
            seg.install_allocator(c, st, ln, used)
            seg.replace_info(c, info)
        raise

    t0 = time.perf_counter()
    now = m.clocks.steady_ns()
    deadline = now + m.config.effective_recovery_kv_lease_ttl_ms * NS_PER_MS      # ONE deadline
    soft_deadline = now + m.config.default_kv_soft_pin_ttl_ms * NS_PER_MS         # ONE soft-pin deadline
    grant_recovery_masked(o.lease_deadline_ns, m.store.soft_pins.parts(), o.flags, bits,
                          deadline, soft_deadline)  # max-update: never shortens
    assignment_s = time.perf_counter() - t0

    for code in codes:  # clear invalid endpoints, publish
        seg.readable[code] = True
        seg.allocatable[code] = True
    visible_ms = (deadline - m.clocks.steady_ns()) / NS_PER_MS
    ttl_ms = m.config.effective_recovery_kv_lease_ttl_ms
    if ttl_ms and assignment_s * 1000 > MATERIAL_TTL_SHARE * ttl_ms:
        log.warning("remount of %d segment(s): deadline assignment took %.3f s of a %d ms recovery TTL",
                    len(codes), assignment_s, ttl_ms)
    return _Recovered(bits, int(matched), deadline, locate_s, rebuild_s, assignment_s, visible_ms)
