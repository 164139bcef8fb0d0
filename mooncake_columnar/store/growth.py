"""Growth of the object columns and the key index, done in steps.

Doubling the columns, rehashing the index table, growing or compacting the key arena: each
copies the whole structure (at 1M keys 40-420 ms). A batch that ran one inside its chunk held
the master lock that long, and every reader waited. Growth is therefore a sequence of *jobs*,
each building a new buffer from the live one in bounded steps and swapping it in at the end:

* a step only reads the live structures and writes the new buffer, so readers (get, exist)
  may run between steps: :func:`batching.grow_ahead` runs them in lock turns of their
  own before a batch chunk;
* anything that mutates the master finishes the remaining steps first (the master lock's
  ``settle`` hook), so a live structure never changes while a job copies it; readers do write
  lease deadlines and the group-refresh flag, and those two columns are copied again at the
  swap;
* nothing live changes before the swap, so a job that fails (out of memory) is dropped and
  leaves the master as it was.

``reserve`` on the tables runs the same jobs to completion at once (one path per concept).
"""
from __future__ import annotations

from time import perf_counter
from typing import Callable, Protocol

import numpy as np

from ..kernels import arena as arena_k
from ..kernels import hashing as hk
from ..kernels import slot_index as sk
from ..schema import OBJECT_COLUMNS, REPLICA_COLUMNS

STEP_S = 0.002  # a step holds the master lock about this long
_FIRST_UNITS = 1 << 16


class GrowthJob(Protocol):
    units: int  # rows, slots or bytes to copy in all
    phase_starts: tuple[int, ...]  # units where the cost per unit changes (a step stops there)

    def step(self, lo: int, hi: int) -> None: ...  # copy units [lo, hi) into the new buffer

    def finish(self) -> None: ...                  # swap the new buffer in (cannot fail)


