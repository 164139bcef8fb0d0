"""Replica offsets between the ``replica_offset`` column and bytes: the kernels agree with the
rule kernels.allocation.offset_shift states (memory replicas on a segment in its units, the rest
in bytes), strided column views included (what a one-slot export reads)."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.kernels.replica_offsets import byte_offsets_of, column_offsets_of
from mooncake_columnar.schema import KIND_LOCAL_DISK, KIND_MEMORY

pytestmark = pytest.mark.kernels  # also run with NUMBA_DISABLE_JIT=1 (make test)


def _replicas() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(column values, kind, segment code, unit bits per code) covering every case: memory on
    segments with 1-byte and wider units, memory on no segment (code -1), another kind."""
    unit_bits = np.array([0, 4, 12], np.int64)
    kind = np.array([KIND_MEMORY, KIND_MEMORY, KIND_MEMORY, KIND_MEMORY, KIND_LOCAL_DISK, KIND_LOCAL_DISK], np.uint8)
    seg = np.array([0, 1, 2, -1, 1, -1], np.int32)
    column = np.array([7, 3, 2**32 - 1, 5, 2**32 - 1, 9], np.uint32)
    return column, kind, seg, unit_bits


def test_byte_offsets_shift_memory_replicas_by_their_segment_units_only():
    column, kind, seg, unit_bits = _replicas()
    assert byte_offsets_of(column, kind, seg, unit_bits).tolist() == [7, 3 << 4, (2**32 - 1) << 12, 5, 2**32 - 1, 9]


def test_column_offsets_invert_byte_offsets():
    column, kind, seg, unit_bits = _replicas()
    offsets = byte_offsets_of(column, kind, seg, unit_bits)
    back = column_offsets_of(offsets, kind, seg, unit_bits)
    assert back.dtype == np.uint32 and back.tolist() == column.tolist()


def test_byte_offsets_read_strided_slot_columns():
    """A (rows, slots) column's first slot is a strided view: same values as a copy."""
    column, kind, seg, unit_bits = _replicas()
    wide = [np.stack([a, a[::-1]], axis=1) for a in (column, kind, seg)]
    views = [a[:, 0] for a in wide]
    assert not views[0].flags.c_contiguous
    assert byte_offsets_of(*views, unit_bits).tolist() == byte_offsets_of(column, kind, seg, unit_bits).tolist()
