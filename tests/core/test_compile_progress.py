"""The one-time compilation says what it is doing: a kernel compiled inside ``compile_progress``
is reported while it compiles and when it is done; without a compile nothing is printed."""
from __future__ import annotations

import io
import threading
import time

import numba

from mooncake_columnar.compile_progress import compile_progress


def test_a_compile_is_reported_while_it_runs_and_when_done() -> None:
    out = io.StringIO()

    @numba.njit(cache=False)
    def slow_to_compile(x):  # a fresh function: compiled on its first call, inside the block
        return x + 1

    with compile_progress(out, interval_s=0.05):
        slow_to_compile(1)
        deadline = time.monotonic() + 5.0  # wait for the reporting thread's first look, not a fixed time
        while not numba.config.DISABLE_JIT and "once per machine" not in out.getvalue():
            assert time.monotonic() < deadline, "no report within 5 s of a compile"
            threading.Event().wait(0.01)
    text = out.getvalue()
    if numba.config.DISABLE_JIT:
        assert text == ""
        return
    assert "once per machine" in text
    assert "kernels compiled: 1" in text


def test_nothing_is_printed_without_a_compile() -> None:
    out = io.StringIO()
    with compile_progress(out, interval_s=0.05):
        pass
    assert out.getvalue() == ""
