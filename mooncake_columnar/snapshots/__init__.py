"""Complete MasterService snapshots (RFC Phase 3 v2 Arrow format, upstream v1 compatibility)."""
from .arrow_codec import decode_state, encode_state
from .complete import (
    RestoreStats,
    cleanup_state,
    convert_v2_state,
    restore_latest,
    restore_latest_with,
    write_snapshot,
)
from .convert import convert_legacy_ms_deadlines, convert_steady_deadlines, legacy_system_deadline_ms
from .manager import SnapshotManager, primary_snapshot_manager, restore_master
from .manifest import (
    SnapshotManifest,
    is_valid_snapshot_id,
    parse_manifest,
    snapshot_id_for,
    v1_manifest,
    v2_manifest,
)
from .mooncake_v1 import decode_v1, encode_v1, write_v1
from .repository import SnapshotFiles, SnapshotRepository
from ..store.snapshot_state import SnapshotState, empty_state

__all__ = [
    "RestoreStats", "SnapshotFiles", "SnapshotManager", "SnapshotManifest", "SnapshotRepository", "SnapshotState",
    "cleanup_state", "convert_legacy_ms_deadlines", "convert_steady_deadlines", "convert_v2_state",
    "decode_state", "decode_v1", "empty_state", "encode_state", "encode_v1", "is_valid_snapshot_id",
    "legacy_system_deadline_ms", "parse_manifest", "primary_snapshot_manager", "restore_latest",
    "restore_latest_with", "restore_master", "snapshot_id_for",
    "v1_manifest", "v2_manifest", "write_snapshot", "write_v1",
]
