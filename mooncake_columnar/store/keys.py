"""KeyIndex: (tenant, key) -> object row.

Key bytes live in an append-only arena (the ``key_ref`` object column packs offset and length);
an open-addressing table of tagged rows indexes hash(tenant, key) and verifies bytes on a hit.
Dead key bytes are reclaimed by compaction once they are the majority of the arena.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

import numpy as np
import pyarrow as pa

from ..kernels import arena as arena_k
from ..kernels import hashing as hk
from ..kernels import index_rows
from .array_epoch import ArrayEpoch
from .growth import ArenaCompaction, ArenaGrowth, GrowthJob, TableRehash, run_job
from .objects import ObjectTable

# The table has any size (kernels/hashing.py): it grows once past _MAX_LOAD, to _GROWN_LOAD
# and by at least _MIN_GROWTH (a batch's chunks each need a little room: growing each by only
# that rehashed the whole table every few chunks, and batch puts ran 25% slower). So it stays
# 68-85% full (9.4-11.8 bytes per key) where a power-of-two size at most 70% full took
# 11.4-22.9. Linear probing at 85% still finds most keys in the home slot's cache line.
_MAX_LOAD = 0.85
_GROWN_LOAD = 0.75
_MIN_GROWTH = 1.25


def table_size(keys: int) -> int:
    """Slots of a table holding ``keys`` keys at the grown load (at least 16)."""
    return max(16, int(np.ceil(keys / _GROWN_LOAD)))


def as_string_array(keys) -> pa.Array:
    """list[str] | pyarrow string array -> a non-chunked pyarrow large_string array."""
    if isinstance(keys, pa.ChunkedArray):
        keys = keys.combine_chunks()
    if not isinstance(keys, pa.Array):
        keys = pa.array(keys, pa.large_string())
    if pa.types.is_string(keys.type):
        keys = keys.cast(pa.large_string())
    if not pa.types.is_large_string(keys.type):
        raise TypeError(f"keys must be strings, got {keys.type}")
    return keys


def string_buffers(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets rebased to 0, uint8 data) views of a large_string array."""
    _, off_buf, data_buf = keys.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=len(keys) + 1, offset=keys.offset * 8)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    # read-only like a single key's (``np.frombuffer`` of its bytes): the key kernels then
    # compile one specialisation for both, not a second for writable key bytes
    data.flags.writeable = False
    return offsets, data


class KeyIndex(ArrayEpoch):
    def __init__(self, objects: ObjectTable, capacity: int = 1024) -> None:
        self.objects = objects
        self.table = np.full(table_size(capacity), hk.EMPTY_SLOT, np.int64)
        self.count = 0
        self.arena = np.empty(1 << 16, np.uint8)
        self.arena_used = 0
        self.arena_garbage = 0

    # ---- lookups -----------------------------------------------------------------------------
    def lookup_batch(self, offsets: np.ndarray, data: np.ndarray, tenants: np.ndarray) -> np.ndarray:
        o = self.objects
        return hk.find_rows(self.table, self.arena, o.key_ref, o.tenant,
                            offsets, data, tenants)

    # ---- mutation ----------------------------------------------------------------------------
    def reserve(self, extra_keys: int, extra_bytes: int) -> None:
        """Grow the table and arena so a batch of this size needs no reallocation in a kernel."""
        for make in self.growth_jobs(extra_keys, extra_bytes):
            run_job(make())

    def growth_jobs(self, extra_keys: int, extra_bytes: int) -> list[Callable[[], GrowthJob]]:
        """What :meth:`reserve` would do, as jobs to run in steps (store/growth.py)."""
        jobs: list[Callable[[], GrowthJob]] = []
        if self.count + extra_keys > _MAX_LOAD * self.table.shape[0]:
            size = max(table_size(self.count + extra_keys), int(self.table.shape[0] * _MIN_GROWTH))
            jobs.append(partial(TableRehash, self, size))
        need = self.arena_used + extra_bytes
        if need > self.arena.shape[0]:
            compact = self.arena_garbage > self.arena_used // 2
            if compact:
                need -= self.arena_garbage
            cap = self.arena.shape[0]
            while cap < need:
                cap *= 2
            jobs.append(partial(ArenaCompaction if compact else ArenaGrowth, self, cap))
        return jobs

    def note_inserted(self, count: int, arena_used: int) -> None:
        """Book-keeping after a kernel inserted keys directly (see kernels.objects.insert_new_puts)."""
        self.count += count
        self.arena_used = arena_used

    def remove(self, rows: np.ndarray) -> None:
        o = self.objects
        self.arena_garbage += index_rows.delete_rows(self.table, rows, self.arena, o.key_ref, o.tenant)
        self.count -= rows.size

    def key_buffers_of(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(int64 offsets from 0, UTF-8 bytes) of the keys of ``rows``."""
        return arena_k.gather_keys(self.arena, self.objects.key_ref, np.asarray(rows, np.int64))

    def keys_of(self, rows: np.ndarray) -> pa.Array:
        offsets, data = self.key_buffers_of(rows)
        return pa.LargeStringArray.from_buffers(len(rows), pa.py_buffer(offsets), pa.py_buffer(data))

    def resident_bytes(self) -> int:
        """Index bytes excluding the key bytes themselves (the arena)."""
        return self.table.nbytes

    # ---- maintenance -------------------------------------------------------------------------
    def _compact_arena(self) -> None:
        run_job(ArenaCompaction(self, self.arena.shape[0]))
