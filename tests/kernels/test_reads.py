"""The parallel batch read kernel (kernels/reads.py, the variant batches run) answers exactly
as the serial one: codes, readable replicas' columns in key order, and the read leases granted
(deadlines and group refresh marks), duplicates and groups included."""
from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.kernels import reads as rk
from mooncake_columnar.policies.views import ReplicaBuffer, _segment_lists
from mooncake_columnar.store.keys import as_string_array, string_buffers
from mooncake_columnar.testing.builders import MB

SEGMENTS = 12
TTL_MS = 1_000


def _master(clocks: ManualClocks, rng: np.random.Generator) -> tuple[MasterService, list[str]]:
    """1-replica objects, 3-replica grouped ones, 12-replica (continuation rows) ones; every 7th
    in flight (not ready), one segment unmounted (its replicas unreadable)."""
    m = MasterService(MasterConfig(max_replica_num=SEGMENTS, default_kv_lease_ttl_ms=TTL_MS), clocks=clocks)
    for i in range(SEGMENTS):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.{i}.1:1", client_id="c0", base=(i + 1) << 32, size=64 * MB)
    keys = []
    for name, n, config in (("one", 3000, ReplicateConfig()),
                            ("grouped", 1500, ReplicateConfig(replica_num=3, group_id="g")),
                            ("other-group", 500, ReplicateConfig(replica_num=2, group_id="h")),
                            ("wide", 200, ReplicateConfig(replica_num=SEGMENTS))):
        batch = [f"{name}-{i}" for i in range(n)]
        m.batch_put_start(batch, np.full(n, 4096), client_id="c0", config=config)
        m.batch_put_end([k for i, k in enumerate(batch) if i % 7], client_id="c0")
        keys += batch
    m.batch_get_replica_list([k for k in keys if rng.random() < 0.3])  # some leases already granted
    clocks.advance(ms=TTL_MS * 3 // 4)  # ...and now past half their TTL: group walks due
    m.unmount_segment("seg5")
    return m, keys


def _run(kernel, m: MasterService, keys: pa.Array, want_replicas: bool):
    s, o = m.store, m.objects
    offsets, data = string_buffers(as_string_array(keys))
    lease, flags = o.lease_deadline_ns.copy(), o.flags.copy()
    codes = np.empty(offsets.size - 1, np.int32)
    _, _, bases, unit_bits = _segment_lists(s)
    buffer = ReplicaBuffer(s, offsets.size - 1)
    out = (buffer.key_index, buffer.replica_id, buffer.segment_code, buffer.address, buffer.size)
    count, fits, *columns = kernel(s.keys.table, s.keys.arena, o.key_ref, o.tenant, offsets, data,
                                   np.array([0], np.int32), m.clocks.steady_ns(), m.lease_ttl_ns, flags, lease,
                                   s.group_of.links(), o.replica_status, o.replica_kind, o.replica_segment,
                                   s.segments.readable, o.replica_more, o.replica_id, o.replica_offset, o.size_bytes,
                                   bases, unit_bits, want_replicas, codes, 0, 0, *out)
    if fits:
        columns = [a[:count] for a in out]
    assert len(columns[0]) == count
    return codes, columns, lease, flags


def test_parallel_batch_read_answers_and_grants_exactly_as_the_serial_one():
    rng = np.random.default_rng(3)
    m, keys = _master(ManualClocks(), rng)
    names = np.array(keys + [f"missing-{i}" for i in range(500)], dtype=object)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        for size in (rk.BATCH_MIN + 1, 20_000):  # duplicates: drawn with replacement
            batch = pa.array(names[rng.integers(0, names.size, size)].tolist(), pa.large_string())
            for want_replicas in (False, True):
                serial = _run(rk._read_batch, m, batch, want_replicas)
                parallel = _run(rk.read_batch, m, batch, want_replicas)  # batches: the parallel variant
                codes, columns, lease, flags = serial
                assert {rk.OK, rk.NOT_FOUND, rk.NOT_READY} <= set(np.unique(codes).tolist())
                assert (lease != m.objects.lease_deadline_ns).any()  # leases were granted
                np.testing.assert_array_equal(parallel[0], codes)
                for got, want in zip(parallel[1], columns):
                    np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(parallel[2], lease)
                np.testing.assert_array_equal(parallel[3], flags)
            key_index = serial[1][0]
            assert np.unique(key_index).size < key_index.size  # multi-replica keys
        assert (m.objects.replica_more[:m.objects.high_water] >= 0).any()  # wide ones: continuation rows
    finally:
        numba.set_num_threads(threads)
