"""The master's background thread: runs one function (``MasterService.tick``) every interval.

A failing round never stops the rounds after it: the exception is logged with its traceback,
counted (metric ``background_tick_failures``) and kept for ``health()``, and the next round runs
on time. Only ``stop()`` ends the thread.
"""
from __future__ import annotations

import logging
import threading
import traceback
from dataclasses import dataclass
from typing import Callable

from .locking import MasterLock
from .metrics import Metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackgroundHealth:
    """What the background thread has done; ``healthy`` is False while its last round failed or
    when the thread ended without ``stop()``."""

    running: bool
    died: bool                  # started, not stopped, and the thread is gone
    rounds: int                 # rounds run since start (failed ones included)
    failures: int               # rounds that raised
    consecutive_failures: int   # failures since the last round that succeeded
    last_error: str | None      # repr of the last exception, None if no round ever failed
    last_traceback: str | None

    @property
    def healthy(self) -> bool:
        return not self.died and self.consecutive_failures == 0


class BackgroundRunner:
    def __init__(self, work: Callable[[], object], metrics: Metrics, name: str,
                 master_lock: MasterLock | None = None) -> None:
        self._work = work
        self._master_lock = master_lock  # rounds are woken by its busy clients (locking.py)
        self._metrics = metrics
        self._name = name
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._rounds = 0
        self._failures = 0
        self._consecutive = 0
        self._last_error: str | None = None
        self._last_traceback: str | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, interval_s: float) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, args=(interval_s,), name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        if self._master_lock is not None:
            self._master_lock.wake_due()
        self._thread.join()
        self._thread = None

    def run_once(self) -> bool:
        """One round with the failure accounting of the thread; True when it succeeded."""
        try:
            self._work()
        except Exception as exc:  # noqa: BLE001 - any failure must be seen, and must not end the loop
            log.exception("%s: background round failed", self._name)
            self._metrics.inc("background_tick_failures")
            with self._lock:
                self._rounds += 1
                self._failures += 1
                self._consecutive += 1
                self._last_error = repr(exc)
                self._last_traceback = traceback.format_exc()
            return False
        with self._lock:
            self._rounds += 1
            self._consecutive = 0
        return True

    def _loop(self, interval_s: float) -> None:
        while True:
            if self._master_lock is not None:
                self._master_lock.sleep_until_due(interval_s)
            else:
                self._stop.wait(interval_s)
            if self._stop.is_set():
                return
            self.run_once()

    def health(self) -> BackgroundHealth:
        with self._lock:
            died = self._thread is not None and not self._thread.is_alive()
            return BackgroundHealth(self.running, died, self._rounds, self._failures, self._consecutive,
                                    self._last_error, self._last_traceback)


@dataclass(frozen=True)
class MasterHealth:
    background: BackgroundHealth
    journal_error: str | None   # the oplog writer's terminal error, if any
    # the last durable removal the master failed to free: its objects stay hidden, their space held
    removal_error: str | None = None

    @property
    def healthy(self) -> bool:
        return self.journal_error is None and self.removal_error is None and self.background.healthy
