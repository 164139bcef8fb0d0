"""Ordered oplog writer: reservations, group commit, backpressure and durable callbacks.

Callers follow upstream's "hide before durable, release after durable" pattern: ``reserve`` first
(before mutating anything; a refusal means "do not mutate"), then mutate, then ``submit`` the
entries (an :class:`OpLogColumns` body, or a few :class:`OpLogOp`) with a callback that finalizes
the mutation once it is durable. Group commit slices and concatenates column bodies into batches
of at most ``max_batch_entries`` (and at most the store's ``max_batch_bytes`` when it has one).

Differences from upstream's OrderedOpLogWriter, on purpose:

* sequence ids are assigned at ``reserve`` so that a caller can reserve a whole eviction cycle as
  one contiguous range; the price is that an unsubmitted reservation blocks every later one;
* backpressure is an explicit ``window`` of reserved-but-not-durable entries (:class:`WindowFull`)
  instead of a limit tied to the batch size;
* flushing is driven by ``flush()`` (deterministic for tests) or by an optional flusher thread.

Retryable store failures (:class:`OpLogStoreUnavailable`, ``OSError``) leave everything pending
and the same batch is retried first on the next flush. Every other failure (fencing, a lost
prefix CAS, a gap, an unwritable batch) makes the writer terminal: a deposed or confused primary
must stop emitting rather than guess.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..clock import Clocks
from ..errors import (
    FencedWrite,
    InvalidParams,
    OpLogConflict,
    OpLogStoreUnavailable,
    UnavailableInCurrentStatus,
    WindowFull,
)
from .oplog import OpLogBatch, OpLogColumns, OpLogOp, encode_batch
from .stores import OpLogStore

if TYPE_CHECKING:
    from ..changelog import RemovalFinalizer
    from ..store.metadata import MetadataStore
    from .journal import Journal

log = logging.getLogger(__name__)

DurableCallback = Callable[[OpLogBatch], None]  # gets the reservation's entries


@dataclass(frozen=True)
class Reservation:
    """Sequence ids ``first_sequence_id .. last_sequence_id`` held for one ``submit``."""

    first_sequence_id: int
    count: int
    writer: object = field(repr=False, compare=False)  # the OpLogWriter that made it

    @property
    def last_sequence_id(self) -> int:
        return self.first_sequence_id + self.count - 1


@dataclass
class _Slot:
    reservation: Reservation
    reserved_at_ns: int
    body: OpLogColumns | None = None


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, (OpLogStoreUnavailable, OSError))


class OpLogWriter:
    def __init__(self, store: OpLogStore, *, window: int, max_batch_entries: int = 1024, clocks: Clocks) -> None:
        if type(window) is not int or window < 1:
            raise InvalidParams(f"window must be a positive int, got {window!r}")
        if type(max_batch_entries) is not int or max_batch_entries < 1:
            raise InvalidParams(f"max_batch_entries must be a positive int, got {max_batch_entries!r}")
        self.store = store
        self.window = window
        self.max_batch_entries = max_batch_entries
        self.clocks = clocks
        self._durable = store.durable_prefix()
        self._next = self._durable + 1
        self._slots: dict[int, _Slot] = {}  # by first id; insertion order is id order
        self._retry: OpLogBatch | None = None  # failed with a retryable error; resent first, unchanged
        # Min-heap of (sequence id, registration order, callback, argument).
        self._callbacks: list[tuple[int, int, Callable[[Any], None], Any]] = []
        self._order = itertools.count()
        self._lock = threading.Lock()  # guards the fields above
        self._space = threading.Condition(self._lock)  # notified when the durable prefix moves
        self._flush_lock = threading.Lock()  # one store write sequence at a time
        self._dispatch_lock = threading.RLock()  # callbacks run one at a time, in order (RLock: they may re-enter)
        self._terminal: BaseException | None = None
        self._closed = False
        self.last_error: BaseException | None = None
        self.batches_written = 0
        self.entries_written = 0
        self.callback_errors = 0
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()

    # --- state -------------------------------------------------------------------------------

    @property
    def durable_prefix(self) -> int:
        return self._durable

    @property
    def reserved_through(self) -> int:
        """The last sequence id reserved so far: once it is durable, every change made before
        this read is (a server acknowledges a call only then)."""
        return self._next - 1

    @property
    def outstanding(self) -> int:
        """Entries reserved but not yet durable (what the window bounds)."""
        with self._lock:
            return self._next - 1 - self._durable

    @property
    def terminal_error(self) -> BaseException | None:
        return self._terminal

    def change_log(self, store: "MetadataStore", finalize: "RemovalFinalizer",
                   admission_timeout_s: float) -> "Journal":
        """A master's change log (changelog.ChangeLogSink) journaling into this writer."""
        from .journal import Journal  # journal.py builds on this module
        return Journal(self, store, finalize, admission_timeout_s)

    def durable_lag_ns(self) -> int:
        """Steady-clock age of the oldest reservation that is not yet durable (0 if none)."""
        with self._lock:
            oldest = next(iter(self._slots.values()), None)
        return 0 if oldest is None else max(0, self.clocks.steady_ns() - oldest.reserved_at_ns)

    def _check_open(self) -> None:
        if self._terminal is not None:
            raise self._terminal
        if self._closed:
            raise UnavailableInCurrentStatus("oplog writer is stopped")

    # --- producer side -----------------------------------------------------------------------

    def reserve(self, n: int = 1, *, timeout_s: float = 0.0) -> Reservation:
        """Hold ``n`` contiguous sequence ids; waits up to ``timeout_s`` (real time) for the
        window to take them, then raises WindowFull."""
        if type(n) is not int or not 1 <= n <= self.window:
            raise InvalidParams(f"reservation size must be an int in [1, {self.window}], got {n!r}")
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                self._check_open()
                outstanding = self._next - 1 - self._durable
                if outstanding + n <= self.window:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WindowFull(
                        f"{outstanding} entries are not durable yet; {n} more would exceed window {self.window}"
                    )
                self._space.wait(left)
            r = Reservation(self._next, n, self)
            self._slots[r.first_sequence_id] = _Slot(r, self.clocks.steady_ns())
            self._next += n
            return r

    def cancel(self, reservation: Reservation) -> None:
        """Give back the newest reservation, unsubmitted (the change it was made for failed
        before anything became visible), so its ids never hold the durable prefix back."""
        with self._lock:
            slot = self._slots.get(reservation.first_sequence_id)
            if (slot is None or slot.reservation is not reservation or slot.body is not None
                    or reservation.last_sequence_id != self._next - 1):
                raise InvalidParams(f"reservation {reservation.first_sequence_id} is not the newest unsubmitted one")
            del self._slots[reservation.first_sequence_id]
            self._next = reservation.first_sequence_id
            self._space.notify_all()

    def submit(self, reservation: Reservation, body: OpLogColumns | Sequence[OpLogOp],
               on_durable: DurableCallback | None = None) -> None:
        """Fill ``reservation`` with ``body`` (one entry per id); ``on_durable(batch)`` runs once all
        are durable, with the reservation's entries as a batch."""
        if not isinstance(reservation, Reservation) or reservation.writer is not self:
            raise InvalidParams("reservation was not made by this writer")
        if not isinstance(body, OpLogColumns):
            ops = tuple(body)
            for i, op in enumerate(ops):
                if not isinstance(op, OpLogOp):
                    raise InvalidParams(f"ops[{i}]: {type(op).__name__} is not an OpLogOp")
            body = OpLogColumns.from_ops(ops)
        if len(body) != reservation.count:
            raise InvalidParams(f"reservation holds {reservation.count} ids, got {len(body)} ops")
        with self._lock:
            self._check_open()
            slot = self._slots.get(reservation.first_sequence_id)
            if slot is None or slot.reservation is not reservation or slot.body is not None:
                raise InvalidParams(f"reservation {reservation.first_sequence_id} was already submitted")
            slot.body = body
            if on_durable is not None:
                heapq.heappush(self._callbacks, (reservation.last_sequence_id, next(self._order), on_durable,
                                                 OpLogBatch(reservation.first_sequence_id, body)))
        self._wake.set()

    def on_durable(self, seq: int, callback: Callable[[int], None]) -> None:
        """Run ``callback(seq)`` once ``seq`` is durable, in sequence order with all other callbacks."""
        if type(seq) is not int or seq < 1:
            raise InvalidParams(f"sequence id must be a positive int, got {seq!r}")
        with self._lock:
            heapq.heappush(self._callbacks, (seq, next(self._order), callback, seq))
        self._dispatch()  # already durable: runs now (after any earlier callback still queued)

    # --- group commit ------------------------------------------------------------------------

    def _ready_batches(self) -> list[OpLogBatch]:
        """The pending retry batch, then every submitted entry contiguous with it, cut to size."""
        with self._lock:
            if self._terminal is not None:  # a stopped writer still drains what was submitted
                raise self._terminal
            batches = [self._retry] if self._retry is not None else []
            start = self._retry.last_sequence_id + 1 if self._retry is not None else self._durable + 1
            pieces: list[OpLogColumns] = []
            for slot in self._slots.values():
                if slot.reservation.last_sequence_id < start:
                    continue
                if slot.body is None:
                    break  # ordered: an unsubmitted reservation holds back everything after it
                skip = max(0, start - slot.reservation.first_sequence_id)
                pieces.append(slot.body.slice(skip, len(slot.body)) if skip else slot.body)
        # Cut the run of bodies into batches of max_batch_entries: slices, concatenated per batch.
        chunk: list[OpLogColumns] = []
        filled = 0
        for piece in pieces:
            pos = 0
            while pos < len(piece):
                take = min(self.max_batch_entries - filled, len(piece) - pos)
                chunk.append(piece if take == len(piece) else piece.slice(pos, pos + take))
                filled += take
                pos += take
                if filled == self.max_batch_entries:
                    batches += self._fit(OpLogBatch(start, OpLogColumns.concat(chunk)))
                    start += filled
                    chunk, filled = [], 0
        if chunk:
            batches += self._fit(OpLogBatch(start, OpLogColumns.concat(chunk)))
        return batches

    def _fit(self, batch: OpLogBatch) -> list[OpLogBatch]:
        """``batch``, halved until each part encodes within the store's ``max_batch_bytes`` (etcd
        refuses larger requests); a single entry that still does not fit is the store's error."""
        limit = getattr(self.store, "max_batch_bytes", None)
        if limit is None or batch.count == 1 or len(encode_batch(batch)) <= limit:
            return [batch]
        half = batch.count // 2
        cols = batch.columns
        return (self._fit(OpLogBatch(batch.first_sequence_id, OpLogColumns.concat([cols.slice(0, half)])))
                + self._fit(OpLogBatch(batch.first_sequence_id + half,
                                       OpLogColumns.concat([cols.slice(half, batch.count)]))))

    def _append(self, batch: OpLogBatch) -> None:
        try:
            self.store.append_batch(batch)
        except OpLogConflict as exc:
            # A retried batch may have landed on the attempt that reported failure.
            if batch is self._retry and not isinstance(exc, FencedWrite) and self._landed(batch):
                return
            raise

    def _landed(self, batch: OpLogBatch) -> bool:
        try:
            if self.store.durable_prefix() < batch.last_sequence_id:
                return False
            stored = self.store.read_batches(batch.first_sequence_id - 1, limit=1)
        except Exception:  # undecidable now: keep the original conflict
            return False
        return stored[:1] == [batch]

    def flush(self) -> int:
        """Write every ready entry (group commit) and run the callbacks that became due.

        Returns the durable prefix. A store failure is recorded in ``last_error`` and raised
        after the callbacks of the batches written before it have run.
        """
        with self._flush_lock:
            for batch in self._ready_batches():
                try:
                    self._append(batch)
                except Exception as exc:
                    with self._lock:
                        self.last_error = exc
                        if _retryable(exc):
                            self._retry = batch
                        else:
                            self._terminal = exc
                            self._space.notify_all()  # waiting reservations fail now
                    self._dispatch()
                    raise
                with self._lock:
                    self._retry = None
                    self._durable = batch.last_sequence_id
                    self._space.notify_all()
                    self.batches_written += 1
                    self.entries_written += batch.count
                    while self._slots:
                        first = next(iter(self._slots))
                        if self._slots[first].reservation.last_sequence_id > self._durable:
                            break
                        del self._slots[first]
                self._dispatch()
            return self._durable

    def _dispatch(self) -> None:
        with self._dispatch_lock:
            while True:
                with self._lock:
                    if not self._callbacks or self._callbacks[0][0] > self._durable:
                        return
                    _, _, callback, arg = heapq.heappop(self._callbacks)
                try:
                    callback(arg)
                except Exception:  # durability cannot be undone; keep later callbacks running
                    self.callback_errors += 1
                    log.exception("oplog durable callback failed")

    # --- optional flusher thread -------------------------------------------------------------

    def start(self, *, max_backoff_s: float = 1.0) -> None:
        """Flush from a background thread whenever entries are submitted."""
        if self._thread is not None:
            raise UnavailableInCurrentStatus("flusher already started")
        self._thread = threading.Thread(target=self._run, args=(max_backoff_s,), name="oplog-writer", daemon=True)
        self._thread.start()

    def _run(self, max_backoff_s: float) -> None:
        backoff = 0.0
        while not self._stop.is_set():
            # After a retryable failure, wake on a doubling timer (1 ms .. max) to retry the batch.
            self._wake.wait(timeout=backoff or None)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.flush()
                backoff = 0.0
            except Exception as exc:
                if self._terminal is not None or not _retryable(exc):
                    log.error("oplog writer is terminal: %r", exc)
                    return
                backoff = min(max(backoff * 2, 0.001), max_backoff_s)

    def stop(self) -> None:
        """Refuse new reservations, stop the flusher thread, then flush what is left."""
        with self._lock:
            self._closed = True
            self._space.notify_all()
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._terminal is None:
            self.flush()
