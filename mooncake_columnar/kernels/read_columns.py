"""The columns the single-key read kernel reads, as one Numba object (a StructRef).

A compiled call unboxes each NumPy argument (~0.2 us apiece): the single-key read's 14 columns
cost more than the read itself. Handed over as one StructRef built once, they unbox as one
pointer. The object holds references to the arrays it was built from, so whoever keeps one
must build a new one when the store replaces any of them (store/read_columns.py does).
"""
from __future__ import annotations

from types import SimpleNamespace

from numba import config, types
from numba.experimental import structref

from .jit import njit

# the fields, in the order read_columns takes them
FIELDS = ("table", "arena", "key_refs", "row_tenant", "flags", "lease", "rep_status", "rep_kind",
          "rep_seg", "seg_readable", "more", "rep_id", "rep_offset", "size_bytes")


@structref.register
class ReadColumnsType(types.StructRef):
    """Numba type of :class:`ReadColumns`: its fields typed as the arrays it was built from."""

    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class ReadColumns(structref.StructRefProxy):
    """Python handle of a ReadColumnsType (opaque here: only kernels read its fields)."""


structref.define_boxing(ReadColumnsType, ReadColumns)
structref.define_constructor(ReadColumns, ReadColumnsType, FIELDS)


@njit(cache=True)
def _read_columns(table, arena, key_refs, row_tenant, flags, lease, rep_status, rep_kind, rep_seg,
                  seg_readable, more, rep_id, rep_offset, size_bytes):
    return ReadColumns(table, arena, key_refs, row_tenant, flags, lease, rep_status, rep_kind, rep_seg,
                       seg_readable, more, rep_id, rep_offset, size_bytes)


def read_columns(*columns):
    """One object holding ``columns`` (:data:`FIELDS`, in that order) for kernels/reads.read_one."""
    if config.DISABLE_JIT:  # the kernels as plain Python (make test): any object with the fields does
        return SimpleNamespace(**dict(zip(FIELDS, columns, strict=True)))
    return _read_columns(*columns)
