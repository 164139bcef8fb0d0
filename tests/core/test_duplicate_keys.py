"""A state with a duplicate (tenant, key) is rejected by the engine load, whole."""
from __future__ import annotations

import pyarrow as pa
import pytest

from mooncake_columnar import MasterService
from mooncake_columnar.errors import SnapshotExtentError, SnapshotIntegrityError
from mooncake_columnar.snapshots.state import SnapshotState
from mooncake_columnar.testing.builders import make_master


def test_from_state_rejects_duplicate_keys(clocks):
    m = make_master(clocks)
    for k in ("a", "b"):
        m.put_start(k, 8, client_id="client0")
        m.put_end(k, client_id="client0")
    s = m.export_state()
    key_field = s.objects.schema.field("key")
    objects = s.objects.set_column(1, key_field, pa.array(["a", "a"], key_field.type))
    with pytest.raises(SnapshotIntegrityError, match="duplicate"):
        MasterService.from_state(SnapshotState(objects, s.replicas, s.segments, s.replica_next_id),
                                 config=m.config, clocks=clocks)


def test_from_state_rejects_overlapping_extents(clocks):
    m = make_master(clocks)
    for k in ("a", "b"):
        m.put_start(k, 8, client_id="client0")
        m.put_end(k, client_id="client0")
    s = m.export_state()
    reps = s.replicas.set_column(s.replicas.schema.get_field_index("offset"), s.replicas.schema.field("offset"),
                                 pa.array([0, 4], pa.int64()))
    with pytest.raises(SnapshotExtentError, match="replicas.offset: segment 'seg0'.*overlap"):
        MasterService.from_state(SnapshotState(s.objects, reps, s.segments, s.replica_next_id),
                                 config=m.config, clocks=clocks)
