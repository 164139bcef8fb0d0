"""One process-wide count of array replacements in the store's array holders.

A reader that keeps the store's arrays between calls (store/read_columns.py) must notice when
any of them was replaced (growth, compaction, a copy). Comparing each array it holds with the
store's costs an attribute load per array on every read; with this, the holders (the object
table, the key index, the segment table) count every assignment of a NumPy array to one of
their attributes, so one integer comparison says whether anything may have changed, and still
no path that replaces an array has to remember to say so.
"""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

_COUNTER = itertools.count(1)


class ArrayEpoch:
    """Mixin: every ``holder.attr = <ndarray>`` (any holder, any master in the process) sets
    :attr:`replaced` to a value never used before. Unique values, not ``+= 1``: two masters'
    threads bumping at once could otherwise write back a value a reader already saw."""

    replaced = 0

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if isinstance(value, np.ndarray):
            ArrayEpoch.replaced = next(_COUNTER)  # after the array is in place (see read_columns)
