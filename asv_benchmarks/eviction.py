"""One BatchEvict cycle of 5% over ``objects`` objects whose leases all expired at seeded random
times, as in ``mooncake-columnar bench evict`` (budget: <= 0.2 s at 1e7, ARCHITECTURE.md section 7).

Eviction removes objects, so every sample evicts from a fresh master rebuilt in ``setup`` from a
cached state (``MasterService.from_state``). The ratio divides by a same-run NumPy copy of the
lease column, the cheapest whole-table pass over that many rows.
"""
from __future__ import annotations

import numpy as np

from mooncake_columnar.tools.memory_floor import eviction_read_seconds
from mooncake_columnar.tools.synthetic import build_master
from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.master import MasterService
from mooncake_columnar.snapshots.state import SnapshotState

from ._common import FreshMasterBenchmark, SEED, SEGMENTS, best_seconds

RATIO = 0.05
WARMUP_OBJECTS = 1024

_STATES: dict[int, SnapshotState] = {}


def expired_master(objects: int) -> MasterService:
    """``objects`` complete objects, every lease expired up to ~17 min ago (seeded), on ManualClocks."""
    if objects not in _STATES:
        clocks = ManualClocks()
        m = build_master(objects, segments=SEGMENTS, clocks=clocks)
        hw = m.objects.high_water
        rng = np.random.default_rng(SEED)
        m.objects.lease_deadline_ns[:hw] = clocks.steady_ns() - rng.integers(1, 10**12, hw)
        _STATES[objects] = m.export_state()
    # ManualClocks() starts at the same steady time as the build's: the leases stay expired.
    return MasterService.from_state(_STATES[objects], clocks=ManualClocks())


class Evict(FreshMasterBenchmark):

    def setup(self, objects: int) -> None:
        expired_master(WARMUP_OBJECTS).evict(target=RATIO)  # JIT warm-up of census/plan/apply
        self.m = expired_master(objects)

    def time_evict_5_percent(self, objects: int) -> None:
        self.m.evict(target=RATIO)

    def track_evicted_objects(self, objects: int) -> int:
        return self.m.evict(target=RATIO).evicted_objects

    track_evicted_objects.unit = "objects"

    def track_evict_ratio_to_baseline(self, objects: int) -> float:
        lease = self.m.objects.lease_deadline_ns[: self.m.objects.high_water]
        copy_s = best_seconds(lambda: np.array(lease))
        evict_s = best_seconds(lambda: self.m.evict(target=RATIO), repeat=1)  # evicting twice differs
        return evict_s / copy_s

    track_evict_ratio_to_baseline.unit = "ratio"

    def track_census_ratio_to_baseline(self, objects: int) -> float:
        """The census part of one cycle (it reads every row; the rest scales with the evicted)."""
        lease = self.m.objects.lease_deadline_ns[: self.m.objects.high_water]
        copy_s = best_seconds(lambda: np.array(lease))
        return self.m.evict(target=RATIO).census_s / copy_s

    track_census_ratio_to_baseline.unit = "ratio"

    def track_next_cycle_ratio_to_read_floor(self, objects: int) -> float:
        """The cycle after a first one on the same master (its buffers kept, as in a master that
        evicts periodically) against one parallel read of what a cycle must read: every row's
        census columns and the key-index table (tools/memory_floor.py)."""
        self.m.evict(target=RATIO)
        evict_s = best_seconds(lambda: self.m.evict(target=RATIO), repeat=1)
        return evict_s / eviction_read_seconds(self.m)

    track_next_cycle_ratio_to_read_floor.unit = "ratio"

    def track_census_ratio_to_census_floor(self, objects: int) -> float:
        """The census of a cycle against one parallel read of the row columns it classifies by
        (the read floor without the key-index table: ``bench evict``'s
        ``census_ratio_to_census_floor``)."""
        return self.m.evict(target=RATIO).census_s / eviction_read_seconds(self.m, index=False)

    track_census_ratio_to_census_floor.unit = "ratio"
