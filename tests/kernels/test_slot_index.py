"""The in-flight table's row index (kernels/slot_index.py) against a dict, through inserts and
deletes that wrap around the table and shift probe runs back."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import slot_index as sk
from mooncake_columnar.store.inflight import InflightTable

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), capacity=st.sampled_from([4, 16, 64]), rounds=st.integers(1, 12))
def test_index_finds_every_owned_slot_and_nothing_else(seed, capacity, rounds):
    rng = np.random.default_rng(seed)
    owner = np.full(capacity, -1, np.int64)
    index = np.full(sk.index_size(capacity), -1, np.int32)
    model: dict[int, int] = {}
    for _ in range(rounds):
        free = np.flatnonzero(owner < 0)
        take = rng.permutation(free)[: rng.integers(0, free.size + 1)]
        # rows from a narrow range collide at home; some near-sequential like real rows
        owner[take] = rng.choice(np.setdiff1d(np.arange(4 * capacity), owner[owner >= 0]), take.size, replace=False)
        sk.insert_slots(index, owner, take.astype(np.int64))
        model.update({int(owner[s]): int(s) for s in take})
        used = np.flatnonzero(owner >= 0)
        drop = rng.permutation(used)[: rng.integers(0, used.size + 1)]
        sk.remove_slots(index, owner, drop.astype(np.int64))
        for s in drop:
            del model[int(owner[s])]
        owner[drop] = -1
        rows = np.arange(4 * capacity, dtype=np.int64)
        out = np.empty(rows.size, np.int64)
        sk.find_slots(index, owner, rows, out)
        assert out.tolist() == [model.get(r, -1) for r in rows.tolist()]
        assert np.count_nonzero(index >= 0) == len(model)


def test_table_growth_and_shrink_keep_every_row_findable():
    t = InflightTable(capacity=4)
    rows = np.arange(1000, 1300, dtype=np.int64)
    slots = t.take(rows)  # grows past 4 slots, the index rebuilt with them
    assert np.array_equal(t.slots_of(rows), slots) and (t.slots_of(rows - 1000) == -1).all()
    t.release(slots[::2])
    assert np.array_equal(t.slots_of(rows[1::2]), slots[1::2]) and (t.slots_of(rows[::2]) == -1).all()
    t.release(slots[1::2])
    assert (t.slots_of(rows) == -1).all() and not (t.index >= 0).any()
