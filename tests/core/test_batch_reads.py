"""Batch reads (kernels/reads.read_batch, one kernel call per chunk) answer every key as the
single-key calls do: codes, descriptors in key order, and the read leases granted."""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig, batching
from mooncake_columnar.errors import MooncakeError
from mooncake_columnar.kernels.dispatch import BATCH_MIN
from mooncake_columnar.policies import views
from mooncake_columnar.testing.builders import MB

TTL_MS = 1_000


def _master(clocks: ManualClocks, n: int) -> tuple[MasterService, list[str]]:
    """n objects: most complete with 1 or 3 replicas, some still in flight; grouped ones."""
    m = MasterService(MasterConfig(max_replica_num=3, default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    for i in range(3):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.{i}.1:1", client_id="c0", base=(i + 1) << 32, size=512 * MB)
    keys = [f"key-{i}" for i in range(n)]
    sizes = np.full(n, 4096, np.int64)
    third = n // 3
    m.batch_put_start(keys[:third], sizes[:third], client_id="c0", config=ReplicateConfig(replica_num=3, group_id="g"))
    m.batch_put_start(keys[third:], sizes[third:], client_id="c0")
    m.batch_put_end([k for i, k in enumerate(keys) if i % 7], client_id="c0")  # every 7th stays in flight
    return m, keys


@pytest.mark.parametrize("n", [50, BATCH_MIN + 500])  # the serial and the parallel variant
def test_batch_reads_answer_each_key_as_single_reads(n: int) -> None:
    clocks = ManualClocks()
    m, keys = _master(clocks, n)
    asked = keys[::-1] + [f"missing-{i}" for i in range(n // 4)] + keys[: n // 5]  # repeats too
    got = m.batch_get_replica_list(asked)
    exists = m.batch_exist_key(asked)
    leases = m.objects.lease_deadline_ns.copy()
    table = got.replicas.to_pydict()
    for i, key in enumerate(asked):
        try:
            want = m.get_replica_list(key)
            code = 0
        except MooncakeError as e:  # the typed error carries the code the batch reports
            want, code = [], int(e.code)
        assert int(got.codes[i]) == code
        assert bool(exists[i]) == (code == 0)
        rows = [j for j, ki in enumerate(table["key_index"]) if ki == i]
        assert [(table["replica_id"][j], table["segment"][j], table["address"][j], table["size"][j]) for j in rows] \
            == [(r.replica_id, r.segment, r.address, r.size) for r in want]
    # the single reads came at the same clock reading: they granted nothing the batch had not
    np.testing.assert_array_equal(m.objects.lease_deadline_ns, leases)


def test_batch_get_names_segments_once_per_batch_even_when_a_mount_lands_between_chunks() -> None:
    """The replica table's segment and endpoint columns are dictionary-encoded over the
    segments' names (no string per replica); a segment mounted between two chunks of one batch
    still names every replica right."""
    clocks = ManualClocks()
    m, keys = _master(clocks, 3000)
    first = m.batch_get_replica_list(keys)
    for name in ("segment", "endpoint"):
        assert pa.types.is_dictionary(first.replicas.schema.field(name).type)
    assert set(first.replicas.column("segment").to_pylist()) == {"seg0", "seg1", "seg2"}
    # two chunks' columns, a segment mounted in between (its code shifts nothing: codes index
    # the names of their own chunk)
    m.mount_segment("seg3", endpoint="10.0.3.1:1", client_id="c0", base=5 << 32, size=512 * MB)
    m.batch_put_start(["late"], [4096], client_id="c0")
    m.batch_put_end(["late"], client_id="c0")
    store, lease = m.store, m.lease_ttl_ns
    offsets = np.array([0, 5, 9], np.int32)
    data = np.frombuffer(b"key-1late", np.uint8)
    before = views.read_batch(store, offsets[:2], np.frombuffer(b"key-1", np.uint8), 0, clocks.steady_ns(), lease,
                              want_replicas=True)[1]
    after = views.read_batch(store, offsets[1:] - 5, data[5:], 0, clocks.steady_ns(), lease, want_replicas=True,
                             key_base=1)[1]
    before = dataclasses.replace(before, names=before.names[:3] + [""], endpoints=before.endpoints[:3] + [""])
    table = views.replica_table([before, after])
    want = [(r.segment, r.endpoint) for k in ("key-1", "late") for r in m.get_replica_list(k)]
    assert list(zip(table.column("segment").to_pylist(), table.column("endpoint").to_pylist())) == want
    assert table.column("key_index").to_pylist() == [0] * (len(want) - 1) + [1]


@pytest.mark.parametrize("between", ["mount", "widen"])
def test_batch_get_in_small_chunks_answers_each_key_as_single_reads(between: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks write their replicas one after another into columns made for the whole batch
    (views.ReplicaBuffer: a full row of slots per key), or into arrays of their own when they do
    not fit: objects with continuation rows, a segment mounted between two chunks (its codes
    shift in place), or the replica columns widened between two chunks (later chunks no longer
    fit); the joined table answers each key as the single reads do."""
    clocks = ManualClocks()
    m = MasterService(MasterConfig(max_replica_num=3, default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    for i in range(3):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.{i}.1:1", client_id="c0", base=(i + 1) << 32, size=512 * MB)
    keys = [f"key-{i}" for i in range(40)]
    hot = m.objects.hot_slots_max
    m.objects.hot_slots_max = 1  # the 3-replica objects keep two replicas in continuation rows
    m.batch_put_start(keys[::13], np.full(4, 4096), client_id="c0", config=ReplicateConfig(replica_num=3))
    m.objects.hot_slots_max = hot
    m.batch_put_start([k for i, k in enumerate(keys) if i % 13], np.full(36, 4096), client_id="c0")
    m.batch_put_end(keys, client_id="c0")
    assert m.objects.slots == 1
    for name in ("FIRST_CHUNK", "MIN_CHUNK", "MAX_CHUNK"):
        monkeypatch.setattr(batching, name, 5)
    real = batching.read_batch
    chunks: list[int] = []

    def between_chunks(*args, **kwargs):
        if len(chunks) == 2:
            if between == "mount":
                m.mount_segment("seg3", endpoint="10.0.3.1:1", client_id="c0", base=5 << 32, size=512 * MB)
            else:
                m.put_start("late", 4096, client_id="c0", config=ReplicateConfig(replica_num=2))
                assert m.objects.slots == 2
        chunks.append(0)
        return real(*args, **kwargs)

    monkeypatch.setattr(batching, "read_batch", between_chunks)
    asked = keys[::-1] + ["missing"] + keys[:13]
    got = m.batch_get_replica_list(asked)
    assert len(chunks) == 11
    table = got.replicas.to_pydict()
    want = []
    for i, key in enumerate(asked):
        if key != "missing":
            want += [(i, r.replica_id, r.segment, r.endpoint, r.address, r.size) for r in m.get_replica_list(key)]
    assert list(zip(*(table[c] for c in ("key_index", "replica_id", "segment", "endpoint", "address", "size")))) \
        == want


def test_replica_table_takes_the_batch_buffer_as_it_is_unless_most_of_it_is_unused() -> None:
    """The chunks' replicas lie back to back in the batch's buffer: the table's columns are
    views of it, not copies; copies when they would keep a buffer mostly unused alive, or
    when a chunk's replicas are elsewhere (arrays of its own)."""
    clocks = ManualClocks()
    m, keys = _master(clocks, 60)
    offsets = np.array([0, 5, 10, 15], np.int64)
    data = np.frombuffer("".join(["key-1", "key-2", "key-3"]).encode(), np.uint8)
    read = lambda lo, hi, buffer: views.read_batch(m.store, offsets[lo:hi + 1], data, 0, clocks.steady_ns(),  # noqa: E731
                                                   m.lease_ttl_ns, want_replicas=True, key_base=lo, buffer=buffer)[1]
    want = [(i, r.segment, r.address) for i, k in enumerate(keys[1:4]) for r in m.get_replica_list(k)]
    assert len(want) == 3 * m.objects.slots  # three replicas each: their rows' slots are full

    def answers(table: pa.Table) -> list[tuple]:
        return list(zip(*(table.column(c).to_pylist() for c in ("key_index", "segment", "address"))))

    for keys_made_for, shared in ((3, True), (7, False)):  # the columns fill 3 of 3 keys' slots, or 3 of 7
        buffer = views.ReplicaBuffer(m.store, keys_made_for)
        table = views.replica_table([read(0, 1, buffer), read(1, 3, buffer)])
        assert answers(table) == want
        assert np.shares_memory(table.column("address").chunk(0).to_numpy(), buffer.address) == shared
    buffer = views.ReplicaBuffer(m.store, 3)
    table = views.replica_table([read(0, 1, buffer), read(1, 2, None), read(2, 3, buffer)])
    assert answers(table) == want
    assert not np.shares_memory(table.column("address").chunk(0).to_numpy(), buffer.address)
