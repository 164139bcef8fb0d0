"""Copying variable-length key bytes between Arrow-style (offsets, data) buffers and the arena."""
from __future__ import annotations

import numpy as np

from .hashing import key_ref, ref_length, ref_offset
from .jit import njit
from .predicates import is_live


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


@njit(nogil=True, cache=True)
def compact_rows(arena, key_refs, flags, lo, hi, new_arena, pos, new_refs):
    """Arena compaction of rows ``[lo, hi)``: the key of each LIVE row (the rows the key index
    holds) is copied to ``new_arena`` from ``pos`` on and its new ref written to ``new_refs``;
    other rows keep their ref. Returns the new end of ``new_arena``'s used bytes."""
    for r in range(lo, hi):
        ref = key_refs[r]
        if is_live(flags[r]):
            n = ref_length(ref)
            s = ref_offset(ref)
            new_arena[pos:pos + n] = arena[s:s + n]
            new_refs[r] = key_ref(pos, n)
            pos += n
        else:
            new_refs[r] = ref
    return pos
