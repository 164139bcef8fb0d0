"""Say what the one-time kernel compilation is doing while it runs.

On an empty Numba cache the first demo, warm-up or ``serve`` compiles every kernel it reaches
(minutes on a small machine), and nothing else prints meanwhile. :func:`compile_progress` listens
to Numba's compile events and, while compiles happen, reports every few seconds how many kernels
are done and which one is compiling: one updating line on a terminal, plain lines otherwise (or
through a logger). With a warm cache no compile event fires and it prints nothing.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from typing import IO, Iterator

from numba.core import event

HEARTBEAT_S = 5.0


class _Listener(event.Listener):
    def __init__(self) -> None:
        self.done = 0
        self.current: str | None = None
        self.started_at: float | None = None
        self.lock = threading.Lock()

    def on_start(self, ev: event.Event) -> None:
        data = ev.data or {}
        dispatcher = data.get("dispatcher")
        fn = getattr(dispatcher, "py_func", None)
        name = f"{fn.__module__.rsplit('.', 1)[-1]}.{fn.__qualname__}" if fn is not None else "a kernel"
        with self.lock:
            if self.started_at is None:
                self.started_at = time.monotonic()
            self.current = name

    def on_end(self, ev: event.Event) -> None:
        with self.lock:
            self.done += 1
            self.current = None


@contextlib.contextmanager
def compile_progress(stream: IO[str] | None = None, *, logger: logging.Logger | None = None,
                     interval_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Report kernel compilation inside the block on ``stream`` (default stderr) or ``logger``."""
    out = stream if stream is not None else sys.stderr
    tty = logger is None and out.isatty()
    listener = _Listener()
    stop = threading.Event()
    said_first = False

    def say(text: str, final: bool = False) -> None:
        if logger is not None:
            logger.info("%s", text)
        elif tty:
            out.write("\r" + text.ljust(100) + ("\n" if final else ""))
            out.flush()
        else:
            out.write(text + "\n")
            out.flush()

    def beat() -> None:
        nonlocal said_first
        while not stop.wait(interval_s if said_first else min(0.5, interval_s)):
            with listener.lock:
                started, done, current = listener.started_at, listener.done, listener.current
            if started is None:
                continue
            if not said_first:
                say("compiling kernels on first use: once per machine, later runs load them from Numba's cache")
                said_first = True
                continue
            now = f", now {current}" if current else ""
            say(f"compiling kernels: {done} compiled in {time.monotonic() - started:.0f} s{now}")

    thread = threading.Thread(target=beat, name="mooncake-compile-progress", daemon=True)
    with event.install_listener("numba:compile", listener):
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if listener.started_at is not None and said_first:
                say(f"kernels compiled: {listener.done} in {time.monotonic() - listener.started_at:.0f} s "
                    "(cached for the next run)", final=True)
