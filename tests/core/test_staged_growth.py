"""Growth of the columns and the key index in steps (store/growth.py): readers run between the
steps and see the master unchanged, a mutating call finishes the steps first, and the result is
the structure a one-shot growth builds."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService
from mooncake_columnar.batching import grow_ahead
from mooncake_columnar.messages import DEFAULT_TENANT
from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.store import growth
from mooncake_columnar.tools.synthetic import fill, mount_segments, synthetic_keys

CLIENT = "client-0"


def _master(objects: int) -> MasterService:
    m = MasterService(MasterConfig(), clocks=ManualClocks(), initial_capacity=1024)
    mount_segments(m, 2, 1 << 34)
    fill(m, objects, object_bytes=4096)
    return m


def _key_table_contents(m: MasterService) -> list[int]:
    return sorted(m.keys.table[m.keys.table >= 0].tolist())


@pytest.fixture()
def small_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Steps of at most 1024 units, and a record of how many ran."""
    ran: list[int] = []
    step = growth.StagedGrowth.step

    def tiny(self: growth.StagedGrowth, budget_s: float = growth.STEP_S) -> bool:
        self.units_per_step = 1024
        ran.append(1)
        return step(self, budget_s)

    monkeypatch.setattr(growth.StagedGrowth, "step", tiny)
    return ran


def test_grow_ahead_builds_what_a_one_shot_growth_builds(small_steps: list[int]) -> None:
    staged, direct = _master(3000), _master(3000)
    staged.batch_remove(synthetic_keys(0, 2000), force=True)  # garbage: the arena compacts
    direct.batch_remove(synthetic_keys(0, 2000), force=True)
    extra_bytes = 200_000
    grow_ahead(staged, 40_000, extra_bytes)
    direct.objects.reserve(40_000)
    direct.keys.reserve(40_000, extra_bytes)
    assert len(small_steps) > 10
    assert staged.objects.capacity == direct.objects.capacity >= 40_000
    assert staged.inflight.free_count >= 40_000
    assert staged.keys.table.shape == direct.keys.table.shape
    assert _key_table_contents(staged) == _key_table_contents(direct)
    live = staged.objects.live_rows()
    assert staged.keys.keys_of(live).equals(direct.keys.keys_of(live))
    assert staged.keys.arena_garbage == 0 and staged.keys.arena.shape[0] >= staged.keys.arena_used + extra_bytes
    staged.verify()
    fresh = synthetic_keys(10_000, 30_000)
    assert (staged.batch_put_start(fresh, np.full(30_000, 4096), client_id=CLIENT).codes == 0).all()
    staged.verify()


def test_readers_between_steps_see_the_master_unchanged_and_a_mutator_finishes_the_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    m = _master(3000)
    m.batch_remove(synthetic_keys(0, 1000), force=True)
    keys = synthetic_keys(1000, 2000).to_pylist()
    seen: list[str] = []
    step = growth.StagedGrowth.step

    def step_then_call(self: growth.StagedGrowth, budget_s: float = growth.STEP_S) -> bool:
        self.units_per_step = 1024
        done = step(self, budget_s)
        if not done and len(seen) < 5:  # a reader between two steps: growth stays pending
            seen.append("read")
            assert m.get_replica_list(keys[len(seen)])
            assert m.exist_key(keys[-1]) and not m.exist_key("absent")
            assert m.lock.settle is not None
        elif not done and "put" not in seen:  # a mutating call: finishes every step first
            seen.append("put")
            m.put_start("between-steps", 4096, client_id=CLIENT)
            assert m.lock.settle is None
        return done

    monkeypatch.setattr(growth.StagedGrowth, "step", step_then_call)
    grow_ahead(m, 40_000, 400_000)
    assert seen == ["read"] * 5 + ["put"]
    assert m.objects.capacity >= 40_000 + m.objects.high_water - m.objects.free_count
    m.put_end("between-steps", client_id=CLIENT)
    assert m.get_replica_list("between-steps")
    assert all(m.exist_key(k) for k in keys)
    m.verify()


