"""Injected clocks.

Runtime deadlines (leases, soft pins, client liveness) are steady-clock int64 nanoseconds.
The system clock is read only where upstream keeps wall time (put start times, snapshot ids,
the snapshot clock mapping). Tests and notebooks use :class:`ManualClocks` to move each clock
independently; nothing in the engine sleeps to wait for time.
"""
from __future__ import annotations

import threading
import time
from typing import Protocol, runtime_checkable

from .errors import ClockOverflow, InvalidParams

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000


def checked_add(a: int, b: int) -> int:
    """a + b as an int64, raising :class:`ClockOverflow` instead of wrapping."""
    r = int(a) + int(b)
    if r < INT64_MIN or r > INT64_MAX:
        raise ClockOverflow(f"int64 overflow in {a} + {b}")
    return r


@runtime_checkable
class Clocks(Protocol):
    def steady_ns(self) -> int:
        """Monotonic time in ns; only differences within one process are meaningful."""

    def system_ns(self) -> int:
        """Wall-clock time in ns since the Unix epoch; may jump."""


class MonotonicClocks:
    """The real clocks of this process: the C functions themselves, not methods that call them
    (every single-key call reads the steady clock; a method around it added about 0.1 us)."""

    steady_ns = staticmethod(time.monotonic_ns)
    system_ns = staticmethod(time.time_ns)


class ManualClocks:
    """Two independent hand-driven clocks for tests and notebooks.

    ``advance`` moves steady time (and, by default, system time by the same amount, as real
    time would); ``jump_system`` moves only the wall clock, forwards or backwards.
    """

    def __init__(self, steady_ns: int = 1_000 * NS_PER_S, system_ns: int = 1_796_000_000 * NS_PER_S):
        self._lock = threading.Lock()
        self._steady = int(steady_ns)
        self._system = int(system_ns)

    def steady_ns(self) -> int:
        return self._steady

    def system_ns(self) -> int:
        return self._system

    def advance(self, ns: int = 0, *, ms: int = 0, s: float = 0, system_too: bool = True) -> None:
        delta = int(ns) + int(ms) * NS_PER_MS + int(round(s * NS_PER_S))
        if delta < 0:
            raise InvalidParams("steady time never goes backwards")
        with self._lock:
            self._steady = checked_add(self._steady, delta)
            if system_too:
                self._system = checked_add(self._system, delta)

    def jump_system(self, ns: int = 0, *, ms: int = 0, s: float = 0) -> None:
        delta = int(ns) + int(ms) * NS_PER_MS + int(round(s * NS_PER_S))
        with self._lock:
            self._system = checked_add(self._system, delta)
