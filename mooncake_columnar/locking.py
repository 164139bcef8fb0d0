"""The master lock: reentrant, taken in turns by the client threads, without lock convoys.

Every public ``MasterService`` call holds one lock. Under CPython's GIL a plain lock makes a
*convoy* as soon as two threads contend: a release hands the lock to a sleeping waiter (the
semaphore under a CPython lock is taken by the woken thread, before it has the GIL), the
releaser comes back for its next call, finds the lock taken and sleeps in turn. Every call
then costs two or more thread switches (measured: 4 threads doing mixed single-key calls
reached 0.6-0.7x the calls/s of one thread). Waking threads is what costs here, so
:class:`MasterLock` hands the lock over only at the end of a *turn*:

* a thread that finds the lock free takes it at once (one C ``acquire``), unless threads wait
  and the current turn is up (:data:`TURN_S` after it began);
* a thread that finds it taken queues up on a private lock; nobody ever sleeps in the master
  lock itself, so a release never hands it to a thread that still needs the GIL. The oldest
  waiter wakes when the turn is up (it looks every :data:`POLL_S` before that, so a holder
  that went idle early is not waited for long) and takes the lock; the others sleep until
  they are the oldest;
* the holder that leaves once its turn is up wakes the oldest waiter, and its own next call
  queues behind the waiters. Threads thus take turns of a few milliseconds at a few switches
  per turn;
* a batch call yields between its chunks (:meth:`MasterLock.yield_turn`): the waiting threads
  then get one call each, and the batch goes on after them, so a single get waits for about
  one chunk (:mod:`.batching`).

It is a subclass of the C ``RLock``: ``acquire``/``release``/``_is_owned`` keep their C speed
and their semantics; ``with lock:`` takes the path above.
"""
from __future__ import annotations

import _thread
from time import monotonic

TURN_S = 0.005      # a turn: once threads have waited this long, the holder queues behind them
POLL_S = 0.001      # the oldest waiter looks whether the lock went idle at least this often
WAIT_S = 0.05       # other waiters look again at least this often (a safety net: each is woken
                    # when it becomes the oldest)


def _wake(waiter: _thread.LockType) -> None:
    try:
        waiter.release()
    except RuntimeError:  # already woken
        pass


class MasterLock(_thread.RLock):
    """A reentrant lock taken in turns, for the one lock of a MasterService."""

    def __init__(self) -> None:
        self._meta = _thread.allocate_lock()   # guards ``waiters`` changes (never held long)
        self.waiters: list = []                # private locks of waiting threads, oldest first
        self._turn_start = 0.0                 # when the current turn began to count
        self._one_call = False                 # the turn is one call (a yielding batch waits)
        self._yielding = 0                     # batch calls queued by yield_turn

    def turn_up(self) -> bool:
        """True when threads wait and the current turn is used up: a thread about to take the
        lock queues behind them instead."""
        return bool(self.waiters) and (self._one_call or monotonic() - self._turn_start >= TURN_S)

    def take(self) -> None:
        """Acquire: at once when free, unless threads wait and the turn is up; else in turn.
        What ``_locked`` and ``with lock:`` do."""
        if (not self.waiters or not self.turn_up()) and self.acquire(False):
            return
        if self._is_owned():  # reentrant: never wait for oneself
            self.acquire()
            return
        self._queue(yielding=False)

    def leave(self) -> None:
        """Release; when the turn is up, wake the oldest waiter (the lock is its now)."""
        self.release()
        if self.waiters and self.turn_up() and not self._is_owned():
            with self._meta:
                head = self.waiters[0] if self.waiters else None
            if head is not None:
                _wake(head)

    def yield_turn(self) -> None:
        """Between two chunks of a batch call (the caller does not hold the lock): when threads
        wait, end the current turn, let each waiter make one call, then take the lock back;
        else take it at once."""
        if not self.waiters or self._is_owned():  # (an outer call holding it keeps it)
            self.take()
            return
        with self._meta:
            self._one_call = True
            self._yielding += 1
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            _wake(head)
        self._queue(yielding=True)

    def _queue(self, *, yielding: bool) -> None:
        """Queue behind the waiting threads and block until this thread holds the lock."""
        me = _thread.allocate_lock()
        me.acquire()
        with self._meta:
            if not self.waiters:
                self._turn_start = monotonic()  # the holder's turn counts from the first waiter
            self.waiters.append(me)
        try:
            while True:
                if self.waiters[0] is me:
                    left = 0.0 if self._one_call else self._turn_start + TURN_S - monotonic()
                    if self.acquire(False):  # the turn is up, or the holder went idle
                        break
                    me.acquire(True, min(left, POLL_S) if left > 0 else WAIT_S)
                else:
                    me.acquire(True, WAIT_S)   # woken when it becomes the oldest
        except BaseException:
            with self._meta:
                self.waiters.remove(me)
                self._yielding -= yielding
            raise
        with self._meta:
            self.waiters.remove(me)
            self._yielding -= yielding
            # this thread's turn; one call each while a yielding batch waits behind
            self._turn_start = monotonic()
            self._one_call = self._yielding > 0
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            _wake(head)  # the next oldest times this turn from now

    # ---- ``with lock:`` ------------------------------------------------------------------------
    def __enter__(self) -> bool:
        self.take()
        return True

    def __exit__(self, *exc: object) -> None:
        self.leave()
