"""A snapshot writer in a forked child process: the copy-on-write freeze.

``fork()`` under the master's lock gives the child the master's memory at that instant, as
copy-on-write pages: a consistent state at one point of the master's history with no column
copied. The lock covers the fork only (page tables: milliseconds per GB of the master), no freeze
buffers are kept (about 70 bytes per object with the in-process freeze, 7 GB at 100M objects), and
only the pages the master writes while the child runs are copied, by the kernel, one at a time.
The child encodes and publishes; the parent learns the outcome through a pipe.

Ids and order: the parent names the snapshot (its id allocator lists the repository, after the
lock is released) and hands the id to the child through a second pipe, one writer at a time, in
the order the children were forked: a child may encode while an older one publishes, but never
publishes before it.

The child runs no Python thread it inherited (none exist after fork), no parallel Numba kernel
(GNU OpenMP aborts in a forked child), no logging, and leaves with ``os._exit``: no atexit hook
or buffered output of the parent runs twice. It closes the pipe ends of older children, so a
child whose parent died reads end-of-file and exits.
"""
from __future__ import annotations

import json
import os
import warnings
from typing import Callable

from ..errors import SnapshotPublishError

FORK_AVAILABLE = hasattr(os, "fork") and hasattr(os, "wait4")
_MAX_RESULT_BYTES = 1 << 16
# Parent-side pipe ends of children still running: each later child closes its copies.
_open_fds: set[int] = set()


class IdFromParent:
    """The child's id source (duck-typed :class:`~.manifest.SnapshotIdAllocator`): blocks until
    the parent sends the id, which is also the signal that older children have published."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def next_id(self, system_ns: int) -> str:
        data = os.read(self._fd, 256)
        if not data:
            raise SnapshotPublishError("no snapshot id came from the master process: nothing published")
        return data.decode("ascii")


class WriterProcess:
    """A forked writer, seen from the parent."""

    def __init__(self, pid: int, go_fd: int, result_fd: int) -> None:
        self.pid, self._go, self._result = pid, go_fd, result_fd
        _open_fds.update((go_fd, result_fd))

    def finish(self, snapshot_id: str | None) -> tuple[dict, int]:
        """Let the child publish as ``snapshot_id`` (None: give up, publishing nothing) and wait
        for it: (its result, its peak RSS in bytes, which counts the pages it shares with the
        master). A child that failed or died raises :class:`SnapshotPublishError`."""
        try:
            if snapshot_id is not None:
                os.write(self._go, snapshot_id.encode("ascii"))
        except BrokenPipeError:  # the child failed before it needed the id: its result says why
            pass
        os.close(self._go)  # (EOF to a child still waiting: it gives up)
        _open_fds.discard(self._go)
        chunks = []
        while data := os.read(self._result, _MAX_RESULT_BYTES):
            chunks.append(data)
        os.close(self._result)
        _open_fds.discard(self._result)
        _, status, usage = os.wait4(self.pid, 0)
        peak_rss = int(usage.ru_maxrss) * 1024  # KiB on Linux
        try:
            result = json.loads(b"".join(chunks))
        except ValueError:
            raise SnapshotPublishError(f"the snapshot writer process died ({_describe(status)}) "
                                       f"without a result") from None
        if "error" in result:
            raise SnapshotPublishError(f"snapshot writer process: {result['error']}", tuple(result.get("failed", ())))
        return result, peak_rss


def private_bytes() -> int:
    """This process's private (not shared with its parent) resident memory; 0 where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            private = [line for line in f if line.startswith(("Private_Clean:", "Private_Dirty:"))]
        return sum(int(line.split()[1]) * 1024 for line in private)
    except OSError:
        return 0


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def fork_writer(body: Callable[[IdFromParent], dict]) -> WriterProcess:
    """Fork now (the caller holds the master's lock: the child sees that instant). The child runs
    ``body(ids)`` (a JSON-able result; ``ids.next_id`` waits for :meth:`WriterProcess.finish`),
    reports it or its exception, and exits."""
    go_read, go_write = os.pipe()
    result_read, result_write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns on fork in a threaded process: see above
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            for fd in (*_open_fds, go_write, result_read):
                os.close(fd)
            try:
                out = body(IdFromParent(go_read))
            except BaseException as e:  # reported to the parent, typed there
                out = {"error": f"{type(e).__name__}: {e}", "failed": list(getattr(e, "failed", ()))}
            data = json.dumps(out).encode()
            while data:
                data = data[os.write(result_write, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(go_read)
    os.close(result_write)
    return WriterProcess(pid, go_write, result_read)
