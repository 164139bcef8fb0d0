"""memory.py: parallel faulting covers every byte of the arrays once and never more memory than
it may take."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_columnar import memory


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=0, max_size=8), parts=st.integers(1, 6))
def test_split_covers_every_byte_once(sizes: list[int], parts: int) -> None:
    arrays = [np.zeros(n, np.uint8) for n in sizes]
    work = memory._split(arrays, parts)
    assert len(work) == parts
    for views in work:
        for v in views:
            v += 1
    assert all((a == 1).all() for a in arrays)
    shares = [sum(v.size for v in views) for views in work]
    assert max(shares, default=0) <= -(-sum(sizes) // parts)


def test_prefault_fills_fresh_arrays_of_any_shape_with_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "MIN_FAULT_BYTES", 0)
    a, b = np.full((1000, 3), 7, np.int64), np.full(12345, 7, np.uint16)
    memory.prefault([a, b, np.empty(0, np.int8)])
    assert not a.any() and not b.any()


def test_prefault_rejects_views_it_cannot_fill_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "MIN_FAULT_BYTES", 0)
    a = np.ones((100, 4), np.int64)
    with pytest.raises(ValueError, match="C-contiguous"):
        memory.prefault([a[:, 1]])
    frozen = np.ones(100)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        memory.prefault([frozen])
    assert (a == 1).all()


def test_small_work_starts_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_threads(*args, **kwargs):
        raise AssertionError("a thread was started")
    monkeypatch.setattr(memory.threading, "Thread", no_threads)
    a = np.full(1000, 3, np.int64)
    memory.prefault([a])  # under MIN_FAULT_BYTES: left alone
    assert (a == 3).all()
    memory.warm_free_memory(1 << 20)


def test_warm_free_memory_takes_at_most_half_the_free_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    touched: list[int] = []
    monkeypatch.setattr(memory, "MIN_FAULT_BYTES", 0)
    monkeypatch.setattr(memory, "free_memory_bytes", lambda: 8 << 20)
    monkeypatch.setattr(memory.np, "ones", lambda n, dtype: touched.append(n))
    memory.warm_free_memory(1 << 40, threads=4)
    assert len(touched) == 4 and sum(touched) <= (4 << 20) + 4
    touched.clear()
    monkeypatch.setattr(memory, "free_memory_bytes", lambda: 0)  # unknown: nothing touched
    memory.warm_free_memory(1 << 30)
    assert touched == []


def test_a_load_prefaults_the_engine_and_restores_the_same_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """load_tables faults the empty columns and the keys' arena span in first (here always, at
    any size): the loaded engine is the one an unfaulted load builds."""
    from mooncake_columnar import MasterConfig, MasterService
    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.tools.synthetic import fill, mount_segments, synthetic_keys

    m = MasterService(MasterConfig(), clocks=ManualClocks())
    mount_segments(m, 2, 64 << 20)
    fill(m, 3000, replica_num=2)
    state = m.export_state()
    plain = MasterService.from_state(state, clocks=ManualClocks())
    faulted: list[int] = []
    monkeypatch.setattr(memory, "MIN_FAULT_BYTES", 0)
    monkeypatch.setattr(memory, "_run", lambda work, touch: faulted.append(len(work)) or
                        [touch(v) for views in work for v in views])
    loaded = MasterService.from_state(state, clocks=ManualClocks())
    assert faulted
    loaded.verify()
    keys = synthetic_keys(0, 3000)
    assert loaded.batch_get_replica_list(keys).codes.tolist() == plain.batch_get_replica_list(keys).codes.tolist()
    assert loaded.export_state().objects.equals(plain.export_state().objects)
