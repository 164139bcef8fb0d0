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
from mooncake_columnar.kernels.index_load import BAD_KEYS, load_keys_unique
from mooncake_columnar.store.keys import string_buffers
from mooncake_columnar.tools.synthetic import synthetic_keys

from ..sizes import compiled_or_plain

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


def _keys(n: int, tenants: int = 3, seed: int = 0):
    """(offsets, bytes, tenant per row) of n distinct (tenant, key) pairs of mixed length."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, n)
    keys = [f"k{i}" * (1 + int(lengths[i]) // 8) for i in range(n)]
    keys[0] = ""  # an empty key is a key too
    data = np.frombuffer("".join(keys).encode(), np.uint8).copy()
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum([len(k) for k in keys])
    return offsets, data, rng.integers(0, tenants, n).astype(np.int32)


def _taken(offsets: np.ndarray, data: np.ndarray, picks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, bytes) of keys ``picks`` of (offsets, data), in that order."""
    lengths = np.diff(offsets)[picks]
    out = np.zeros(picks.size + 1, np.int64)
    out[1:] = np.cumsum(lengths)
    return out, data[np.repeat(offsets[picks] - out[:-1], lengths) + np.arange(out[-1])]


def _load(table: np.ndarray, rows: np.ndarray, offsets: np.ndarray, data: np.ndarray, tenants: np.ndarray,
          src: np.ndarray | None = None, shift: int = 0):
    """load_keys_unique of the keys ``src`` (default: row r's key is key r) of (offsets, data) into
    rows ``rows`` of a fresh arena and key refs: (its result, arena, refs)."""
    src = rows if src is None else src
    offsets, data = _taken(offsets, data, src)
    arena = np.zeros(data.size + shift, np.uint8)
    refs = np.full(int(rows.max(initial=0)) + 1, -1, np.int64)
    return load_keys_unique(table, rows, offsets, data, arena, shift, refs, tenants), arena, refs


def _table(n: int) -> np.ndarray:
    return np.full(1 << max(4, int(np.ceil(np.log2(n / 0.7)))), hk.EMPTY_SLOT, np.int64)


# the largest: many build windows (at least 8 of 4096 slots), so probes cross window ends
@pytest.mark.parametrize("n", [1, 1000, compiled_or_plain(70_000, 12_000)])
def test_bulk_index_answers_like_sequential_inserts(n: int) -> None:
    offsets, data, tenants = _keys(n)
    rows = np.random.default_rng(1).permutation(n).astype(np.int64)
    bulk, seq = _table(n), _table(n)
    dup, arena, refs = _load(bulk, rows, offsets, data, tenants, shift=5)
    assert dup == -1
    for r in (0, n // 2, n - 1):  # each row's ref points at its own key's bytes in the arena
        key = arena[hk.ref_offset(refs[r]):hk.ref_offset(refs[r]) + hk.ref_length(refs[r])]
        assert np.array_equal(key, data[offsets[r]:offsets[r + 1]])
    assert index_rows.insert_rows_unique(seq, rows, arena, refs, tenants) == -1
    assert np.array_equal(np.sort(bulk), np.sort(seq))  # the same entries, maybe other slots
    for table in (bulk, seq):
        assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, data, tenants), np.arange(n))
    # absent keys: another tenant, and keys never inserted
    assert (hk.find_rows(bulk, arena, refs, tenants, offsets, data, tenants + 7) == -1).all()
    # deletes shift back correctly in the bulk-built table too
    gone = rows[: n // 2]
    index_rows.delete_rows(bulk, gone, arena, refs, tenants)
    found = hk.find_rows(bulk, arena, refs, tenants, offsets, data, tenants)
    expect = np.arange(n)
    expect[gone] = -1
    assert np.array_equal(found, expect)


def test_bulk_index_reports_a_duplicate() -> None:
    last = compiled_or_plain(70_000, 12_000)  # (several build windows)
    offsets, data = string_buffers(synthetic_keys(0, last))
    n = last + 1
    src = np.append(np.arange(last), 123)  # row `last` repeats row 123's key
    tenants = np.zeros(n, np.int32)
    rows = np.arange(n, dtype=np.int64)
    assert _load(_table(n), rows, offsets, data, tenants, src)[0] in (123, last)
    tenants[last] = 1  # the same bytes under another tenant are another key
    assert _load(_table(n), rows, offsets, data, tenants, src)[0] == -1


@settings(max_examples=compiled_or_plain(60, 20), deadline=None)
@given(n=st.integers(1, 9000), load=st.floats(0.05, 0.97), n_dups=st.integers(0, 3),
       seed=st.integers(0, 2**32 - 1))
def test_bulk_index_on_crowded_tables_matches_sequential_inserts(n: int, load: float, n_dups: int,
                                                                 seed: int) -> None:
    """Windows deferring probes past their end (and wrapping the table) still build a table that
    answers like sequential inserts, and duplicates are found wherever they land."""
    offsets, data, tenants = _keys(n, seed=seed)
    rng = np.random.default_rng(seed)
    size = 1 << max(4, int(np.ceil(np.log2(n / load))))
    copies = rng.integers(0, n, n_dups)  # rows n.. repeat the (tenant, key) of these rows
    key_of = np.concatenate([np.arange(n), copies])  # each row's key
    tenants = np.concatenate([tenants, tenants[copies]])
    rows = np.arange(n + n_dups, dtype=np.int64)
    rng.shuffle(rows)
    table = np.full(size if size > rows.size else 2 * size, hk.EMPTY_SLOT, np.int64)
    dup, arena, refs = _load(table, rows, offsets, data, tenants, key_of[rows])
    if n_dups:
        assert dup >= 0
        twin = rows[dup]
        same = (key_of == key_of[twin]) & (tenants == tenants[twin])
        assert same.sum() >= 2  # the reported row really repeats another row's (tenant, key)
        return
    assert dup == -1
    assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, data, tenants), np.arange(n))
    assert (table >= 0).sum() == n


