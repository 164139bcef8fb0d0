"""Replica slots and allocators: extents inside their segments, aligned, tiling the free lists."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..kernels.jit import njit
from ..clock import INT64_MAX
from ..kernels import allocation as ak
from ..kernels.predicates import memory_replica_on_mask

from .report import MEM, EMPTY, fail, row_name, seg_name

if TYPE_CHECKING:
    from .engine import Engine


# ================================================================================ replica slots
_SLOT_OK, _SLOT_ROW, _SLOT_ID, _SLOT_SEG, _SLOT_EXTENT = 0, 1, 2, 3, 4
_SLOT_CHECKS = {_SLOT_ROW: "replica_row", _SLOT_ID: "replica_id", _SLOT_SEG: "replica_segment",
                _SLOT_EXTENT: "replica_extent"}


@njit(inline="always", cache=True)
def _extent_problem(o, z, capacity):
    """A memory extent of ``z`` bytes at ``o`` on a segment: inside it (on a unit boundary by
    construction: a slot holds its offset in units). Scalars only (see _step); one test per
    `if` (see kernels.predicates)."""
    if z <= 0:
        return _SLOT_EXTENT
    if o > capacity - z:
        return _SLOT_EXTENT
    return _SLOT_OK


@njit(cache=True, nogil=True)
def _slot_pass(hw, owned, status, kind, seg, off, size, rep_id, next_id, mounted, capacity, unit_bits):
    """Validate every in-use slot of rows [0, hw) in row order (``owned``: the LIVE rows and
    their continuation rows, the only rows that may hold slots). Returns (problem, row, slot,
    per-segment ascending): ascending[s] says the memory replicas of segment s appear in strictly
    increasing offset order by row (bulk loads and restores allocate so), which lets the extent
    check stream the columns instead of gathering and sorting."""
    n_codes = mounted.shape[0]
    last = np.full(n_codes, -1, np.int64)
    ascending = np.ones(n_codes, np.bool_)
    for r in range(hw):
        live = owned[r]
        for j in range(status.shape[1]):
            if status[r, j] == EMPTY:
                continue
            if not live:
                return _SLOT_ROW, r, j, ascending
            if rep_id[r, j] == 0:
                return _SLOT_ID, r, j, ascending
            if rep_id[r, j] >= next_id:
                return _SLOT_ID, r, j, ascending
            if kind[r, j] != MEM:
                continue
            s = np.int64(seg[r, j])
            if s < 0 or s >= n_codes:
                return _SLOT_SEG, r, j, ascending
            if not mounted[s]:
                return _SLOT_SEG, r, j, ascending
            o = np.int64(off[r, j]) << unit_bits[s]  # replica_offset: in units (ak.offset_shift)
            problem = _extent_problem(o, size[r], capacity[s])
            if problem != _SLOT_OK:
                return problem, r, j, ascending
            if o <= last[s]:
                ascending[s] = False
            last[s] = o
    return _SLOT_OK, -1, -1, ascending


def _mounted_mask(m: "Engine") -> np.ndarray:
    s = m.store.segments
    mounted = np.zeros(max(1, len(s.info)), np.bool_)
    mounted[[c for c, i in enumerate(s.info) if i is not None]] = True
    return mounted


def check_slots(m: "Engine", owned: np.ndarray | None = None) -> np.ndarray:
    """Every in-use slot and discarded extent; returns the per-segment ascending flags.
    ``owned``: the rows that may hold slots (from check_rows, which runs it when not given)."""
    if owned is None:
        from .rows import check_rows
        owned = check_rows(m)
    o, s = m.store.objects, m.store.segments
    mounted = _mounted_mask(m)
    n = mounted.size
    problem, r, j, ascending = _slot_pass(
        o.high_water, owned, o.replica_status, o.replica_kind, o.replica_segment, o.replica_offset,
        o.size_bytes, o.replica_id, np.uint64(m.store.next_replica_id), mounted, s.capacity[:n], s.unit_bits[:n])
    if problem:
        code = int(o.replica_segment[r, j])
        fail(_SLOT_CHECKS[problem],
              f"{row_name(m, r)} slot {j}: status {int(o.replica_status[r, j])}, kind "
              f"{int(o.replica_kind[r, j])}, replica id {int(o.replica_id[r, j])} (next "
              f"{m.store.next_replica_id}), {seg_name(m, code)}, offset column {int(o.replica_offset[r, j])}, "
              f"size {int(o.size_bytes[r])}")
    check_discarded(m, mounted)
    return ascending


def check_discarded(m: "Engine", mounted: np.ndarray) -> None:
    """The pending extents of abandoned puts obey the memory-slot rules (a few, vectorised)."""
    d = m.store.discarded
    seg, off, size = d.seg, d.off, d.size
    if not seg.size:
        return
    s = m.store.segments
    valid = (seg >= 0) & (seg < mounted.size)
    on = np.where(valid, seg, 0)
    bad = {"replica_segment": ~valid | ~mounted[on],
           "replica_extent": (size <= 0) | (off < 0) | (off > s.capacity[on] - size),
           "replica_alignment": (off & ((np.int64(1) << s.unit_bits[on]) - 1)) != 0}
    for check, mask in bad.items():
        if mask.any():
            i = int(np.flatnonzero(mask)[0])
            fail(check, f"discarded extent {i}: {seg_name(m, int(seg[i]))}, offset {int(off[i])}, "
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
        f = f_off[fi[s]] if fi[s] < f_bounds[s + 1] else INT64_MAX
        d = d_off[di[s]] if di[s] < d_bounds[s + 1] else INT64_MAX
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
    firsts = [np.where(b[1:] > b[:-1], np.append(off, INT64_MAX)[b[:-1]], INT64_MAX)
              for off, b in ((f_off, f_bounds), (d_off, d_bounds))]
    state[:, _NEXT] = np.minimum(*firsts)
    return state


@njit(cache=True, nogil=True)
def _finish(capacity, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err):
    """Visit what is left of every segment and demand the tiling reach its capacity."""
    for s in range(capacity.shape[0]):
        _advance(s, INT64_MAX - 1, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state,
                 allocatable, err)
        if allocatable[s] and state[s, _CURSOR] < capacity[s]:
            _record(err, _T_GAP, s, state[s, _CURSOR])


@njit(inline="always", cache=True)
def _held_step(o, e, cursor, after_free, allocatable):
    """One held extent [o, e) of a segment in the tiling walk (extents come in start order),
    once the free and discarded extents before it are visited: (problem or -1, where, new
    cursor, new after-free flag). Scalars only: the walk calls it per replica, and a helper that
    takes the walk's arrays costs Numba's reference counting of each, per call (20x the walk)."""
    k, new_cursor = _step(o, e, cursor, after_free != 0, allocatable)
    return k, (cursor if k == _T_GAP else o), new_cursor, (0 if e > cursor else after_free)


@njit(cache=True, nogil=True)
def _tile_rows(hw, status, kind, seg, off, size, unit_bits, capacity, allocatable,
               f_off, f_end, f_bounds, d_off, d_end, d_bounds, state):
    """The tiling walk straight over the replica columns, for segments whose replicas ascend
    in row order (checked by _slot_pass). Returns err: per problem kind (segment, offset)."""
    fi = f_bounds[:-1].copy()
    di = d_bounds[:-1].copy()
    err = np.full((3, 2), -1, np.int64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] == EMPTY:
                continue
            if kind[r, j] != MEM:
                continue
            s = np.int64(seg[r, j])
            o = np.int64(off[r, j]) << unit_bits[s]  # the column counts allocation units
            e = ak.held_end(o, size[r], unit_bits[s], capacity[s])
            if state[s, _NEXT] <= o:  # free or discarded extents come first (rare: once per extent)
                state[s, _NEXT] = _advance(s, o, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds,
                                           state, allocatable, err)
            k, at, state[s, _CURSOR], state[s, _AFTER_FREE] = _held_step(o, e, state[s, _CURSOR],
                                                                         state[s, _AFTER_FREE], allocatable[s])
            if k >= 0:
                _record(err, k, s, at)
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
            if status[r, j] != EMPTY and kind[r, j] == MEM:
                bounds[seg[r, j] + 1] += 1
    for s in range(n):
        bounds[s + 1] += bounds[s]
    fill = bounds[:-1].copy()
    starts = np.empty(bounds[n], np.int64)
    ends = np.empty(bounds[n], np.int64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] != EMPTY and kind[r, j] == MEM:
                s = seg[r, j]
                k = fill[s]
                starts[k] = np.int64(off[r, j]) << unit_bits[s]
                ends[k] = ak.held_end(starts[k], size[r], unit_bits[s], capacity[s])
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
            o, e = starts[i], ends[i]
            if state[s, _NEXT] <= o:
                state[s, _NEXT] = _advance(s, o, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds,
                                           state, allocatable, err)
            k, at, state[s, _CURSOR], state[s, _AFTER_FREE] = _held_step(o, e, state[s, _CURSOR],
                                                                         state[s, _AFTER_FREE], allocatable[s])
            if k >= 0:
                _record(err, k, s, at)
            state[s, _HELD] += e - o
    _finish(capacity, f_off, f_end, fi, f_bounds, d_off, d_end, di, d_bounds, state, allocatable, err)
    return err


def check_free_lists(m: "Engine") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each mounted segment's free list on its own. Returns the free extents of allocatable
    segments as flat (starts, ends, per-segment bounds) for the tiling walk (a region lookup
    per replica would cost more than the walk itself), and the free bytes per segment code."""
    s = m.store.segments
    n = max(1, len(s.info))
    free = np.zeros(n, np.int64)
    starts, ends = [np.zeros(0, np.int64)] * n, [np.zeros(0, np.int64)] * n
    for code, info in enumerate(s.info):  # one iteration per segment
        if info is None:
            continue
        count, cap, ex = int(s.extents.count[code]), int(s.capacity[code]), s.extents
        if not (0 <= count <= int(ex.room[code]) and 0 <= int(ex.base[code])
                and int(ex.base[code]) + int(ex.room[code]) <= min(ex.start.size, ex.length.size)):
            fail("free_list", f"{seg_name(m, code)}: extent count {count} outside its buffers")
        st, ln = ex.of(code)
        end = st + ln
        problems = (("an empty or negative extent", ln <= 0),
                    ("an extent outside the capacity", (st < 0) | (end > cap)),
                    ("extents out of order or overlapping", np.r_[False, st[1:] < end[:-1]]),
                    ("adjacent extents not coalesced", np.r_[False, st[1:] == end[:-1]]))
        for what, mask in problems:
            if mask.any():
                i = int(np.flatnonzero(mask)[0])
                fail("free_list", f"{seg_name(m, code)}: {what} at free extent {i} "
                                   f"[{int(st[i])}, {int(end[i])}) (capacity {cap})")
        free[code] = int(ln.sum())
        if s.allocatable[code]:  # see the module docstring: only these keep an exact free list
            starts[code], ends[code] = st, end
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum([a.size for a in starts], out=bounds[1:])
    return np.concatenate(starts), np.concatenate(ends), bounds, free


