"""Offload-on-evict queue: eviction pins a memory replica (refcnt) as the source of a copy to the
owner's local disk instead of dropping it; completion adds the LOCAL_DISK replica.

Tasks are columns (object row, the source slot's row and slot, replica id, start time; the
slot's row is the object's row or a continuation row of it); the queue is bounded by
``offloading_queue_limit`` and each eviction cycle queues at most ``cap_ratio`` of that.
"""
from __future__ import annotations

import numpy as np

OFFLOAD_CAP_RATIO = 0.5  # upstream offload_cap_ratio default


class OffloadQueue:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rows = np.zeros(0, np.int64)
        self.slot_rows = np.zeros(0, np.int64)
        self.slots = np.zeros(0, np.int64)
        self.replica_ids = np.zeros(0, np.uint64)
        self.start_ms = np.zeros(0, np.int64)

    def __len__(self) -> int:
        return int(self.rows.size)

    @property
    def cycle_cap(self) -> int:
        return int(self.limit * OFFLOAD_CAP_RATIO)

    def push(self, rows: np.ndarray, slot_rows: np.ndarray, slots: np.ndarray, replica_ids: np.ndarray,
             now_ms: int) -> None:
        self.rows = np.concatenate((self.rows, rows))
        self.slot_rows = np.concatenate((self.slot_rows, slot_rows))
        self.slots = np.concatenate((self.slots, slots))
        self.replica_ids = np.concatenate((self.replica_ids, replica_ids))
        self.start_ms = np.concatenate((self.start_ms, np.full(rows.size, now_ms, np.int64)))

    def keep(self, mask: np.ndarray) -> None:
        self.rows, self.slot_rows, self.slots = self.rows[mask], self.slot_rows[mask], self.slots[mask]
        self.replica_ids, self.start_ms = self.replica_ids[mask], self.start_ms[mask]

    def position_of(self, row: int) -> int:
        hit = np.flatnonzero(self.rows == row)
        return int(hit[0]) if hit.size else -1
