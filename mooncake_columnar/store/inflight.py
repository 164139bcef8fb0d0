"""InflightTable: state that only in-progress puts need, kept out of the hot object columns.

An object row points at a slot here (``inflight`` column) from put_start until its replicas
are complete; the slot holds the put start time (system-clock ms, RFC non-goal 7) and the
pending soft-pin TTL of an ENABLE request, and the row that owns it: a slot is found from its row
and its row from the slot, and the two must agree (``owned_rows``) before background work acts on
a slot, so a recycled slot never reaches a row that already let go of it.
"""
from __future__ import annotations

import numpy as np

_SHRINK_ABOVE = 4096  # slots kept when no put is in flight


class InflightTable:
    def __init__(self, capacity: int = 64) -> None:
        self._reset(capacity)

    def _reset(self, capacity: int) -> None:
        self.put_start_time_ms = np.zeros(capacity, np.int64)
        self.pending_soft_pin_ttl_ns = np.zeros(capacity, np.int64)
        self.in_use = np.zeros(capacity, np.bool_)
        self.row = np.full(capacity, -1, np.int64)   # owner row of an in-use slot
        self.free_slots = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # stack, top at the end
        self.free_count = capacity

    @property
    def capacity(self) -> int:
        return self.put_start_time_ms.size

    def take(self, rows: np.ndarray) -> np.ndarray:
        """One slot for each of ``rows`` (their owners)."""
        n = int(rows.size)
        if n > self.free_count:
            self._grow(n - self.free_count)
        slots = self.free_slots[self.free_count - n: self.free_count][::-1].copy()
        self.free_count -= n
        self.in_use[slots] = True
        self.row[slots] = rows
        return slots

    def release(self, slots: np.ndarray) -> None:
        """Free slots (negative entries are ignored; a slot not in use is never freed twice)."""
        slots = np.asarray(slots, np.int64)
        slots = slots[slots >= 0]
        slots = slots[self.in_use[slots]]
        if slots.size > 1:
            slots = np.unique(slots)
        self.in_use[slots] = False
        self.row[slots] = -1
        self.free_slots[self.free_count: self.free_count + slots.size] = slots
        self.free_count += slots.size
        if self.free_count == self.capacity > _SHRINK_ABOVE:  # a big batch is done: give its slots back
            self._reset(64)

    def owned_rows(self, slots: np.ndarray, row_slot: np.ndarray) -> np.ndarray:
        """Owner rows of in-use ``slots`` whose row still points back at the slot
        (``row_slot``: the object table's inflight column)."""
        slots = slots[self.in_use[slots]]
        rows = self.row[slots]
        return rows[row_slot[rows] == slots]

    def oldest_put_start_ms(self) -> int | None:
        """Earliest put start among in-flight puts (None when there are none)."""
        if self.free_count == self.capacity:
            return None
        return int(self.put_start_time_ms[self.in_use].min())

    def resident_bytes(self) -> int:
        return (self.put_start_time_ms.nbytes + self.pending_soft_pin_ttl_ns.nbytes + self.in_use.nbytes
                + self.row.nbytes + self.free_slots.nbytes)

    def _grow(self, extra: int) -> None:
        old = self.capacity
        cap = max(2 * old, old + extra)
        for name, fill in (("put_start_time_ms", 0), ("pending_soft_pin_ttl_ns", 0), ("in_use", False),
                           ("row", -1)):
            grown = np.full(cap, fill, getattr(self, name).dtype)
            grown[:old] = getattr(self, name)
            setattr(self, name, grown)
        free = np.empty(cap, np.int64)
        free[: self.free_count] = self.free_slots[: self.free_count]
        new_slots = np.arange(cap - 1, old - 1, -1, dtype=np.int64)
        free[self.free_count: self.free_count + new_slots.size] = new_slots
        self.free_slots = free
        self.free_count += new_slots.size
