"""ObjectTable: one row per object (structure of arrays) plus fixed replica slots per row.

Rows are allocated from a free-row stack (recycled) or by extending the high-water mark; columns
grow by doubling. Replica slot columns have shape (capacity, R): R grows with the replica counts
puts commonly use (up to HOT_REPLICA_SLOTS); an object with more replicas than R keeps the rest
in continuation rows linked by ``replica_more`` (see kernels/chains.py), so one wide object costs
its own bytes, not rows x its width.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import numpy as np

from ..kernels import chains as ck
from ..kernels import put_start as pk
from ..kernels.predicates import memory_replica_on_mask
from .array_epoch import ArrayEpoch
from .growth import ColumnGrowth, GrowthJob, run_job
from .rare_fields import ContinuationOwnerTable
from ..schema import (EMPTY_CODE, FLAG_LIVE, HOT_REPLICA_SLOTS, NEVER_LEASED, OBJECT_COLUMNS, PUT_START_NONE,
                      REPLICA_COLUMNS)

_OBJECT_FILL = {
    "lease_deadline_ns": NEVER_LEASED,
    "client": EMPTY_CODE,
    "tenant": EMPTY_CODE,
    "put_start_rel": PUT_START_NONE,
}
# put_start_rel holds ms after a per-table base in a uint32 (4 bytes an object instead of 8).
PUT_START_SPAN = 0xFFFF_FFFE      # largest offset: about 49.7 days
_PUT_START_BACK = 1 << 30         # room kept below the oldest put start when (re)basing: ~12.4 days
_PUT_START_AHEAD = 1 << 31        # room kept above the newest when the range outgrows the span: ~24.8 days
_REPLICA_FILL = {"replica_segment": EMPTY_CODE}
_NO_CHAINS = np.empty(0, np.int32)


@dataclass(frozen=True)
class Chains:
    """The rows holding the slots of some objects, object by object in chain order."""

    owner: np.ndarray  # per chain row: index of its object in the objects given
    rows: np.ndarray   # the rows (an object's own row first)
    n: int             # number of objects

    def any(self, mask: np.ndarray) -> np.ndarray:
        """Per object: some slot of ``mask`` (a (len(rows), R) matrix) is set."""
        # (mask is 2-D, so any(axis=1) is an array; numpy's stubs also allow a scalar)
        return self.count(mask) > 0 if self.rows.size != self.n else mask.any(axis=1)  # type: ignore[return-value]

    def count(self, mask: np.ndarray) -> np.ndarray:
        per_row = mask.sum(axis=1)
        if self.rows.size == self.n:
            return per_row
        return np.bincount(self.owner, weights=per_row, minlength=self.n).astype(np.int64)


class ObjectTable(ArrayEpoch):
    # the columns, set from OBJECT_COLUMNS / REPLICA_COLUMNS in __init__ (named here for type
    # checkers; a test holds the two lists equal)
    lease_deadline_ns: np.ndarray
    size_bytes: np.ndarray
    key_ref: np.ndarray
    tenant: np.ndarray
    client: np.ndarray
    put_start_rel: np.ndarray
    flags: np.ndarray
    data_type: np.ndarray
    replica_offset: np.ndarray
    replica_id: np.ndarray
    replica_segment: np.ndarray
    replica_refcnt: np.ndarray
    replica_kind: np.ndarray
    replica_status: np.ndarray

    def __init__(self, capacity: int = 1024, replica_slots: int = 1) -> None:
        capacity = max(16, int(capacity))
        self.capacity = capacity
        self.slots = max(1, int(replica_slots))
        self.hot_slots_max = HOT_REPLICA_SLOTS   # widest the slot columns grow (tests lower it)
        for name, dt in OBJECT_COLUMNS.items():
            setattr(self, name, np.zeros(capacity, dt))
        for name, dt in REPLICA_COLUMNS.items():
            setattr(self, name, np.zeros((capacity, self.slots), dt))
        self.high_water = 0                      # rows [0, high_water) have ever been used
        self.free_rows = np.empty(0, np.int64)   # stack of recycled rows
        self.free_count = 0
        self.live_count = 0
        self.replica_more = _NO_CHAINS           # per row: next row of its replica chain, -1; see chains.py
        self.cont_count = 0                      # continuation rows in use
        self.continuation_owner = ContinuationOwnerTable()  # continuation row -> its object row
        self.put_start_base_ms: int | None = None  # see set_put_start
        # upstream's optional object checksum, sparse: the (sorted) rows that have one
        self.checksum_rows = np.empty(0, np.int64)
        self.checksum_values = np.empty(0, np.uint64)
        self._put_start_bounds: tuple[int, int] | None = None  # oldest and newest put start ever stored

    # ---- growth ------------------------------------------------------------------------------
    def reserve(self, extra: int) -> None:
        """Make room for ``extra`` more rows without reallocating inside a kernel."""
        for make in self.growth_jobs(extra):
            run_job(make())

    def growth_jobs(self, extra: int) -> list[Callable[[], GrowthJob]]:
        """What :meth:`reserve` would do, as jobs to run in steps (store/growth.py)."""
        need = self.high_water + max(0, extra - self.free_count)
        if need <= self.capacity:
            return []
        cap = self.capacity
        while cap < need:
            cap *= 2
        return [partial(ColumnGrowth, self, cap)]

    def ensure_slots(self, slots: int) -> None:
        if slots <= self.slots:
            return
        for name, dt in REPLICA_COLUMNS.items():
            old = getattr(self, name)
            new = np.zeros((self.capacity, slots), dt)
            new[:, : self.slots] = old
            if name in _REPLICA_FILL:
                new[:, self.slots:] = _REPLICA_FILL[name]
            setattr(self, name, new)
        self.slots = slots

    # ---- rows --------------------------------------------------------------------------------
    def take_rows(self, n: int) -> np.ndarray:
        """Allocate ``n`` rows (recycled first), initialised to an empty object."""
        self.reserve(n)
        from_free = min(n, self.free_count)
        rows = np.empty(n, np.int64)
        if from_free:
            rows[:from_free] = self.free_rows[self.free_count - from_free: self.free_count][::-1]
            self.free_count -= from_free
        fresh = n - from_free
        rows[from_free:] = np.arange(self.high_water, self.high_water + fresh)
        self.high_water += fresh
        self.clear_rows(rows)
        self.live_count += n
        return rows

    def clear_rows(self, rows: np.ndarray) -> None:
        # one row (a single put): scalar stores, about 10x cheaper than a fancy-index store each
        at = int(rows[0]) if rows.size == 1 else rows
        for name in OBJECT_COLUMNS:
            getattr(self, name)[at] = _OBJECT_FILL.get(name, 0)
        for name in REPLICA_COLUMNS:
            getattr(self, name)[at] = _REPLICA_FILL.get(name, 0)
        if self.replica_more.size:
            self.replica_more[at] = -1

    def release_rows(self, rows: np.ndarray) -> None:
        """Return rows, with their continuation rows, to the free stack; the caller already
        unlinked keys and cleared the replica slots."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        self.flags[rows] = 0
        self.live_count -= rows.size
        if self.replica_more.size:
            chains = self.chains(rows)
            self.replica_more[chains.rows] = -1
            if chains.rows.size > rows.size:
                conts = chains.rows[chains.rows != rows[chains.owner]]
                self.continuation_owner.release_rows(conts)
                self.cont_count -= conts.size
                rows = np.concatenate((rows, conts))
        if self.checksum_rows.size:  # a recycled row starts without a checksum
            keep = ~np.isin(self.checksum_rows, rows)
            self.checksum_rows, self.checksum_values = self.checksum_rows[keep], self.checksum_values[keep]
        self._push_free(rows)

    def _push_free(self, rows: np.ndarray) -> None:
        need = self.free_count + rows.size
        if need > self.free_rows.size:
            grown = np.empty(max(need, 2 * self.free_rows.size, 64), np.int64)
            grown[: self.free_count] = self.free_rows[: self.free_count]
            self.free_rows = grown
        self.free_rows[self.free_count: need] = rows
        self.free_count = need

    # ---- replica chains (kernels/chains.py) ----------------------------------------------------
    def chains(self, rows: np.ndarray) -> Chains:
        """The rows holding the slots of objects ``rows`` (just ``rows`` while no chain exists)."""
        rows = np.asarray(rows, np.int64)
        if not self.replica_more.size:
            return Chains(np.arange(rows.size), rows, rows.size)
        owner, chain = ck.expand(rows, self.replica_more)
        return Chains(owner, chain, rows.size)

    def owners(self, rows: np.ndarray) -> np.ndarray:
        """The object row of each row (a continuation row's from :attr:`continuation_owner`)."""
        if not self.cont_count:
            return rows
        owner = self.continuation_owner.get(rows)
        return np.where(owner >= 0, owner, rows)

    def add_continuations(self, owners: np.ndarray) -> np.ndarray:
        """One new, empty continuation row per entry of ``owners`` (object rows, repeats
        allowed), each appended to its object's chain in order; returns the new rows."""
        owners = np.asarray(owners, np.int64)
        if owners.size == 0:
            return owners
        rows = self.take_rows(owners.size)
        self.live_count -= rows.size
        self.cont_count += rows.size
        if not self.replica_more.size:
            self.replica_more = np.full(self.capacity, -1, np.int32)
        self.continuation_owner.add(rows, owners)
        self.size_bytes[rows] = self.size_bytes[owners]
        ck.link_continuations(owners, rows, self.replica_more)
        return rows

    def extra_slots(self, owners: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, slots) for ``counts[i]`` replicas beyond the own row of each (chainless)
        object ``owners[i]``: new continuation rows filled slot by slot, in order."""
        per = self.slots
        n_rows = (counts + per - 1) // per
        new = self.add_continuations(np.repeat(owners, n_rows))
        first = np.repeat(np.cumsum(n_rows) - n_rows, counts)
        rank = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        return new[first + rank // per], rank % per

    # ---- object checksums (sparse) ------------------------------------------------------------
    def set_checksums(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Give ``rows`` (distinct) upstream object checksums (replacing any they had)."""
        rows = np.asarray(rows, np.int64)
        if rows.size == 0:
            return
        keep = ~np.isin(self.checksum_rows, rows)
        r = np.concatenate((self.checksum_rows[keep], rows))
        v = np.concatenate((self.checksum_values[keep], np.asarray(values, np.uint64)))
        order = np.argsort(r, kind="stable")
        self.checksum_rows, self.checksum_values = r[order], v[order]

    # ---- put start times --------------------------------------------------------------------
    def set_put_start(self, rows: np.ndarray, ms: np.ndarray | int) -> None:
        """Record the system-clock put start (ms; 0: unknown) of ``rows``.

        Stored as uint32 ms after ``put_start_base_ms`` (PUT_START_NONE: unknown), exact while
        every put start held lies within PUT_START_SPAN (~49.7 days) of one another. The base
        follows the values: a put start outside the window moves it (one vectorized pass over
        the column, rare: the window keeps ~12 days of room below the oldest value and, once the
        values span more than it, ~24.8 days above the newest). Overflow handling: when the put
        starts held span more than the window, the newest stay exact and those older than the
        window's start read as its start (saturated: later than they were, never earlier).
        """
        rows = np.asarray(rows, np.int64)
        ms = np.asarray(ms, np.int64)
        one = ms.ndim == 0  # one start for every row (a put_start call): scalar arithmetic below
        known, lo, hi = (int(ms > 0), int(ms), int(ms)) if one else pk.known_range(ms)
        if known:
            base = self.put_start_base_ms
            outside = base is None or lo < base or hi > base + PUT_START_SPAN
            if self._put_start_bounds is not None:
                lo, hi = min(lo, self._put_start_bounds[0]), max(hi, self._put_start_bounds[1])
            self._put_start_bounds = (lo, hi)
            if outside:
                self._rebase_put_start(lo, hi)
        base = self.put_start_base_ms or 0
        if one:
            self.put_start_rel[rows] = min(max(int(ms) - base, 0), PUT_START_SPAN) if known else PUT_START_NONE
        else:  # a column of them (a restore): no temporaries
            pk.store_relative(self.put_start_rel, rows, ms, base, PUT_START_SPAN, int(PUT_START_NONE))

    def put_start_ms(self, rows: np.ndarray) -> np.ndarray:
        """System-clock put start (ms, int64; 0: unknown) of ``rows``."""
        return put_start_ms(self.put_start_rel[rows], self.put_start_base_ms)

    def _rebase_put_start(self, lo: int, hi: int) -> None:
        """A put start fell outside the window: move the base so that [lo, hi] (every put start
        stored so far) fits, or, when it cannot, so that the newest do; shift the stored offsets."""
        old = self.put_start_base_ms
        if hi - lo <= PUT_START_SPAN - _PUT_START_BACK:
            base = lo - _PUT_START_BACK
        elif hi - lo <= PUT_START_SPAN:  # still all exact, with less room
            base = lo
        elif old is None or hi > old + PUT_START_SPAN:
            base = hi + _PUT_START_AHEAD - PUT_START_SPAN
        else:  # only older ones fell below a window already as late as it can be: they saturate
            return
        self.put_start_base_ms = base
        if old is None or old == base:
            return
        col = self.put_start_rel[:self.high_water]
        stored = col != PUT_START_NONE
        col[stored] = np.clip(col[stored].astype(np.int64) + (old - base), 0, PUT_START_SPAN).astype(np.uint32)

    def memory_slots_on(self, segment: int) -> np.ndarray:
        """(high_water, R) mask of the slots holding a memory replica on segment code ``segment``
        (what unmounting it drops)."""
        hw = self.high_water
        return memory_replica_on_mask(self.replica_status[:hw], self.replica_kind[:hw], self.replica_segment[:hw],
                                      segment)

    def live_rows(self) -> np.ndarray:
        hw = self.high_water
        return np.flatnonzero(self.flags[:hw] & FLAG_LIVE).astype(np.int64)

    def resident_bytes(self) -> int:
        """Bytes of every column for the rows in use (what the process actually touches)."""
        return sum(self.column_bytes().values())

    def column_bytes(self) -> dict[str, int]:
        """:meth:`resident_bytes` column by column (the side tables under their own names)."""
        hw = self.high_water
        out = {name: dt.itemsize * hw for name, dt in OBJECT_COLUMNS.items()}
        out.update({name: dt.itemsize * hw * self.slots for name, dt in REPLICA_COLUMNS.items()})
        out["replica_more"] = self.replica_more.itemsize * hw if self.replica_more.size else 0
        out["continuation_owner"] = self.continuation_owner.resident_bytes()
        out["free_rows"] = self.free_rows.nbytes
        out["checksums"] = self.checksum_rows.nbytes + self.checksum_values.nbytes
        return out


def put_start_ms(rel: np.ndarray, base_ms: int | None) -> np.ndarray:
    """System-clock ms (int64; 0 where PUT_START_NONE) of stored put_start_rel values."""
    return np.where(rel == PUT_START_NONE, 0, rel.astype(np.int64) + (base_ms or 0))
