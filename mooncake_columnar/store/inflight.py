"""InflightTable: state that only in-progress puts need, kept out of the hot object columns.

An object row owns a slot here from put_start until its replicas are complete (exactly while
it is PROCESSING); the slot holds the put start time (system-clock ms, RFC non-goal 7) and the
pending soft-pin TTL of an ENABLE request, and the row that owns it. A row finds its slot
through a small open-addressing index (kernels/slot_index.py) instead of a column: every object
paid 4 bytes for what only puts in flight use.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np

from ..kernels import slot_index as sk
from .growth import GrowthJob, InflightGrowth, run_job

_SHRINK_ABOVE = 4096  # slots kept when no put is in flight
_NONE_IN_FLIGHT = 2**63 - 1


class InflightTable:
    def __init__(self, capacity: int = 64) -> None:
        self._reset(capacity)

    def _reset(self, capacity: int) -> None:
        self.put_start_time_ms = np.zeros(capacity, np.int64)
        self.pending_soft_pin_ttl_ns = np.zeros(capacity, np.int64)
        self.in_use = np.zeros(capacity, np.bool_)
        self.row = np.full(capacity, -1, np.int64)   # owner row of an in-use slot
        self.index = np.full(sk.index_size(capacity), -1, np.int32)  # row -> slot (kernels/slot_index.py)
        self.free_slots = np.arange(capacity - 1, -1, -1, dtype=np.int64)  # stack, top at the end
        self.free_count = capacity
        # a lower bound of the in-flight puts' start times: put_start asks "is any put older than
        # the discard timeout?" on every call, and answering from the bound spares a scan of the table
        self.oldest_bound_ms = _NONE_IN_FLIGHT

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
        self.in_use[slots] = False
        self.row[slots] = -1
        self.free_slots[self.free_count: self.free_count + slots.size] = slots
        self.free_count += slots.size
        if self.free_count == self.capacity > _SHRINK_ABOVE:  # a big batch is done: give its slots back
            self._reset(64)

    def slots_of(self, rows: np.ndarray) -> np.ndarray:
        """The slot each of ``rows`` owns, -1 where none (int64)."""
        rows = np.asarray(rows, np.int64)
        out = np.empty(rows.size, np.int64)
        sk.find_slots(self.index, self.row, rows, out)
        return out

    def owned_rows(self, slots: np.ndarray) -> np.ndarray:
        """Owner rows of the in-use ones of ``slots``."""
        return self.row[slots[self.in_use[slots]]]

    def started(self, slots: np.ndarray, start_ms: np.ndarray | int) -> None:
        """Record the (system-clock) start of the puts holding ``slots``."""
        self.put_start_time_ms[slots] = start_ms
        if slots.size:
            self.oldest_bound_ms = min(self.oldest_bound_ms, int(np.min(start_ms)))

    def any_started_before(self, cutoff_ms: int) -> bool:
        """Whether some in-flight put started before ``cutoff_ms``; scans the table only when the
        lower bound says it might, and then tightens the bound to the exact oldest start."""
        if self.oldest_bound_ms >= cutoff_ms:
            return False
        in_flight = self.put_start_time_ms[self.in_use]
        self.oldest_bound_ms = int(in_flight.min()) if in_flight.size else _NONE_IN_FLIGHT
        return self.oldest_bound_ms < cutoff_ms

    def resident_bytes(self) -> int:
        return (self.put_start_time_ms.nbytes + self.pending_soft_pin_ttl_ns.nbytes + self.in_use.nbytes
                + self.row.nbytes + self.free_slots.nbytes + self.index.nbytes)

    def growth_jobs(self, extra: int) -> list[Callable[[], GrowthJob]]:
        """What ``take`` of ``extra`` more slots would grow, as jobs to run in steps (store/growth.py)."""
        if extra <= self.free_count:
            return []
        return [partial(InflightGrowth, self, max(2 * self.capacity, self.capacity + extra - self.free_count))]

    def _grow(self, extra: int) -> None:
        run_job(InflightGrowth(self, max(2 * self.capacity, self.capacity + extra)))
