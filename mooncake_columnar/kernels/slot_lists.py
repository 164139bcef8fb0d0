"""Lists of replica slots and objects taken from per-slot masks, in parallel passes: what an
eviction plan's apply needs from its (chain row, slot) matrices. NumPy's ``np.nonzero`` of such
a matrix and the gather of its rows are three serial passes and three arrays (at 100M objects,
a 5% eviction: 0.03-0.12 s of a cycle in which every other pass is parallel).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .dispatch import BATCH_MIN
from .jit import njit

_CHUNKS = 64


def _chunks(n: int) -> int:
    """Parallel chunks for ``n`` entries. Only an eviction's apply calls these kernels, a batch
    operation whose other passes are parallel too, so a few entries take one chunk of the same
    kernels rather than serial variants that would compile as well."""
    return 1 if n < BATCH_MIN else _CHUNKS


@njit(cache=True, nogil=True, parallel=True)
def _count_set(mask, chunks):
    """Set entries of ``mask`` per chunk of its rows."""
    n = mask.shape[0]
    per = (n + chunks - 1) // chunks
    count = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        k = 0
        for i in range(c * per, min(n, (c + 1) * per)):
            for j in range(mask.shape[1]):
                k += mask[i, j]
        count[c] = k
    return count


@njit(cache=True, nogil=True, parallel=True)
def _fill_set(rows, mask, chunks, first, out_rows, out_slots):
    """Each chunk writes (rows[i], j) for its set mask[i, j] from position first[c] on."""
    n = mask.shape[0]
    per = (n + chunks - 1) // chunks
    for c in prange(chunks):
        k = first[c]
        for i in range(c * per, min(n, (c + 1) * per)):
            for j in range(mask.shape[1]):
                if mask[i, j]:
                    out_rows[k] = rows[i]
                    out_slots[k] = j
                    k += 1


def set_slots(rows: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows[i], j) for every set ``mask[i, j]`` (``mask``: bool, one row per entry of ``rows``),
    in (i, j) order: ``r, j = np.nonzero(mask); rows[r], j``. The outputs are NumPy's arrays (huge
    pages where the system gives them), each written once."""
    chunks = _chunks(mask.shape[0])
    count = _count_set(mask, chunks)
    first = np.zeros(chunks, np.int64)
    np.cumsum(count[:-1], out=first[1:])
    total = int(count.sum())
    out_rows, out_slots = np.empty(total, np.int64), np.empty(total, np.int64)
    _fill_set(np.ascontiguousarray(rows, np.int64), mask, chunks, first, out_rows, out_slots)
    return out_rows, out_slots


@njit(inline="always", cache=True)
def _holds_none(i, k, owner, chain_rows, status, empty):
    """Whether object i's chain rows, entries k.. while ``owner`` is i, hold no replica slot in
    use; and the entry after them."""
    none = True
    while k < owner.shape[0] and owner[k] == i:
        for j in range(status.shape[1]):
            none &= status[chain_rows[k], j] == empty
        k += 1
    return none, k


@njit(cache=True, nogil=True, parallel=True)
def _count_emptied(n, owner, chain_rows, status, empty, chunks):
    per = (n + chunks - 1) // chunks
    count = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        k = np.searchsorted(owner, c * per)
        found = 0
        for i in range(c * per, min(n, (c + 1) * per)):
            none, k = _holds_none(i, k, owner, chain_rows, status, empty)
            found += none
        count[c] = found
    return count


@njit(cache=True, nogil=True, parallel=True)
def _fill_emptied(rows, owner, chain_rows, status, empty, chunks, first, out):
    n = rows.shape[0]
    per = (n + chunks - 1) // chunks
    for c in prange(chunks):
        k = np.searchsorted(owner, c * per)
        at = first[c]
        for i in range(c * per, min(n, (c + 1) * per)):
            none, k = _holds_none(i, k, owner, chain_rows, status, empty)
            if none:
                out[at] = rows[i]
                at += 1


def emptied_objects(rows: np.ndarray, owner: np.ndarray, chain_rows: np.ndarray, status: np.ndarray,
                    empty: int) -> np.ndarray:
    """The objects ``rows`` whose chain rows (``chain_rows``, grouped by object in order:
    ``owner``, see ObjectTable.chains) hold no replica slot whose ``status`` is other than
    ``empty``, in order: ``rows[~chains.any(status[chain_rows] != empty)]`` in two parallel
    passes."""
    chunks = _chunks(rows.size)
    owner = np.ascontiguousarray(owner, np.int64)
    count = _count_emptied(rows.size, owner, chain_rows, status, status.dtype.type(empty), chunks)
    first = np.zeros(chunks, np.int64)
    np.cumsum(count[:-1], out=first[1:])
    out = np.empty(int(count.sum()), np.int64)
    _fill_emptied(np.ascontiguousarray(rows, np.int64), owner, chain_rows, status, status.dtype.type(empty), chunks,
                  first, out)
    return out
