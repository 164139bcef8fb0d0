"""Vectorized deadline conversion between clock domains, in checked int64 arithmetic.

Every formula here is a chain of additions of scalars to the deadline array, so each intermediate
value is monotonic in the deadline: checking the chain at the array's min and max with Python
ints proves that no element overflows. Only then is the chain applied, as one total shift in one
pass (two passes in all: min/max, then shift).
``INT64_MIN`` (NEVER_LEASED / NO_DEADLINE) is a sentinel, never converted.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import prange

from ..kernels.jit import njit
from ..clock import INT64_MAX, INT64_MIN, NS_PER_MS
from ..errors import ClockConversionError

SENTINEL = INT64_MIN


def _check_scalar(value: int, name: str) -> int:
    value = int(value)
    if value < INT64_MIN or value > INT64_MAX:
        raise ClockConversionError(f"{name}={value} is outside int64")
    return value


# A step is (sign, int64 operand): operands stay int64 (negating INT64_MIN would not).
Step = tuple[int, int]


def _check_chain(start: int, steps: Sequence[Step], what: str) -> None:
    """Raise if ``start`` followed by the signed additions in ``steps`` ever leaves int64."""
    value = start
    for sign, operand in steps:
        value += sign * operand
        if value < INT64_MIN or value > INT64_MAX:
            raise ClockConversionError(f"{what}: int64 overflow converting deadline {start}")


@njit(cache=True, nogil=True, parallel=True)
def _live_range(values):
    """(count, min, max) of the values that are not the sentinel."""
    count, lo, hi = 0, INT64_MAX, INT64_MIN
    for i in prange(values.shape[0]):
        v = values[i]
        if v != SENTINEL:
            count += 1
            lo = min(lo, v)
            hi = max(hi, v)
    return count, lo, hi


@njit(cache=True, nogil=True, parallel=True)
def _shift_into(values, delta, out):
    """out = values + delta (uint64 bits: wrapping, exact whenever the true sum fits int64), the
    sentinel kept; returns how many shifted values landed on the sentinel."""
    hits = 0
    d = np.uint64(delta)
    for i in prange(values.shape[0]):
        v = values[i]
        if v == SENTINEL:
            out[i] = v
        else:
            w = np.int64(np.uint64(v) + d)
            if w == SENTINEL:
                hits += 1
            out[i] = w
    return hits


def _apply_chain(values: np.ndarray | Sequence[np.ndarray], steps: Sequence[Step], what: str) -> np.ndarray:
    """``values ± operand ± ...`` in order, with the sentinel kept and overflow rejected.
    ``values``: an array, or the chunks of one (a column of several record batches, read where
    it lies: converted into one new array, never concatenated first)."""
    parts = [np.ascontiguousarray(v, dtype=np.int64) for v in
             ((values,) if isinstance(values, np.ndarray) else values)]
    ranges = [_live_range(v) for v in parts if v.size]
    live = [(lo, hi) for count, lo, hi in ranges if count]
    out = np.empty(sum(v.size for v in parts), np.int64)
    if not live:
        return np.concatenate(parts, out=out) if parts else out
    # Each step's sign decides which end can overflow; checking both ends covers both.
    _check_chain(min(int(lo) for lo, _ in live), steps, what)
    _check_chain(max(int(hi) for _, hi in live), steps, what)
    # Every intermediate fits, so the total shift applied in two's complement is exact.
    delta = np.uint64(sum(sign * operand for sign, operand in steps) % (1 << 64))
    hits, at = 0, 0
    for v in parts:
        hits += _shift_into(v, delta, out[at:at + v.size])
        at += v.size
    # A converted deadline must never land on the sentinel value itself.
    if hits:
        raise ClockConversionError(f"{what}: a deadline converts onto the INT64_MIN sentinel")
    return out


def convert_steady_deadlines(deadlines: np.ndarray | Sequence[np.ndarray], *, snapshot_system_ns: int,
                             snapshot_steady_ns: int, restore_system_ns: int,
                             restore_steady_ns: int) -> np.ndarray:
    """v2 mapping: ``remaining = (S0 + (D0 - C0)) - S1; new = C1 + remaining``.

    An expired deadline (remaining <= 0) stays expired: it becomes ``<= C1``; it never gets a TTL.
    ``deadlines``: an array, or the chunks of a column (one array returned).
    """
    s0 = _check_scalar(snapshot_system_ns, "S0")
    c0 = _check_scalar(snapshot_steady_ns, "C0")
    s1 = _check_scalar(restore_system_ns, "S1")
    c1 = _check_scalar(restore_steady_ns, "C1")
    return _apply_chain(deadlines, ((-1, c0), (1, s0), (-1, s1), (1, c1)), "v2 steady mapping")


def convert_legacy_ms_deadlines(deadlines_ms: np.ndarray, *, restore_system_ns: int,
                                restore_steady_ns: int) -> np.ndarray:
    """v1 adapter: ``remaining = D_sys_ms * 1e6 - S1; new = C1 + remaining``; 0 ms = never leased."""
    s1 = _check_scalar(restore_system_ns, "S1")
    c1 = _check_scalar(restore_steady_ns, "C1")
    ms = np.asarray(deadlines_ms, dtype=np.int64)
    never = ms == 0
    live = ms[~never]
    if live.size:
        lo, hi = int(live.min()) * NS_PER_MS, int(live.max()) * NS_PER_MS
        if lo < INT64_MIN or hi > INT64_MAX:
            raise ClockConversionError("v1 adapter: a millisecond deadline overflows int64 ns")
    ns = np.where(never, np.int64(SENTINEL), ms * np.int64(NS_PER_MS))
    if (ns[~never] == SENTINEL).any():
        raise ClockConversionError("v1 adapter: a deadline equals the INT64_MIN sentinel")
    return _apply_chain(ns, ((-1, s1), (1, c1)), "v1 adapter")


def legacy_system_deadline_ms(deadlines: np.ndarray, *, system_now_ns: int,
                              steady_now_ns: int) -> np.ndarray:
    """v1 writer: ``(system_now + (D - steady_now)) // 1e6``; NEVER_LEASED -> 0.

    Floor division rounds a deadline down by under 1 ms, so rollback never extends a lease.
    """
    s = _check_scalar(system_now_ns, "system_now")
    c = _check_scalar(steady_now_ns, "steady_now")
    d = np.asarray(deadlines, dtype=np.int64)
    ns = _apply_chain(d, ((-1, c), (1, s)), "v1 writer")
    ms = ns // np.int64(NS_PER_MS)
    return np.where(d == SENTINEL, np.int64(0), ms)
