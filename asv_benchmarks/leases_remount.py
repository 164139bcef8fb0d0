"""Remount recovery of one segment after standby promotion (RFC Phase 1), as in
``mooncake-columnar bench remount``.

One segment holds all ``objects`` objects: the RFC's worst case (nearly 1e8 objects per segment).
Every sample remounts a fresh promoted master built in ``setup`` by the real promotion
(``ha.standby.promoted_master``) from a cached filled master (a remount publishes the segment, so
it cannot be repeated on the same master). Budget at 1e8 objects (ARCHITECTURE.md section 7):
match + assign <= 0.5 s and
<= 3x a same-run NumPy copy of the lease column; visible window >= 9.9 s at 1e7 with a 10 s TTL.
"""
from __future__ import annotations

import numpy as np

from mooncake_columnar.clock import MonotonicClocks
from mooncake_columnar.ha.standby import promoted_master
from mooncake_columnar.master import MasterService
from mooncake_columnar.policies.recovery import RemountReport
from mooncake_columnar.tools.synthetic import build_master, segment_request

from ._common import FreshMasterBenchmark, best_seconds

SEGMENTS = 1
CLIENT = "client-0"
WARMUP_OBJECTS = 1024

_FILLED: dict[int, MasterService] = {}


def promoted(objects: int) -> MasterService:
    """A freshly promoted master (every segment unreadable, leases NEVER_LEASED), real clocks."""
    if objects not in _FILLED:
        _FILLED[objects] = build_master(objects, segments=SEGMENTS)
    return promoted_master(_FILLED[objects], clocks=MonotonicClocks())


def remount(m: MasterService) -> RemountReport:
    return m.remount_segments(CLIENT, [segment_request(m, 0)])


class Remount(FreshMasterBenchmark):

    def setup(self, objects: int) -> None:
        remount(promoted(WARMUP_OBJECTS))  # JIT warm-up of the locate/rebuild/assign kernels
        self.m = promoted(objects)

    def time_remount_refresh(self, objects: int) -> None:
        remount(self.m)

    def peakmem_remount_refresh(self, objects: int) -> None:
        remount(self.m)

    def track_visible_recovery_ttl_ms(self, objects: int) -> float:
        return remount(self.m).visible_ttl_ms

    track_visible_recovery_ttl_ms.unit = "ms"

    def track_refresh_ratio_to_baseline(self, objects: int) -> float:
        # The baseline copies the same (pre-remount) lease column the refresh writes.
        lease = self.m.objects.lease_deadline_ns[: self.m.objects.high_water]
        copy_s = best_seconds(lambda: np.array(lease))
        report = remount(self.m)
        return (report.locate_seconds + report.assignment_seconds) / copy_s

    track_refresh_ratio_to_baseline.unit = "ratio"
