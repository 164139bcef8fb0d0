"""kernels/index_load.py: the bulk-built key index answers lookups, inserts and deletes exactly
like one built by index_rows.insert_rows_unique, and reports duplicates instead of indexing them."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.kernels import index_rows
from mooncake_columnar.kernels import rebuild
from mooncake_columnar.kernels.index_load import (
    bulk_insert_unique,
    set_key_refs,
)
from mooncake_columnar.store.keys import string_buffers
from mooncake_columnar.tools.synthetic import synthetic_keys

from ..sizes import compiled_or_plain

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


def _keys(n: int, tenants: int = 3, seed: int = 0):
    """(offsets, arena, key_refs, tenant per row) of n distinct (tenant, key) pairs of mixed length."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, n)
    keys = [f"k{i}" * (1 + int(lengths[i]) // 8) for i in range(n)]
    keys[0] = ""  # an empty key is a key too
    arena = np.frombuffer("".join(keys).encode(), np.uint8).copy()
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([len(k) for k in keys])
    refs = np.empty(n, np.int64)
    assert set_key_refs(refs, np.arange(n), offsets, 0)
    return offsets, arena, refs, rng.integers(0, tenants, n).astype(np.int32)


def _table(n: int) -> np.ndarray:
    return np.full(1 << max(4, int(np.ceil(np.log2(n / 0.7)))), hk.EMPTY_SLOT, np.int64)


# the largest: many build windows (at least 8 of 4096 slots), so probes cross window ends
@pytest.mark.parametrize("n", [1, 1000, compiled_or_plain(70_000, 12_000)])
def test_bulk_index_answers_like_sequential_inserts(n: int) -> None:
    offsets, arena, refs, tenants = _keys(n)
    rows = np.random.default_rng(1).permutation(n).astype(np.int64)
    bulk, seq = _table(n), _table(n)
    assert bulk_insert_unique(bulk, rows, arena, refs, tenants) == -1
    assert index_rows.insert_rows_unique(seq, rows, arena, refs, tenants) == -1
    assert np.array_equal(np.sort(bulk), np.sort(seq))  # the same entries, maybe other slots
    for table in (bulk, seq):
        assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, arena, tenants), np.arange(n))
    # absent keys: another tenant, and keys never inserted
    assert (hk.find_rows(bulk, arena, refs, tenants, offsets, arena, tenants + 7) == -1).all()
    # deletes shift back correctly in the bulk-built table too
    gone = rows[: n // 2]
    index_rows.delete_rows(bulk, gone, arena, refs, tenants)
    found = hk.find_rows(bulk, arena, refs, tenants, offsets, arena, tenants)
    expect = np.arange(n)
    expect[gone] = -1
    assert np.array_equal(found, expect)


def test_bulk_index_reports_a_duplicate() -> None:
    last = compiled_or_plain(70_000, 12_000)  # (several build windows)
    keys = synthetic_keys(0, last)
    offsets, data = string_buffers(keys)
    arena = np.concatenate([data, data[32 * 123: 32 * 124]])  # row `last` repeats row 123's key
    offsets = np.append(offsets, offsets[-1] + 32)
    n = last + 1
    refs = np.empty(n, np.int64)
    assert set_key_refs(refs, np.arange(n), offsets, 0)
    tenants = np.zeros(n, np.int32)
    dup = bulk_insert_unique(_table(n), np.arange(n, dtype=np.int64), arena, refs, tenants)
    assert dup in (123, last)
    tenants[last] = 1  # the same bytes under another tenant are another key
    assert bulk_insert_unique(_table(n), np.arange(n, dtype=np.int64), arena, refs, tenants) == -1


@settings(max_examples=compiled_or_plain(60, 20), deadline=None)
@given(n=st.integers(1, 9000), load=st.floats(0.05, 0.97), n_dups=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_bulk_index_on_crowded_tables_matches_sequential_inserts(n: int, load: float, n_dups: int,
                                                                 seed: int) -> None:
    """Windows deferring probes past their end (and wrapping the table) still build a table that
    answers like sequential inserts, and duplicates are found wherever they land."""
    offsets, arena, refs, tenants = _keys(n, seed=seed)
    rng = np.random.default_rng(seed)
    size = 1 << max(4, int(np.ceil(np.log2(n / load))))
    copies = rng.integers(0, n, n_dups)  # rows n.. repeat the (tenant, key) of these rows
    rows = np.concatenate([np.arange(n), n + np.arange(n_dups)]).astype(np.int64)
    refs = np.concatenate([refs, refs[copies]])
    tenants = np.concatenate([tenants, tenants[copies]])
    rng.shuffle(rows)
    table = np.full(size if size > rows.size else 2 * size, hk.EMPTY_SLOT, np.int64)
    dup = bulk_insert_unique(table, rows, arena, refs, tenants)
    if n_dups:
        assert dup >= 0
        twin = rows[dup]
        same = (refs == refs[twin]) & (tenants == tenants[twin])
        assert same.sum() >= 2  # the reported row really repeats another row's (tenant, key)
        return
    assert dup == -1
    assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, arena, tenants), np.arange(n))
    assert (table >= 0).sum() == n


