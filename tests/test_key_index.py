"""KeyIndex against a dict under insert/delete churn (backward-shift deletion, growth, compaction)."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
from hypothesis import given, settings

from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.store.keys import KeyIndex, as_string_array, string_buffers
from mooncake_columnar.store.objects import ObjectTable


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
            hk.insert_rows(index.table, row, index.arena, objects.key_ref, objects.tenant)
            index.note_inserted(1, index.arena_used + len(key))
            model[(tenant, key)] = int(row[0])
        elif not insert and found >= 0:
            index.remove(np.array([found]))
            objects.release_rows(np.array([found]))
            del model[(tenant, key)]
    rows = np.array(list(model.values()), np.int64)
    assert sorted(index.keys_of(rows).to_pylist()) == sorted(k for _, k in model)
    assert sorted(hk.slot_rows(index.table).tolist()) == sorted(rows.tolist())
