"""Property tests: the eviction kernels against a slow, obviously-correct NumPy version."""
from __future__ import annotations

import ast
import pathlib
import re

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import eviction as ek
from mooncake_columnar.kernels.slot_lists import rows_before
from mooncake_columnar.testing.builders import soft_pins_of
from mooncake_columnar.schema import (FLAG_HARD_PINNED, FLAG_LIVE, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY,
                                      ST_COMPLETE)

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)

I64 = st.sampled_from([-(2**63), -1, 0, 1, 99, 100, 101, 2**63 - 1]) | st.integers(-(2**63), 2**63 - 1)


_EDGES = np.array([-(2**63), -1, 0, 1, 99, 100, 101, 2**63 - 1], np.int64)


def _deadlines(rng: np.random.Generator, n: int) -> np.ndarray:
    """Half edge values (around now = 100 and the int64 ends), half anything."""
    anything = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    return np.where(rng.random(n) < 0.5, rng.choice(_EDGES, n), anything)


@st.composite
def tables(draw):
    """Column values come from a drawn seed, not element by element: drawing hundreds of list
    elements per example made hypothesis's generation most of these tests' time (shrinking then
    reduces ``n`` and the slot count)."""
    n = draw(st.integers(0, 40))
    slots = draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    shape = (n, slots)
    flags = rng.choice(np.array([0, 1, 3, 5, 7, 1 | 4], np.uint8), n)
    status = rng.choice(np.array([0, 2, 3, 4], np.uint8), shape)
    kind = rng.choice(np.array([0, 0, 2], np.uint8), shape)
    seg = rng.integers(-1, 2, shape, dtype=np.int32, endpoint=True)
    refcnt = rng.choice(np.array([0, 0, 1], np.uint16), shape)
    readable = rng.random(3) < 0.5
    now = draw(st.sampled_from([0, 100, -(2**63) + 1, 2**63 - 2]))
    return now, flags, _deadlines(rng, n), _deadlines(rng, n), status, kind, seg, refcnt, readable


def slow_census(now, allow_soft, flags, lease, soft, status, kind, seg, refcnt, readable):
    seg_ok = np.where(seg >= 0, readable[np.maximum(seg, 0)], False)
    evictable = (kind == int(KIND_MEMORY)) & (status == int(ST_COMPLETE)) & (refcnt == 0) & seg_ok
    live = (flags & FLAG_LIVE) != 0
    hard = (flags & FLAG_HARD_PINNED) != 0
    has = evictable.any(axis=1)
    in_base = live & ~hard & has
    expired = now >= lease
    soft_active = ((flags & FLAG_SOFT_PIN_ENABLED) != 0) & (now < soft)
    nopin = np.flatnonzero(in_base & expired & ~soft_active)
    softs = np.flatnonzero(in_base & expired & soft_active) if allow_soft else np.zeros(0, np.int64)
    return int(in_base.sum()), nopin, softs


@settings(max_examples=300, deadline=None)
@given(t=tables(), allow_soft=st.booleans(), k=st.integers(0, 50))
def test_census_and_selection_match_slow_numpy(t, allow_soft, k):
    now, flags, lease, soft, status, kind, seg, refcnt, readable = t
    n = flags.size
    codes, counts, _ = ek.census(now, n, np.zeros(n, np.int32), -1, flags, lease, soft_pins_of(soft).parts(),
                                 status, kind, seg, refcnt, readable, np.empty(0, np.int32))  # no chains
    base = counts[ek.IN_BASE] + counts[ek.NO_PIN_CANDIDATE] + counts[ek.SOFT_PINNED_CANDIDATE]
    nopin = ek.rows_coded(codes, ek.NO_PIN_CANDIDATE, lease, None)
    softs = ek.rows_coded(codes, ek.SOFT_PINNED_CANDIDATE, lease, None) if allow_soft else nopin[:0]
    want = slow_census(now, allow_soft, flags, lease, soft, status, kind, seg, refcnt, readable)
    assert base == want[0]
    assert nopin.tolist() == want[1].tolist() and softs.tolist() == want[2].tolist()
    assert counts[ek.NO_PIN_CANDIDATE] == nopin.size and counts.sum() == n
    chosen = ek.earliest_first(nopin, lease, k)
    expect = sorted(nopin.tolist(), key=lambda r: (lease[r], r))[:k]
    assert chosen.tolist() == expect
    unsorted = ek.earliest_coded(codes, ek.NO_PIN_CANDIDATE, nopin.size, lease, k)
    assert unsorted.tolist() == sorted(expect)


