"""Scratch: large per-call buffers kept from one call to the next.

A fresh array above glibc's mmap threshold (32 MB at most) is new memory from the system at
every call, and its first writes fault its pages in: the eviction census's codes at 100M rows
(100 MB) took the census from 0.17 s into a kept buffer to 0.22-0.26 s. A buffer here stays
between calls, so only the first call pays. The caller owns what it gets until its next request
of the same name: only for results used up within one call, never for anything that outlives
it (an eviction plan that a journal keeps, a returned array). The bytes it keeps are
:attr:`Scratch.nbytes`: once an eviction ran, 1 per object row for the census codes (resident
only once a cycle needed every row's code: a listing census writes none) and 12 per entry of the
census listing's rooms (:func:`..kernels.eviction.listing_entries`: about twice the
share of rows a cycle lists, so 1.6 bytes per row at 100M rows and 5% evicted; every row of a
master under 64K rows).
"""
from __future__ import annotations

import numpy as np


class Scratch:
    def __init__(self) -> None:
        self._kept: dict[str, np.ndarray] = {}

    def array(self, name: str, n: int, dtype: type | np.dtype) -> np.ndarray:
        """``n`` entries of buffer ``name`` (contents left from its last use), made anew with an
        eighth to spare when it is missing, too short or of another dtype."""
        kept = self._kept.get(name)
        if kept is None or kept.shape[0] < n or kept.dtype != np.dtype(dtype):
            kept = np.empty(n + n // 8, dtype)
            self._kept[name] = kept
        return kept[:n]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._kept.values())
