"""Arrow columns as NumPy arrays, each column converted once per restore.

A column of one record batch converts zero-copy. A snapshot written range by range
(:mod:`.streamed`) has several record batches per file, and each ``to_numpy`` of such a column
is a fresh copy (about 0.05 s per 80 MB column at 10M objects on cold memory); a restore's
validation, deadline checks, clock conversion and cleanup read the same columns again. Inside
:func:`numpy_columns` every column is converted at most once: the copies live until the block
ends (before the engine is built, so they never add to the restore's peak). Arrays are
read-only either way, so the kernels that read them compile one signature (a zero-copy array
is read-only already).
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Iterator

import numpy as np
import pyarrow as pa

# the column's data (see _key) -> (the column, its array): the column is kept so that the
# addresses of its buffers are not reused meanwhile
_Key = tuple[str, int, tuple[tuple[int, ...], ...]]
_converted: ContextVar[dict[_Key, tuple[pa.ChunkedArray, np.ndarray]] | None] = ContextVar(
    "numpy_columns", default=None)


def _key(column: pa.ChunkedArray) -> _Key:
    """What identifies a column's values: its type, length and each chunk's offset and buffer
    addresses (``Table.column`` returns a new wrapper object at every call)."""
    return (str(column.type), len(column),
            tuple((c.offset, *(0 if b is None else b.address for b in c.buffers())) for c in column.chunks))


@contextlib.contextmanager
def numpy_columns() -> Iterator[None]:
    """Within the block (this thread or task), :func:`column_numpy` converts each column once."""
    token = _converted.set({})
    try:
        yield
    finally:
        _converted.reset(token)


def column_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """``column`` as a read-only NumPy array (booleans as bytes)."""
    cache = _converted.get()
    if cache is None:
        return _read_only(column.to_numpy())
    key = _key(column)
    if key not in cache:
        cache[key] = (column, _read_only(column.to_numpy()))
    return cache[key][1]


def _read_only(values: np.ndarray) -> np.ndarray:
    values.flags.writeable = False
    return values
