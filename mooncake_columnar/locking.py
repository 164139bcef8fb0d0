"""The master lock: reentrant, taken in turns by the client threads, without lock convoys.

Every public ``MasterService`` call holds one lock. Under CPython's GIL a plain lock makes a
*convoy* as soon as two threads contend: the waiter sleeps in the lock, the holder's release
hands the lock to it, but the waiter needs the GIL that the releaser still holds; the releaser
comes back for its next call, finds the lock taken and sleeps in turn. Every call then costs
two thread switches (measured: 4 threads doing single-key gets reached 0.4x the calls/s of
one thread). Waking threads is what costs here, so :class:`MasterLock` wakes as few as it can:

* a thread that finds the lock free and nobody waiting takes it at once (the fast path: one C
  ``acquire``), and keeps doing so for its next calls;
* a thread that finds it taken queues up. Only the oldest waiter sleeps in the master lock
  itself, so a release wakes it without the GIL and it gets the lock as soon as the holder
  does not come straight back (the holder went idle). The others sleep on private locks until
  they are the oldest. Nobody polls: a thread that wakes up wants the GIL, and as long as it
  waits for it, every GIL release of the running thread (NumPy releases it in each
  fancy-indexing operation) becomes a futex wake and a lost race;
* once threads have waited for :data:`TURN_S`, the holder's turn is up: its next call (like
  any newcomer's) queues behind them instead of taking the lock, and it sleeps until its turn
  comes round. Threads thus take turns of a few milliseconds at a few switches per turn, and
  the thread that gave up its turn sleeps instead of competing for the GIL;
* a long batch call queues behind any waiter between its chunks
  (:func:`.batching.run_in_chunks`), so a single get waits for about one chunk.

It is a subclass of the C ``RLock``: ``acquire``/``release``/``_is_owned`` keep their C speed
and their semantics; ``with lock:`` takes the path above.
"""
from __future__ import annotations

import _thread
from time import monotonic

TURN_S = 0.005      # once threads have waited this long, the holder queues behind them
WAIT_S = 0.05       # waiters look again at least this often (a safety net: wake-ups come from
                    # releases and from the waiter ahead taking the lock)


class MasterLock(_thread.RLock):
    """A reentrant lock taken in turns, for the one lock of a MasterService."""

    def __init__(self) -> None:
        self._meta = _thread.allocate_lock()   # guards ``waiters`` changes (never held long)
        self.waiters: list = []                # private locks of waiting threads, oldest first
        self._turn_start = 0.0                 # when the current turn began to count

    def turn_up(self) -> bool:
        """True when threads wait and the current turn is used up: a thread about to take the
        lock queues behind them instead."""
        return bool(self.waiters) and monotonic() - self._turn_start >= TURN_S

    def take(self) -> None:
        """Acquire: at once when free and nobody waits (or the turn is not up yet), else in
        turn. What ``_locked`` and ``with lock:`` do."""
        if (self.waiters and self.turn_up() and not self._is_owned()) or not self.acquire(False):
            self.wait_turn()

    def wait_turn(self) -> None:
        """Queue behind the waiting threads and block until this thread holds the lock."""
        if self._is_owned():  # reentrant: never wait for oneself
            self.acquire()
            return
        me = _thread.allocate_lock()
        me.acquire()
        with self._meta:
            if not self.waiters:
                self._turn_start = monotonic()  # the holder's turn counts from the first waiter
            self.waiters.append(me)
        try:
            while True:
                if self.waiters[0] is me:
                    # the oldest sleeps in the lock itself: a release hands it over
                    if self.acquire(False) or self.acquire(True, WAIT_S):
                        break
                else:
                    me.acquire(True, WAIT_S)   # woken when the waiter ahead takes the lock
        finally:
            with self._meta:
                self.waiters.remove(me)
                self._turn_start = monotonic()
                head = self.waiters[0] if self.waiters else None
            if head is not None:
                try:
                    head.release()             # the next oldest now sleeps in the lock
                except RuntimeError:           # already woken
                    pass

    # ---- ``with lock:`` ------------------------------------------------------------------------
    def __enter__(self) -> bool:
        self.take()
        return True

    def __exit__(self, *exc: object) -> None:
        self.release()
