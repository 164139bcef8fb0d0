"""Client threads against one master: mixed single-key calls beside chunked batch calls.

Bounded runs (seconds, not TTLs: ManualClocks never move here), no timing asserts tighter than
a noisy 2-core CI machine holds.
"""
from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import pytest

from mooncake_columnar import ErrorCode, ManualClocks, MasterConfig, MasterService
from mooncake_columnar import batching, locking
from mooncake_columnar.errors import ObjectNotFound
from mooncake_columnar.kernels import index_rows
from mooncake_columnar.kernels import objects as ok
from mooncake_columnar.locking import MasterLock
from mooncake_columnar.tools.synthetic import fill, mount_segments, synthetic_keys

CLIENT = "client-0"


def _master(objects: int, *, segment_bytes: int = 1 << 34) -> MasterService:
    m = MasterService(MasterConfig(), clocks=ManualClocks(), initial_capacity=max(1024, objects))
    mount_segments(m, 4, segment_bytes)
    fill(m, objects, object_bytes=4096)
    return m


def _run(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), f"{t.name} did not finish"


def test_threads_mixed_clients_and_batches_stay_consistent() -> None:
    base = 20_000
    m = _master(base)
    base_keys = synthetic_keys(0, base).to_pylist()
    seconds = 2.0
    errors: list[BaseException] = []
    live: dict[int, set[str]] = {}       # per client: put_end returned OK, not removed
    removed: dict[int, set[str]] = {}
    batch_live: set[str] = set()

    def client(t: int) -> None:
        rng = np.random.default_rng(t)
        mine, gone, order = set(), set(), []
        live[t], removed[t] = mine, gone
        stop_at = time.monotonic() + seconds
        i = 0
        try:
            while time.monotonic() < stop_at and i < 200_000:
                r = rng.random()
                if r < 0.5:
                    assert m.get_replica_list(base_keys[int(rng.integers(base))])
                elif r < 0.8:
                    assert m.exist_key(base_keys[int(rng.integers(base))])
                elif r < 0.9:
                    k = f"client-{t}-{i}"
                    m.put_start(k, 4096, client_id=CLIENT)
                    m.put_end(k, client_id=CLIENT)
                    mine.add(k)
                    order.append(k)
                elif order:
                    k = order.pop(0)  # never read by anyone: no lease, so remove succeeds
                    m.remove(k)
                    mine.discard(k)
                    gone.add(k)
                i += 1
        except BaseException as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    def batcher() -> None:
        n = 20_000  # several chunks (batching.FIRST_CHUNK keys first)
        stop_at = time.monotonic() + seconds
        r = 0
        try:
            while time.monotonic() < stop_at:
                keys = synthetic_keys(10_000_000 + r * n, n)
                dup = synthetic_keys(10_000_000 + r * n, 1).to_pylist() * 2  # same key twice
                res = m.batch_put_start(keys, np.full(n, 4096, np.int64), client_id=CLIENT)
                assert (res.codes == 0).all()
                assert res.replicas.num_rows == n
                assert np.array_equal(np.unique(res.replicas.column("key_index").to_numpy()), np.arange(n))
                assert (m.batch_put_end(keys, client_id=CLIENT).codes == 0).all()
                again = m.batch_put_start(dup, [4096, 4096], client_id=CLIENT)
                assert list(again.codes) == [ErrorCode.OBJECT_ALREADY_EXISTS] * 2
                got = m.batch_get_replica_list(keys)
                assert (got.codes == 0).all() and got.replicas.num_rows == n
                assert m.batch_exist_key(keys).all()
                if r % 2:  # every other batch goes again; its keys stay otherwise
                    codes = m.batch_remove(keys, force=True)
                    assert (codes == 0).all()
                    assert not m.batch_exist_key(keys).any()
                else:
                    batch_live.update(keys.to_pylist())
                r += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    m.start(0.01)  # the background thread ticks as in a server
    try:
        _run([threading.Thread(target=client, args=(t,), name=f"client-{t}") for t in range(4)]
             + [threading.Thread(target=batcher, name="batcher")])
    finally:
        m.stop()
    assert not errors, errors
    assert m.health().healthy
    for t in live:
        assert live[t] or removed[t]
        assert all(m.exist_key(k) for k in live[t])
        assert not any(m.exist_key(k) for k in removed[t])
        for k in list(removed[t])[:100]:
            with pytest.raises(ObjectNotFound):
                m.get_replica_list(k)
    assert m.batch_exist_key(sorted(batch_live)).all() if batch_live else True
    assert m.batch_exist_key(base_keys).all()
    m.verify()


