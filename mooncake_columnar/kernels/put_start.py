"""Put-start times of many rows at once (ObjectTable.set_put_start for a column of them, as a
restore or standby apply loads): one pass for their range, one to store them, no temporaries."""
from __future__ import annotations

import numpy as np
from .jit import njit


@njit(cache=True, nogil=True)
def known_range(ms):
    """(how many of ``ms`` are known (> 0), their min, their max; 0, 0 when none is)."""
    n = 0
    lo = hi = np.int64(0)
    for v in ms:
        if v > 0:
            if n == 0 or v < lo:
                lo = v
            if n == 0 or v > hi:
                hi = v
            n += 1
    return n, lo, hi


@njit(cache=True, nogil=True)
def store_relative(out, rows, ms, base, span, unknown):
    """``out[rows[i]]`` = ms[i] - base clipped to [0, span], ``unknown`` where ms[i] <= 0."""
    for i in range(rows.shape[0]):
        v = ms[i]
        out[rows[i]] = unknown if v <= 0 else min(max(v - base, 0), span)
