"""RowSideTable: fields only a few objects need, kept off the hot object columns.

A row owns at most one slot; a slot holds the table's value columns and its owner row, and a row
finds its slot through a small open-addressing index (kernels/slot_index.py), so the objects
that have none pay nothing. Kernels read a row's value with ``slot_index.find_slot(index, row,
owner)`` and index the value column with it. Used by in-flight puts (store/inflight.py); soft
pins and group membership hold one value each (:class:`RowValueTable`, store/rare_fields.py).
"""
from __future__ import annotations

from functools import partial
from typing import Callable, ClassVar

import numpy as np

from ..kernels import slot_index as sk
from .growth import GrowthJob, SideTableGrowth, run_job

_SHRINK_ABOVE = 4096  # slots kept when no row holds one


class RowSideTable:
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {}  # value column -> (dtype, value of a free slot)
    in_use: np.ndarray
    row: np.ndarray
    index: np.ndarray

    def __init__(self, capacity: int = 64) -> None:
        self._reset(capacity)

    def _reset(self, capacity: int) -> None:
        for name, (dt, fill) in self.VALUES.items():
            setattr(self, name, np.full(capacity, fill, dt))
        self.in_use = np.zeros(capacity, np.bool_)
        self.row = np.full(capacity, -1, np.int64)   # owner row of an in-use slot
        self.index = np.full(sk.index_size(capacity), -1, np.int32)  # row -> slot
        self.free_slots = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # stack, top at the end
        self.free_count = capacity

    @property
    def capacity(self) -> int:
        return self.in_use.size

    @property
    def empty(self) -> bool:
        """No row holds a slot."""
        return self.free_count == self.capacity

    def fills(self) -> dict[str, object]:
        """Every per-slot column and the value a free slot holds in it."""
        return {**{name: fill for name, (_, fill) in self.VALUES.items()}, "in_use": False, "row": -1}

    def take(self, rows: np.ndarray) -> np.ndarray:
        """One slot for each of ``rows`` (distinct rows that hold none), values at their fill."""
        n = int(rows.size)
        if n > self.free_count:
            self._grow(n - self.free_count)
        slots = self.free_slots[self.free_count - n: self.free_count][::-1].copy()
        self.free_count -= n
        self.in_use[slots] = True
        self.row[slots] = rows
        sk.insert_slots(self.index, self.row, slots)
        return slots

    def release(self, slots: np.ndarray) -> None:
        """Free slots (negative entries are ignored; a slot not in use is never freed twice)."""
        slots = np.asarray(slots, np.int64)
        slots = slots[slots >= 0]
        slots = slots[self.in_use[slots]]
        if slots.size > 1:
            slots = np.unique(slots)
        sk.remove_slots(self.index, self.row, slots)
        for name, (_, fill) in self.VALUES.items():
            getattr(self, name)[slots] = fill
        self.in_use[slots] = False
        self.row[slots] = -1
        self.free_slots[self.free_count: self.free_count + slots.size] = slots
        self.free_count += slots.size
        if self.free_count == self.capacity > _SHRINK_ABOVE:  # a big batch is done: give its slots back
            self._reset(64)

    def release_rows(self, rows: np.ndarray) -> None:
        """Free the slots ``rows`` hold (nothing to look up while no row holds one: the common
        case of the soft-pin and group tables)."""
        if not self.empty:
            self.release(self.slots_of(rows))

    def slots_of(self, rows: np.ndarray) -> np.ndarray:
        """The slot each of ``rows`` owns, -1 where none (int64)."""
        rows = np.asarray(rows, np.int64)
        out = np.empty(rows.size, np.int64)
        sk.find_slots(self.index, self.row, rows, out)
        return out

    def owned_rows(self, slots: np.ndarray) -> np.ndarray:
        """Owner rows of the in-use ones of ``slots``."""
        return self.row[slots[self.in_use[slots]]]

    def resident_bytes(self) -> int:
        return sum(getattr(self, name).nbytes for name in self.fills()) + self.free_slots.nbytes + self.index.nbytes

    def growth_jobs(self, extra: int) -> list[Callable[[], GrowthJob]]:
        """What ``take`` of ``extra`` more slots would grow, as jobs to run in steps (store/growth.py)."""
        if extra <= self.free_count:
            return []
        return [partial(SideTableGrowth, self, max(2 * self.capacity, self.capacity + extra - self.free_count))]

    def _grow(self, extra: int) -> None:
        run_job(SideTableGrowth(self, max(2 * self.capacity, self.capacity + extra)))


class RowValueTable(RowSideTable):
    """A side table of one value per row (``VALUES`` names it ``value``): rows without a slot
    read its fill."""

    value: np.ndarray

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index, owner rows, values): what kernels take to read a row's value
        (``slot_index.slot_value``)."""
        return self.index, self.row, self.value

    def get(self, rows: np.ndarray) -> np.ndarray:
        """The value of each of ``rows`` (the fill where it holds no slot)."""
        slots = self.slots_of(rows)
        return np.where(slots >= 0, self.value[np.maximum(slots, 0)], self.VALUES["value"][1])

    def add(self, rows: np.ndarray, values: np.ndarray | np.integer | int) -> None:
        """Give ``rows`` (distinct, holding none) slots with ``values``."""
        slots = self.take(np.asarray(rows, np.int64))  # first: taking may grow the table
        self.value[slots] = values

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, values) of the slots in use (copies)."""
        slots = np.flatnonzero(self.in_use)
        return self.row[slots], self.value[slots]

    @classmethod
    def dense(cls, rows: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
        """The value of every row in [0, n) from :meth:`held`'s (rows, values), the fill
        elsewhere: the column a snapshot or a check reads."""
        dt, fill = cls.VALUES["value"]
        out = np.full(n, fill, dt)
        out[rows] = values
        return out
