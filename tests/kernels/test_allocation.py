"""Batch frees of the extent allocator: any order of the same extents gives the same free list."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import allocation as ak
from mooncake_columnar.kernels.dispatch import BATCH_MIN
from mooncake_columnar.store.free_extents import FreeExtents
from mooncake_columnar.store.segments import Segment, SegmentTable

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


def _allocated(sizes: list[int], segments: int) -> tuple[SegmentTable, np.ndarray, np.ndarray, np.ndarray]:
    table = SegmentTable()
    for s in range(segments):
        table.mount(Segment(f"seg{s}", f"ep{s}", "c", 0, 1 << 20))
    segs, offs = [], []
    for i, size in enumerate(sizes):
        s = i % segments
        segs.append(s)
        offs.append(ak.alloc_first_fit(*table.extents.arrays(), table.unit_bits, table.capacity, s, size))
        table.used[s] += size
    return table, np.array(segs, np.int64), np.array(offs, np.int64), np.array(sizes, np.int64)


def _free_list(table: SegmentTable, s: int) -> list[tuple[int, int]]:
    return list(zip(*(a.tolist() for a in table.extents.of(s))))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 4096), min_size=1, max_size=60), segments=st.integers(1, 3),
       data=st.data())
def test_batch_free_in_any_order_matches_ascending_order(sizes, segments, data):
    """Extents listed in row order (offsets ascending per segment: the counting-sort path) and
    shuffled (the comparison-sort path) free to identical, fully coalesced free lists."""
    picks = data.draw(st.lists(st.integers(0, len(sizes) - 1), unique=True, min_size=1))
    results = []
    for shuffle in (False, True):
        table, segs, offs, lens = _allocated(sizes, segments)
        order = np.array(picks) if shuffle else np.sort(picks)
        assert table.extents.free_many(segs[order], offs[order], lens[order], table.used, table.unit_bits,
                                       table.capacity) == 0
        results.append(([_free_list(table, s) for s in range(segments)], table.used[:segments].tolist()))
    assert results[0] == results[1]
    # freeing everything that is left restores one extent per segment
    table, segs, offs, lens = _allocated(sizes, segments)
    table.extents.free_many(segs, offs, lens, table.used, table.unit_bits, table.capacity)
    assert [_free_list(table, s) for s in range(segments)] == [[(0, 1 << 20)]] * segments


def test_double_free_is_rejected_not_merged():
    table, segs, offs, lens = _allocated([100, 200], 1)
    again = np.array([0, 0], np.int64)
    bad = table.extents.free_many(segs[again], offs[again], lens[again], table.used, table.unit_bits, table.capacity)
    assert bad == 2 and table.used[0] == 300


def test_a_batch_merges_its_segments_in_parallel_and_rejects_only_the_segment_that_overlaps():
    """A batch (the parallel merge, one segment per thread) frees exactly what freeing each
    segment's share alone does; a double free in one segment rejects that segment's share
    whole and leaves the others merged."""
    table, segs, offs, lens = _allocated([64] * 15_000, 3)
    picks = np.arange(0, segs.size, 2)
    again = picks[segs[picks] == 1][:5]  # five of segment 1's extents named twice
    batch = np.concatenate((picks, again))
    assert batch.size >= BATCH_MIN
    bad = table.extents.free_many(segs[batch], offs[batch], lens[batch], table.used, table.unit_bits, table.capacity)
    assert bad == int(np.count_nonzero(segs[batch] == 1))
    alone, *_ = _allocated([64] * 15_000, 3)
    for s in (0, 2):
        share = picks[segs[picks] == s]
        assert share.size < BATCH_MIN  # the serial variant
        assert alone.extents.free_many(segs[share], offs[share], lens[share], alone.used, alone.unit_bits,
                                       alone.capacity) == 0
    assert [_free_list(table, s) for s in range(3)] == [_free_list(alone, s) for s in range(3)]
    assert table.used[:3].tolist() == alone.used[:3].tolist()


def test_a_region_that_outgrows_its_room_keeps_every_segments_free_list():
    """Freeing every other replica of segment 0 needs more room than its region has: the pool is
    rebuilt, and both segments' free lists (and the one-at-a-time free path) come out exact."""
    table, segs, offs, lens = _allocated([64] * 40, 2)
    room = int(table.extents.room[0])
    odd = np.flatnonzero(segs == 0)[::2]
    assert table.extents.free_many(segs[odd], offs[odd], lens[odd], table.used, table.unit_bits,
                                   table.capacity) == 0
    assert int(table.extents.room[0]) > room
    assert _free_list(table, 0) == [(int(o), 64) for o in offs[odd]] + [(64 * 20, (1 << 20) - 64 * 20)]
    assert _free_list(table, 1) == [(64 * 20, (1 << 20) - 64 * 20)]
    one = np.flatnonzero(segs == 1)[::2]
    for o in offs[one]:
        table.free(1, int(o), 64)
    assert _free_list(table, 1) == [(int(o), 64) for o in offs[one]] + [(64 * 20, (1 << 20) - 64 * 20)]
    assert _free_list(table, 0)[0] == (0, 64)


