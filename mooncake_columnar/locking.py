"""The master lock: reentrant, taken in turns by the client threads, without lock convoys.

Every public ``MasterService`` call holds one lock. Under CPython's GIL two things make a lock
between busy threads expensive, and :class:`MasterLock` avoids both:

* a *convoy*: a release hands a plain lock to a sleeping waiter (the semaphore under a CPython
  lock is taken by the woken thread before it has the GIL); the releaser comes back for its
  next call, finds the lock taken and sleeps in turn, so every call costs thread switches;
* a *GIL storm*: a thread woken while another one runs Python waits for the GIL, and every
  GIL release of the runner (NumPy drops it in most operations) wakes it again to lose the
  race (the runner takes the GIL straight back), for as long as the runner does not block.
  Measured with 4 threads of put/put_end/remove: 8,000 wake-ups per thread and second.

So the lock changes hands only at the end of a *turn*, and a waiter is only woken by a thread
that is about to leave the lock or to sleep itself:

* a thread that finds the lock free takes it at once (one C ``acquire``), unless threads wait
  and the current turn is up (:data:`TURN_S` after it began);
* a thread that finds it taken queues up on a private lock; nobody sleeps in the master lock
  itself. Each waiter sleeps until the turns ahead of it are due, plus :data:`IDLE_SLACK_S`
  (a holder that went idle); a busy holder wakes the oldest waiter when its turn is up, in
  its next ``take`` (then it queues and sleeps) or ``leave``;
* a batch call yields between its chunks (:meth:`MasterLock.yield_turn`): the waiting threads
  then get one call each, and the batch goes on after them, so a single get waits for about
  one chunk (:mod:`.batching`).

It is a subclass of the C ``RLock``: ``acquire``/``release``/``_is_owned`` keep their C speed
and their semantics; ``with lock:`` takes the path above.
"""
from __future__ import annotations

import _thread
from collections import deque
from time import monotonic
from typing import TYPE_CHECKING, Callable

TURN_S = 0.005      # a turn: once threads have waited this long, the holder queues behind them
IDLE_SLACK_S = 0.005  # a waiter wakes on its own this long after its turn was due (a holder
                      # that went idle); one woken earlier would only fight a busy holder for the GIL
MIN_SLEEP_S = 0.001  # an overdue waiter that is not the oldest sleeps at least this long
WAIT_S = 0.05       # a waiter whose turn is due looks again at least this often (a safety net:
                    # the holder wakes it when it leaves or sleeps)


_NEVER = float("inf")


def _wake(waiter: _thread.LockType) -> None:
    try:
        waiter.release()
    except RuntimeError:  # already woken
        pass


