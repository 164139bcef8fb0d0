"""kernels/read_columns.columns_at: the single read's views of a column table are the store's own
columns (dtype, shape, memory), so the lease it grants lands in the store's column. JIT only
(not in the NUMBA_DISABLE_JIT run): the views are built in compiled code."""
from __future__ import annotations

import numpy as np
from numba import njit

from mooncake_columnar.kernels.read_columns import _LAYOUT, FIELDS, column_table, columns_at, key_view


_LEASE = FIELDS.index("lease")


@njit(_nrt=False)  # as the single read: no reference counting
def _key_bytes(key):
    view = key_view(key)
    total = 0
    for i in range(view.shape[0]):
        total += view[i]
    return view.shape[0], total, view[view.shape[0] - 1] if view.shape[0] else -1


@njit
def _views_and_write(address, lease_row, deadline):
    views = columns_at(address)
    views[_LEASE][lease_row] = deadline
    return views


def test_the_views_are_the_columns_themselves_and_a_write_lands_in_the_column():
    columns = []
    for i, name in enumerate(FIELDS):
        dtype, ndim = _LAYOUT[name]
        shape = (5 + i, 3) if ndim == 2 else (7 + i,)
        columns.append(np.arange(np.prod(shape)).reshape(shape).astype(dtype))
    table = column_table(*columns)
    lease = columns[_LEASE]
    views = _views_and_write(table.ctypes.data, 2, 12345)
    assert lease[2] == 12345
    for name, column, view in zip(FIELDS, columns, views):
        assert view.dtype == column.dtype and view.shape == column.shape and view.strides == column.strides, name
        assert view.ctypes.data == column.ctypes.data, name
        assert (view == column).all(), name


def test_the_key_view_reads_the_key_bytes_in_a_kernel_without_reference_counting():
    for key in (b"", b"k", b"key-0123456789abcdef\xff"):
        assert _key_bytes(key) == (len(key), sum(key), key[-1] if key else -1)
