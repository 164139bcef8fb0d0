"""The guard of the one erase primitive: the rows about to be erased are distinct live objects.

A row index is only a handle: rows are recycled, so a handle kept across a free (an in-flight
slot, a queued durable-callback) can name a row that is free or already someone else. Erasing
such a row twice puts it on the free stack twice and loses whatever object takes it next.
"""
from __future__ import annotations

import numpy as np

from ..schema import FLAG_ERASE_MARK
from .dispatch import BATCH_MIN, variant
from .jit import njit
from .predicates import is_erase_marked, is_live

_MARK = np.uint8(FLAG_ERASE_MARK)


@njit(cache=True, nogil=True)
def _first_not_erasable(rows, flags):
    """Index of the first entry of ``rows`` that is out of range, not live, or repeated; -1 when
    all are distinct live rows. Two passes with a scratch flag bit, so no sort and no temporary."""
    bad = -1
    n = rows.shape[0]
    marked = n
    for i in range(n):
        r = rows[i]
        if r < 0 or r >= flags.shape[0]:
            bad = i
        elif not is_live(flags[r]):
            bad = i
        elif is_erase_marked(flags[r]):
            bad = i
        if bad >= 0:
            marked = i
            break
        flags[r] |= _MARK
    for i in range(marked):
        flags[rows[i]] &= ~_MARK
    return bad


_first_not_erasable_small = variant(_first_not_erasable, "_small", nogil=False)


def first_not_erasable(rows, flags):
    """See :func:`_first_not_erasable`; a few rows (one remove) keep the GIL (:mod:`.dispatch`)."""
    return (_first_not_erasable_small if rows.shape[0] < BATCH_MIN else _first_not_erasable)(rows, flags)
