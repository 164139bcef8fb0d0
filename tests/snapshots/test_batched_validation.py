"""A state whose tables come in several record batches (a snapshot written range by range) is
validated and converted batch by batch where its columns lie: a forged value in a later batch is
refused naming its row in the whole table, and what passes converts and loads exactly like the
same state in one batch."""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.errors import SnapshotFieldError
from mooncake_columnar.master import MasterService
from mooncake_columnar.snapshots.convert import convert_steady_deadlines
from mooncake_columnar.snapshots.state import SnapshotState, column_chunks
from mooncake_columnar.tools.synthetic import build_master, synthetic_keys

ROWS = 5  # rows per record batch: the two replicas of some objects lie in two batches


def _batched(table: pa.Table) -> pa.Table:
    return pa.Table.from_batches(table.to_batches(max_chunksize=ROWS), table.schema)


def _state() -> SnapshotState:
    m = build_master(12, segments=4, replicas=2)
    m.batch_get_replica_list(synthetic_keys(0, 12))  # leases: deadlines that are not the sentinel
    state = m.export_state().encoded()
    return dataclasses.replace(state, objects=_batched(state.objects), replicas=_batched(state.replicas))


def _forged(state: SnapshotState, table: str, name: str, row: int, value: int) -> SnapshotState:
    t = getattr(state, table)
    values = t.column(name).to_numpy().copy()
    values[row] = value
    i = t.schema.get_field_index(name)
    column = pa.array(values, t.schema.field(name).type)
    return dataclasses.replace(state, **{table: _batched(t.set_column(i, t.schema.field(name), column))})


def test_a_state_in_several_batches_validates_and_loads_like_one_batch() -> None:
    state = _state()
    assert state.objects.column("size_bytes").num_chunks > 1 and state.replicas.column("size").num_chunks > 1
    state.validate()
    one = dataclasses.replace(state, objects=state.objects.combine_chunks(), replicas=state.replicas.combine_chunks())
    a, b = MasterService.from_state(state), MasterService.from_state(one)
    a.verify()
    assert a.export_state().objects.equals(b.export_state().objects)


@pytest.mark.parametrize(("table", "name", "row", "value"), [
    ("replicas", "size", 7, 1),                    # differs from its object's size_bytes
    ("replicas", "replica_id", 11, 0),
    ("replicas", "status", 12, 0),
    ("replicas", "offset", 9, -4096),
    ("replicas", "object_index", 13, 99),          # outside the objects
    ("objects", "put_start_time_ms", 8, -1),
    ("objects", "size_bytes", 11, 0),
])
def test_a_forged_value_in_a_later_batch_is_refused_naming_its_row(table: str, name: str, row: int,
                                                                    value: int) -> None:
    with pytest.raises(SnapshotFieldError) as e:
        _forged(_state(), table, name, row, value).validate()
    assert (e.value.table, e.value.row) == (table, row)


def test_a_replica_id_repeated_in_a_later_batch_is_refused_naming_the_repeat() -> None:
    state = _state()
    first = int(state.replicas.column("replica_id")[1].as_py())
    with pytest.raises(SnapshotFieldError, match="used twice") as e:
        _forged(state, "replicas", "replica_id", 16, first).validate()
    assert (e.value.field, e.value.row) == ("replica_id", 16)


def test_replica_counts_are_matched_across_batches() -> None:
    state = _state()
    counts = state.objects.column("replica_count").to_numpy()
    assert (counts == 2).all()
    for row in (2, 11):  # an object whose replicas straddle a batch boundary, and the last one
        with pytest.raises(SnapshotFieldError, match="replica_count"):
            _forged(state, "objects", "replica_count", row, 1).validate()


def test_deadline_horizon_names_a_row_of_a_later_batch() -> None:
    state = _state()
    lease = state.objects.column("lease_deadline_ns").to_numpy()
    forged = _forged(state, "objects", "lease_deadline_ns", 9, int(lease.max()) + 10**15)
    with pytest.raises(SnapshotFieldError) as e:
        forged.check_deadline_horizon(int(lease.max()), 10**9)
    assert (e.value.field, e.value.row) == ("lease_deadline_ns", 9)


def test_deadlines_convert_chunk_by_chunk_exactly_as_one_array() -> None:
    column = _state().objects.column("lease_deadline_ns")
    clocks = dict(snapshot_system_ns=10**18, snapshot_steady_ns=5 * 10**9, restore_system_ns=10**18 + 10**9,
                  restore_steady_ns=7 * 10**9)
    chunks = column_chunks(column)
    assert len(chunks) > 1
    np.testing.assert_array_equal(convert_steady_deadlines(chunks, **clocks),
                                  convert_steady_deadlines(column.to_numpy(), **clocks))
