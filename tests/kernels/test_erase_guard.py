"""The erase guard: the first row of a batch that is not a distinct live object, whichever path
(a few rows, a batch sorted by row, any other batch) checks it."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.kernels.erase_guard import first_not_erasable
from mooncake_columnar.schema import FLAG_GROUPED, FLAG_LIVE

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


@pytest.mark.parametrize("n", [10, 50_000])
@pytest.mark.parametrize("order", ["sorted", "shuffled"])
def test_the_first_row_not_live_repeated_or_out_of_range_is_named_and_no_flag_changes(n, order):
    rng = np.random.default_rng(n)
    flags = np.full(4 * n, FLAG_LIVE | FLAG_GROUPED, np.uint8)
    flags[1::7] = 0  # free rows
    live = np.flatnonzero(flags)
    rows = np.sort(rng.choice(live, n, replace=False))
    if order == "shuffled":
        rng.shuffle(rows)
    before = flags.copy()
    assert first_not_erasable(rows, flags) == -1
    for bad in (1, 3, 4 * n, -1):  # a free row, a repeat (rows[0] again), out of range, negative
        at = n // 2
        broken = rows.copy()
        broken[at] = {1: 1, 3: rows[0], 4 * n: 4 * n, -1: -1}[bad]
        assert first_not_erasable(broken, flags) == at
    assert np.array_equal(flags, before)  # the guard's scratch bit is clear again
