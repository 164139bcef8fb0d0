"""The lists an eviction cycle takes, each in two parallel passes (count per chunk, then each
chunk fills its share): the rows before the k-th deadline (the plan) and the objects a plan
empties (the apply, from its (chain row, slot) matrix). Serially, or in NumPy, they were
0.05-0.17 s of a 5% cycle at 100M objects in which every other pass is parallel. (The slots a
plan removes need no list: the slot clear takes the matrix, :func:`.objects.clear_slots`.)
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .dispatch import BATCH_MIN
from .jit import njit

_CHUNKS = 64


def _chunks(n: int) -> int:
    """Parallel chunks for ``n`` entries. Only an eviction calls these kernels (its plan and its
    apply), a batch operation whose other passes are parallel too, so a few entries take one
    chunk of the same kernels rather than serial variants that would compile as well."""
    return 1 if n < BATCH_MIN else _CHUNKS


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each chunk writes its share: the counts of the chunks before it."""
    first = np.zeros(counts.size, np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    return first


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
    first = _starts(count)
    out = np.empty(int(count.sum()), np.int64)
    _fill_emptied(np.ascontiguousarray(rows, np.int64), owner, chain_rows, status, status.dtype.type(empty), chunks,
                  first, out)
    return out


@njit(cache=True, nogil=True, parallel=True)
def _count_before(keys, kth, chunks):
    """Per chunk of ``keys``: how many are before ``kth`` and how many equal it."""
    n = keys.shape[0]
    per = (n + chunks - 1) // chunks
    below = np.zeros(chunks, np.int64)
    at = np.zeros(chunks, np.int64)
    for c in prange(chunks):
        b = e = 0
        for i in range(c * per, min(n, (c + 1) * per)):
            b += keys[i] < kth
            e += keys[i] == kth
        below[c], at[c] = b, e
    return below, at


@njit(cache=True, nogil=True, parallel=True)
def _fill_before(rows, keys, kth, first, ties, total):
    """Each chunk (as :func:`_count_before`'s) writes its rows before ``kth`` and its first
    ties[c] rows at it, from first[c] on, into a fresh int64 array of ``total``."""
    out = np.empty(total, np.int64)
    n = keys.shape[0]
    chunks = first.shape[0]
    per = (n + chunks - 1) // chunks
    for c in prange(chunks):
        k = first[c]
        left = ties[c]
        for i in range(c * per, min(n, (c + 1) * per)):
            d = keys[i]
            if d < kth or (d == kth and left > 0):
                left -= d == kth
                out[k] = rows[i]
                k += 1
    return out


def rows_before(rows: np.ndarray, keys: np.ndarray, kth: int, ties: int) -> np.ndarray:
    """The rows whose deadline (``keys``, aligned with ``rows``) is before the k-th one, ``kth``,
    and the first ``ties`` rows (in input order) at it, as int64: two parallel passes (count,
    then fill each chunk's share; serially this was 0.014-0.05 s of a 100M cycle)."""
    chunks = _chunks(keys.shape[0])
    below, at = _count_before(keys, kth, chunks)
    taken = np.minimum(at, np.maximum(0, ties - (np.cumsum(at) - at)))  # the first ties, chunk by chunk
    share = below + taken
    first = _starts(share)
    return _fill_before(rows, keys, kth, first, taken, int(share.sum()))
