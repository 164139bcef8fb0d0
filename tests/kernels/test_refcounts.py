"""Serial kernels that run per key keep no reference counting inside their loops (kernels/nrt_free.py):
an NRT incref/decref pair per array per key made the serial batch lookup 4x slower in cache.
Reads the kernels' LLVM IR, so JIT only (not in the NUMBA_DISABLE_JIT run)."""
from __future__ import annotations

import numpy as np
from numba import njit

from mooncake_columnar import MasterConfig, MasterService
from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.kernels import index_rows
from mooncake_columnar.kernels import objects as ok
from mooncake_columnar.kernels import reads as rk
from mooncake_columnar.store.keys import as_string_array, string_buffers
from mooncake_columnar.testing.builders import MB
from mooncake_columnar.testing.refcounts import loop_refcounts


@njit(inline="always")
def _equal_run(values, i, want):
    for k in range(4):
        if values[i + k] != want:
            return False
    return True


@njit(inline="always")
def _verified(values, tags, i, want):  # the shape of the old lookup's per-key helper: early exits, a looping callee
    if i < 0:
        return -1
    if tags[i] == want:
        if _equal_run(values, i, want):
            return i
    return -2


@njit
def _verify_all(values, tags, wants):
    n = 0
    for k in range(wants.shape[0]):
        n += _verified(values, tags, k, wants[k])
    return n


def test_the_check_sees_counts_that_an_inlined_helper_leaves_in_a_loop():
    """Not vacuous: the pattern the serial lookup had (a looping helper inlined per key) is found."""
    values = np.arange(20)
    assert _verify_all(values, values, np.arange(5)) == -10
    assert sum(loop_refcounts(_verify_all).values()) > 0


def test_serial_lookups_puts_and_removes_keep_no_reference_counts_in_their_loops():
    m = MasterService(MasterConfig())
    m.mount_segment("seg", endpoint="10.0.0.1:1", client_id="c0", base=1 << 40, size=64 * MB)
    keys = [f"key-{i}" for i in range(100)]
    m.batch_put_start(keys, np.full(100, 4096), client_id="c0")
    m.batch_put_end(keys, client_id="c0")
    assert m.get_replica_list("key-7")
    o, index = m.objects, m.store.keys
    offsets, data = string_buffers(as_string_array(keys))
    rows = hk._find_rows(index.table, index.arena, o.key_ref, o.tenant, offsets, data, np.array([0], o.tenant.dtype))
    assert (rows >= 0).all()
    assert hk.last_of_each_key(offsets, data, np.zeros(len(keys), o.tenant.dtype)).all()  # the standby's batch apply
    m.remove("key-3")
    assert (m.batch_get_replica_list(keys[10:60]).codes == 0).all()  # a small batch: the serial read
    for kernel in (hk._find_rows, rk.read_one, hk.last_of_each_key, ok._insert_new_puts, ok._complete_puts,
                   ok._place_one, index_rows._delete_rows_small, rk._read_batch):
        assert loop_refcounts(kernel) == {}, kernel.py_func.__name__
