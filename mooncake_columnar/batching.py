"""Batch calls in chunks: the master lock is released between chunks, so a 1M-key batch does
not make every other client wait for all of it (190 ms and more) but for one chunk.

Chunks run in order, each as the same internal call on a contiguous slice of the keys, so
duplicates inside one batch behave as the same calls made one after another, as before; what
changes is that other threads' calls may now come between two chunks.
"""
from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

import numpy as np

from .locking import MasterLock
from .messages import BatchResult
from .policies.views import ReplicaBuffer, ReplicaColumns, joined_replica_columns, read_batch, replica_table
from .store.growth import StagedGrowth
from .validation import require_str

if TYPE_CHECKING:
    from .clock import Clocks
    from .store.metadata import MetadataStore

T = TypeVar("T")


class Batched(Protocol):
    """The service (master.py: MasterService, which runs its batch calls through this module) as
    the growth and read helpers here see it."""

    @property
    def lock(self) -> MasterLock: ...
    @property
    def store(self) -> MetadataStore: ...
    @property
    def clocks(self) -> Clocks: ...
    @property
    def lease_ttl_ns(self) -> int: ...  # the read lease a read grants

CHUNK_TARGET_S = 0.004  # a chunk holds the lock about this long
FIRST_CHUNK = 8192      # keys in a batch's first chunk (later ones adapt to CHUNK_TARGET_S)
MIN_CHUNK = 1024
MAX_CHUNK = 1 << 20


def run_in_chunks(lock: MasterLock, n: int, step: Callable[[int, int], T], *,
                  target_s: float | None = None, first: int | None = None,
                  bounds: list[int] | None = None, reading: bool = False,
                  before: Callable[[int, int], None] | None = None) -> list[tuple[int, T]]:
    """``[(lo, step(lo, hi)), ...]`` over consecutive ranges covering ``range(n)`` in order,
    each call under ``lock``; between calls the lock is released and handed to waiting threads.

    Chunk sizes adapt so that each call holds the lock about ``target_s``, unless ``bounds``
    gives the chunks' starts (those of an earlier pass). ``n == 0`` makes one call
    ``step(0, 0)``. A caller that already holds the lock (a batch call made inside another
    locked call) keeps it throughout: the chunks then run back to back, as one call.
    ``reading``: the steps only read (see :meth:`MasterLock.take`). ``before(lo, hi)`` runs
    before each chunk takes the lock (it makes the chunk's room: ``_grow_ahead``)."""
    target_s = CHUNK_TARGET_S if target_s is None else target_s
    out: list[tuple[int, T]] = []
    lo, size = 0, max(1, FIRST_CHUNK if first is None else first)
    first_call = True
    while True:
        hi = min(n, lo + size)
        if bounds is not None:
            k = len(out) + 1
            hi = bounds[k] if k < len(bounds) else n
        if before is not None:
            before(lo, hi)
        if first_call:
            lock.take(reading=reading)
        else:
            # between chunks the lock goes to whoever waits (a single get, typically), one
            # call each, and comes back once they are done
            lock.yield_turn(reading=reading)
        try:
            t0 = perf_counter()
            out.append((lo, step(lo, hi)))
            held = perf_counter() - t0
        finally:
            lock.leave()
        if hi >= n:
            return out
        first_call = False
        # next size: aim at target_s, moving by at most 2x (one slow chunk is often noise)
        want = size * target_s / max(held, 1e-6)
        size = int(min(MAX_CHUNK, max(MIN_CHUNK, size // 2, min(2 * size, want))))
        lo = hi


def grow_ahead(m: Batched, rows: int, key_bytes: int) -> None:
    """Before a batch chunk that may add ``rows`` objects with ``key_bytes`` of keys: make their
    room (column growth, index rehash, arena growth or compaction, in-flight slots) in steps taken in lock
    turns of their own, readers going between them, not inside the chunk's one turn; a
    mutating call in between finishes the steps first (store/growth.py)."""
    lock = m.lock
    lock.take()  # (finishes a growth another batch left pending)
    try:
        s = m.store
        jobs = s.objects.growth_jobs(rows) + s.keys.growth_jobs(rows, key_bytes) + s.inflight.growth_jobs(rows)
        if not jobs:
            return
        staged = StagedGrowth(jobs)

        def settle() -> None:
            lock.settle = None  # first: a job that fails is dropped, the live state untouched
            staged.settle()

        lock.settle = settle
        while True:
            if lock.settle is not settle:  # a mutating call finished it meanwhile
                return
            try:
                if staged.step():
                    lock.settle = None
                    return
            except BaseException:
                lock.settle = None
                raise
            lock.leave()
            lock.yield_turn(reading=True)
    finally:
        lock.leave()


def grow_if_short(m: Batched, rows: int, key_bytes: int) -> None:
    """:func:`grow_ahead` when some table is short of room for ``rows`` more objects; read
    without the lock (a hint: the call still grows whatever is left under the lock). For single
    puts: the one that crosses a threshold at 10M objects would copy ~1 GB in its turn."""
    s = m.store
    if s.objects.growth_jobs(rows) or s.keys.growth_jobs(rows, key_bytes) or s.inflight.growth_jobs(rows):
        grow_ahead(m, rows, key_bytes)


def read_in_chunks(m: Batched, offsets: np.ndarray, data: np.ndarray, tenant_id: str, *,
                   want_replicas: bool) -> list[tuple[int, tuple[np.ndarray, ReplicaColumns | None]]]:
    """The batch reads (get, exist) in chunks: each chunk looks its keys up, classifies them
    (read leases granted) and, with ``want_replicas``, gathers the readable replicas' columns,
    in one kernel pass (:func:`views.read_batch`)."""
    require_str("tenant_id", tenant_id)
    buffer = ReplicaBuffer(m.store, offsets.size - 1) if want_replicas else None  # the chunks' replicas in one

    def chunk(lo: int, hi: int) -> tuple[np.ndarray, ReplicaColumns | None]:
        return read_batch(m.store, offsets[lo:hi + 1], data, m.store.tenants.find(tenant_id), m.clocks.steady_ns(),
                          m.lease_ttl_ns, want_replicas=want_replicas, key_base=lo, buffer=buffer)

    return run_in_chunks(m.lock, offsets.size - 1, chunk, reading=True)


def joined_codes(parts: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """One array from the chunks' per-key arrays, in key order."""
    if len(parts) == 1:
        return parts[0][1]
    return np.concatenate([a for _, a in parts])


def joined_results(parts: list[tuple[int, tuple[np.ndarray, ReplicaColumns | None]]]) -> BatchResult:
    """One BatchResult from the chunks' (codes, replica columns): codes in key order, and one
    replica table, built here, outside the master lock."""
    codes = joined_codes([(lo, c) for lo, (c, _) in parts])
    return BatchResult(codes, replica_table([cols for _, (_, cols) in parts if cols is not None]))


def joined_columns(parts: list[tuple[int, tuple[np.ndarray, ReplicaColumns | None]]]
                   ) -> tuple[np.ndarray, ReplicaColumns]:
    """The chunks' codes in key order and their replica columns joined, without an Arrow table."""
    codes = joined_codes([(lo, c) for lo, (c, _) in parts])
    return codes, joined_replica_columns([cols for _, (_, cols) in parts if cols is not None])
