"""Side tables of rare per-object values (store/side_table.py), so that the objects without
one pay nothing for it.

SoftPinTable: the soft-pin deadline (was an 8-byte column). An object holds one while it is
SOFT_PIN_ENABLED or awaits its ENABLE commit (PENDING_SOFT_PIN), and when it was restored with a
deadline; every other object's deadline is NO_DEADLINE. Kernels read it through
``predicates.soft_pin_active`` with the table's ``parts()``.

GroupTable: the group code of a grouped object (was a 4-byte column); -1 for the others. Its
``next`` column links the members of each group into a circular list (was the 4-byte
``group_next`` column): kernels walk a group through ``slot_index.slot_value(links(), row, ...)``.

ContinuationOwnerTable: the object row a continuation row (kernels/chains.py) belongs to.
"""
from __future__ import annotations

from typing import ClassVar

import numpy as np

from ..schema import EMPTY_CODE, FLAG_PENDING_SOFT_PIN, FLAG_SOFT_PIN_ENABLED, NO_DEADLINE
from .side_table import RowValueTable

SOFT_PIN_FLAGS = np.uint8(FLAG_SOFT_PIN_ENABLED | FLAG_PENDING_SOFT_PIN)  # the objects that hold a slot


class SoftPinTable(RowValueTable):
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {"value": (np.dtype(np.int64), int(NO_DEADLINE))}


class GroupTable(RowValueTable):
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {"value": (np.dtype(np.int32), EMPTY_CODE),
                                                         "next": (np.dtype(np.int32), -1)}
    next: np.ndarray  # per slot: the next member row of its row's group (itself when alone)

    def links(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index, owner rows, next member rows): what kernels take to walk a group."""
        return self.index, self.row, self.next


class ContinuationOwnerTable(RowValueTable):
    VALUES: ClassVar[dict[str, tuple[np.dtype, int]]] = {"value": (np.dtype(np.int32), -1)}
