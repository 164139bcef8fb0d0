"""The engine's self-check: every structural invariant of a MasterService, in columnar passes.

:func:`verify_engine` runs one check after another and raises :class:`EngineInvariantError` on
the first violation (``.check`` is a stable id, the message names the offending segment, row or
key). Every per-row pass is a Numba kernel or a vectorised NumPy expression; Python loops only
over segments, tenants and group codes (few).

Checks, in order:

* ``segment_registry``: ``by_name``/``info`` agree; unmounted codes hold no allocator state.
* ``live_count``, ``free_rows``: LIVE rows below high_water == live_count; the free-row stack
  is duplicate-free, below high_water, holds no LIVE row, and free + live == high_water.
* ``replica_row``, ``replica_id``, ``replica_segment``, ``replica_extent``,
  ``replica_alignment``: every in-use replica slot belongs to a LIVE row and has an id in
  [1, next_replica_id); every in-use MEMORY slot (and every pending discarded extent) lies on a
  mounted segment, inside its capacity, at an offset aligned to its allocation unit.
* ``free_list``, ``extent_overlap``, ``free_overlap``, ``free_list_gap``, ``segment_used``:
  each segment's free list is sorted, non-empty, coalesced and inside capacity; held extents
  (ak.held_end rule, discarded ones included) do not overlap each other or free space; on an
  allocatable segment free + held tile the whole capacity and ``used`` is the held sum. A
  mounted segment that takes no allocations (a standby's, or a promoted or unreadably restored
  one awaiting its remount) keeps an allocator nobody maintains: oplog apply places replicas
  without allocating (ha.apply), frees skip it (objects.clear_slots), and the remount rebuilds
  it from the replicas (recovery). There only its own shape, ``used + free == capacity`` and
  the no-overlap rule among held extents hold.
* ``index_count``, ``index_slot``, ``key_ref``, ``index_lookup``: the key index holds exactly
  live_count entries, each pointing at a LIVE row, and every LIVE row is found by its own key
  (hashing.find_row's answer, checked as one sequential pass over the table: see _scan_index).
* ``inflight_slots``, ``inflight_row``, ``inflight_claim``: the InflightTable's free stack is
  the exact complement of its in-use slots, and only in-use slots name an owner row; a LIVE row
  holds a slot iff it is PROCESSING, the slot is in use and names it as owner, and every
  in-use slot is held by exactly one LIVE row; a free row holds none (release_rows drops it).
* ``group_member``, ``group_link``, ``group_head``: grouped LIVE rows form one circular
  ``group_next`` list per group code, members share the code and FLAG_GROUPED, ungrouped LIVE
  rows point at themselves, ``group_head[g]`` is a member of g or -1 for an empty group.
* ``tenant_ledger`` (multi-tenant mode): pending/committed equal a from-scratch charge of every
  LIVE row (quota.TenantLedger.charge).
* ``replica_id_unique``: no replica id is used twice.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit, prange

from .errors import EngineInvariantError
from .kernels import allocation as ak
from .kernels import hashing as hk
from .kernels.predicates import is_grouped, is_live, is_put_in_flight
from .schema import FLAG_GROUPED, FLAG_LIVE, KIND_MEMORY, ReplicaStatus

if TYPE_CHECKING:
    from .master import MasterService

_MEM = int(KIND_MEMORY)
_ST_PROCESSING = int(ReplicaStatus.PROCESSING)
_ST_COMPLETE = int(ReplicaStatus.COMPLETE)
_ROW_MASK = np.int64(0xFFFFFFFF)
_INT64_MAX = np.int64(2**63 - 1)
_CHUNKS = 64  # parallel kernels split rows into this many chunks (first violation: lowest chunk)


def _fail(check: str, message: str) -> None:
    raise EngineInvariantError(check, message)


def _row_name(m: "MasterService", row: int) -> str:
    """``row N (tenant T, key K)``; the key only when its reference is sane (never trusted)."""
    o = m.objects
    try:
        ref, t = int(o.key_ref[row]), int(o.tenant[row])
        off, ln = ref >> hk.KEY_LENGTH_BITS, ref & ((1 << hk.KEY_LENGTH_BITS) - 1)
        if 0 <= off and off + ln <= m.keys.arena_used and 0 <= t < len(m.tenants):
            key = bytes(m.keys.arena[off:off + ln]).decode("utf-8", "replace")
            state = "" if o.flags[row] & FLAG_LIVE else "free "  # a free row's key is its last one
            return f"{state}row {row} (tenant {m.tenants.name(t)!r}, key {key!r})"
    except (IndexError, ValueError):
        pass
    return f"row {row}"


def _seg_name(m: "MasterService", code: int) -> str:
    info = m.segments.info
    return f"segment {info[code].name!r} (code {code})" if 0 <= code < len(info) and info[code] else \
        f"segment code {code}"


# ================================================================================ segments, rows
def _check_segment_registry(m: "MasterService") -> None:
    s = m.segments
    for code, info in enumerate(s.info):  # one iteration per segment code
        if info is None:
            if s.used[code] or s.extent_counts[code] or s.allocatable[code]:
                _fail("segment_registry", f"unmounted segment code {code} keeps allocator state")
        elif s.by_name.get(info.name) != code or s.capacity[code] != info.size:
            _fail("segment_registry", f"{_seg_name(m, code)}: name index or capacity disagrees")
    if len(s.by_name) != sum(i is not None for i in s.info):
        _fail("segment_registry", "segment name index holds unmounted names")


@njit(cache=True, nogil=True)
def _check_free_stack(free_rows, free_count, hw, flags):
    """(0, -1) or (problem, stack position): 1 out of range, 2 LIVE, 3 listed twice."""
    seen = np.zeros(hw, np.bool_)
    for i in range(free_count):
        r = free_rows[i]
        if r < 0 or r >= hw:
            return 1, i
        if is_live(flags[r]):
            return 2, i
        if seen[r]:
            return 3, i
        seen[r] = True
    return 0, -1


def _check_rows(m: "MasterService") -> None:
    o = m.objects
    hw = o.high_water
    live = int(np.count_nonzero(o.flags[:hw] & FLAG_LIVE))
    if live != o.live_count:
        _fail("live_count", f"{live} LIVE rows below high_water {hw}, live_count is {o.live_count}")
    if not 0 <= o.free_count <= o.free_rows.size:
        _fail("free_rows", f"free_count {o.free_count} outside the free stack of {o.free_rows.size}")
    problem, at = _check_free_stack(o.free_rows, o.free_count, hw, o.flags)
    if problem:
        r = int(o.free_rows[at])
        what = {1: f"row {r} is outside [0, high_water {hw})", 2: f"{_row_name(m, r)} is LIVE",
                3: f"row {r} is listed twice"}[problem]
        _fail("free_rows", f"free stack position {at}: {what}")
    if o.free_count + o.live_count != hw:
        _fail("free_rows", f"free_count {o.free_count} + live_count {o.live_count} != high_water {hw}")


# ================================================================================ replica slots
_SLOT_OK, _SLOT_ROW, _SLOT_ID, _SLOT_SEG, _SLOT_EXTENT, _SLOT_ALIGN = 0, 1, 2, 3, 4, 5
_SLOT_CHECKS = {_SLOT_ROW: "replica_row", _SLOT_ID: "replica_id", _SLOT_SEG: "replica_segment",
                _SLOT_EXTENT: "replica_extent", _SLOT_ALIGN: "replica_alignment"}


@njit(inline="always", cache=True)
def _extent_problem(o, z, capacity, unit_bits):
    """A memory extent of ``z`` bytes at ``o`` on a segment: inside it, on a unit boundary.
    Scalars only (see _step); one test per `if` (see kernels.predicates)."""
    if z <= 0:
        return _SLOT_EXTENT
    if o < 0:
        return _SLOT_EXTENT
    if o > capacity - z:
        return _SLOT_EXTENT
    if o & ((np.int64(1) << unit_bits) - 1):
        return _SLOT_ALIGN
    return _SLOT_OK


@njit(cache=True, nogil=True)
def _slot_pass(hw, flags, status, kind, seg, off, size, rep_id, next_id, mounted, capacity, unit_bits):
    """Validate every in-use slot of rows [0, hw) in row order. Returns (problem, row, slot,
    per-segment ascending): ascending[s] says the memory replicas of segment s appear in strictly
    increasing offset order by row (bulk loads and restores allocate so), which lets the extent
    check stream the columns instead of gathering and sorting."""
    n_codes = mounted.shape[0]
    last = np.full(n_codes, -1, np.int64)
    ascending = np.ones(n_codes, np.bool_)
    for r in range(hw):
        live = is_live(flags[r])
        for j in range(status.shape[1]):
            if status[r, j] == 0:
                continue
            if not live:
                return _SLOT_ROW, r, j, ascending
            if rep_id[r, j] == 0:
                return _SLOT_ID, r, j, ascending
            if rep_id[r, j] >= next_id:
                return _SLOT_ID, r, j, ascending
            if kind[r, j] != _MEM:
                continue
            s = np.int64(seg[r, j])
            if s < 0 or s >= n_codes:
                return _SLOT_SEG, r, j, ascending
            if not mounted[s]:
                return _SLOT_SEG, r, j, ascending
            o = off[r, j]
            problem = _extent_problem(o, size[r], capacity[s], unit_bits[s])
            if problem != _SLOT_OK:
                return problem, r, j, ascending
            if o <= last[s]:
                ascending[s] = False
            last[s] = o
    return _SLOT_OK, -1, -1, ascending


def _mounted_mask(m: "MasterService") -> np.ndarray:
    s = m.segments
    mounted = np.zeros(max(1, len(s.info)), np.bool_)
    mounted[[c for c, i in enumerate(s.info) if i is not None]] = True
    return mounted


def _check_slots(m: "MasterService") -> np.ndarray:
    """Every in-use slot and discarded extent; returns the per-segment ascending flags."""
    o, s = m.objects, m.segments
    mounted = _mounted_mask(m)
    n = mounted.size
    problem, r, j, ascending = _slot_pass(
        o.high_water, o.flags, o.replica_status, o.replica_kind, o.replica_segment, o.replica_offset,
        o.size_bytes, o.replica_id, np.uint64(m.next_replica_id), mounted, s.capacity[:n], s.unit_bits[:n])
    if problem:
        code = int(o.replica_segment[r, j])
        _fail(_SLOT_CHECKS[problem],
              f"{_row_name(m, r)} slot {j}: status {int(o.replica_status[r, j])}, kind "
              f"{int(o.replica_kind[r, j])}, replica id {int(o.replica_id[r, j])} (next "
              f"{m.next_replica_id}), {_seg_name(m, code)}, offset {int(o.replica_offset[r, j])}, "
              f"size {int(o.size_bytes[r])}")
    _check_discarded(m, mounted)
    return ascending


def _check_discarded(m: "MasterService", mounted: np.ndarray) -> None:
    """The pending extents of abandoned puts obey the memory-slot rules (a few, vectorised)."""
    seg, off, size = m._discarded_seg, m._discarded_off, m._discarded_size
    if not seg.size:
        return
    s = m.segments
    valid = (seg >= 0) & (seg < mounted.size)
    on = np.where(valid, seg, 0)
    bad = {"replica_segment": ~valid | ~mounted[on],
           "replica_extent": (size <= 0) | (off < 0) | (off > s.capacity[on] - size),
           "replica_alignment": (off & ((np.int64(1) << s.unit_bits[on]) - 1)) != 0}
    for check, mask in bad.items():
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            _fail(check, f"discarded extent {i}: {_seg_name(m, int(seg[i]))}, offset {int(off[i])}, "
                         f"size {int(size[i])}")


# ================================================================================ allocators
# Tiling problems, in report priority (the first kind found anywhere wins).
_T_OVERLAP, _T_FREE_OVERLAP, _T_GAP = 0, 1, 2
_TILING_CHECKS = ("extent_overlap", "free_overlap", "free_list_gap")

# The hot loops below pass only scalars to their helpers: a helper with branches that takes
# arrays keeps Numba's reference counting of them, several times the cost of the walk itself.


@njit(inline="always", cache=True)
def _step(a, e, cursor, free_involved, allocatable):
    """Visit extent [a, e) of a segment whose extents come in start order: it must start at the
    cursor (allocatable: free + held tile the capacity) or past it (never before: an overlap;
    ``free_involved``: this extent or the one that set the cursor is free space).
    Returns (problem or -1, new cursor)."""
    if a < cursor:
        return (_T_FREE_OVERLAP if free_involved else _T_OVERLAP), max(cursor, e)
    if a > cursor and allocatable:
        return _T_GAP, e
    return -1, e


@njit(cache=True)
def _record(err, k, s, at):
    if err[k, 0] < 0:
        err[k, 0] = s
        err[k, 1] = at


@njit(cache=True)
def _advance(s, limit, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err):
    """Visit segment s's free and discarded extents that start at or before ``limit``; returns
    the start of the next one (INT64_MAX: none). Runs once per free or discarded extent only,
    so the array arguments cost nothing that matters."""
    while True:
        f = f_off[fi[s]] if fi[s] < f_bounds[s + 1] else _INT64_MAX
        d = d_off[di[s]] if di[s] < d_bounds[s + 1] else _INT64_MAX
        if f > limit and d > limit:
            return min(f, d)
        free = f <= d
        a, e = (f, f_end[fi[s]]) if free else (d, d_end[di[s]])
        cursor = state[s, _CURSOR]
        k, state[s, _CURSOR] = _step(a, e, cursor, free or state[s, _AFTER_FREE] != 0, allocatable[s])
        if k >= 0:
            _record(err, k, s, cursor if k == _T_GAP else a)
        if e > cursor:  # this extent now sets the cursor
            state[s, _AFTER_FREE] = 1 if free else 0
        if free:
            fi[s] += 1
        else:
            state[s, _HELD] += e - a
            di[s] += 1


_CURSOR, _AFTER_FREE, _HELD, _NEXT = 0, 1, 2, 3  # columns of the per-segment walk state


def _walk_state(n: int, f_off: np.ndarray, f_bounds: np.ndarray, d_off: np.ndarray,
                d_bounds: np.ndarray) -> np.ndarray:
    """Per segment: cursor, after-free flag, held bytes, start of the next free/discarded extent."""
    state = np.zeros((n, 4), np.int64)
    firsts = [np.where(b[1:] > b[:-1], np.append(off, _INT64_MAX)[b[:-1]], _INT64_MAX)
              for off, b in ((f_off, f_bounds), (d_off, d_bounds))]
    state[:, _NEXT] = np.minimum(*firsts)
    return state


@njit(cache=True, nogil=True)
def _finish(capacity, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err):
    """Visit what is left of every segment and demand the tiling reach its capacity."""
    for s in range(capacity.shape[0]):
        _advance(s, _INT64_MAX - 1, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state,
                 allocatable, err)
        if allocatable[s] and state[s, _CURSOR] < capacity[s]:
            _record(err, _T_GAP, s, state[s, _CURSOR])


@njit(cache=True, nogil=True)
def _tile_rows(hw, status, kind, seg, off, size, unit_bits, capacity, allocatable,
               f_off, f_end, f_bounds, d_off, d_end, d_bounds, state):
    """The tiling walk straight over the replica columns, for segments whose replicas ascend
    in row order (checked by _slot_pass). Returns err: per problem kind (segment, offset)."""
    n = capacity.shape[0]
    fi = f_bounds[:-1].copy()
    di = d_bounds[:-1].copy()
    err = np.full((3, 2), -1, np.int64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] == 0:
                continue
            if kind[r, j] != _MEM:
                continue
            s = np.int64(seg[r, j])
            o = off[r, j]
            e = ak.held_end(o, size[r], unit_bits[s], capacity[s])
            if state[s, _NEXT] <= o:
                state[s, _NEXT] = _advance(s, o, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds,
                                           state, allocatable, err)
            cursor = state[s, _CURSOR]
            k, state[s, _CURSOR] = _step(o, e, cursor, state[s, _AFTER_FREE] != 0, allocatable[s])
            if k >= 0:
                _record(err, k, s, cursor if k == _T_GAP else o)
            if e > cursor:
                state[s, _AFTER_FREE] = 0
            state[s, _HELD] += e - o
    _finish(capacity, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err)
    return err


@njit(cache=True, nogil=True)
def _gather_held(hw, status, kind, seg, off, size, unit_bits, capacity):
    """Held extents of every in-use memory slot grouped by segment (a counting sort, row order
    inside a segment): (starts, ends, bounds)."""
    n = capacity.shape[0]
    bounds = np.zeros(n + 1, np.int64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] != 0 and kind[r, j] == _MEM:
                bounds[seg[r, j] + 1] += 1
    for s in range(n):
        bounds[s + 1] += bounds[s]
    fill = bounds[:-1].copy()
    starts = np.empty(bounds[n], np.int64)
    ends = np.empty(bounds[n], np.int64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] != 0 and kind[r, j] == _MEM:
                s = seg[r, j]
                k = fill[s]
                starts[k] = off[r, j]
                ends[k] = ak.held_end(off[r, j], size[r], unit_bits[s], capacity[s])
                fill[s] = k + 1
    return starts, ends, bounds


@njit(cache=True, nogil=True)
def _tile_sorted(starts, ends, bounds, capacity, allocatable, f_off, f_end, f_bounds,
                 d_off, d_end, d_bounds, state):
    """The tiling walk over held extents whose starts and ends are each sorted per segment.
    Sorting the two separately is enough: disjoint extents pair up in that order, and if any
    two overlap then some sorted start falls before the previous sorted end, which the walk
    reports as an overlap."""
    n = capacity.shape[0]
    fi = f_bounds[:-1].copy()
    di = d_bounds[:-1].copy()
    err = np.full((3, 2), -1, np.int64)
    for s in range(n):
        for i in range(bounds[s], bounds[s + 1]):
            o = starts[i]
            e = ends[i]
            if state[s, _NEXT] <= o:
                state[s, _NEXT] = _advance(s, o, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds,
                                           state, allocatable, err)
            cursor = state[s, _CURSOR]
            k, state[s, _CURSOR] = _step(o, e, cursor, state[s, _AFTER_FREE] != 0, allocatable[s])
            if k >= 0:
                _record(err, k, s, cursor if k == _T_GAP else o)
            if e > cursor:
                state[s, _AFTER_FREE] = 0
            state[s, _HELD] += e - o
    _finish(capacity, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err)
    return err


def _check_free_lists(m: "MasterService") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each mounted segment's free list on its own. Returns the free extents of allocatable
    segments as flat (starts, ends, per-segment bounds) for the tiling walk (a typed List read
    per replica would cost more than the walk itself), and the free bytes per segment code."""
    s = m.segments
    n = max(1, len(s.info))
    free = np.zeros(n, np.int64)
    starts, ends = [np.zeros(0, np.int64)] * n, [np.zeros(0, np.int64)] * n
    for code, info in enumerate(s.info):  # one iteration per segment
        if info is None:
            continue
        count, cap = int(s.extent_counts[code]), int(s.capacity[code])
        st, ln = s.extent_starts[code], s.extent_lengths[code]
        if not 0 <= count <= min(st.size, ln.size):
            _fail("free_list", f"{_seg_name(m, code)}: extent count {count} outside its buffers")
        st, ln = st[:count], ln[:count]
        end = st + ln
        problems = (("an empty or negative extent", ln <= 0),
                    ("an extent outside the capacity", (st < 0) | (end > cap)),
                    ("extents out of order or overlapping", np.r_[False, st[1:] < end[:-1]]),
                    ("adjacent extents not coalesced", np.r_[False, st[1:] == end[:-1]]))
        for what, mask in problems:
            if mask.any():
                i = int(np.flatnonzero(mask)[0])
                _fail("free_list", f"{_seg_name(m, code)}: {what} at free extent {i} "
                                   f"[{int(st[i])}, {int(end[i])}) (capacity {cap})")
        free[code] = int(ln.sum())
        if s.allocatable[code]:  # see the module docstring: only these keep an exact free list
            starts[code], ends[code] = st, end
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum([a.size for a in starts], out=bounds[1:])
    return np.concatenate(starts), np.concatenate(ends), bounds, free


