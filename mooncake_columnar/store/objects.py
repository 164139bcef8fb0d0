"""ObjectTable: one row per object (structure of arrays) plus fixed replica slots per row.

Rows are allocated from a free-row stack (recycled) or by extending the high-water mark; columns
grow by doubling. Replica slot columns have shape (capacity, R); R grows when an object needs
more replicas than any before it.
"""
from __future__ import annotations

import numpy as np

from ..schema import (EMPTY_CODE, FLAG_LIVE, NEVER_LEASED, NO_DEADLINE, OBJECT_COLUMNS,
                      REPLICA_COLUMNS)

_OBJECT_FILL = {
    "lease_deadline_ns": NEVER_LEASED,
    "soft_pin_deadline_ns": NO_DEADLINE,
    "group": EMPTY_CODE,
    "client": EMPTY_CODE,
    "tenant": EMPTY_CODE,
    "inflight": EMPTY_CODE,
}
_REPLICA_FILL = {"replica_segment": EMPTY_CODE}


class ObjectTable:
    def __init__(self, capacity: int = 1024, replica_slots: int = 1) -> None:
        capacity = max(16, int(capacity))
        self.capacity = capacity
        self.slots = max(1, int(replica_slots))
        for name, dt in OBJECT_COLUMNS.items():
            setattr(self, name, np.zeros(capacity, dt))
        for name, dt in REPLICA_COLUMNS.items():
            setattr(self, name, np.zeros((capacity, self.slots), dt))
        self.high_water = 0                      # rows [0, high_water) have ever been used
        self.free_rows = np.empty(0, np.int64)   # stack of recycled rows
        self.free_count = 0
        self.live_count = 0

    # ---- growth ------------------------------------------------------------------------------
    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more rows without reallocating inside a kernel."""
        need = self.high_water + max(0, extra - self.free_count)
        if need <= self.capacity:
            return
        cap = self.capacity
        while cap < need:
            cap *= 2
        for name, dt in OBJECT_COLUMNS.items():
            old = getattr(self, name)
            new = np.empty(cap, dt)  # untouched pages stay non-resident until rows are used
            new[: self.high_water] = old[: self.high_water]
            setattr(self, name, new)
        for name, dt in REPLICA_COLUMNS.items():
            old = getattr(self, name)
            new = np.empty((cap, self.slots), dt)
            new[: self.high_water] = old[: self.high_water]
            setattr(self, name, new)
        self.capacity = cap

    def ensure_slots(self, slots: int) -> None:
        if slots <= self.slots:
            return
        for name, dt in REPLICA_COLUMNS.items():
            old = getattr(self, name)
            new = np.zeros((self.capacity, slots), dt)
            new[:, : self.slots] = old
            if name in _REPLICA_FILL:
                new[:, self.slots:] = _REPLICA_FILL[name]
            setattr(self, name, new)
        self.slots = slots

    # ---- rows --------------------------------------------------------------------------------
    def take_rows(self, n: int) -> np.ndarray:
        """Allocate ``n`` rows (recycled first), initialised to an empty object."""
        self.reserve(n)
        from_free = min(n, self.free_count)
        rows = np.empty(n, np.int64)
        if from_free:
            rows[:from_free] = self.free_rows[self.free_count - from_free: self.free_count][::-1]
            self.free_count -= from_free
        fresh = n - from_free
        rows[from_free:] = np.arange(self.high_water, self.high_water + fresh)
        self.high_water += fresh
        self.clear_rows(rows)
        self.live_count += n
        return rows

    def clear_rows(self, rows: np.ndarray) -> None:
        for name in OBJECT_COLUMNS:
            getattr(self, name)[rows] = _OBJECT_FILL.get(name, 0)
        for name in REPLICA_COLUMNS:
            getattr(self, name)[rows] = _REPLICA_FILL.get(name, 0)
        self.group_next[rows] = rows

    def release_rows(self, rows: np.ndarray) -> None:
        """Return rows to the free stack; the caller already unlinked keys and replicas."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        self.flags[rows] = 0
        self.inflight[rows] = EMPTY_CODE  # a free row holds no in-flight slot (the caller freed it)
        need = self.free_count + rows.size
        if need > self.free_rows.size:
            grown = np.empty(max(need, 2 * self.free_rows.size, 64), np.int64)
            grown[: self.free_count] = self.free_rows[: self.free_count]
            self.free_rows = grown
        self.free_rows[self.free_count: need] = rows
        self.free_count = need
        self.live_count -= rows.size

    def live_rows(self) -> np.ndarray:
        hw = self.high_water
        return np.flatnonzero(self.flags[:hw] & FLAG_LIVE).astype(np.int64)

    def resident_bytes(self) -> int:
        """Bytes of every column for the rows in use (what the process actually touches)."""
        per_row = sum(dt.itemsize for dt in OBJECT_COLUMNS.values())
        per_row += self.slots * sum(dt.itemsize for dt in REPLICA_COLUMNS.values())
        return per_row * self.high_water + self.free_rows.nbytes
