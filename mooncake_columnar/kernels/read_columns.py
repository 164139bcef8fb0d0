"""The columns the single-key read kernel reads, handed over as one integer.

A compiled call unboxes each argument: a NumPy array costs about 0.2 us, and one StructRef
holding the columns (what this module built until session 12) cost about 0.3 us plus a
reference count in and out for each column the kernel took from it: 0.55 us of a 1.6 us read
in cache. So the columns go over as the address of an int64 *column table*, (data address,
rows, slots) per column, and the kernel views them with ``numba.carray``: nothing to unbox,
allocate or count.

The views hold no reference. Whoever builds a table keeps it and the arrays it describes alive,
and builds a new one when the store replaces any of them (store/read_columns.py does). A table
is only built over arrays of the dtype, dimensions and C layout the kernel reads: a copy made to
fix a layout would take the kernel's lease writes away from the store's column.
"""
from __future__ import annotations

import numpy as np
from numba import carray, types
from numba.extending import intrinsic

from ..errors import InternalError
from ..schema import CODE_DTYPE, OBJECT_COLUMNS, REPLICA_COLUMNS
from .jit import njit

# the fields, in the order column_table takes them, with the dtype and dimensions read_one reads
FIELDS = ("table", "arena", "key_refs", "row_tenant", "flags", "lease", "rep_status", "rep_kind",
          "rep_seg", "seg_readable", "more", "rep_id", "rep_offset", "size_bytes", "unit_bits")
_LAYOUT = {
    "table": (np.int64, 1), "arena": (np.uint8, 1), "key_refs": (OBJECT_COLUMNS["key_ref"].type, 1),
    "row_tenant": (CODE_DTYPE.type, 1), "flags": (OBJECT_COLUMNS["flags"].type, 1),
    "lease": (OBJECT_COLUMNS["lease_deadline_ns"].type, 1), "rep_status": (REPLICA_COLUMNS["replica_status"].type, 2),
    "rep_kind": (REPLICA_COLUMNS["replica_kind"].type, 2), "rep_seg": (REPLICA_COLUMNS["replica_segment"].type, 2),
    "seg_readable": (np.bool_, 1), "more": (np.int32, 1), "rep_id": (REPLICA_COLUMNS["replica_id"].type, 2),
    "rep_offset": (REPLICA_COLUMNS["replica_offset"].type, 2), "size_bytes": (OBJECT_COLUMNS["size_bytes"].type, 1),
    "unit_bits": (np.int64, 1),
}
_WIDTH = 3  # a column's entries in the table: data address, rows, slots (0 for a 1-D column)
_TABLE_LENGTH = _WIDTH * len(FIELDS)


def column_table(*columns: np.ndarray) -> np.ndarray:
    """The column table of ``columns`` (:data:`FIELDS`, in that order) for kernels/reads.read_one
    (pass its ``.ctypes.data``); InternalError when one is not of the dtype, dimensions and C
    layout the kernel reads."""
    if len(columns) != len(FIELDS):
        raise InternalError(f"column_table takes {len(FIELDS)} columns, got {len(columns)}")
    out = np.zeros(_TABLE_LENGTH, np.int64)
    for i, (name, a) in enumerate(zip(FIELDS, columns)):
        dtype, ndim = _LAYOUT[name]
        if a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
            raise InternalError(f"column {name}: {a.dtype}, {a.ndim}-D, C-contiguous {a.flags.c_contiguous}; "
                                f"the single read views {np.dtype(dtype)}, {ndim}-D, C-contiguous")
        out[_WIDTH * i:_WIDTH * i + 1 + ndim] = (a.ctypes.data, *a.shape)
    return out


@intrinsic
def _pointer(typingctx, address, dtype):
    """``address`` (an int64) as a pointer to ``dtype`` (a NumPy scalar type), for carray."""
    pointer = types.CPointer(dtype.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))

    return pointer(types.int64, dtype), codegen


@njit(inline="always", cache=True)
def _column(t, i, dtype):
    return carray(_pointer(t[_WIDTH * i], dtype), (t[_WIDTH * i + 1],))


@njit(inline="always", cache=True)
def _slot_column(t, i, dtype):
    return carray(_pointer(t[_WIDTH * i], dtype), (t[_WIDTH * i + 1], t[_WIDTH * i + 2]))


_T = tuple(_LAYOUT[name][0] for name in FIELDS)  # the dtypes, as globals the kernel below reads


@njit(inline="always", cache=True)
def columns_at(address):
    """The columns of the column table at ``address`` (:data:`FIELDS` order), as views."""
    t = carray(_pointer(address, np.int64), (_TABLE_LENGTH,))
    return (_column(t, 0, _T[0]), _column(t, 1, _T[1]), _column(t, 2, _T[2]), _column(t, 3, _T[3]),
            _column(t, 4, _T[4]), _column(t, 5, _T[5]), _slot_column(t, 6, _T[6]), _slot_column(t, 7, _T[7]),
            _slot_column(t, 8, _T[8]), _column(t, 9, _T[9]), _column(t, 10, _T[10]), _slot_column(t, 11, _T[11]),
            _slot_column(t, 12, _T[12]), _column(t, 13, _T[13]), _column(t, 14, _T[14]))
