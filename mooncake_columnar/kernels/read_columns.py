"""The columns the single-key read kernel reads, handed over as one integer.

A compiled call unboxes each argument: a NumPy array costs about 0.2 us, and one StructRef
holding the columns (what this module built before) cost about 0.3 us plus a
reference count in and out for each column the kernel took from it: 0.55 us of a 1.6 us read
in cache. So the columns go over as the address of an int64 *column table*, (data address,
rows, slots) per column, and the kernel views them (:func:`columns_at`, like ``numba.carray``): nothing to unbox,
allocate or count.

The views hold no reference. Whoever builds a table keeps it and the arrays it describes alive,
and builds a new one when the store replaces any of them (store/read_columns.py does). A table
is only built over arrays of the dtype, dimensions and C layout the kernel reads: a copy made to
fix a layout would take the kernel's lease writes away from the store's column.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from numba import types
from numba.extending import intrinsic
from numba.np.arrayobj import populate_array
from numba.np.numpy_support import from_dtype

from ..errors import InternalError
from ..schema import CODE_DTYPE, OBJECT_COLUMNS, REPLICA_COLUMNS

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


def _array_type(name: str) -> types.Array:
    dtype, ndim = _LAYOUT[name]
    return types.Array(from_dtype(np.dtype(dtype)), ndim, "C")


_VIEWS = types.Tuple([_array_type(name) for name in FIELDS])  # what columns_at returns


@intrinsic
def columns_at(typingctx, address):
    """The columns of the column table at ``address`` (an int64; :data:`FIELDS` order), as views
    (C-contiguous, no reference held). One intrinsic: the 15 views cost one typing step and a
    few loads each, where inlined ``carray`` calls were typed and lowered one by one (a second
    of the first read's compile on an empty Numba cache)."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        intp = context.get_value_type(types.intp)
        table = builder.inttoptr(args[0], intp.as_pointer())
        views = []
        for i, aryty in enumerate(_VIEWS):
            def entry(k: int, i: int = i) -> Any:
                return builder.load(builder.gep(table, [intp(_WIDTH * i + k)]))
            shape = [entry(1 + d) for d in range(aryty.ndim)]
            itemsize = context.get_abi_sizeof(context.get_data_type(aryty.dtype))
            strides = [intp(itemsize)] if aryty.ndim == 1 else [builder.mul(shape[1], intp(itemsize)), intp(itemsize)]
            view = context.make_array(aryty)(context, builder)
            data = builder.inttoptr(entry(0), context.get_data_type(aryty.dtype).as_pointer())
            populate_array(view, data=data, shape=shape, strides=strides, itemsize=intp(itemsize), meminfo=None)
            views.append(view._getvalue())
        return context.make_tuple(builder, _VIEWS, views)

    return _VIEWS(types.int64), codegen


_KEY_VIEW = types.Array(types.uint8, 1, "C", readonly=True)  # a put's key buffer (store/keys.py)


@intrinsic
def key_view(typingctx, key):
    """``key`` (a ``bytes``) as a read-only uint8 array that holds no reference (the caller's
    ``bytes`` keeps it alive), for a kernel without reference counting (kernels/nrt_free.py):
    ``np.frombuffer`` takes the reference that the call's unboxing allocated for the ``bytes``
    (a meminfo per call), and is an overload of its own to compile."""
    if not isinstance(key, types.Bytes):
        return None

    def codegen(context, builder, signature, args):
        buf = context.make_array(signature.args[0])(context, builder, args[0])
        view = context.make_array(_KEY_VIEW)(context, builder)
        populate_array(view, data=buf.data, shape=[buf.nitems], strides=[buf.itemsize], itemsize=buf.itemsize,
                       meminfo=None)
        return view._getvalue()

    return _KEY_VIEW(key), codegen
