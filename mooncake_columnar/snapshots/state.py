"""Moved to store/snapshot_state.py (the store exports and loads a SnapshotState, and the store
sits below snapshots/); its names stay importable from here."""
from ..store.snapshot_state import (
    MAX_PUT_START_MS,
    MAX_REPLICA_NEXT_ID,
    SnapshotState,
    check_next_id,
    check_object_columns,
    check_replica_columns,
    check_replicas,
    check_segments,
    check_table,
    column_chunks,
    column_numpy,
    empty_state,
    layout_table,
    name_array,
    name_codes,
    segment_rows,
    segment_usage,
    with_segment_identity,
    with_usage,
)

__all__ = [
    "MAX_PUT_START_MS", "MAX_REPLICA_NEXT_ID", "SnapshotState", "check_next_id", "check_object_columns",
    "check_replica_columns", "check_replicas", "check_segments", "check_table", "column_chunks", "column_numpy",
    "empty_state", "layout_table", "name_array", "name_codes", "segment_rows", "segment_usage",
    "with_segment_identity", "with_usage",
]
