"""kernels/put_start.py: a column of put starts stored as ObjectTable.set_put_start defines it
(offsets after the base, clipped to the span; unknown (<= 0) as PUT_START_NONE)."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.kernels.put_start import known_range, store_relative
from mooncake_columnar.schema import PUT_START_NONE

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


def test_known_range_ignores_unknown_starts() -> None:
    assert known_range(np.array([0, 7, -3, 5, 9, 0], np.int64)) == (3, 5, 9)
    assert known_range(np.zeros(4, np.int64))[0] == 0
    assert known_range(np.zeros(0, np.int64))[0] == 0


def test_store_relative_matches_the_clipped_offsets() -> None:
    rng = np.random.default_rng(3)
    ms = rng.integers(-5, 1000, 500).astype(np.int64)
    rows = rng.permutation(600)[:500].astype(np.int64)
    out = np.full(600, 7, np.uint32)
    base, span = 100, 600
    store_relative(out, rows, ms, base, span, int(PUT_START_NONE))
    expect = np.where(ms > 0, np.clip(ms - base, 0, span), PUT_START_NONE).astype(np.uint32)
    assert np.array_equal(out[rows], expect)
    untouched = np.setdiff1d(np.arange(600), rows)
    assert (out[untouched] == 7).all()