def test_load_refuses_keys_whose_offsets_are_bad() -> None:
    """An overlong key, offsets out of order (inside or outside the keys' span) or past the bytes:
    refused, and nothing is copied outside the keys' span of the arena."""
    limit = (1 << hk.KEY_LENGTH_BITS) - 1
    data = np.ones(limit + 20, np.uint8)
    rows = np.arange(3, dtype=np.int64)
    for offsets in ([0, 4, 4 + limit + 1, limit + 6], [0, 4, 2, 6], [0, 9, 3, 6], [0, 1 << 40, 5, 6],
                    [0, 4, 5, data.size + 1], [-1, 4, 5, 6]):
        arena = np.zeros(limit + 30, np.uint8)
        span = slice(max(0, offsets[0]) + 3, max(offsets[0], offsets[-1]) + 3)
        got = load_keys_unique(_table(3), rows, np.array(offsets), data, arena, 3, np.zeros(3, np.int64),
                               np.zeros(3, np.int32))
        assert got == BAD_KEYS, offsets
        outside = np.ones(arena.size, np.bool_)
        outside[span] = False
        assert not arena[outside].any(), offsets
    refs = np.zeros(3, np.int64)
    good = np.array([0, 4, 4, 4 + limit])  # the longest key, and an empty one
    assert load_keys_unique(_table(3), rows, good, data, np.zeros(limit + 14, np.uint8), 10, refs,
                            np.zeros(3, np.int32)) == -1
    assert hk.ref_offset(refs[2]) == 14 and hk.ref_length(refs[2]) == limit


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


@pytest.mark.parametrize("limit", ["_BATCH_ROWS", "_BATCH_BYTES"])
def test_batched_load_indexes_every_row_and_finds_a_duplicate_across_batches(monkeypatch, limit: str) -> None:
    """Rows go in bounded batches (by rows, and by key bytes: a restore's temporaries and
    mapped pages stay small): every row is indexed, ``after_copy`` runs after each batch, and a
    (tenant, key) repeated in a later batch is reported at its index into ``rows``."""
    from mooncake_columnar.kernels import index_load
    monkeypatch.setattr(index_load, limit, 1000 if limit == "_BATCH_ROWS" else 17 * 1000)
    n = 5500
    offsets, data, tenants = _keys(n)
    rows = np.random.default_rng(2).permutation(n).astype(np.int64)
    table = _table(n)
    ordered, ordered_data = _taken(offsets, data, rows)
    arena, refs, calls = np.zeros(ordered_data.size, np.uint8), np.zeros(n, np.int64), []
    assert load_keys_unique(table, rows, ordered, ordered_data, arena, 0, refs, tenants,
                            lambda: calls.append(1)) == -1
    assert len(calls) >= 5
    assert np.array_equal(hk.find_rows(table, arena, refs, tenants, offsets, data, tenants), np.arange(n))
    # a new last row (index n, the last batch) repeats the (tenant, key) of rows[10] (the first batch)
    again = np.append(rows, n)
    assert _load(_table(n + 1), again, offsets, data, np.append(tenants, tenants[rows[10]]),
                 np.append(rows, rows[10]))[0] == n