@settings(max_examples=300, deadline=None)
@given(t=tables(), bound=I64, k=st.integers(0, 50))
def test_census_listing_lists_the_candidates_at_or_below_the_bound_in_the_same_pass(t, bound, k):
    now, flags, lease, soft, status, kind, seg, refcnt, readable = t
    n = flags.size
    columns = (now, n, np.zeros(n, np.int32), -1, flags, lease, soft_pins_of(soft).parts(), status, kind, seg,
               refcnt, readable, np.empty(0, np.int32))
    # codes into a kept buffer, longer than the rows, full of a previous cycle's codes
    kept = np.full(n + 7, ek.PLANNED_SOFT, np.uint8)
    codes, counts, skipped = ek.census(*columns, out=kept)
    assert codes.base is kept and np.array_equal(codes, ek.census(*columns)[0])
    listed_counts, listed_skipped, listed = ek.census_listing(*columns, bound)
    assert np.array_equal(listed_counts, counts) and listed_skipped == skipped
    nopin = ek.rows_coded(codes, ek.NO_PIN_CANDIDATE, lease, None)
    assert listed.rows.tolist() == [r for r in nopin.tolist() if lease[r] <= bound]
    assert np.array_equal(listed.deadlines, lease[listed.rows])
    # into kept listing buffers holding a previous cycle's entries: the same listing, viewing them
    entries = ek.listing_entries(n, 1.0)
    kept_rows, kept_deadlines = np.full(entries + 3, 7, np.uint32), np.full(entries + 3, -9, np.int64)
    again = ek.census_listing(*columns, bound, listing_out=(kept_rows, kept_deadlines))[2]
    assert again.rows.tolist() == listed.rows.tolist() and again.deadlines.tolist() == listed.deadlines.tolist()
    assert np.shares_memory(again.rows, kept_rows) or again.rows.size == 0
    assert np.shares_memory(again.deadlines, kept_deadlines) or again.rows.size == 0
    # the earliest k, whether the listing holds them all or (too few listed) is passed over
    expect = sorted(sorted(nopin.tolist(), key=lambda r: (lease[r], r))[:k])
    assert ek.earliest_coded(codes, ek.NO_PIN_CANDIDATE, nopin.size, lease, k, listed).tolist() == expect


