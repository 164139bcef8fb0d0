"""The package's decorators (kernels/jit.py): kernels carry no C-callable wrapper, and a
kernel-only helper, compiled without a Python wrapper, works from kernels and refuses a call from
Python with a TypeError (a null-pointer jump otherwise). JIT only: with NUMBA_DISABLE_JIT both are
plain Python functions."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.kernels import hashing as hk
from mooncake_columnar.kernels import objects as ok
from mooncake_columnar.kernels import reads as rk
from mooncake_columnar.kernels import slot_index as sk
from mooncake_columnar.kernels.jit import KernelOnly, kernel_only, njit


@kernel_only()
def _plus_one(a, i):
    return a[i] + 1


@njit(cache=True)
def _twice_plus_one(a):
    return 2 * _plus_one(a, 1)


def test_a_kernel_only_helper_runs_inside_kernels_and_refuses_python_calls():
    assert _twice_plus_one(np.arange(3)) == 4
    with pytest.raises(TypeError, match="kernels only"):
        _plus_one(np.arange(3), 1)


def test_kernels_build_no_c_callable_wrapper_and_their_inner_helpers_no_python_wrapper():
    assert ok.complete_puts is not None and ok._complete_puts.targetoptions["no_cfunc_wrapper"]
    assert ok._insert_new_puts_nogil.targetoptions["no_cfunc_wrapper"]  # a variant keeps its kernel's options
    for helper in (hk.hash_key, hk.probe_until, ok._place_one, rk._read_one):
        assert isinstance(helper, KernelOnly), helper
        assert helper.targetoptions["no_cpython_wrapper"]
    assert not ok._place_one.targetoptions["_nrt"]  # an nrt_free core stays without reference counting


def test_kernels_that_python_calls_per_key_and_that_allocate_nothing_count_no_references():
    """With reference counting, the call's wrapper would allocate an NRT meminfo for each array
    or bytes argument at every call (kernels/nrt_free.py)."""
    for kernel in (rk.read_one, sk.insert_slots, sk.remove_slots, ok._insert_new_puts, ok._complete_puts):
        assert not kernel.targetoptions["_nrt"], kernel.py_func.__name__
