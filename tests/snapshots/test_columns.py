"""snapshots.columns: a restore converts each Arrow column to NumPy once, read-only."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.snapshots.columns import column_numpy, numpy_columns


def _table() -> pa.Table:
    """Two record batches per column, as a snapshot written range by range has."""
    return pa.table({"n": pa.chunked_array([np.arange(5), np.arange(3)]),
                     "b": pa.chunked_array([[True, False, True, True, True], [True, False, False]])})


def test_inside_the_block_a_column_is_converted_once():
    t = _table()
    with numpy_columns():
        first = column_numpy(t.column("n"))  # Table.column: a new wrapper at every call
        assert column_numpy(t.column("n")) is first
        assert first.tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
        assert column_numpy(t.column("b")).tolist() == [True, False, True, True, True, True, False, False]
        # a slice is other values: its own conversion
        assert column_numpy(t.slice(1).column("n")).tolist() == [1, 2, 3, 4, 0, 1, 2]
        assert column_numpy(t.slice(1).column("b")).tolist() == [False, True, True, True, True, False, False]
    assert column_numpy(t.column("n")) is not column_numpy(t.column("n"))  # outside: no cache


def test_arrays_are_read_only_copied_or_not():
    t = _table()
    single = pa.table({"n": np.arange(4)})
    for values in (column_numpy(t.column("n")), column_numpy(single.column("n"))):
        with pytest.raises(ValueError):
            values[0] = 1
