"""Copying variable-length key bytes between Arrow-style (offsets, data) buffers and the arena."""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def append_keys(arena, arena_used, offsets, data, picks, rows, key_offset, key_length):
    """Append keys ``picks`` of a batch to the arena for object ``rows``; returns the new used size."""
    pos = arena_used
    for i in range(picks.shape[0]):
        k = picks[i]
        s = offsets[k]
        ln = offsets[k + 1] - s
        arena[pos:pos + ln] = data[s:s + ln]
        key_offset[rows[i]] = pos
        key_length[rows[i]] = ln
        pos += ln
    return pos


@njit(cache=True)
def gather_keys(arena, key_offset, key_length, rows):
    """(offsets, data) of the keys of ``rows``, ready to wrap as an Arrow string array."""
    n = rows.shape[0]
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    for i in range(n):
        offsets[i + 1] = offsets[i] + key_length[rows[i]]
    data = np.empty(offsets[n], np.uint8)
    for i in range(n):
        s = key_offset[rows[i]]
        data[offsets[i]:offsets[i + 1]] = arena[s:s + key_length[rows[i]]]
    return offsets, data
