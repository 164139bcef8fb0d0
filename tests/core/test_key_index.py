"""KeyIndex against a dict under insert/delete churn (backward-shift deletion, growth, compaction)."""
from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.kernels import index_rows
from mooncake_columnar.store.keys import KeyIndex, as_string_array, string_buffers
from mooncake_columnar.store.objects import ObjectTable

from ..sizes import compiled_or_plain

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 300), st.integers(0, 2)), max_size=400))
def test_key_index_matches_dict_under_churn(ops):
    objects = ObjectTable(16)
    index = KeyIndex(objects, 16)
    model: dict[tuple[int, str], int] = {}
    for insert, k, tenant in ops:
        key = f"k{k}"
        arr = as_string_array([key])
        offsets, data = string_buffers(arr)
        found = index.lookup_batch(offsets, data, np.array([tenant], np.int32))[0]
        assert found == model.get((tenant, key), -1)
        if insert and found < 0:
            row = objects.take_rows(1)
            objects.tenant[row] = tenant
            index.reserve(1, len(key))
            index.arena[index.arena_used:index.arena_used + len(key)] = data
            objects.key_ref[row] = hk.key_ref(index.arena_used, len(key))
            assert index_rows.insert_rows_unique(index.table, row, index.arena, objects.key_ref, objects.tenant) == -1
            index.note_inserted(1, index.arena_used + len(key))
            model[(tenant, key)] = int(row[0])
        elif not insert and found >= 0:
            index.remove(np.array([found]))
            objects.release_rows(np.array([found]))
            del model[(tenant, key)]
    rows = np.array(list(model.values()), np.int64)
    assert sorted(index.keys_of(rows).to_pylist()) == sorted(k for _, k in model)
    assert sorted(hk.slot_rows(index.table).tolist()) == sorted(rows.tolist())
    # the lookups above took the one-key kernel; a batch (the staged kernel) answers the same,
    # absent keys and other tenants' included
    asked = [(t, f"k{k}") for _, k, t in ops]
    offsets, data = string_buffers(as_string_array([key for _, key in asked]))
    found = index.lookup_batch(offsets, data, np.array([t for t, _ in asked], np.int32))
    assert found.tolist() == [model.get(q, -1) for q in asked]


def _index_with_keys(n: int, tenants: int, capacity: int) -> tuple[KeyIndex, ObjectTable, pa.Array, np.ndarray]:
    objects = ObjectTable(n)
    index = KeyIndex(objects, capacity)
    keys = as_string_array([f"key-{i}" for i in range(n)])
    offsets, data = string_buffers(keys)
    rows = objects.take_rows(n)
    tenant = (np.arange(n) % tenants).astype(np.int32)
    objects.tenant[rows] = tenant
    index.reserve(n, int(offsets[-1]))
    index.arena[: offsets[-1]] = data[: offsets[-1]]
    objects.key_ref[rows] = (offsets[:-1] << hk.KEY_LENGTH_BITS) | np.diff(offsets)
    assert index_rows.insert_rows_unique(index.table, rows, index.arena, objects.key_ref, objects.tenant) == -1
    index.note_inserted(n, int(offsets[-1]))
    return index, objects, keys, tenant


def _bulk_path(sweep: bool):
    """Every bulk delete takes the table sweep (``sweep``) or the per-row path, whatever its size."""
    return mock.patch.object(index_rows, "_SWEEP_RATIO", 1 << 40 if sweep else 0)


@pytest.mark.parametrize("sweep", [False, True])
@settings(max_examples=compiled_or_plain(8, 2), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), fraction=st.floats(0.4, 1.0))
def test_bulk_delete_across_region_boundaries_matches_one_by_one(sweep, seed, fraction):
    """The parallel bulk deletes (regions of a small, 75%-full table: many probe runs cross a
    region boundary; or chunks of the sweep) leave an index that answers every lookup like
    deleting one key at a time."""
    n = 11_000  # 14667 slots (not a power of two): 256 regions of 57 or 58 slots
    index, objects, keys, tenant = _index_with_keys(n, tenants=3, capacity=n)
    assert index.table.shape[0] == 14667
    rng = np.random.default_rng(seed)
    doomed = np.sort(rng.choice(n, int(n * fraction), replace=False)).astype(np.int64)
    assert doomed.size >= index_rows._PARALLEL_DELETE_MIN
    with _bulk_path(sweep):
        index.remove(doomed)
    offsets, data = string_buffers(keys)
    found = index.lookup_batch(offsets, data, tenant)
    expected = np.arange(n)
    expected[doomed] = -1
    np.testing.assert_array_equal(found, expected)
    assert sorted(hk.slot_rows(index.table).tolist()) == np.flatnonzero(expected >= 0).tolist()