def _and_operands(node):
    """The operands of an ``&`` / ``and`` chain (nested chains flattened)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd):
        return _and_operands(node.left) + _and_operands(node.right)
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        return [o for v in node.values for o in _and_operands(v)]
    return [node]


def test_only_predicates_module_tests_pin_bits_or_compares_deadlines():
    """One predicate, one place, package-wide: nothing compares a lease or soft-pin deadline with
    the clock, derives a replica's readability or tests "memory replica on a segment" itself; it
    calls kernels.predicates (leases.py owns the grant rules: max-update and the group refresh
    threshold; testing/reference.py is the independent model the tests compare the engine with).
    Kernels also leave every flag bit test to it."""
    package = pathlib.Path(ek.__file__).parent.parent
    memory_kind = ("KIND_MEMORY", "_MEM", "_MEMORY", "ReplicaKind.MEMORY")
    for path in sorted(package.rglob("*.py")):
        name = path.relative_to(package).as_posix()
        if name in ("kernels/predicates.py", "kernels/leases.py", "testing/reference.py"):
            continue
        tree = ast.parse(path.read_text())
        if name.startswith("kernels/"):
            names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            assert not names & {"FLAG_HARD_PINNED", "FLAG_SOFT_PIN_ENABLED", "_HARD", "_SOFT_ENABLED"}, name
            bit_tests = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.BinOp)  # not `& ~bit`
                         and isinstance(n.op, ast.BitAnd) and "flags" in ast.unparse(n.left)
                         and not isinstance(n.right, ast.UnaryOp)]
            assert not bit_tests, f"{name} tests flag bits itself: {bit_tests}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                text = ast.unparse(node)
                assert not (re.search(r"(?<![a-z])lease", text) and "now" in text), f"{name}: {text}"
                assert "soft_deadline" not in text, f"{name}: {text}"
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitAnd)
                    or isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And)):
                continue  # (unparsing every node of every module would take seconds)
            text = ast.unparse(node)
            assert not ("readable" in text and "complete" in text.lower()), f"{name} derives readability: {text}"
            compares = [ast.unparse(o) for o in _and_operands(node) if isinstance(o, ast.Compare)]
            if compares:
                assert not (any(k in t for t in compares for k in memory_kind)
                            and any("seg" in t for t in compares)), f"{name} tests memory-on-segment: {text}"


@settings(max_examples=60, deadline=None)
@given(st.lists(I64, min_size=1, max_size=300), st.data())
def test_kth_smallest_and_its_ties_match_a_full_partition(keys, data):
    """The histogram select (buckets over any int64 span, ties, one distinct value) agrees with
    np.partition on the k-th smallest and on how many of the k smallest equal it."""
    keys = np.array(keys, np.int64)
    k = data.draw(st.integers(1, keys.size))
    part = np.partition(keys, k - 1)
    kth = part[k - 1]
    assert ek._kth(keys, k) == (int(kth), k - int(np.count_nonzero(part[:k] < kth)))


def test_kth_of_many_keys_in_few_buckets():
    """Most keys in the k-th's bucket (the bucket is then partitioned whole) and keys spread
    over every bucket."""
    rng = np.random.default_rng(9)
    for keys in (np.concatenate([np.full(50_000, 3), rng.integers(0, 2**40, 1_000)]),
                 rng.integers(-(2**62), 2**62, 200_000)):
        for k in (1, 777, keys.size // 2, keys.size):
            part = np.partition(keys, k - 1)
            assert ek._kth(keys, k) == (int(part[k - 1]), k - int(np.count_nonzero(part[:k] < part[k - 1])))


@pytest.mark.parametrize("n", [5, 3_000, 200_000])
def test_rows_before_the_kth_take_the_first_ties_in_input_order(n):
    """Few distinct deadlines: the k-th's ties run across many parallel chunks, and only the first
    of them (in input order) are taken, up to k rows in all."""
    rng = np.random.default_rng(n)
    rows = np.sort(rng.choice(10**7, n, replace=False)).astype(np.uint32)
    keys = rng.integers(0, 20, n)
    for k in {1, n // 3 + 1, n // 2, n}:
        order = np.lexsort((np.arange(n), keys))[:k]  # earliest first, ties in input order
        got = rows_before(rows, keys, *ek._kth(keys, k))
        assert np.array_equal(got, np.sort(rows[order]).astype(np.int64))


def test_sampled_selection_matches_full_sort():
    rng = np.random.default_rng(3)
    n = 600_000
    lease = rng.integers(-(2**62), 2**62, n)
    lease[rng.integers(0, n, 50_000)] = 7  # many ties
    rows = np.flatnonzero(rng.random(n) < 0.9)
    codes = np.zeros(n, np.uint8)
    codes[rows] = ek.NO_PIN_CANDIDATE
    for k in (1, 1000, 60_000, 100_000):
        expect = rows[np.lexsort((rows, lease[rows]))][:k]
        assert np.array_equal(ek.earliest_first(rows, lease, k), expect)
        assert np.array_equal(ek.earliest_coded(codes, ek.NO_PIN_CANDIDATE, rows.size, lease, k), np.sort(expect))


def test_census_listing_sized_too_small_lists_the_overflowing_chunks_again():
    """Deadlines that cluster by row (old rows, old leases) overflow a chunk's room in the
    listing buffer (sized by the sample's share): those chunks' rows are classified again, and
    the listing is the same as with room for every row."""
    n = 70_000  # chunks of 1094 rows: more than the smallest room (1024)
    lease = np.where(np.arange(n) < n // 2, -5, -1).astype(np.int64)
    lease[::7] = 3  # some rows live: not candidates
    flags = np.full(n, FLAG_LIVE, np.uint8)
    columns = (0, n, np.zeros(n, np.int32), -1, flags, lease, soft_pins_of(np.zeros(0, np.int64)).parts(),
               np.full((n, 1), ST_COMPLETE, np.uint8), np.full((n, 1), KIND_MEMORY, np.uint8),
               np.zeros((n, 1), np.int32), np.zeros((n, 1), np.uint16), np.ones(1, np.bool_), np.empty(0, np.int32))
    roomy = ek.census_listing(*columns, -5)[2]
    tight = ek.census_listing(*columns, -5, 0.0)[2]
    entries = ek.listing_entries(n, 0.0)
    kept = (np.zeros(entries, np.uint32), np.zeros(entries, np.int64))
    tight_kept = ek.census_listing(*columns, -5, 0.0, listing_out=kept)[2]
    expect = [r for r in range(n // 2) if r % 7]
    assert roomy.rows.tolist() == tight.rows.tolist() == tight_kept.rows.tolist() == expect
    assert np.array_equal(tight.deadlines, lease[tight.rows])
    assert np.array_equal(tight_kept.deadlines, lease[tight_kept.rows])


def test_listing_bound_of_a_sample_covers_the_first_pass_and_a_short_listing_is_passed_over():
    rng = np.random.default_rng(5)
    n = 200_000
    lease = rng.integers(-(2**40), 0, n)
    lease[rng.integers(0, n, 20_000)] = -7  # many ties
    flags = np.full(n, FLAG_LIVE, np.uint8)
    status = np.full((n, 1), ST_COMPLETE, np.uint8)
    no_soft_pins = soft_pins_of(np.zeros(0, np.int64)).parts()
    columns = (0, n, np.zeros(n, np.int32), -1, flags, lease, no_soft_pins, status,
               np.full((n, 1), KIND_MEMORY, np.uint8), np.zeros((n, 1), np.int32), np.zeros((n, 1), np.uint16),
               np.ones(1, np.bool_), np.empty(0, np.int32))
    k = n // 20
    expect = np.sort(np.lexsort((np.arange(n), lease))[:k])
    bound = ek.listing_bound(0.05, *columns)
    assert bound is not None
    assert 0.05 <= bound.share < 0.1  # the sample's share of rows at or below it
    codes = ek.census(*columns)[0]
    listed = ek.census_listing(*columns, *bound)[2]
    assert k <= listed.rows.size < n // 10  # a little more than the pass takes, not every candidate
    assert np.array_equal(ek.earliest_coded(codes, ek.NO_PIN_CANDIDATE, n, lease, k, listed), expect)
    short = ek.Listed(listed.rows[: k - 1], listed.deadlines[: k - 1])
    assert np.array_equal(ek.earliest_coded(codes, ek.NO_PIN_CANDIDATE, n, lease, k, short), expect)
    assert ek.listing_bound(0.5, *columns) is None  # the pass takes most candidates: nothing to list