# What each job reads and swaps in of the structure it grows. The tables (objects.py, keys.py,
# side_table.py) build their jobs from this module, so it names them by these shapes, not by import.
class GrowingObjects(Protocol):
    """store/objects.py's ObjectTable, as ColumnGrowth and ArenaCompaction see it (its columns
    are read and swapped in by name)."""

    capacity: int
    replica_more: np.ndarray
    key_ref: np.ndarray

    @property
    def high_water(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def flags(self) -> np.ndarray: ...


class GrowingKeys(Protocol):
    """store/keys.py's KeyIndex, as the index and arena jobs see it."""

    table: np.ndarray
    arena: np.ndarray
    arena_used: int
    arena_garbage: int

    @property
    def objects(self) -> GrowingObjects: ...


class GrowingSideTable(Protocol):
    """store/side_table.py's RowSideTable, as SideTableGrowth sees it (its columns by name)."""

    index: np.ndarray
    free_slots: np.ndarray
    free_count: int

    @property
    def capacity(self) -> int: ...
    def fills(self) -> dict[str, object]: ...


def run_job(job: GrowthJob) -> None:
    """All of ``job`` at once."""
    job.step(0, job.units)
    job.finish()


class ColumnGrowth:
    """The object columns at a larger capacity (rows beyond the high-water mark stay
    uninitialised: their pages are not touched until rows are taken)."""

    phase_starts: tuple[int, ...] = ()

    _READER_WRITTEN = ("lease_deadline_ns", "flags")  # read leases write these (kernels/leases.py)

    def __init__(self, objects: GrowingObjects, capacity: int) -> None:
        self.objects, self.capacity = objects, capacity
        self.units = objects.high_water
        self.new = {name: np.empty(capacity, dt) for name, dt in OBJECT_COLUMNS.items()}
        self.new.update({name: np.empty((capacity, objects.slots), dt) for name, dt in REPLICA_COLUMNS.items()})

    def step(self, lo: int, hi: int) -> None:
        for name, col in self.new.items():
            col[lo:hi] = getattr(self.objects, name)[lo:hi]

    def finish(self) -> None:
        o, hw = self.objects, self.units
        for name in self._READER_WRITTEN:
            self.new[name][:hw] = getattr(o, name)[:hw]
        for name, col in self.new.items():
            setattr(o, name, col)
        if o.replica_more.size:
            o.replica_more = np.concatenate((o.replica_more, np.full(self.capacity - o.capacity, -1, np.int32)))
        o.capacity = self.capacity


class TableRehash:
    """The key index's slot table at a larger size: first emptied, then filled by the stored
    tags (units: the new slots to empty, then the old slots to rehash)."""

    def __init__(self, keys: GrowingKeys, capacity: int) -> None:
        self.keys, self.capacity = keys, capacity
        self.units = capacity + keys.table.shape[0]
        self.phase_starts: tuple[int, ...] = (capacity,)
        self.new = np.empty(capacity, np.int64)  # untouched until a step (a fill costs ms)

    def step(self, lo: int, hi: int) -> None:
        cap = self.capacity
        if lo < cap:
            self.new[lo:min(hi, cap)] = hk.EMPTY_SLOT
        if hi > cap:
            hk.rehash_slots(self.keys.table, max(lo, cap) - cap, hi - cap, self.new)

    def finish(self) -> None:
        self.keys.table = self.new


class ArenaGrowth:
    """The key arena in a larger buffer. The arena is append-only between compactions, and no
    key is appended while a job runs, so its used bytes are copied as they are."""

    phase_starts: tuple[int, ...] = ()

    def __init__(self, keys: GrowingKeys, capacity: int) -> None:
        self.keys = keys
        self.units = keys.arena_used
        self.new = np.empty(capacity, np.uint8)

    def step(self, lo: int, hi: int) -> None:
        self.new[lo:hi] = self.keys.arena[lo:hi]

    def finish(self) -> None:
        self.keys.arena = self.new


class ArenaCompaction:
    """The keys of the LIVE rows, row by row, into a new arena of ``capacity`` bytes, and a new
    ``key_ref`` column pointing at them (the old arena stays intact: a frozen snapshot may still
    read it)."""

    phase_starts: tuple[int, ...] = ()

    def __init__(self, keys: GrowingKeys, capacity: int) -> None:
        self.keys, o = keys, keys.objects
        self.units = o.high_water
        self.new = np.empty(capacity, np.uint8)
        self.refs = np.empty(o.capacity, np.int64)
        self.used = 0

    def step(self, lo: int, hi: int) -> None:
        o = self.keys.objects
        self.used = int(arena_k.compact_rows(self.keys.arena, o.key_ref, o.flags, lo, hi,
                                             self.new, self.used, self.refs))

    def finish(self) -> None:
        k = self.keys
        k.objects.key_ref = self.refs
        k.arena, k.arena_used, k.arena_garbage = self.new, self.used, 0


class SideTableGrowth:
    """A row side table (store/side_table.py) at a larger capacity (units: its slots, the old
    ones copied, the new ones set free), the new slots on top of the free stack, and its row
    index rebuilt."""

    phase_starts: tuple[int, ...] = ()

    def __init__(self, table: GrowingSideTable, capacity: int) -> None:
        self.table, self.units, self.old = table, capacity, table.capacity
        self.fill = table.fills()
        self.new = {name: np.empty(capacity, getattr(table, name).dtype) for name in self.fill}
        self.index = np.full(sk.index_size(capacity), -1, np.int32)

    def step(self, lo: int, hi: int) -> None:
        cut = min(max(lo, self.old), hi)
        for name, col in self.new.items():
            col[lo:cut] = getattr(self.table, name)[lo:cut]
            col[cut:hi] = self.fill[name]
        sk.insert_slots(self.index, self.new["row"], lo + np.flatnonzero(self.new["in_use"][lo:cut]))

    def finish(self) -> None:
        t, old, cap = self.table, self.old, self.units
        free = np.empty(cap, np.int64)
        free[: t.free_count] = t.free_slots[: t.free_count]
        free[t.free_count: t.free_count + cap - old] = np.arange(cap - 1, old - 1, -1)
        for name, col in self.new.items():
            setattr(t, name, col)
        t.index = self.index
        t.free_slots = free
        t.free_count += cap - old


class StagedGrowth:
    """Jobs run one after another in steps of about :data:`STEP_S` each."""

    def __init__(self, jobs: list[Callable[[], GrowthJob]]) -> None:
        self.jobs = list(jobs)  # callables making each job when its turn comes (it sees what
                                # the jobs before it swapped in: a larger capacity)
        self.job: GrowthJob | None = None
        self.done_units = 0
        self.units_per_step = _FIRST_UNITS

    def step(self, budget_s: float = STEP_S) -> bool:
        """One step of the current job; True once every job is done and swapped in."""
        while self.job is None:
            if not self.jobs:
                return True
            self.job, self.done_units = self.jobs.pop(0)(), 0
        job = self.job
        t0 = perf_counter()
        hi = min(job.units, self.done_units + self.units_per_step)
        phase = next((cut for cut in job.phase_starts if self.done_units < cut <= hi), None)
        hi = hi if phase is None else phase
        job.step(self.done_units, hi)
        took = perf_counter() - t0
        # aim the next step at the budget, moving by at most 2x (one slow step is often noise);
        # a new phase or job costs another amount per unit: start small again
        want = self.units_per_step * budget_s / max(took, 1e-6)
        self.units_per_step = int(max(1024, self.units_per_step // 2, min(2 * self.units_per_step, want)))
        self.done_units = hi
        if phase is not None:
            self.units_per_step = _FIRST_UNITS
        if hi >= job.units:
            job.finish()
            self.job, self.units_per_step = None, _FIRST_UNITS
        return not self.jobs and self.job is None

    def settle(self) -> None:
        """Every remaining step at once."""
        if self.job is not None:
            self.job.step(self.done_units, self.job.units)
            self.job.finish()
            self.job = None
        while self.jobs:
            run_job(self.jobs.pop(0)())