@pytest.mark.parametrize("sweep", [False, True])
@settings(max_examples=compiled_or_plain(8, 2), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), fraction=st.floats(0.4, 1.0), capacity=st.floats(0.9, 1.3))
def test_bulk_delete_leaves_the_table_one_by_one_deletes_leave(sweep, seed, fraction, capacity):
    """Slot for slot: the parallel bulk deletes (the per-row one, whose regions skip the run-end
    check before their last empty slot; the sweep, which rebuilds each run holding a deleted
    entry) leave exactly the table that deleting the rows one at a time leaves, at loads up to
    83% (long runs, some crossing region or chunk ends, some wrapping around the table)."""
    n = 11_000
    index, objects, _, _ = _index_with_keys(n, tenants=3, capacity=int(n * capacity))
    doomed = np.sort(np.random.default_rng(seed).choice(n, int(n * fraction), replace=False)).astype(np.int64)
    one_by_one = index.table.copy()
    for k in range(doomed.size):
        index_rows.delete_rows(one_by_one, doomed[k:k + 1], index.arena, objects.key_ref, objects.tenant)
    with _bulk_path(sweep):
        index.remove(doomed)
    np.testing.assert_array_equal(index.table, one_by_one)


@pytest.mark.parametrize("fraction", [0.02, 0.05, 0.3])
def test_table_sweep_and_per_row_bulk_delete_leave_the_same_table(fraction):
    """The two bulk deletes, called directly on the same table with a few deleted rows per run
    (as an eviction of 5% leaves them) and rows that are not in the index (ignored; their key
    bytes still counted): the same table and the same key bytes."""
    n = 11_000
    index, objects, _, _ = _index_with_keys(n + 500, tenants=3, capacity=n + 500)
    rng = np.random.default_rng(7)
    index_rows.delete_rows(index.table, np.arange(n, n + 500), index.arena, objects.key_ref, objects.tenant)
    doomed = np.sort(np.concatenate([rng.choice(n, int(n * fraction), replace=False),
                                     rng.choice(np.arange(n, n + 500), 50, replace=False)])).astype(np.int64)
    swept, per_row = index.table.copy(), index.table.copy()
    refs, tenants = objects.key_ref, objects.tenant
    swept_bytes = index_rows._delete_rows_sweep(swept, doomed, refs)
    assert swept_bytes == index_rows._delete_rows_parallel(per_row, doomed, index.arena, refs, tenants)
    np.testing.assert_array_equal(swept, per_row)
    assert sorted(hk.slot_rows(swept).tolist()) == sorted(set(range(n)) - set(doomed.tolist()))


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["", "a", "ab", "k" * 9, "k" * 17])),
                     max_size=200))
def test_last_of_each_key_matches_a_dict(rows):
    """The last row of each (tenant, key), as a dict keeping the last index sees it."""
    offsets, data = string_buffers(as_string_array([key for _, key in rows]))
    tenants = np.array([tenant for tenant, _ in rows], np.int32)
    last = {row: i for i, row in enumerate(rows)}
    assert np.flatnonzero(hk.last_of_each_key(offsets, data, tenants)).tolist() == sorted(last.values())


def test_index_table_stays_between_68_and_85_percent_full_as_it_grows():
    """Bytes per key: once past 85% full the table grows to 75% full, or by 25% if that is
    more, whatever its size (not a power of two); every key stays found across the growths."""
    objects = ObjectTable(16)
    index = KeyIndex(objects, 16)
    keys = as_string_array([f"key-{i}" for i in range(20_000)])
    offsets, data = string_buffers(keys)
    tenant = np.zeros(1, np.int32)
    for lo in range(0, 20_000, 1000):
        rows = objects.take_rows(1000)
        objects.tenant[rows] = 0
        index.reserve(1000, int(offsets[lo + 1000] - offsets[lo]))
        index.arena[index.arena_used:index.arena_used + offsets[lo + 1000] - offsets[lo]] = \
            data[offsets[lo]:offsets[lo + 1000]]
        objects.key_ref[rows] = ((offsets[lo:lo + 1000] - offsets[lo] + index.arena_used) << hk.KEY_LENGTH_BITS) \
            | np.diff(offsets[lo:lo + 1001])
        assert index_rows.insert_rows_unique(index.table, rows, index.arena, objects.key_ref, objects.tenant) == -1
        index.note_inserted(1000, index.arena_used + int(offsets[lo + 1000] - offsets[lo]))
        assert 0.6 <= index.count / index.table.shape[0] <= 0.85  # (the first batch: 1000 keys in 16 slots)
    assert index.table.nbytes / index.count <= 8 / 0.68
    found = index.lookup_batch(offsets, data, tenant)
    np.testing.assert_array_equal(found, np.arange(20_000))
