"""Each segment's allocator and buffer handles, read out of v1 snapshot payloads."""
from __future__ import annotations

import dataclasses

import msgpack
import numpy as np

from mooncake_columnar.snapshots.mooncake_v1 import METADATA_FILE, SEGMENTS_FILE
from mooncake_columnar.snapshots.mooncake_v1_allocator import (
    AllocationHandles,
    AllocatorState,
    unpack_allocator,
    unpack_handle,
    unzstd,
)


@dataclasses.dataclass
class SegmentView:
    """One segment as a v1 snapshot stores it."""

    allocator: AllocatorState
    handles: AllocationHandles
    replica_ids: list[int]
    mounted: list  # the MountedSegment value


def v1_allocators(payloads: dict[str, bytes]) -> dict[str, SegmentView]:
    """Per segment name: its allocator, the handles of its buffers (and their replica ids)."""
    seg = msgpack.unpackb(unzstd(payloads[SEGMENTS_FILE], "segments"), strict_map_key=False)
    rows: dict[str, list] = {uid: [] for uid in seg["ms"]}
    meta = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
    for blob in meta["shards"].values():
        for _, _, m in msgpack.unpackb(unzstd(blob, "shard"))["metadata"]:
            for rid, _, _, buf in m[8:8 + m[6]]:
                if buf[3]:
                    real, size, off, node = unpack_handle(buf[4], "handle")
                    assert (real, size) == (buf[1], buf[0])  # the handle describes its buffer
                    rows[buf[2]].append((rid, real, size, off, node))
    out = {}
    for uid, ms in seg["ms"].items():
        assert ms[6] is True
        r = sorted(rows[uid])
        handles = AllocationHandles(np.array([x[1] for x in r], np.uint64),
                                    *(np.array([x[k] for x in r], np.int64) for k in (2, 3, 4)))
        out[ms[1]] = SegmentView(unpack_allocator(ms[7], ms[1]), handles, [x[0] for x in r], ms)
    return out
