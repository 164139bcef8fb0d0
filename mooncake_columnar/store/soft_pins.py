"""SoftPinTable: the soft-pin deadlines, kept only for the objects that may be soft-pinned.

An object owns a slot here while it is SOFT_PIN_ENABLED or awaits its ENABLE commit
(PENDING_SOFT_PIN), and when it was restored with a deadline; every other object's deadline is
NO_DEADLINE. Objects without a soft pin, the common case, pay nothing (was 8 bytes each).
Kernels read a deadline through :func:`kernels.leases.soft_pin_deadline` with the table's
``parts()``.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..schema import FLAG_PENDING_SOFT_PIN, FLAG_SOFT_PIN_ENABLED, NO_DEADLINE
from .side_table import RowSideTable

SOFT_PIN_FLAGS = np.uint8(FLAG_SOFT_PIN_ENABLED | FLAG_PENDING_SOFT_PIN)  # the objects that hold a slot


class SoftPinTable(RowSideTable):
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {"deadline_ns": (np.dtype(np.int64), int(NO_DEADLINE))}
    deadline_ns: np.ndarray

    def parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index, owner rows, deadlines): what kernels take to read a row's deadline."""
        return self.index, self.row, self.deadline_ns

    def deadlines(self, rows: np.ndarray) -> np.ndarray:
        """The soft-pin deadline of each of ``rows`` (NO_DEADLINE where it holds no slot)."""
        slots = self.slots_of(rows)
        return np.where(slots >= 0, self.deadline_ns[np.maximum(slots, 0)], NO_DEADLINE)

    def add(self, rows: np.ndarray, deadlines: np.ndarray | np.integer | int) -> None:
        """Give ``rows`` (distinct, holding none) slots with ``deadlines``."""
        slots = self.take(np.asarray(rows, np.int64))  # first: taking may grow the table
        self.deadline_ns[slots] = deadlines

    def held(self) -> tuple[np.ndarray, np.ndarray]:
        """(rows, deadlines) of the slots in use (copies)."""
        slots = np.flatnonzero(self.in_use)
        return self.row[slots], self.deadline_ns[slots]


def soft_pin_column(rows: np.ndarray, deadlines: np.ndarray, n: int) -> np.ndarray:
    """The deadline of every row in [0, n) (NO_DEADLINE where none is held), as the dense
    column a snapshot holds."""
    out = np.full(n, NO_DEADLINE, np.int64)
    out[rows] = deadlines
    return out
