"""Batch frees of the extent allocator: any order of the same extents gives the same free list."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import allocation as ak
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
