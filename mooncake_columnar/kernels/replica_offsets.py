"""Replica offsets between the engine's ``replica_offset`` column and byte offsets, in one pass.

A memory replica's column value counts its segment's allocation units, any other kind's counts
bytes (:func:`.allocation.offset_shift`). Snapshot export turns a column into byte offsets and a
restore turns validated byte offsets back into column values, 10M replicas at a time; as NumPy
expressions that took five temporaries per replica, here one output array.
"""
from __future__ import annotations

import numpy as np

from .allocation import offset_shift
from .jit import njit
from .nrt_free import nrt_free_core


@nrt_free_core
def _to_bytes(column, kind, seg, unit_bits, out):
    for i in range(column.shape[0]):
        out[i] = np.int64(column[i]) << offset_shift(kind[i], seg[i], unit_bits)


@njit(cache=True, nogil=True)
def byte_offsets_of(column, kind, seg, unit_bits):
    """Byte offsets (int64) of replica slots whose ``replica_offset`` values are ``column``
    (their kind and segment code alongside; ``unit_bits`` per segment code)."""
    out = np.empty(column.shape[0], np.int64)
    _to_bytes(column, kind, seg, unit_bits, out)
    return out


@nrt_free_core
def _to_column(offsets, kind, seg, unit_bits, out):
    for i in range(offsets.shape[0]):
        out[i] = np.uint32(np.int64(offsets[i]) >> offset_shift(kind[i], seg[i], unit_bits))


@njit(cache=True, nogil=True)
def column_offsets_of(offsets, kind, seg, unit_bits):
    """``replica_offset`` values (uint32) of replicas at byte ``offsets``: a memory replica's
    on a unit boundary of its segment, another kind's below 2**32 (the caller checked both)."""
    out = np.empty(offsets.shape[0], np.uint32)
    _to_column(offsets, kind, seg, unit_bits, out)
    return out
