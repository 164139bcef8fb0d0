"""InflightTable: state that only in-progress puts need, kept out of the hot object columns.

An object row owns a slot here from put_start until its replicas are complete (exactly while
it is PROCESSING); the slot holds the put start time (system-clock ms, RFC non-goal 7) and the
pending soft-pin TTL of an ENABLE request, and the row that owns it. A row finds its slot
through a small open-addressing index (kernels/slot_index.py) instead of a column: every object
paid 4 bytes for what only puts in flight use (store/side_table.py).
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from .side_table import RowSideTable

_NONE_IN_FLIGHT = 2**63 - 1


class InflightTable(RowSideTable):
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {
        "put_start_time_ms": (np.dtype(np.int64), 0), "pending_soft_pin_ttl_ns": (np.dtype(np.int64), 0)}
    put_start_time_ms: np.ndarray
    pending_soft_pin_ttl_ns: np.ndarray

    def _reset(self, capacity: int) -> None:
        super()._reset(capacity)
        # a lower bound of the in-flight puts' start times: put_start asks "is any put older than
        # the discard timeout?" on every call, and answering from the bound spares a scan of the table
        self.oldest_bound_ms = _NONE_IN_FLIGHT

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