class MasterLock(_thread.RLock):  # type: ignore[misc]  # final in typeshed; subclassed for its C speed (docstring)
    """A reentrant lock taken in turns, for the one lock of a MasterService."""

    # slots, not an instance dict: an attribute of a C type's subclass is found in its instance
    # dict without the interpreter's specialised fast path (about 30 ns a load, 8 in a slot),
    # and every single-key call reads three of them
    __slots__ = ("_meta", "waiters", "_turn_start", "_one_call", "_yielding", "_due_at", "_due", "settle", "deferred")

    if TYPE_CHECKING:
        def _is_owned(self) -> bool:
            """The C RLock's own method (typeshed does not declare it): this thread holds the lock."""

    def __init__(self) -> None:
        self._meta = _thread.allocate_lock()   # guards ``waiters`` changes (never held long)
        self.waiters: list = []                # private locks of waiting threads, oldest first
        self._turn_start = 0.0                 # when the current turn began to count
        self._one_call = False                 # the turn is one call (a yielding batch waits)
        self._yielding = 0                     # batch calls queued by yield_turn
        self._due_at = _NEVER                  # when the background thread wants its next round
        self._due: _thread.LockType | None = None  # ... and the private lock it sleeps on
        # what a call that may mutate the master runs first, once it holds the lock (unfinished
        # staged growth, store/growth.py); None when nothing is pending
        self.settle: Callable[[], None] | None = None
        # changes handed over by threads that found the lock busy (run_or_defer): the next call
        # that may mutate runs them, after ``settle``, when it is not nested in another call
        self.deferred: deque[Callable[[], object]] = deque()

    def turn_up(self) -> bool:
        """True when threads wait and the current turn is used up: a thread about to take the
        lock queues behind them instead."""
        return bool(self.waiters) and (self._one_call or monotonic() - self._turn_start >= TURN_S)

    def take(self, *, reading: bool = False, first: bool = False) -> None:
        """Acquire: at once when free, unless threads wait and the turn is up; else in turn.
        What ``locked`` and ``with lock:`` do. Unless the caller only ``reading`` (it may
        grant leases), pending work the master must finish before it changes runs first.
        ``first``: the background round, which a client woke and waits for: it goes before
        the waiting threads."""
        # deferred changes wait for the outermost call: a nested one runs inside a change
        deferred = False if reading or not self.deferred else not self._is_owned()
        self._take(first)
        if not reading and (self.settle is not None or deferred):
            self._settle(deferred)

    def take_reading(self) -> None:
        """``take(reading=True)`` with its common case inline (no waiter, the background round
        not due, the lock free: one C ``acquire``), for the single-key reads."""
        if self.waiters or self._due_at <= monotonic() or not self.acquire(False):
            self._take(False)

    def _settle(self, deferred: bool) -> None:
        try:
            if self.settle is not None:
                self.settle()
            if deferred:
                self._run_deferred()
        except BaseException:
            self.leave()  # the caller's try/finally has not begun
            raise

    def _run_deferred(self) -> None:
        while self.deferred:
            self.deferred.popleft()()

    def run_or_defer(self, change: Callable[[], object]) -> None:
        """Make ``change`` to the master now if the lock is free and no growth is pending, else
        leave it to the next call that may mutate (:meth:`take`). Never waits: for a thread
        whose work the holder may be waiting for (the oplog writer's durable callbacks free
        window space a reserving holder waits for). Queued first, so a holder that leaves
        meanwhile cannot miss it."""
        self.deferred.append(change)
        if self._is_owned() or not self.acquire(False):  # held by another thread, or by a call of this one
            return
        try:
            if self.settle is None:  # a growth job copies the live structures: no change before it ends
                self._run_deferred()
        finally:
            self.leave()

    def _take(self, first: bool) -> None:
        if self._due_at <= monotonic() and not self._is_owned():
            self.wake_due()  # the background round goes first; this call waits until it is done
            self._queue(yielding=False, first_look=False)
            return
        if (first or not self.waiters or not self.turn_up()) and self.acquire(False):
            return
        elif self._is_owned():  # reentrant: never wait for oneself
            self.acquire()
            return
        elif self.turn_up() and not first:  # the holder whose turn is over: the oldest waiter goes next
            self._wake_head()
        self._queue(yielding=False, first=first)

    def leave(self, *, going_idle: bool = False) -> None:
        """Release; when the turn is up, or the caller says it will not be back soon (a
        background round), wake the oldest waiter (the lock is its now)."""
        self.release()
        if self.waiters and (going_idle or self.turn_up()) and not self._is_owned():
            self._wake_head()

    def _wake_head(self) -> None:
        with self._meta:
            head = self.waiters[0] if self.waiters else None
        if head is not None:
            _wake(head)

    def sleep_until_due(self, interval_s: float) -> None:
        """Sleep (a background thread) until ``interval_s`` from now. A busy client thread
        wakes it when it is due, at the start of its next call, and queues behind it, so the
        background thread never has to wrest the GIL from a busy client (see the module
        docstring); with no client calling, it wakes on its own a while later."""
        me = _thread.allocate_lock()
        me.acquire()
        with self._meta:
            self._due, self._due_at = me, monotonic() + interval_s
        me.acquire(True, interval_s + IDLE_SLACK_S)
        with self._meta:
            if self._due is me:
                self._due, self._due_at = None, _NEVER

    def wake_due(self) -> None:
        """Wake the background thread sleeping in :meth:`sleep_until_due` now."""
        with self._meta:
            due, self._due, self._due_at = self._due, None, _NEVER
        if due is not None:
            _wake(due)

    def yield_turn(self, *, reading: bool = False) -> None:
        """Between two chunks of a batch call (the caller does not hold the lock): when threads
        wait, end the current turn, let each waiter make one call, then take the lock back;
        else take it at once. ``reading`` as in :meth:`take`."""
        if not self.waiters or self._is_owned():  # (an outer call holding it keeps it)
            self.take(reading=reading)
            return
        deferred = not reading and len(self.deferred) > 0
        with self._meta:
            self._one_call = True
            self._yielding += 1
        self._wake_head()
        self._queue(yielding=True)
        if not reading and (self.settle is not None or deferred):
            self._settle(deferred)

    def _queue(self, *, yielding: bool, first_look: bool = True, first: bool = False) -> None:
        """Queue behind the waiting threads and block until this thread holds the lock.

        A thread woken while another runs Python needs the GIL it cannot get: every GIL release
        of the runner (NumPy drops it in most operations) wakes it again and it loses the race
        (the runner takes the GIL straight back), for as long as the runner does not block. So
        a waiter sleeps until the turns ahead of it are expected to be over, and is woken
        early only by a thread about to leave the lock or to sleep itself."""
        me = _thread.allocate_lock()
        me.acquire()
        with self._meta:
            if not self.waiters:
                self._turn_start = monotonic()  # the holder's turn counts from the first waiter
            self.waiters.insert(0, me) if first else self.waiters.append(me)
        try:
            woken = first_look  # by a thread leaving the lock or going to sleep (first: it may be free)
            while True:
                ahead = self.waiters.index(me)
                if ahead == 0 and (woken or self.turn_up()):
                    if self.acquire(False):
                        break
                    if self.turn_up():  # the holder is in a call past its turn: its leave() wakes us
                        woken = me.acquire(True, WAIT_S)
                        continue
                # the current turn and one per waiter ahead come first, and their holders wake
                # this thread when they hand over; on its own it wakes a slack later (a holder
                # that went idle): woken earlier, it would only fight a busy holder for the GIL
                woken = me.acquire(True, max(MIN_SLEEP_S, self._turn_start + (ahead + 1) * TURN_S
                                             + IDLE_SLACK_S - monotonic()))
        finally:
            with self._meta:
                self.waiters.remove(me)
                self._yielding -= yielding
        with self._meta:
            # this thread's turn; one call each while a yielding batch waits behind
            self._turn_start = monotonic()
            self._one_call = self._yielding > 0
            head = self.waiters[0] if self.waiters and self._one_call else None
        if head is not None:
            _wake(head)  # one-call turns: the next waiter goes right after this call

    # ---- ``with lock:`` ------------------------------------------------------------------------
    def __enter__(self) -> bool:  # type: ignore[override]  # `with` passes no arguments to __enter__
        self.take()
        return True

    def __exit__(self, *exc: object) -> None:
        self.leave()
