"""Copying variable-length key bytes between Arrow-style (offsets, data) buffers and the arena."""
from __future__ import annotations

import numpy as np
from numba import njit

from .hashing import key_ref, ref_length, ref_offset


@njit(cache=True)
def gather_keys(arena, key_refs, rows):
    """(offsets, data) of the keys of ``rows``, ready to wrap as an Arrow string array."""
    n = rows.shape[0]
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + ref_length(key_refs[rows[i]])
    data = np.empty(offsets[n], np.uint8)
    for i in range(n):
        s = ref_offset(key_refs[rows[i]])
        data[offsets[i]:offsets[i + 1]] = arena[s:s + offsets[i + 1] - offsets[i]]
    return offsets, data


@njit(cache=True)
def rebase_refs(key_refs, rows, new_offsets):
    """Point ``rows`` at their keys' new arena offsets after compaction."""
    for i in range(rows.shape[0]):
        r = rows[i]
        key_refs[r] = key_ref(new_offsets[i], ref_length(key_refs[r]))