def _sorted_discarded(m: "Engine", n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discarded extents as (offsets, held ends, per-segment bounds), sorted by (segment, offset)."""
    s = m.store.segments
    d = m.store.discarded
    seg = d.seg.astype(np.int64)
    order = np.lexsort((d.off, seg))
    seg, off, size = seg[order], d.off[order].astype(np.int64), d.size[order]
    end = ak.held_end(off, size.astype(np.int64), s.unit_bits[seg], s.capacity[seg]) if seg.size else off
    return off, end.astype(np.int64), np.searchsorted(seg, np.arange(n + 1)).astype(np.int64)


def check_allocators(m: "Engine", ascending: np.ndarray) -> None:
    o, s = m.store.objects, m.store.segments
    f_off, f_end, f_bounds, free = check_free_lists(m)
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
        for unsorted in np.flatnonzero(~ascending):  # sort only the segments that need it
            lo, hi = bounds[unsorted], bounds[unsorted + 1]
            starts[lo:hi].sort()
            ends[lo:hi].sort()
        err = _tile_sorted(starts, ends, bounds, cap, alloc, *extents, state)
    for k, check in enumerate(_TILING_CHECKS):
        if err[k, 0] >= 0:
            fail(check, _tiling_message(m, k, int(err[k, 0]), int(err[k, 1])))
    held = state[:, _HELD]
    for code, info in enumerate(s.info):
        if info is None:
            continue
        used, c = int(s.used[code]), int(cap[code])
        if alloc[code] and used != int(held[code]):
            fail("segment_used", f"{seg_name(m, code)}: used {used} != held {int(held[code])}")
        if used + int(free[code]) != c:
            fail("segment_used", f"{seg_name(m, code)}: used {used} + free {int(free[code])} != capacity {c}")


def _tiling_message(m: "Engine", kind: int, code: int, at: int) -> str:
    if kind == _T_GAP:
        return f"{seg_name(m, code)}: offset {at} is neither held nor free"
    rows = _rows_at(m, code, at)
    who = ", ".join(row_name(m, r) for r in rows[:2]) if rows.size else "a discarded extent"
    what = "two held extents overlap" if kind == _T_OVERLAP else "a held extent overlaps free space"
    return f"{seg_name(m, code)}: {what} at offset {at} ({who})"


def _rows_at(m: "Engine", code: int, at: int) -> np.ndarray:
    """Rows holding a memory extent of segment ``code`` that covers byte ``at`` (error path)."""
    o, s = m.store.objects, m.store.segments
    hw = o.high_water
    seg, off = o.replica_segment[:hw], o.replica_offset[:hw].astype(np.int64) << s.unit_bits[code]
    end = off + o.size_bytes[:hw, None]
    on = memory_replica_on_mask(o.replica_status[:hw], o.replica_kind[:hw], seg, code)
    hit = on & (off <= at) & (end > at)
    if not hit.any():  # the extent starting there may cover only its rounded-up unit
        hit = on & (off <= at) & (ak.held_end(off, np.broadcast_to(o.size_bytes[:hw, None], off.shape),
                                               s.unit_bits[code], s.capacity[code]) > at)
    return np.flatnonzero(hit.any(axis=1))


