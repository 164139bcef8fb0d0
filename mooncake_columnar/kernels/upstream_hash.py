"""Upstream's string hash (libstdc++ ``std::hash<std::string>``: MurmurHash64A, seed 0xc70f6907)
over a whole Arrow string column, so v1 shard routing is checked without a Python loop per key."""
from __future__ import annotations

import numpy as np
from .jit import njit

from .hashing import load_word

_MUL = np.uint64(0xC6A4A7935BD1E995)
_SEED = np.uint64(0xC70F6907)
_R = np.uint64(47)  # uint64 shift count: an int64 one would promote the word to float64


@njit(cache=True, nogil=True)
def murmur64a(data, offsets):
    """Hash of each string data[offsets[j]:offsets[j+1]] (uint64), as upstream's _Hash_bytes."""
    n = offsets.shape[0] - 1
    out = np.empty(n, np.uint64)
    for j in range(n):
        start, end = offsets[j], offsets[j + 1]
        h = _SEED ^ (np.uint64(end - start) * _MUL)
        i = start
        while i + 8 <= end:
            k = load_word(data, i, 8) * _MUL
            h = (h ^ ((k ^ (k >> _R)) * _MUL)) * _MUL
            i += 8
        if i < end:
            h = (h ^ load_word(data, i, end - i)) * _MUL
        h = (h ^ (h >> _R)) * _MUL
        out[j] = h ^ (h >> _R)
    return out
