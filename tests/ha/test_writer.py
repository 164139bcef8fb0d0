"""OpLogWriter: ordering, group commit, backpressure window, failure handling, durable callbacks."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.errors import (
    FencedWrite,
    InvalidParams,
    OpLogConflict,
    OpLogGap,
    OpLogStoreUnavailable,
    UnavailableInCurrentStatus,
    WindowFull,
)
from mooncake_columnar.ha.oplog import (
    OpLogBatch,
    OpLogColumns,
    OpLogEntry,
    OpLogOp,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    encode_batch,
)
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter


class FakeStore:
    """In-memory OpLogStore with fault injection: ``faults[n]`` decides the n-th append (1-based).

    A fault is ``("fail", exc)`` (nothing written) or ``("commit_then_fail", exc)`` (written, but
    the caller hears an error: the ambiguous case).
    """

    def __init__(self) -> None:
        self.batches: list[OpLogBatch] = []
        self.calls = 0
        self.faults: dict[int, tuple[str, Exception]] = {}

    def append_batch(self, batch: OpLogBatch) -> None:
        self.calls += 1
        mode, exc = self.faults.get(self.calls, ("ok", None))  # type: ignore[arg-type]
        if mode == "fail":
            raise exc
        prefix = self.durable_prefix()
        if batch.first_sequence_id != prefix + 1:
            raise (OpLogGap if batch.first_sequence_id > prefix + 1 else OpLogConflict)("not contiguous")
        self.batches.append(batch)
        if mode == "commit_then_fail":
            raise exc

    def durable_prefix(self) -> int:
        return self.batches[-1].last_sequence_id if self.batches else 0

    def read_batches(self, after_seq: int, limit: int | None = None) -> list[OpLogBatch]:
        out = [b for b in self.batches if b.last_sequence_id > after_seq]
        return out if limit is None else out[:limit]

    def producer_view(self) -> int:
        return 0

    def set_producer_view(self, view: int) -> None:
        pass

    def compact_through(self, seq: int) -> int:
        return 0

    def ids(self) -> list[int]:
        return [i for b in self.batches for i in b.sequence_ids]

    def sizes(self) -> list[int]:
        return [b.count for b in self.batches]


def rm(key: str) -> OpLogOp:
    return OpLogOp(OpType.REMOVE, "default", key)


def make(store: object = None, **kw: int) -> tuple[OpLogWriter, FakeStore]:
    store = store if store is not None else FakeStore()
    kw.setdefault("window", 64)
    return OpLogWriter(store, clocks=ManualClocks(), **kw), store  # type: ignore[arg-type,return-value]


def recorder(log: list, tag: str) -> Callable:
    return lambda arg: log.append((tag, list(arg.sequence_ids) if isinstance(arg, OpLogBatch) else arg))


def test_callbacks_run_in_sequence_order() -> None:
    w, store = make()
    log: list = []
    r1, r2, r3 = w.reserve(2), w.reserve(1), w.reserve(3)
    assert (r1.first_sequence_id, r2.first_sequence_id, r3.first_sequence_id) == (1, 3, 4)
    w.on_durable(5, recorder(log, "seq5"))
    w.on_durable(4, recorder(log, "seq4"))
    w.submit(r3, [rm("c"), rm("d"), rm("e")], recorder(log, "r3"))
    w.submit(r1, [rm("a1"), rm("a2")], recorder(log, "r1"))
    w.submit(r2, [rm("b")], recorder(log, "r2"))
    assert log == []  # nothing runs before the store confirms
    assert w.flush() == 6
    assert log == [("r1", [1, 2]), ("r2", [3]), ("seq4", 4), ("seq5", 5), ("r3", [4, 5, 6])]
    assert store.ids() == [1, 2, 3, 4, 5, 6]
    assert store.batches[0].entries[0] == OpLogEntry(1, OpType.REMOVE, "default", "a1")


def test_unsubmitted_reservation_blocks_later_ones() -> None:
    w, store = make()
    log: list = []
    r1, r2 = w.reserve(), w.reserve()
    w.submit(r2, [rm("b")], recorder(log, "r2"))
    assert w.flush() == 0
    assert store.batches == [] and log == []
    w.submit(r1, [rm("a")], recorder(log, "r1"))
    assert w.flush() == 2
    assert store.sizes() == [2] and log == [("r1", [1]), ("r2", [2])]


def test_window_backpressure() -> None:
    w, _ = make(window=4)
    a = w.reserve(3)
    with pytest.raises(WindowFull, match="window 4"):
        w.reserve(2)
    b = w.reserve(1)
    with pytest.raises(WindowFull):
        w.reserve(1)
    assert w.outstanding == 4
    w.submit(a, [rm("a"), rm("b"), rm("c")])
    assert w.flush() == 3  # b is reserved but not submitted: still counts against the window
    with pytest.raises(WindowFull):
        w.reserve(4)
    w.reserve(3)
    w.submit(b, [rm("d")])
    with pytest.raises(InvalidParams):
        w.reserve(5)  # could never fit: a programming error, not backpressure


def test_window_reopens_after_durability() -> None:
    w, _ = make(window=2)
    r = w.reserve(2)
    with pytest.raises(WindowFull):
        w.reserve()
    w.submit(r, [rm("a"), rm("b")])
    w.flush()
    assert w.outstanding == 0
    assert w.reserve(2).first_sequence_id == 3


@pytest.mark.parametrize("max_batch, reservations, sizes", [
    (1024, [1] * 10, [10]),
    (4, [1] * 10, [4, 4, 2]),
    (4, [6, 1], [4, 3]),
    (3, [2, 2, 2], [3, 3]),
])
def test_group_commit_batch_sizes(max_batch: int, reservations: list[int], sizes: list[int]) -> None:
    w, store = make(max_batch_entries=max_batch)
    for n in reservations:
        w.submit(w.reserve(n), [rm(f"k{i}") for i in range(n)])
    w.flush()
    assert store.sizes() == sizes
    assert w.batches_written == len(sizes) and w.entries_written == sum(reservations)
    assert store.ids() == list(range(1, sum(reservations) + 1))


def put(key: str, client: str, group: str) -> OpLogOp:
    rep = ReplicaDescriptor(len(key), 0, f"seg-{client}", 64, 10, 3)
    return OpLogOp(OpType.PUT_END, "default", key, PutEndPayload(client, 10, (rep,), 0, group))


def test_column_bodies_are_sliced_across_batches_with_compact_string_tables() -> None:
    w, store = make(max_batch_entries=4)
    bodies = [[put(f"a{i}", "c1", f"g{i}") for i in range(6)], [rm("b")],
              [put(f"c{i}", "c2", "") for i in range(5)]]
    for ops in bodies:
        w.submit(w.reserve(len(ops)), OpLogColumns.from_ops(ops))
    w.flush()
    assert store.sizes() == [4, 4, 4]
    flat = [o.at(i + 1) for i, o in enumerate(o for ops in bodies for o in ops)]
    assert [e for b in store.batches for e in b.entries] == flat
    for b in store.batches:  # each batch carries only the strings its rows use, once
        names = b.columns.strings.to_pylist()
        assert len(names) == len(set(names))
        assert set(names) == {s for e in b.entries for s in _strings(e)}


def _strings(e: OpLogEntry) -> set[str]:
    p = e.payload
    if p is None:
        return {e.tenant}
    return {e.tenant, p.client, p.group_id} | {s for r in p.replicas for s in (r.segment, r.endpoint)}


class LimitedStore(FakeStore):
    """A store that refuses batches over ``max_batch_bytes`` (as etcd's request limit does)."""

    max_batch_bytes = 600

    def append_batch(self, batch: OpLogBatch) -> None:
        assert len(encode_batch(batch)) <= self.max_batch_bytes or batch.count == 1
        super().append_batch(batch)


def test_batches_are_halved_to_fit_the_store_byte_limit() -> None:
    w, store = make(LimitedStore(), max_batch_entries=64)
    w.submit(w.reserve(40), [put(f"key-{i:04d}-" + "x" * 20, "c", "") for i in range(40)])
    w.flush()
    assert len(store.batches) > 1 and sum(store.sizes()) == 40
    assert store.ids() == list(range(1, 41))
    assert all(len(encode_batch(b)) <= LimitedStore.max_batch_bytes for b in store.batches)


def test_failed_append_stays_pending_and_is_retried_unchanged() -> None:
    w, store = make(max_batch_entries=2)
    store.faults[2] = ("fail", OpLogStoreUnavailable("etcd down"))
    log: list = []
    for i in range(5):
        w.submit(w.reserve(), [rm(f"k{i}")], recorder(log, f"r{i + 1}"))
    with pytest.raises(OpLogStoreUnavailable, match="etcd down"):
        w.flush()
    assert w.durable_prefix == 2 and w.outstanding == 3
    assert isinstance(w.last_error, OpLogStoreUnavailable) and w.terminal_error is None
    assert [t for t, _ in log] == ["r1", "r2"]  # batch 1 confirmed before the failure
    w.submit(w.reserve(), [rm("late")], recorder(log, "r6"))
    assert w.flush() == 6
    assert store.sizes() == [2, 2, 2]  # [3, 4] retried as it was, then [5, 6]
    assert [t for t, _ in log] == ["r1", "r2", "r3", "r4", "r5", "r6"]


def test_ambiguous_append_that_landed_is_not_a_conflict() -> None:
    w, store = make()
    store.faults[1] = ("commit_then_fail", OpLogStoreUnavailable("answer lost"))
    log: list = []
    w.submit(w.reserve(2), [rm("a"), rm("b")], recorder(log, "r1"))
    with pytest.raises(OpLogStoreUnavailable):
        w.flush()
    assert log == []
    assert w.flush() == 2  # the retry meets "already durable", verifies the batch, moves on
    assert log == [("r1", [1, 2])] and store.sizes() == [2]


def test_fenced_writer_becomes_terminal(tmp_path: Path) -> None:
    old_handle = FileOpLogStore(tmp_path)
    old_handle.set_producer_view(1)
    w, _ = make(old_handle)
    log: list = []
    w.submit(w.reserve(), [rm("a")], recorder(log, "a"))
    w.flush()
    FileOpLogStore(tmp_path).set_producer_view(2)  # a new primary took over
    w.submit(w.reserve(), [rm("b")], recorder(log, "b"))
    with pytest.raises(FencedWrite):
        w.flush()
    assert isinstance(w.terminal_error, FencedWrite)
    with pytest.raises(FencedWrite):
        w.reserve()
    with pytest.raises(FencedWrite):
        w.flush()
    assert log == [("a", [1])]
    assert old_handle.durable_prefix() == 1


def test_writer_continues_an_existing_log(tmp_path: Path) -> None:
    store = FileOpLogStore(tmp_path)
    w, _ = make(store, max_batch_entries=2)
    for i in range(3):
        w.submit(w.reserve(), [rm(f"k{i}")])
    w.stop()
    assert store.durable_prefix() == 3
    w2, _ = make(FileOpLogStore(tmp_path))
    assert w2.reserve().first_sequence_id == 4


def test_on_durable_for_a_durable_seq_runs_now() -> None:
    w, _ = make()
    w.submit(w.reserve(), [rm("a")])
    w.flush()
    log: list = []
    w.on_durable(1, recorder(log, "past"))
    assert log == [("past", 1)]
    with pytest.raises(InvalidParams):
        w.on_durable(0, recorder(log, "bad"))


def test_failing_callback_does_not_stop_later_ones(caplog: pytest.LogCaptureFixture) -> None:
    w, _ = make()
    log: list = []

    def boom(_: object) -> None:
        raise RuntimeError("callback bug")

    w.submit(w.reserve(), [rm("a")], boom)
    w.submit(w.reserve(), [rm("b")], recorder(log, "b"))
    w.flush()
    assert log == [("b", [2])] and w.callback_errors == 1
    assert "callback failed" in caplog.text


def test_durable_lag_uses_the_steady_clock() -> None:
    clocks = ManualClocks()
    w = OpLogWriter(FakeStore(), window=8, clocks=clocks)
    assert w.durable_lag_ns() == 0
    r = w.reserve()
    clocks.advance(ms=250)
    assert w.durable_lag_ns() == 250_000_000
    w.submit(r, [rm("a")])
    w.flush()
    assert w.durable_lag_ns() == 0


def test_submit_validation() -> None:
    w, _ = make()
    other, _ = make()
    r = w.reserve(2)
    with pytest.raises(InvalidParams, match="holds 2 ids"):
        w.submit(r, [rm("a")])
    with pytest.raises(InvalidParams, match="not made by this writer"):
        other.submit(r, [rm("a"), rm("b")])
    with pytest.raises(InvalidParams, match="not an OpLogOp"):
        w.submit(r, [rm("a"), OpLogEntry(2, OpType.REMOVE, "t", "k")])  # type: ignore[list-item]
    w.submit(r, [rm("a"), rm("b")])
    with pytest.raises(InvalidParams, match="already submitted"):
        w.submit(r, [rm("a"), rm("b")])
    with pytest.raises(InvalidParams):
        OpLogWriter(FakeStore(), window=0, clocks=ManualClocks())  # type: ignore[arg-type]


def test_flusher_thread() -> None:
    w, store = make()
    w.start()
    done = threading.Event()
    w.submit(w.reserve(), [rm("a")], lambda entries: done.set())
    assert done.wait(timeout=10), "the flusher thread did not flush in 10 s"
    r = w.reserve()
    w.submit(r, [rm("b")])
    w.stop()  # drains what was submitted
    assert store.ids() == [1, 2]
    with pytest.raises(UnavailableInCurrentStatus):
        w.reserve()


def test_flusher_thread_retries_after_a_transient_failure() -> None:
    w, store = make()
    store.faults[1] = ("fail", OpLogStoreUnavailable("blip"))
    done = threading.Event()
    w.start(max_backoff_s=0.01)
    w.submit(w.reserve(), [rm("a")], lambda entries: done.set())
    assert done.wait(timeout=10), "the flusher thread did not flush in 10 s"
    w.stop()
    assert store.ids() == [1] and store.calls == 2


actions = st.lists(st.one_of(
    st.tuples(st.just("reserve"), st.integers(1, 5)),
    st.tuples(st.just("submit"), st.integers(0, 10)),
    st.tuples(st.just("flush"), st.sampled_from(["ok", "fail", "commit_then_fail"])),
), max_size=40)


@settings(max_examples=150, deadline=None)
@given(actions, st.integers(1, 6))
def test_any_interleaving_keeps_the_log_contiguous_and_callbacks_ordered(script: list, max_batch: int) -> None:
    store = FakeStore()
    w = OpLogWriter(store, window=12, max_batch_entries=max_batch, clocks=ManualClocks())
    open_reservations: list = []
    fired: list[int] = []
    for action, arg in script:
        if action == "reserve":
            try:
                open_reservations.append(w.reserve(arg))
            except WindowFull:
                assert w.outstanding + arg > 12
        elif action == "submit" and open_reservations:
            r = open_reservations.pop(arg % len(open_reservations))
            w.submit(r, [rm(f"k{i}") for i in range(r.count)], lambda b: fired.extend(b.sequence_ids))
        elif action == "flush":
            if arg != "ok":
                store.faults[store.calls + 1] = (arg, OpLogStoreUnavailable("injected"))
            try:
                w.flush()
            except OpLogStoreUnavailable:
                pass
    for r in open_reservations:
        w.submit(r, [rm("x")] * r.count)
    store.faults.clear()
    w.flush()
    assert store.ids() == list(range(1, w.durable_prefix + 1))
    assert w.outstanding == 0
    assert fired == sorted(fired) and len(fired) == len(set(fired))
    assert all(b.count <= max_batch for b in store.batches)
