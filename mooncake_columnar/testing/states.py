"""Snapshot states built from NumPy arrays, and a forger's way to publish one unchecked."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import ArrayLike

from mooncake_columnar.schema import (
    NEVER_LEASED,
    NO_DEADLINE,
    OBJECTS_ARROW_SCHEMA,
    REPLICAS_ARROW_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    ReplicaStatus,
)
from mooncake_columnar.snapshots.arrow_codec import (
    DIGEST_FILE,
    OBJECTS_FILE,
    REPLICAS_FILE,
    SEGMENTS_FILE,
    DigestPayload,
    IpcPayload,
)
from mooncake_columnar.snapshots.manifest import snapshot_id_for, v2_manifest
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.snapshots.state import SnapshotState, with_usage

NEXT_ID_METADATA_KEY = b"mooncake.replica_next_id"  # where replicas.arrow keeps replica_next_id
SLOT = 1 << 16  # bytes between consecutive objects' offsets
CLIENT = "5855271126332135054-12946329639865218993"


def make_state(n: int = 6, *, replicas_per_object: int = 1, lease: ArrayLike | None = None,
               soft: ArrayLike | None = None, hard: ArrayLike | None = None,
               soft_enabled: ArrayLike | None = None, status: ArrayLike | None = None,
               segments: tuple[str, ...] = ("seg_a", "seg_b"), segment_size: int = 1 << 34) -> SnapshotState:
    """A consistent state built from NumPy arrays: object i's replica r lives on segment
    (i + r) % S at offset i * SLOT, so replicas never overlap."""
    n_seg, r = len(segments), replicas_per_object
    i = np.arange(n, dtype=np.int64)

    def col(value: ArrayLike | None, default: object) -> np.ndarray:
        return np.broadcast_to(np.asarray(default if value is None else value), (n,))

    objects = pa.table({
        "tenant": pa.array(["default"] * n),
        "key": pa.array([f"key_{k:06d}" for k in range(n)]),
        "client": pa.array([CLIENT] * n),
        "size_bytes": pa.array(1024 * (i % 7 + 1)),
        "data_type": pa.array(np.zeros(n, np.uint8)),
        "group": pa.array([""] * n),
        "hard_pinned": pa.array(col(hard, False).astype(bool)),
        "soft_pin_enabled": pa.array(col(soft_enabled, False).astype(bool)),
        "lease_deadline_ns": pa.array(col(lease, NEVER_LEASED).astype(np.int64)),
        "soft_pin_deadline_ns": pa.array(col(soft, NO_DEADLINE).astype(np.int64)),
        "put_start_time_ms": pa.array(1_796_019_927_000 + i),
        "processing": pa.array(np.zeros(n, bool)),
        "replica_count": pa.array(np.full(n, r, np.int32)),
    }, schema=OBJECTS_ARROW_SCHEMA)
    obj = np.repeat(i, r)
    slot = np.tile(np.arange(r), n)
    rep_status = np.broadcast_to(np.asarray(ReplicaStatus.COMPLETE if status is None else status,
                                            dtype=np.uint8), (n * r,))
    seg_names = np.array(segments, dtype=object)[(obj + slot) % n_seg]
    replicas = pa.table({
        "object_index": pa.array(obj),
        "replica_id": pa.array((1 + obj * r + slot).astype(np.uint64)),
        "kind": pa.array(np.zeros(n * r, np.uint8)),
        "status": pa.array(rep_status),
        "segment": pa.array(seg_names.tolist(), pa.string()),
        "offset": pa.array(obj * SLOT),
        "size": pa.array(1024 * (obj % 7 + 1)),
        "readable": pa.array(np.ones(n * r, bool)),
    }, schema=REPLICAS_ARROW_SCHEMA)
    segs = pa.table({
        "name": pa.array(list(segments)),
        "endpoint": pa.array([f"{s}:7001" for s in segments]),
        "client": pa.array([f"{k + 1}-{k + 2}" for k in range(n_seg)]),
        "base": pa.array(((np.arange(n_seg) + 3) << 32).astype(np.uint64)),
        "size": pa.array(np.full(n_seg, segment_size, np.int64)),
        "used": pa.array(np.zeros(n_seg, np.int64)),
        "readable": pa.array(np.ones(n_seg, bool)),
        "segment_id": pa.array([f"{k + 100}-{k + 200}" for k in range(n_seg)]),
        "host_id": pa.array([f"host-{k % 2}" for k in range(n_seg)]),
    }, schema=SEGMENTS_ARROW_SCHEMA)
    return with_usage(SnapshotState(objects, replicas, segs, replica_next_id=n * r + 1)).validate()


def publish_unvalidated(repo: SnapshotRepository, state: SnapshotState, system_ns: int, steady_ns: int) -> str:
    """Publish ``state`` as a v2 snapshot without the writer's validation, digest and manifest
    checksum computed: a forger's well-formed candidate."""
    sid = snapshot_id_for(system_ns)
    state = state.encoded()
    files = {OBJECTS_FILE: IpcPayload(state.objects, None, {}),
             REPLICAS_FILE: IpcPayload(state.replicas, None,
                                       {NEXT_ID_METADATA_KEY: str(state.replica_next_id).encode()}),
             SEGMENTS_FILE: IpcPayload(state.segments, None, {})}
    repo.publish(sid, {**files, DIGEST_FILE: DigestPayload(files)}, v2_manifest(sid, system_ns, steady_ns).encode())
    return sid