def _sorted_discarded(m: "MasterService", n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discarded extents as (offsets, held ends, per-segment bounds), sorted by (segment, offset)."""
    s = m.segments
    seg = m._discarded_seg.astype(np.int64)
    order = np.lexsort((m._discarded_off, seg))
    seg, off, size = seg[order], m._discarded_off[order].astype(np.int64), m._discarded_size[order]
    end = ak.held_end(off, size.astype(np.int64), s.unit_bits[seg], s.capacity[seg]) if seg.size else off
    return off, end.astype(np.int64), np.searchsorted(seg, np.arange(n + 1)).astype(np.int64)


def _check_allocators(m: "MasterService", ascending: np.ndarray) -> None:
    o, s = m.objects, m.segments
    f_off, f_end, f_bounds, free = _check_free_lists(m)
    n = free.size
    d_off, d_end, d_bounds = _sorted_discarded(m, n)
    extents = (f_off, f_end, f_bounds, d_off, d_end, d_bounds)
    state = _walk_state(n, f_off, f_bounds, d_off, d_bounds)
    cap, units, alloc = s.capacity[:n], s.unit_bits[:n], s.allocatable[:n]
    cols = (o.high_water, o.replica_status, o.replica_kind, o.replica_segment, o.replica_offset, o.size_bytes)
    if ascending.all():  # the usual case: no gathered copy of the extents at all
        err = _tile_rows(*cols, units, cap, alloc, *extents, state)
    else:
        starts, ends, bounds = _gather_held(*cols, units, cap)
        for code in np.flatnonzero(~ascending):  # sort only the segments that need it
            lo, hi = bounds[code], bounds[code + 1]
            starts[lo:hi].sort()
            ends[lo:hi].sort()
        err = _tile_sorted(starts, ends, bounds, cap, alloc, *extents, state)
    for k, check in enumerate(_TILING_CHECKS):
        if err[k, 0] >= 0:
            _fail(check, _tiling_message(m, k, int(err[k, 0]), int(err[k, 1])))
    held = state[:, _HELD]
    for code, info in enumerate(s.info):
        if info is None:
            continue
        used, c = int(s.used[code]), int(cap[code])
        if alloc[code] and used != int(held[code]):
            _fail("segment_used", f"{_seg_name(m, code)}: used {used} != held {int(held[code])}")
        if used + int(free[code]) != c:
            _fail("segment_used", f"{_seg_name(m, code)}: used {used} + free {int(free[code])} != capacity {c}")


def _tiling_message(m: "MasterService", kind: int, code: int, at: int) -> str:
    if kind == _T_GAP:
        return f"{_seg_name(m, code)}: offset {at} is neither held nor free"
    rows = _rows_at(m, code, at)
    who = ", ".join(_row_name(m, r) for r in rows[:2]) if rows.size else "a discarded extent"
    what = "two held extents overlap" if kind == _T_OVERLAP else "a held extent overlaps free space"
    return f"{_seg_name(m, code)}: {what} at offset {at} ({who})"


def _rows_at(m: "MasterService", code: int, at: int) -> np.ndarray:
    """Rows holding a memory extent of segment ``code`` that covers byte ``at`` (error path)."""
    o, s = m.objects, m.segments
    hw = o.high_water
    seg, off = o.replica_segment[:hw], o.replica_offset[:hw]
    end = off + o.size_bytes[:hw, None]
    on = (o.replica_status[:hw] != 0) & (o.replica_kind[:hw] == _MEM) & (seg == code)
    hit = on & (off <= at) & (end > at)
    if not hit.any():  # the extent starting there may cover only its rounded-up unit
        hit = on & (off <= at) & (ak.held_end(off, np.broadcast_to(o.size_bytes[:hw, None], off.shape),
                                               s.unit_bits[code], s.capacity[code]) > at)
    return np.flatnonzero(hit.any(axis=1))


# ================================================================================ key index
@njit(cache=True, nogil=True, parallel=True)
def _check_key_refs(hw, flags, key_refs, row_tenant, arena_used, n_tenants):
    """First LIVE row whose key reference lies outside the arena or tenant is unknown, or -1."""
    step = (hw + _CHUNKS - 1) // _CHUNKS
    bad = np.full(_CHUNKS, -1, np.int64)
    for c in prange(_CHUNKS):
        for r in range(c * step, min(hw, (c + 1) * step)):
            if not is_live(flags[r]):
                continue
            ref = key_refs[r]
            off = hk.ref_offset(ref)
            ln = hk.ref_length(ref)
            t = row_tenant[r]
            if ln == 0 or off < 0 or off + ln > arena_used or t < 0 or t >= n_tenants:
                bad[c] = r
                break
    for c in range(_CHUNKS):
        if bad[c] >= 0:
            return bad[c]
    return -1


_NOT_LIVE = np.uint32(0xFFFFFFFF)  # above every 31-bit tag


@njit(cache=True, nogil=True, parallel=True)
def _row_tags(hw, flags, key_refs, row_tenant, arena):
    """The index tag (hashing.hash_tag of hashing.hash_key) of every LIVE row, _NOT_LIVE for the
    others, in row order: a sequential pass over the key bytes. The index scan then reads one
    array per slot instead of two (its row accesses are the random ones)."""
    tags = np.empty(hw, np.uint32)
    step = (hw + _CHUNKS - 1) // _CHUNKS
    for c in prange(_CHUNKS):
        for r in range(c * step, min(hw, (c + 1) * step)):
            if is_live(flags[r]):  # a free row's key_ref is stale: never read through it
                ref = key_refs[r]
                tags[r] = hk.hash_tag(hk.hash_key(arena, hk.ref_offset(ref), hk.ref_length(ref), row_tenant[r]))
            else:
                tags[r] = _NOT_LIVE
    return tags


@njit(inline="always", cache=True)
def _same_key(arena, ref_a, tenant_a, ref_b, tenant_b):
    """Two rows hold the same (tenant, key) (rows whose refs are known to lie in the arena)."""
    if tenant_a != tenant_b:
        return False
    n = hk.ref_length(ref_a)
    if hk.ref_length(ref_b) != n:
        return False
    a, b = hk.ref_offset(ref_a), hk.ref_offset(ref_b)
    for i in range(n):
        if arena[a + i] != arena[b + i]:
            return False
    return True


_IX_OK, _IX_SLOT, _IX_LOOKUP, _IX_FULL = 0, 1, 2, 3


@njit(inline="always", cache=True)
def _earlier_equal_key(table, i, home, mask, v, arena, key_refs, row_tenant, tags, hw):
    """Does a slot of the probe run from ``home`` up to slot i hold another row with slot i's
    (tenant, key)? Then a lookup stops there first (only tag matches compare key bytes). A slot
    naming no LIVE row is skipped here: its own visit reports it, and its key is not read."""
    r = v & _ROW_MASK
    p = home
    while p != i:
        w = table[p]
        if (w >> 32) == (v >> 32):
            other = w & _ROW_MASK
            if other < hw and tags[other] != _NOT_LIVE:
                if _same_key(arena, key_refs[r], row_tenant[r], key_refs[other], row_tenant[other]):
                    return True
        p = (p + 1) & mask
    return False


@njit(cache=True, nogil=True, parallel=True)
def _scan_index(table, tags, hw, key_refs, row_tenant, arena):
    """One sequential pass over the index table (regions in parallel). A lookup of row r's own
    key (hashing.find_row) finds r exactly when: r's slot holds r's tag, r's home slot (its
    tag's low bits) lies in the same run of occupied slots at or before it, and no earlier slot
    of that run holds an equal key. Returns (occupied slots, first bad slot or -1, problem)."""
    size = table.shape[0]
    mask = size - 1
    regions = min(_CHUNKS, size)
    step = size // regions  # sizes are powers of two
    bad = np.full(regions, -1, np.int64)
    problem = np.zeros(regions, np.int64)
    count = np.zeros(regions, np.int64)
    for g in prange(regions):
        lo = g * step
        run = lo  # the run holding slot lo starts after the last empty slot before it
        for back in range(1, size + 1):
            if table[(lo - back) & mask] == hk.EMPTY_SLOT:
                run = (lo - back + 1) & mask
                break
            if back == size:
                run = -1  # no empty slot at all: a probe for a missing key would never end
        if run < 0:
            bad[g] = lo
            problem[g] = _IX_FULL
            continue
        n = 0
        for i in range(lo, lo + step):
            v = table[i]
            if v == hk.EMPTY_SLOT:
                run = (i + 1) & mask
                continue
            r = v & _ROW_MASK
            if v < 0 or r >= hw or tags[r] == _NOT_LIVE:
                bad[g] = i
                problem[g] = _IX_SLOT
                break
            tag = v >> 32
            home = tag & mask
            if tag != tags[r] or ((i - home) & mask) > ((i - run) & mask):
                bad[g] = i
                problem[g] = _IX_LOOKUP
                break
            if _earlier_equal_key(table, i, home, mask, v, arena, key_refs, row_tenant, tags, hw):
                bad[g] = i
                problem[g] = _IX_LOOKUP
                break
            n += 1
        count[g] = n
    for g in range(regions):
        if bad[g] >= 0:
            return count.sum(), bad[g], problem[g]
    return count.sum(), -1, _IX_OK


def _check_key_index(m: "MasterService") -> None:
    o, k = m.objects, m.keys
    hw = o.high_water
    if k.count != o.live_count:
        _fail("index_count", f"key index count {k.count} != live_count {o.live_count}")
    if not 0 <= k.arena_used <= k.arena.size:
        _fail("key_ref", f"arena_used {k.arena_used} outside the arena of {k.arena.size} bytes")
    r = _check_key_refs(hw, o.flags, o.key_ref, o.tenant, k.arena_used, len(m.tenants))
    if r >= 0:
        _fail("key_ref", f"row {r}: key_ref {int(o.key_ref[r]):#x} / tenant code {int(o.tenant[r])} "
                         f"outside the arena ({k.arena_used} bytes) or the tenant dictionary")
    tags = _row_tags(hw, o.flags, o.key_ref, o.tenant, k.arena)
    occupied, slot, problem = _scan_index(k.table, tags, hw, o.key_ref, o.tenant, k.arena)
    if problem == _IX_FULL:
        _fail("index_count", f"index table of {k.table.size} slots has no empty slot")
    if problem == _IX_SLOT:
        v = int(k.table[slot])
        _fail("index_slot", f"index slot {slot} holds {v:#x}: row {v & 0xFFFFFFFF} is not a LIVE row")
    if problem == _IX_LOOKUP:
        _fail("index_lookup", f"{_row_name(m, int(k.table[slot]) & 0xFFFFFFFF)} (index slot {slot}) is not "
                              f"found by its own key")
    if occupied != o.live_count:  # every slot holds a distinct LIVE row: some LIVE row is missing
        indexed = np.zeros(hw, np.bool_)
        indexed[hk.slot_rows(k.table)] = True
        missing = np.flatnonzero(((o.flags[:hw] & FLAG_LIVE) != 0) & ~indexed)
        who = _row_name(m, int(missing[0])) if missing.size else "a LIVE row"
        _fail("index_lookup", f"{occupied} index entries for {o.live_count} LIVE rows: {who} is not found "
                              f"by its own key")


# ================================================================================ in-flight
@njit(cache=True, nogil=True)
def _claim_slots(hw, flags, inflight, in_use, owner, claims):
    """Count the LIVE rows holding each in-flight slot. (0, -1) or (problem, row): 1 PROCESSING
    without a slot, 2 slot out of range, 3 a slot without PROCESSING, 4 the slot is free,
    5 a second row claims the slot, 6 the slot names another owner row, 7 a freed row keeps a
    slot (release_rows drops it, so background work can never reach a freed row)."""
    cap = in_use.shape[0]
    for r in range(hw):
        f = flags[r]
        slot = inflight[r]
        if not is_live(f):
            if slot != -1:
                return 7, r
            continue
        if slot == -1:
            if is_put_in_flight(f):
                return 1, r
            continue
        if slot < 0 or slot >= cap:
            return 2, r
        if not is_put_in_flight(f):
            return 3, r
        if not in_use[slot]:
            return 4, r
        claims[slot] += 1
        if claims[slot] > 1:
            return 5, r
        if owner[slot] != r:
            return 6, r
    return 0, -1


def _check_inflight_table(m: "MasterService") -> None:
    """The InflightTable's own bookkeeping: its free stack is the exact complement of the in-use
    slots, and only in-use slots name an owner row."""
    t = m.inflight
    cap = t.in_use.size
    if not 0 <= t.free_count <= min(cap, t.free_slots.size):
        _fail("inflight_slots", f"free_count {t.free_count} outside [0, capacity {cap}]")
    free = t.free_slots[:t.free_count]
    if free.size and (free.min() < 0 or free.max() >= cap):
        _fail("inflight_slots", f"free slot stack holds a slot outside [0, {cap})")
    if t.in_use[free].any():
        _fail("inflight_slots", f"slot {int(free[t.in_use[free]][0])} is both free and in use")
    if np.bincount(free, minlength=1).max() > 1:
        _fail("inflight_slots", f"slot {int(np.argmax(np.bincount(free)))} is on the free stack twice")
    in_use = int(np.count_nonzero(t.in_use))
    if in_use + t.free_count != cap:
        _fail("inflight_slots", f"{in_use} in-use + {t.free_count} free slots != capacity {cap}")
    stray = np.flatnonzero(~t.in_use & (t.row[:cap] != -1))
    if stray.size:
        _fail("inflight_slots", f"free slot {int(stray[0])} still names owner row {int(t.row[stray[0]])}")


def _check_inflight(m: "MasterService") -> None:
    t, o = m.inflight, m.objects
    _check_inflight_table(m)
    cap = t.in_use.size
    claims = np.zeros(cap, np.int32)
    problem, r = _claim_slots(o.high_water, o.flags, o.inflight, t.in_use, t.row, claims)
    if problem:
        slot = int(o.inflight[r])
        what = {1: "is PROCESSING without an in-flight slot", 2: f"points at slot {slot} (out of range)",
                3: f"holds in-flight slot {slot} but is not PROCESSING",
                4: f"points at free in-flight slot {slot}",
                5: f"claims in-flight slot {slot}, which another LIVE row already holds",
                6: f"claims in-flight slot {slot}, whose owner is row {int(t.row[max(slot, 0)])}",
                7: f"is free but keeps in-flight slot {slot}"}[problem]
        _fail("inflight_claim" if problem in (5, 6) else "inflight_row", f"{_row_name(m, r)} {what}")
    orphan = np.flatnonzero(t.in_use & (claims == 0))
    if orphan.size:
        s = int(orphan[0])
        _fail("inflight_claim", f"in-flight slot {s} is in use (owner row {int(t.row[s])}) but no LIVE row "
                                f"holds it")


# ================================================================================ groups
@njit(cache=True, nogil=True)
def _link_pass(hw, flags, group, group_next, n_groups, members, indegree):
    """Per LIVE row: a grouped row's code is known and its successor is a LIVE member of the
    same group; an ungrouped row points at itself. Counts members and predecessors.
    (0, -1) or (problem, row): 1 bad code, 2 successor outside the group, 3 ungrouped not self."""
    for r in range(hw):
        f = flags[r]
        if not is_live(f):
            continue
        nxt = np.int64(group_next[r])
        if not is_grouped(f):
            if nxt != r:
                return 3, r
            continue
        g = group[r]
        if g < 0 or g >= n_groups:
            return 1, r
        if nxt < 0 or nxt >= hw:
            return 2, r
        fn = flags[nxt]
        if not is_live(fn) or not is_grouped(fn) or group[nxt] != g:
            return 2, r
        members[g] += 1
        indegree[nxt] += 1
    return 0, -1


@njit(cache=True, nogil=True)
def _walk_groups(group_head, group_next, flags, group, members, hw):
    """(0, -1) or (problem, group code): 1 head invalid, 2 the members are not one cycle.
    group_next is a permutation of the grouped rows here, so a walk from the head returns to it."""
    for g in range(group_head.shape[0]):
        h = group_head[g]
        if g >= members.shape[0] or members[g] == 0:
            if h != -1:
                return 1, g
            continue
        if h < 0 or h >= hw:
            return 1, g
        if not is_live(flags[h]) or not is_grouped(flags[h]) or group[h] != g:
            return 1, g
        n = 1
        r = np.int64(group_next[h])
        while r != h:
            n += 1
            r = np.int64(group_next[r])
        if n != members[g]:
            return 2, g
    return 0, -1


def _check_groups(m: "MasterService") -> None:
    o = m.objects
    hw = o.high_water
    n_groups = len(m._group_names)
    if len(m.groups) != n_groups or m.group_head.size < n_groups:
        _fail("group_head", f"{len(m.groups)} group codes, {n_groups} names, {m.group_head.size} heads")
    members = np.zeros(max(1, n_groups), np.int64)
    indegree = np.zeros(hw, np.int32)
    problem, r = _link_pass(hw, o.flags, o.group, o.group_next, n_groups, members, indegree)
    if problem:
        what = {1: f"has unknown group code {int(o.group[r])}",
                2: f"links to row {int(o.group_next[r])}, not a LIVE member of its group {int(o.group[r])}",
                3: f"is ungrouped but links to row {int(o.group_next[r])}"}[problem]
        _fail("group_member" if problem < 3 else "group_link", f"{_row_name(m, r)} {what}")
    grouped = (o.flags[:hw] & (FLAG_LIVE | FLAG_GROUPED)) == (FLAG_LIVE | FLAG_GROUPED)
    bad = np.flatnonzero(grouped & (indegree != 1))
    if bad.size:
        r = int(bad[0])
        _fail("group_link", f"{_row_name(m, r)} has {int(indegree[r])} predecessors in its group list")
    problem, g = _walk_groups(m.group_head, o.group_next, o.flags, o.group, members[:n_groups], hw)
    if problem:
        name = m._group_names[g] if g < n_groups else "?"
        what = (f"head {int(m.group_head[g])} is not a LIVE member" if problem == 1
                else f"the {int(members[g])} members are not one circular list")
        _fail("group_head" if problem == 1 else "group_link", f"group {g} ({name!r}): {what}")


# ================================================================================ ledger, ids
@njit(cache=True, nogil=True)
def _ledger_sums(hw, flags, tenant, size, status, kind, n_tenants):
    """quota.TenantLedger.charge over every LIVE row: (pending, committed, bad row or -1)."""
    pending = np.zeros(n_tenants, np.int64)
    committed = np.zeros(n_tenants, np.int64)
    for r in range(hw):
        if not is_live(flags[r]):
            continue
        t = tenant[r]
        if t < 0 or t >= n_tenants:
            return pending, committed, r
        for j in range(status.shape[1]):
            if kind[r, j] != _MEM:
                continue
            if status[r, j] == _ST_PROCESSING:
                pending[t] += size[r]
            elif status[r, j] == _ST_COMPLETE:
                committed[t] += size[r]
    return pending, committed, -1


def _check_ledger(m: "MasterService") -> None:
    if not m.config.enable_multi_tenants:
        return
    o, ledger = m.objects, m.ledger
    n = max(len(m.tenants), ledger.pending.size, ledger.committed.size)
    pending, committed, r = _ledger_sums(o.high_water, o.flags, o.tenant, o.size_bytes, o.replica_status,
                                         o.replica_kind, n)
    if r >= 0:
        _fail("tenant_ledger", f"row {r} has unknown tenant code {int(o.tenant[r])}")
    for name, want in (("pending", pending), ("committed", committed)):
        have = np.zeros(n, np.int64)
        got = getattr(ledger, name)
        have[:got.size] = got
        bad = np.flatnonzero(have != want)
        if bad.size:
            t = int(bad[0])
            who = repr(m.tenants.name(t)) if t < len(m.tenants) else f"code {t}"
            _fail("tenant_ledger", f"tenant {who}: {name} is {int(have[t])}, its LIVE rows hold {int(want[t])}")


@njit(cache=True, nogil=True)
def _first_duplicate_id(hw, status, rep_id, words):
    """(row, slot) of the first in-use slot whose id an earlier slot already has, via a bitmap
    over [0, next id) (ids were range-checked by _slot_pass), or (-1, -1)."""
    seen = np.zeros(words, np.uint64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] == 0:
                continue
            i = rep_id[r, j]
            w = np.int64(i >> np.uint64(6))
            b = np.uint64(1) << (i & np.uint64(63))
            if seen[w] & b:
                return r, j
            seen[w] |= b
    return -1, -1


def _check_replica_ids(m: "MasterService") -> None:
    o = m.objects
    hw = o.high_water
    in_use = int(np.count_nonzero(o.replica_status[:hw]))
    if m.next_replica_id <= 64 * (in_use + (1 << 20)):  # a bitmap of at most ~8 bytes per replica
        r, j = _first_duplicate_id(hw, o.replica_status, o.replica_id, (m.next_replica_id + 63) // 64)
        if r < 0:
            return
    else:  # ids spread far wider than the replicas: sort instead
        ids = o.replica_id[:hw][o.replica_status[:hw] != 0]
        ids.sort()
        dup = np.flatnonzero(ids[1:] == ids[:-1])
        if not dup.size:
            return
        hit = (o.replica_id[:hw] == ids[dup[0]]) & (o.replica_status[:hw] != 0)
        r, j = (int(x[0]) for x in np.nonzero(hit))
    _fail("replica_id_unique", f"{_row_name(m, int(r))} slot {int(j)}: replica id {int(o.replica_id[r, j])} "
                               f"is used twice")


# ================================================================================ entry point
def verify_engine(m: "MasterService") -> None:
    """Raise EngineInvariantError naming the first broken invariant (caller holds the lock)."""
    _check_segment_registry(m)
    _check_rows(m)
    ascending = _check_slots(m)
    _check_allocators(m, ascending)
    _check_key_index(m)
    _check_inflight(m)
    _check_groups(m)
    _check_ledger(m)
    _check_replica_ids(m)
