"""Replica chains: the rows that hold one object's replica slots.

An object's first slots live in its own row (the hot ``(rows, R)`` replica columns). An object
with more replicas than R (rare: up to ``max_replica_num``) keeps the rest in continuation rows
of the same table, linked by ``ObjectTable.replica_more``: its own bytes, instead of widening
every row. ``more`` is empty until the first continuation row exists, so the common case costs
one length test per object. Continuation rows are not LIVE; each carries its object's size (so
per-slot code reads ``sizes[row]`` for any row); ``ObjectTable.continuation_owner`` names its object.

Kernels walk an object's slots as::

    rr = r
    while rr >= 0:
        for j in range(status.shape[1]):
            ... status[rr, j] ...
        rr = next_row(more, rr)
"""
from __future__ import annotations

import numpy as np

from .jit import njit


@njit(inline="always", cache=True)
def next_row(more, r):
    """The next row of ``r``'s chain, -1 at its end (``more`` is empty while no chain exists)."""
    if r < more.shape[0]:
        return np.int64(more[r])
    return np.int64(-1)


@njit(cache=True, nogil=True)
def expand(rows, more):
    """(owner, chain_rows): every row holding slots of the objects ``rows``, object by object
    in chain order (the order the chain-walking kernels use); owner[k] indexes ``rows``."""
    n = 0
    for i in range(rows.shape[0]):
        rr = np.int64(rows[i])
        while rr >= 0:
            n += 1
            rr = next_row(more, rr)
    owner = np.empty(n, np.int64)
    chain = np.empty(n, np.int64)
    k = 0
    for i in range(rows.shape[0]):
        rr = np.int64(rows[i])
        while rr >= 0:
            owner[k] = i
            chain[k] = rr
            k += 1
            rr = next_row(more, rr)
    return owner, chain


@njit(cache=True, nogil=True)
def link_continuations(owners, rows, more):
    """Append rows[i] to the end of owners[i]'s chain, in order."""
    for i in range(owners.shape[0]):
        tail = np.int64(owners[i])
        while more[tail] >= 0:
            tail = more[tail]
        more[tail] = rows[i]
        more[rows[i]] = -1
