"""A second process for a fresh process's first compile: while the first put compiles its kernel,
a forked helper compiles the put_end and single-get kernels into the Numba cache.

On an empty Numba cache a fresh process's first put, put_end and get compile their kernels one
after another (Numba compiles on one thread, under one global lock): about 4.1 of the 4.7 s of a
first call on a quiet 2-core host, the put's kernel about half of it. So the first put forks a
helper that runs a put_end and a get of an absent key on a throwaway master: that compiles the
very kernels, with the very signatures, this process's own put_end and get take (the same API
code builds their arguments), and Numba writes them to the cache. The put waits for the helper
before it returns; the later calls load the kernels (milliseconds). What the helper runs is the
service's (master.py, above this module): the put policy passes it in.

Only where it can help: ``fork`` exists, the process may run on two CPUs or more, the JIT is
on, the cache is on disk, the get kernel is neither compiled in this process nor in the cache,
and once per process; ``MOONCAKE_COLUMNAR_COMPILE_HELPER=0`` turns it off (a process that must
not fork). The fork happens under Numba's compiler lock (no other thread is half way
through a compile the helper would wait on; the lock is re-entrant, so the helper, whose one
thread is the forking one, takes it again). The helper runs no inherited thread and no parallel
kernel, writes nothing to the parent's output, and leaves with ``os._exit``. One that fails or
outlives its budget (twice the put's own compile, 2 s at least) costs only that wait: it is
killed and this process compiles what it needs itself.
"""
from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numba
from numba.core.compiler_lock import global_compiler_lock

from .kernels import reads

FORK_AVAILABLE = hasattr(os, "fork") and hasattr(os, "wait4")
OFF_SWITCH = "MOONCAKE_COLUMNAR_COMPILE_HELPER"  # "0": never fork one (e.g. a process that must not fork)
MIN_WAIT_S = 2.0
WAIT_FACTOR = 2.0


@dataclass
class HelperRun:
    """What the last helper of this process did (``bench startup`` reports it)."""

    outcome: str = "not run"  # "done", "failed (...)", "killed after N s" or why it did not run
    waited_s: float = 0.0     # how long the first put waited for it after its own compile
    helper_s: float = 0.0     # the helper's lifetime as the parent saw it (fork to exit)
    helper_cpu_s: float = 0.0  # the helper's own CPU seconds


last_run = HelperRun()
_tried = False
_start_lock = threading.Lock()


class Helper:
    """A forked helper, seen from the parent."""

    def __init__(self, pid: int, done_fd: int) -> None:
        self.pid, self._done = pid, done_fd
        self.started = time.perf_counter()

    def wait(self) -> HelperRun:
        """Wait for the helper: up to WAIT_FACTOR times the time since the fork (MIN_WAIT_S at
        least), then kill it. Always reaps it; returns (and records) what happened."""
        t0 = time.perf_counter()
        budget = max(MIN_WAIT_S, WAIT_FACTOR * (t0 - self.started))
        exits = select.poll()  # (not select(): no limit on the descriptor's number)
        exits.register(self._done, select.POLLIN)
        ready = exits.poll(budget * 1000)  # end of file (a hang-up) once the helper exits
        os.close(self._done)
        if not ready:
            os.kill(self.pid, signal.SIGKILL)
        _, status, usage = os.wait4(self.pid, 0)
        waited = time.perf_counter() - t0
        if not ready:
            outcome = f"killed after {budget:.1f} s"
        elif os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            outcome = "done"
        else:
            outcome = f"failed (exit code {os.waitstatus_to_exitcode(status)}; -N: signal N)"
        run = HelperRun(outcome, waited, time.perf_counter() - self.started, usage.ru_utime + usage.ru_stime)
        _record(run)
        return run


def _record(run: HelperRun) -> None:
    global last_run
    last_run = run


def fork_helper(body: Callable[[], None]) -> Helper:
    """Fork a helper that runs ``body()`` and exits (status 0 when it returned, 1 when it raised);
    its standard output and error go to /dev/null."""
    done_read, done_write = os.pipe()
    try:
        with global_compiler_lock, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork in a threaded process
            pid = os.fork()
    except OSError:
        os.close(done_read)
        os.close(done_write)
        raise
    if pid == 0:  # the helper: never returns (done_write closes as it exits)
        code = 1
        try:
            os.close(done_read)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.dup2(null, 2)
            sys.stdout = sys.stderr = open(os.devnull, "w")  # (these may write elsewhere than 1 and 2)
            body()
            code = 0
        finally:
            os._exit(code)
    os.close(done_write)
    return Helper(pid, done_read)


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _in_cache(dispatcher: object) -> bool:
    """The dispatcher's kernel is in this process or has a Numba cache index (True when unknown:
    no helper is forked on a guess)."""
    if getattr(dispatcher, "signatures", None):
        return True
    try:
        return os.path.exists(dispatcher._cache._cache_file._index_path)  # type: ignore[attr-defined]
    except AttributeError:  # no disk cache (a NullCache) or another Numba layout
        return True


def why_not() -> str | None:
    """Why no helper would be forked now (None: one would)."""
    if _tried:
        return "once per process"
    if os.environ.get(OFF_SWITCH) == "0":
        return f"turned off ({OFF_SWITCH}=0)"
    if not FORK_AVAILABLE:
        return "no fork on this platform"
    if getattr(numba.config, "DISABLE_JIT", False):
        return "JIT disabled"
    if _usable_cpus() < 2:
        return "one CPU"
    if _in_cache(reads.read_one):
        return "get kernel compiled or cached"
    return None


def start_for_first_put(body: Callable[[], None]) -> Helper | None:
    """At a put, before its kernel runs: the helper running ``body`` when one is worth forking
    (see the module doc), else None. The caller waits for it (:meth:`Helper.wait`) once its own
    kernel ran. ``body`` comes from the service (master.py), which this module sits below."""
    global _tried
    if _tried:  # every put but a process's first: one flag test
        return None
    with _start_lock:  # two threads' first puts (on two masters): one helper
        reason = why_not()
        _tried = True
    if reason is not None:
        _record(HelperRun(f"not run: {reason}"))
        return None
    try:
        return fork_helper(body)
    except OSError as e:  # no process or descriptor to spare: the put compiles alone, as without it
        _record(HelperRun(f"not run: could not start it ({e})"))
        return None
