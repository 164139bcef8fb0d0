"""Remount's row bitsets: the locate kernel and the assignment against plain boolean NumPy."""
from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from mooncake_columnar.kernels import leases, rowbits
from mooncake_columnar.kernels import objects as ok
from mooncake_columnar.schema import FLAG_LIVE, FLAG_SOFT_PIN_ENABLED, KIND_MEMORY
from mooncake_columnar.testing.builders import soft_pins_of

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


@settings(max_examples=80, deadline=None)
@given(n=st.integers(0, 300), slots=st.integers(1, 3), seed=st.integers(0, 2**32 - 1))
def test_locate_bitset_and_assignment_match_boolean_numpy(n, slots, seed):
    rng = np.random.default_rng(seed)
    flags = rng.choice(np.array([0, FLAG_LIVE, FLAG_LIVE | FLAG_SOFT_PIN_ENABLED], np.uint8), n)
    status = rng.integers(0, 5, (n, slots)).astype(np.uint8)
    kind = rng.choice(np.array([0, KIND_MEMORY, 2], np.uint8), (n, slots))
    seg = rng.integers(-1, 4, (n, slots)).astype(np.int32)
    on = np.array([True, False, True, False])
    bits, count = ok.objects_on_segments(on, n, flags, status, kind, seg, np.empty(0, np.int32))  # no chains
    want = ((flags & FLAG_LIVE) != 0) & ((status != 0) & (kind == KIND_MEMORY) & (seg >= 0)
                                         & on[np.maximum(seg, 0)]).any(axis=1)
    assert np.array_equal(rowbits.to_bool(bits, n), want) and count == want.sum()
    assert np.array_equal(rowbits.to_bool(rowbits.from_bool(want), n), want)

    lease = rng.integers(-100, 100, n)
    soft = rng.integers(-100, 100, n)
    want_lease = np.where(want, np.maximum(lease, 50), lease)
    want_soft = np.where(want & ((flags & FLAG_SOFT_PIN_ENABLED) != 0), np.maximum(soft, 70), soft)
    table = soft_pins_of(soft)
    leases.grant_recovery_masked(lease, table.parts(), flags, bits, 50, 70)
    assert np.array_equal(lease, want_lease) and np.array_equal(table.get(np.arange(n)), want_soft)
