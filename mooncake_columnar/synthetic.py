"""Seeded synthetic workloads for benchmarks, the demo and notebooks (no per-key Python objects)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from .master import MasterService

KEY_BYTES = 32
_PREFIX = b"obj-"


def synthetic_keys(start: int, count: int, key_bytes: int = KEY_BYTES) -> pa.Array:
    """``count`` distinct fixed-width keys ``obj-000...<i>`` built with array arithmetic."""
    ids = np.arange(start, start + count, dtype=np.int64)
    data = np.empty((count, key_bytes), np.uint8)
    data[:, : len(_PREFIX)] = np.frombuffer(_PREFIX, np.uint8)
    rest = ids.copy()
    for col in range(key_bytes - 1, len(_PREFIX) - 1, -1):
        data[:, col] = ord("0") + rest % 10
        rest //= 10
    offsets = np.arange(0, (count + 1) * key_bytes, key_bytes, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data.reshape(-1)))


def mount_segments(m: MasterService, segments: int, segment_bytes: int, client_prefix: str = "client") -> None:
    for i in range(segments):
        m.mount_segment(f"segment-{i}", endpoint=f"10.0.{i // 256}.{i % 256}:17777",
                        client_id=f"{client_prefix}-{i}", base=(i + 1) << 40, size=segment_bytes)


def segment_request(m: MasterService, index: int, client_prefix: str = "client") -> dict:
    """What the owner of ``mount_segments``' segment ``index`` sends when it remounts."""
    seg = m.segments.get(f"segment-{index}")
    return dict(name=seg.name, endpoint=seg.endpoint, client=f"{client_prefix}-{index}",
                base=(index + 1) << 40, size=seg.size)


def fill(m: MasterService, objects: int, *, object_bytes: int = 4096, chunk: int = 1_000_000,
         client_id: str = "client-0", progress=None, **put_config) -> None:
    """Put and complete ``objects`` objects in vectorized batches of ``chunk`` keys."""
    from .messages import ReplicateConfig
    cfg = ReplicateConfig(**put_config)
    done = 0
    while done < objects:
        n = min(chunk, objects - done)
        keys = synthetic_keys(done, n)
        sizes = np.full(n, object_bytes, np.int64)
        res = m.batch_put_start(keys, sizes, client_id=client_id, config=cfg)
        if not (res.codes == 0).all():
            raise RuntimeError(f"fill: {(res.codes != 0).sum()} puts failed (code {res.codes[res.codes != 0][0]})")
        m.batch_put_end(keys, client_id=client_id)
        done += n
        if progress is not None:
            progress(n)