def _chunk_starts(monkeypatch: pytest.MonkeyPatch, owner: object, attr: str) -> list[float]:
    """Start times of the batch thread's calls of the internal ``owner.attr`` (one per chunk)."""
    starts: list[float] = []
    inner = getattr(owner, attr)

    def hooked(*args, **kwargs):
        if threading.current_thread().name == "batch":
            starts.append(time.perf_counter())
        return inner(*args, **kwargs)

    monkeypatch.setattr(owner, attr, hooked)
    return starts


@pytest.mark.parametrize("call", ["batch_get_replica_list", "batch_put_start"])
def test_threads_single_get_completes_while_big_batch_runs(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    base = 100_000
    m = _master(base)
    n = 600_000
    if call == "batch_get_replica_list":
        keys = synthetic_keys(0, base).take(np.random.default_rng(3).integers(0, base, n))
        run = lambda: m.batch_get_replica_list(keys)  # noqa: E731
        starts = _chunk_starts(monkeypatch, batching, "read_batch")  # one call per chunk
    else:
        keys = synthetic_keys(base, n)
        run = lambda: m.batch_put_start(keys, np.full(n, 4096, np.int64), client_id=CLIENT)  # noqa: E731
        starts = _chunk_starts(monkeypatch, m.store, "insert_puts")
    probe = synthetic_keys(0, base).to_pylist()
    m.get_replica_list(probe[0])
    m.batch_get_replica_list(probe[:4096])  # compile the batch-sized kernel variants first
    result: list = []
    batch_done = threading.Event()

    def batch() -> None:
        result.append(run())
        batch_done.set()

    th = threading.Thread(target=batch, name="batch")
    th.start()
    deadline = time.monotonic() + 60
    while not starts and time.monotonic() < deadline:
        time.sleep(0.0005)
    assert starts  # the batch holds the lock for its first chunk (or is past it)
    answered, waits = [], []
    i = 0
    while not batch_done.is_set() and i < 2000:
        t0 = time.perf_counter()
        assert m.get_replica_list(probe[i])
        answered.append(time.perf_counter())
        waits.append(answered[-1] - t0)
        i += 1
    th.join(120)
    assert not th.is_alive(), "the batch did not finish in 120 s"
    assert result and (result[0].codes == 0).all()
    # Gets issued after the first chunk began were answered before the last chunk began: the
    # batch released the lock in between. One unchunked call has a single chunk, so none
    # could be; here the call has many.
    assert len(starts) > 1
    assert sum(t < starts[-1] for t in answered) >= 1, "single gets waited for the whole batch"
    # a loose bound only: each get waits for about one chunk, the batch takes many
    assert np.median(waits) < 0.5


def test_threads_batch_chunks_match_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks are the same calls made one after another: per-key results (duplicates, missing
    and invalid keys across chunk boundaries) equal those of one unchunked call."""
    keys = [f"k{i % 23}" for i in range(60)] + ["", "k-missing", "k5"]
    fresh = synthetic_keys(0, 40).to_pylist()

    def scenario(chunk: int) -> list:
        monkeypatch.setattr(batching, "FIRST_CHUNK", chunk)
        monkeypatch.setattr(batching, "MIN_CHUNK", chunk)
        monkeypatch.setattr(batching, "MAX_CHUNK", chunk)
        m = MasterService(MasterConfig(), clocks=ManualClocks())
        mount_segments(m, 2, 1 << 30)
        m.batch_put_start(fresh, np.full(len(fresh), 100, np.int64), client_id=CLIENT)
        out = []
        put = m.batch_put_start(keys, np.arange(1, len(keys) + 1), client_id=CLIENT)
        out += [put.codes.tolist(), put.replicas.to_pydict()]
        out.append(m.batch_put_end(keys[:30] + fresh, client_id="other").codes.tolist())
        out.append(m.batch_put_end(keys[:30] + fresh, client_id=CLIENT).codes.tolist())
        got = m.batch_get_replica_list(keys + fresh)
        out += [got.codes.tolist(), got.replicas.to_pydict()]
        out.append(m.batch_exist_key(keys + fresh).tolist())
        out.append(m.batch_remove(keys, force=False).tolist())  # leases from the gets above
        out.append(m.batch_remove(keys + fresh, force=True).tolist())
        out.append(m.batch_exist_key(keys + fresh).tolist())
        out.append(m.batch_get_replica_list([]).codes.tolist())
        m.verify()
        return out

    whole = scenario(1 << 30)
    for chunk in (1, 7, 16):
        assert scenario(chunk) == whole, chunk


def test_threads_single_key_calls_take_no_parallel_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-key call never wakes the threading layer's workers (parallel kernels are for
    large inputs only)."""
    def refuse(*args, **kwargs):
        raise AssertionError("parallel kernel on a single-key path")

    monkeypatch.setattr(ok, "_clear_slots_parallel", refuse)
    monkeypatch.setattr(index_rows, "_delete_rows_parallel", refuse)
    m = _master(1000)
    for i in range(50):
        k = f"single-{i}"
        m.put_start(k, 4096, client_id=CLIENT)
        m.put_end(k, client_id=CLIENT)
        assert m.exist_key(k)
        m.remove(k, force=True)
    m.put_start("revoked", 4096, client_id=CLIENT)
    m.put_revoke("revoked", client_id=CLIENT)
    assert (m.batch_remove(synthetic_keys(0, 100), force=True) == 0).all()


def test_threads_master_lock_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The master lock is reentrant; a waiter gets it when the holder leaves; once the turn is
    up, the holder's next call queues behind the waiter."""
    lock = MasterLock()
    with lock:
        with lock:
            assert lock._is_owned()
        assert lock._is_owned()
    assert not lock._is_owned()

    def queued(thread: threading.Thread) -> None:
        deadline = time.monotonic() + 30
        while not lock.waiters and time.monotonic() < deadline:
            time.sleep(0.001)
        assert lock.waiters, thread

    # a holder that simply leaves: the oldest waiter gets the lock once its turn is due
    got = threading.Event()
    lock.acquire()
    th = threading.Thread(target=lambda: (lock.take(), got.set(), lock.release()))
    th.start()
    queued(th)
    lock.release()
    assert got.wait(30), "the waiter never got the lock"
    th.join(30)
    assert not th.is_alive(), "the waiter did not finish in 30 s"
    assert not lock.waiters

    # turn up: the holder's next `with lock` queues behind the waiter
    monkeypatch.setattr(locking, "TURN_S", 0.0)
    order: list[str] = []
    lock.acquire()
    th = threading.Thread(target=lambda: (lock.take(), order.append("waiter"), lock.release()))
    th.start()
    queued(th)
    lock.release()
    with lock:
        order.append("holder")
    th.join(30)
    assert not th.is_alive(), "the waiter did not finish in 30 s"
    assert order == ["waiter", "holder"]


def test_threads_master_lock_state_is_its_slots_only() -> None:
    """The lock's state lives in slots (read on every single-key call): an attribute outside
    them is refused rather than silently added, and the lock still takes weak references."""
    lock = MasterLock()
    with pytest.raises(AttributeError):
        lock.waiter = []  # type: ignore[attr-defined]  # (a typo of ``waiters``)
    lock.settle = None
    assert weakref.ref(lock)() is lock


def test_threads_a_change_handed_over_runs_at_the_next_outermost_mutating_call() -> None:
    """run_or_defer (the oplog writer's durable callbacks): at once when the lock is free and no
    growth is pending; else queued, never waiting, for the next call that may mutate, after it
    finished the growth, and never inside a call already running (a nested take) or a read."""
    lock, done = MasterLock(), []
    lock.run_or_defer(lambda: done.append("free"))
    assert done == ["free"] and not lock.deferred

    def from_another_thread(name: str) -> None:
        th = threading.Thread(target=lambda: lock.run_or_defer(lambda: done.append(name)))
        th.start()
        th.join(30)
        assert not th.is_alive()

    with lock:
        from_another_thread("busy")
        with lock:  # a nested call: inside a change, so the handed-over one waits
            assert done == ["free"]
        lock.run_or_defer(lambda: done.append("own"))  # this thread holds the lock: queued too
        assert done == ["free"]
    lock.take(reading=True)  # a read changes nothing
    lock.leave()
    assert done == ["free"]
    lock.settle = lambda: (done.append("growth finished"), setattr(lock, "settle", None))  # a growth job is copying
    from_another_thread("during growth")  # the lock is free, but a growth is pending
    assert done == ["free"]
    with lock:
        assert done == ["free", "growth finished", "busy", "own", "during growth"]
    assert not lock.deferred


def test_threads_busy_callers_hand_the_lock_over_per_turn_not_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads calling back to back: the lock changes hands about once per turn, not on
    every call (a release never hands it to a thread still waiting for the GIL), and every
    thread gets turns."""
    lock = MasterLock()
    handovers = [0]
    queue = MasterLock._queue

    def counted(self, **kwargs):
        handovers[0] += 1
        return queue(self, **kwargs)

    monkeypatch.setattr(MasterLock, "_queue", counted)
    calls = [0] * 4
    stop = time.monotonic() + 0.5

    def client(t: int) -> None:
        while time.monotonic() < stop:
            with lock:
                x = 0
                for i in range(200):  # a call's work, holding the lock
                    x += i
            calls[t] += 1

    pool = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(30)
        assert not th.is_alive(), f"{th.name} did not finish in 30 s"
    assert min(calls) > 0, calls
    # one handover per turn (TURN_S = 5 ms) and thread, with slack for a loaded host; a lock
    # that changes hands per call would hand over about sum(calls) times
    assert handovers[0] < max(40, sum(calls) // 20), (handovers[0], calls)


@pytest.mark.parametrize("call", ["batch_get_replica_list", "batch_exist_key"])
def test_threads_batch_read_sees_keys_changed_between_its_chunks(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A chunk of a batch read looks its keys up and reads their rows in one lock turn: a key
    removed before its chunk, whose row another key then takes, is not found (not read through
    the stale row)."""
    m = MasterService(MasterConfig(), clocks=ManualClocks())
    mount_segments(m, 2, 1 << 30)
    keys = [f"k{i}" for i in range(10)]
    m.batch_put_start(keys, np.full(10, 100, np.int64), client_id=CLIENT)
    m.batch_put_end(keys, client_id=CLIENT)
    row_of = lambda key: int(m.store.lookup(np.array([0, len(key)], np.int64), np.frombuffer(key.encode(), np.uint8),  # noqa: E731
                                       "default")[0])
    old_row = row_of("k7")
    for name in ("FIRST_CHUNK", "MIN_CHUNK", "MAX_CHUNK"):
        monkeypatch.setattr(batching, name, 5)
    real = batching.read_batch
    chunks: list[int] = []

    def between_chunks(store, offsets, *args, **kwargs):
        if len(chunks) == 1:  # before the second chunk: k7 goes, and its row goes to another key
            m.remove("k7", force=True)
            m.put_start("intruder", 100, client_id=CLIENT)
            m.put_end("intruder", client_id=CLIENT)
        chunks.append(offsets.size - 1)
        return real(store, offsets, *args, **kwargs)

    monkeypatch.setattr(batching, "read_batch", between_chunks)
    result = getattr(m, call)(keys)
    assert chunks == [5, 5]
    assert row_of("intruder") == old_row  # the stale row now holds another key
    if call == "batch_exist_key":
        assert result.tolist() == [i != 7 for i in range(10)]
    else:
        assert result.codes.tolist() == [ErrorCode.OBJECT_NOT_FOUND if i == 7 else 0 for i in range(10)]
        assert 7 not in result.replicas.column("key_index").to_pylist()
        assert result.replicas.num_rows == 9


def test_threads_background_round_hands_the_lock_back_to_a_busy_client() -> None:
    """With the background thread running, a client calling back to back wakes each round at
    its next call and gets the lock back as soon as the round is done: it is not held up for a
    turn after every round (before: one ~10 ms stall per round, every 10 ms)."""
    m = _master(10_000)
    keys = synthetic_keys(0, 10_000).to_pylist()
    m.start()
    try:
        stalls, calls = 0, 0
        stop = time.monotonic() + 1.0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            m.exist_key(keys[calls % len(keys)])
            stalls += time.perf_counter() - t0 > locking.TURN_S
            calls += 1
        rounds = m.health().background.rounds
    finally:
        m.stop()
    assert rounds >= 10 and m.health().background.failures == 0
    assert stalls < rounds / 2, (stalls, rounds, calls)
