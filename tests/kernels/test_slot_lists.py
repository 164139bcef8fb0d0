"""The apply's object list against the NumPy it replaces."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.kernels.slot_lists import emptied_objects

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


@pytest.mark.parametrize("n, width", [(0, 1), (9, 2), (9_000, 1), (20_000, 3)])
def test_emptied_objects_are_those_whose_chain_rows_hold_no_slot_in_use(n, width):
    """Objects with one to three chain rows, so chunks of objects split the chain rows unevenly;
    an object counts as emptied only when every slot of every one of its rows is empty."""
    rng = np.random.default_rng(n + 1)
    rows = np.sort(rng.choice(10**6, n, replace=False))
    owner = np.repeat(np.arange(n), rng.integers(1, 4, n))
    chain_rows = rng.choice(10**6, owner.size, replace=False)
    status = rng.integers(1, 4, (10**6, width)).astype(np.uint8)
    status[rng.random(status.shape) < 0.7] = 0
    in_use = np.bincount(owner, weights=(status[chain_rows] != 0).sum(axis=1), minlength=n) > 0
    assert np.array_equal(emptied_objects(rows, owner, chain_rows, status, 0), rows[~in_use])