def test_leases_granted_between_steps_survive_the_column_swap(small_steps: list[int]) -> None:
    m = _master(3000)
    key = synthetic_keys(5, 1).to_pylist()[0]
    row = int(m.store.lookup(*_buffers(key), DEFAULT_TENANT)[0])
    jobs = m.objects.growth_jobs(50_000)
    staged = growth.StagedGrowth(jobs)
    assert not staged.step()  # part of the rows copied
    m.clocks.advance(s=3)
    m.get_replica_list(key)  # a reader grants a lease in the old columns
    granted = int(m.objects.lease_deadline_ns[row])
    staged.settle()
    assert int(m.objects.lease_deadline_ns[row]) == granted
    m.verify()


def _buffers(key: str) -> tuple[np.ndarray, np.ndarray]:
    data = np.frombuffer(key.encode(), np.uint8)
    return np.array([0, data.size], np.int64), data


def test_a_failing_growth_job_leaves_the_master_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    m = _master(3000)
    before = (m.objects.capacity, m.keys.table.shape, _key_table_contents(m))

    def no_memory(self: growth.TableRehash, lo: int, hi: int) -> None:
        raise MemoryError("test: no room for the new table")

    monkeypatch.setattr(growth.TableRehash, "step", no_memory)
    with pytest.raises(MemoryError):
        m.batch_put_start(synthetic_keys(10_000, 20_000), np.full(20_000, 4096), client_id=CLIENT)
    assert m.lock.settle is None
    assert m.keys.table.shape == before[1] and _key_table_contents(m) == before[2]
    m.verify()
    monkeypatch.undo()
    assert (m.batch_put_start(synthetic_keys(10_000, 20_000), np.full(20_000, 4096),
                              client_id=CLIENT).codes == 0).all()
    m.verify()


def test_gets_beside_a_growing_batch_put_stay_correct() -> None:
    m = _master(20_000)
    probe = synthetic_keys(0, 20_000).to_pylist()
    errors: list[BaseException] = []
    done = threading.Event()

    def batcher() -> None:
        try:
            for b in range(3):
                fresh = synthetic_keys(100_000 + b * 60_000, 60_000)
                res = m.batch_put_start(fresh, np.full(60_000, 4096), client_id=CLIENT)
                assert (res.codes == 0).all()
                m.batch_put_end(fresh, client_id=CLIENT)
        except BaseException as e:  # noqa: BLE001 - asserted below
            errors.append(e)
        finally:
            done.set()

    th = threading.Thread(target=batcher)
    th.start()
    i = 0
    deadline = time.monotonic() + 120  # bounds the wait for the batch thread
    while not done.is_set():
        assert time.monotonic() < deadline, "the batch thread did not finish in 120 s"
        assert m.get_replica_list(probe[i % len(probe)])
        if i % 7 == 0:
            m.put_start(f"single-{i}", 4096, client_id=CLIENT)
            m.put_end(f"single-{i}", client_id=CLIENT)
        i += 1
    th.join(timeout=120)
    assert not th.is_alive(), "the batch thread did not finish in 120 s"
    assert not errors, errors
    assert m.objects.capacity >= 200_000
    m.verify()


def test_rehash_by_stored_tags_finds_every_key() -> None:
    m = _master(2000)
    old = m.keys.table
    new = np.full(old.shape[0] * 4, hk.EMPTY_SLOT, np.int64)
    hk.rehash_slots(old, 0, old.shape[0], new)
    m.keys.table = new
    rows = m.store.lookup(*_many(synthetic_keys(0, 2000)), DEFAULT_TENANT)
    assert (rows >= 0).all() and np.unique(rows).size == 2000
    m.verify()


def _many(keys) -> tuple[np.ndarray, np.ndarray]:
    from mooncake_columnar.store.keys import as_string_array, string_buffers
    return string_buffers(as_string_array(keys))


def test_a_single_put_that_crosses_a_growth_threshold_grows_in_steps(small_steps: list[int]) -> None:
    m = MasterService(MasterConfig(), clocks=ManualClocks(), initial_capacity=16)
    mount_segments(m, 1, 1 << 30)
    fill(m, 3000, object_bytes=4096)  # batches: the tables are sized to what they hold
    small_steps.clear()
    for i in range(m.objects.capacity - m.objects.high_water + 1):
        m.put_start(f"single-{i}", 4096, client_id=CLIENT)
    assert small_steps, "the put that needed a row beyond the capacity grew in steps"
    assert m.lock.settle is None
    m.verify()