def test_regions_that_all_grow_again_and_again_keep_their_extents_and_the_pool_stays_small():
    """Every segment's free list grows at each eviction of random objects: each growth keeps
    every region's extents, and the pool never holds much more than the rooms (a new pool
    drops the space that moved regions left behind)."""
    ext = FreeExtents(4)
    want: list[list[int]] = [[] for _ in range(4)]
    for step in range(12):
        grow = np.array([3, 50, 0, 7]) * (step + 1) ** 2
        ext.make_room(ext.count + grow)
        for c in range(4):
            b, n = int(ext.base[c]), int(ext.count[c])
            new = list(range(len(want[c]), len(want[c]) + int(grow[c])))
            ext.start[b + n:b + n + len(new)] = new
            ext.length[b + n:b + n + len(new)] = [v + c for v in new]
            ext.count[c] += len(new)
            want[c] += new
        for c in range(4):
            starts, lengths = ext.of(c)
            assert starts.tolist() == want[c] and lengths.tolist() == [v + c for v in want[c]]
        assert (ext.room >= ext.count).all() and (ext.room <= np.maximum(2 * ext.count, 8) + 2 * grow).all()
        assert ext.start.size <= 1.5 * ext.room.sum() + 1, (step, ext.start.size, ext.room.sum())


@pytest.mark.parametrize("n", [7, 5000])  # the serial variant (one remove) and the parallel one
@pytest.mark.parametrize("shuffled", [False, True])
def test_a_slot_clear_returns_its_extents_grouped_by_segment_in_input_order(n, shuffled):
    """The slots set in a (row, slot) matrix are cleared, each row's in slot order; rows with
    none, one and both slots set; unset slots keep their replicas."""
    from mooncake_columnar.kernels import objects as ko
    from mooncake_columnar.schema import KIND_LOCAL_DISK, KIND_MEMORY, ST_COMPLETE, ST_EMPTY

    rng = np.random.default_rng(n + shuffled)
    rows = np.arange(n, dtype=np.int64) * 2
    if shuffled:
        rng.shuffle(rows)
    mask = rng.random((n, 2)) < 0.6
    allocatable = np.array([True, False, True, True, True])
    status = np.full((2 * n, 2), int(ST_COMPLETE), np.uint8)
    kind = np.where(rng.random((2 * n, 2)) < 0.9, int(KIND_MEMORY), int(KIND_LOCAL_DISK)).astype(np.uint8)
    seg = rng.integers(-1, 5, (2 * n, 2)).astype(np.int16)
    offset = (np.arange(4 * n, dtype=np.uint32) * 3).reshape(2 * n, 2)  # grows with the row
    sizes = rng.integers(1, 100, 2 * n)
    unit_bits = np.array([0, 0, 2, 0, 1], np.uint8)
    r_idx, slots = np.nonzero(mask)
    set_rows = rows[r_idx]
    frees = [(int(seg[r, j]), int(offset[r, j]) << int(unit_bits[seg[r, j]]), int(sizes[r]))
             for r, j in zip(set_rows.tolist(), slots.tolist()) if kind[r, j] == KIND_MEMORY and seg[r, j] >= 0
             and allocatable[seg[r, j]]]
    want = sorted(frees, key=lambda e: e[0])  # stable: input order within a segment
    want_ascending = all(a[1] < b[1] for a, b in zip(want, want[1:]) if a[0] == b[0])
    dropped_want = int(sizes[set_rows].sum())
    kept_status, kept_seg = status[rows][~mask], seg[rows][~mask]

    buffers = np.full(set_rows.size + 3, -7, np.int64), np.full(set_rows.size + 3, -7, np.int64)  # longer than needed
    per_segment, offs, lens, ascending, dropped = ko.clear_slots(rows, mask, allocatable, sizes, status, kind, seg,
                                                                 offset, unit_bits, *buffers)
    assert all(np.shares_memory(out, buffer) for out, buffer in zip((offs, lens), buffers))  # written in place
    segs = np.repeat(np.arange(per_segment.size), per_segment)
    assert per_segment.size == allocatable.size
    assert list(zip(segs.tolist(), offs.tolist(), lens.tolist())) == want
    assert bool(ascending) == want_ascending
    assert want_ascending if not shuffled else (n < 100 or not want_ascending)  # both answers are checked
    assert int(dropped) == dropped_want
    assert (status[set_rows, slots] == ST_EMPTY).all() and (seg[set_rows, slots] == -1).all()
    assert np.array_equal(status[rows][~mask], kept_status) and np.array_equal(seg[rows][~mask], kept_seg)