def test_set_key_refs_rejects_an_overlong_key() -> None:
    refs = np.zeros(2, np.int64)
    assert not set_key_refs(refs, np.arange(2), np.array([0, 4, 4 + (1 << hk.KEY_LENGTH_BITS)]), 0)
    assert set_key_refs(refs, np.arange(2), np.array([0, 4, 4 + (1 << hk.KEY_LENGTH_BITS) - 1]), 10)
    assert hk.ref_offset(refs[1]) == 14 and hk.ref_length(refs[1]) == (1 << hk.KEY_LENGTH_BITS) - 1


def test_allocator_rebuild_in_offset_order_matches_the_sorted_one() -> None:
    rng = np.random.default_rng(3)
    n, n_seg = 5000, 3
    seg = rng.integers(0, n_seg, n)
    sizes = rng.integers(1, 100, n)
    gaps_before = rng.integers(0, 3, n) * rng.integers(1, 50, n)
    offsets = np.zeros(n, np.int64)
    ends = np.zeros(n_seg, np.int64)
    for i in range(n):  # increasing offsets per segment, with random holes
        offsets[i] = ends[seg[i]] + gaps_before[i]
        ends[seg[i]] = offsets[i] + sizes[i]
    capacity = ends + np.array([0, 7, 1000])  # segment 0 is full to the end
    unit_bits = np.zeros(n_seg, np.int64)
    on = np.ones(n_seg, np.bool_)
    status, _, starts, lengths, lo, hi, used = rebuild.free_extents_sorted(seg, offsets, sizes, on, capacity, unit_bits)
    assert status == rebuild.OK
    shuffled = np.random.default_rng(4).permutation(n)  # the sorted path
    want = rebuild.free_extents_sorted(seg[shuffled], offsets[shuffled], sizes[shuffled], on, capacity, unit_bits)
    assert want[0] == rebuild.OK
    for c in range(n_seg):
        mine = seg == c
        ends = offsets[mine] + sizes[mine]
        gap_starts, gap_ends = np.concatenate(([0], ends)), np.concatenate((offsets[mine], [capacity[c]]))
        keep = gap_ends > gap_starts
        assert np.array_equal(starts[lo[c]:hi[c]], gap_starts[keep])
        assert np.array_equal(lengths[lo[c]:hi[c]], (gap_ends - gap_starts)[keep])
        assert np.array_equal(want[2][want[4][c]:want[5][c]], gap_starts[keep])
        assert used[c] == sizes[mine].sum() == want[6][c]
    for bad, expect in (("out_of_order", rebuild.UNSORTED), ("overlap", rebuild.OVERLAP),
                        ("past_capacity", rebuild.OUT_OF_RANGE), ("empty", rebuild.OUT_OF_RANGE)):
        o, z = offsets.copy(), sizes.copy()
        first, second = np.flatnonzero(seg == 1)[:2]
        if bad == "out_of_order":
            o[[first, second]] = o[[second, first]]
        elif bad == "overlap":
            o[second] = o[first]
        elif bad == "past_capacity":
            z[np.flatnonzero(seg == 0)[-1]] += 1
        else:
            z[first] = 0
        rows = np.ones((n, 1), np.uint8)
        status = rebuild.free_extents(rebuild.all_rows(n), on, capacity, unit_bits, unit_bits * 0, z, rows, rows * 0,
                                      seg.astype(np.int32).reshape(n, 1), o.reshape(n, 1), np.empty(0, np.int32))[0]
        assert status == expect, bad


def test_batched_bulk_insert_indexes_every_row_and_finds_a_duplicate_across_batches(monkeypatch) -> None:
    """Rows go in bounded batches (a restore's temporaries stay small): every row is indexed,
    and a (tenant, key) repeated in a later batch is reported at its index into ``rows``."""
    from mooncake_columnar.kernels import index_load
    monkeypatch.setattr(index_load, "_BATCH_ROWS", 1000)
    n = 5500
    offsets, arena, refs, tenants = _keys(n)
    rows = np.random.default_rng(2).permutation(n).astype(np.int64)
    table = _table(n)
    assert bulk_insert_unique(table, rows, arena, refs, tenants) == -1
    assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, arena, tenants), np.arange(n))
    # a new last row (index n, the last batch) repeats the (tenant, key) of rows[10] (the first batch)
    refs2, tenants2 = np.append(refs, refs[rows[10]]), np.append(tenants, tenants[rows[10]])
    again = np.append(rows, n)
    assert bulk_insert_unique(_table(n + 1), again, arena, refs2, tenants2) == n
