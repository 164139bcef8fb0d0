"""The first put's compile helper: a forked process whose failure or hang costs the put only a
bounded wait, never its result (the put then compiles what it needs itself)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from mooncake_columnar import compile_helper
from mooncake_columnar.compile_helper import fork_helper

pytestmark = pytest.mark.skipif(not compile_helper.FORK_AVAILABLE, reason="no fork on this platform")


def _gone(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def test_a_helper_that_returns_is_done_and_reaped():
    helper = fork_helper(lambda: None)
    run = helper.wait()
    assert run.outcome == "done"
    assert compile_helper.last_run is run
    assert _gone(helper.pid)


def test_a_helper_that_raises_is_reported_failed_and_reaped():
    def body() -> None:
        raise RuntimeError("broken kernel")

    helper = fork_helper(body)
    run = helper.wait()
    assert run.outcome.startswith("failed (exit code 1"), run
    assert _gone(helper.pid)


def test_a_hung_helper_is_killed_after_its_budget(monkeypatch):
    monkeypatch.setattr(compile_helper, "MIN_WAIT_S", 0.2)
    helper = fork_helper(signal.pause)  # hangs: no signal comes until the kill
    t0 = time.perf_counter()
    run = helper.wait()
    assert run.outcome == "killed after 0.2 s"
    assert time.perf_counter() - t0 < 5
    assert _gone(helper.pid)


def test_a_helper_writes_nothing_to_the_parents_output(capfd):
    fork_helper(lambda: print("from the helper") or os.write(2, b"helper stderr\n")).wait()
    out, err = capfd.readouterr()
    assert "helper" not in out and "helper" not in err


def test_no_helper_once_the_get_kernel_is_compiled_or_after_the_first_put(master, monkeypatch):
    monkeypatch.setattr(compile_helper, "_tried", False)
    master.mount_segment("seg", endpoint="10.0.0.1:1", client_id="c", base=1 << 40, size=1 << 26)
    master.put_start("k", 4096, client_id="c")
    master.put_end("k", client_id="c")
    master.get_replica_list("k")  # compiled (or loaded) in this process now
    monkeypatch.setattr(compile_helper, "_tried", False)
    assert compile_helper.why_not() in ("get kernel compiled or cached", "JIT disabled")
    assert compile_helper.start_for_first_put(lambda: None) is None
    assert compile_helper.why_not() == "once per process"


def test_the_off_switch_forks_no_helper(monkeypatch):
    monkeypatch.setattr(compile_helper, "_tried", False)
    monkeypatch.setenv(compile_helper.OFF_SWITCH, "0")
    assert compile_helper.why_not() == "turned off (MOONCAKE_COLUMNAR_COMPILE_HELPER=0)"
    assert compile_helper.start_for_first_put(lambda: None) is None
    assert compile_helper.last_run.outcome == "not run: turned off (MOONCAKE_COLUMNAR_COMPILE_HELPER=0)"


def test_a_fork_that_fails_leaves_the_put_to_compile_alone(monkeypatch):
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(compile_helper, "_tried", False)
    monkeypatch.setattr(compile_helper, "why_not", lambda: None)
    monkeypatch.setattr(os, "fork", no_fork)
    open_before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0
    assert compile_helper.start_for_first_put(lambda: None) is None
    assert compile_helper.last_run.outcome.startswith("not run: could not start it"), compile_helper.last_run
    if open_before:
        assert len(os.listdir("/proc/self/fd")) == open_before  # the pipe closed again
