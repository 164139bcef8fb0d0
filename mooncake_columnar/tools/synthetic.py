"""Seeded synthetic workloads for benchmarks, the demo, the analysis and notebooks (no per-key
Python objects): keys, segments, filled masters and the master a promotion leaves."""
from __future__ import annotations

import resource

import numpy as np
import pyarrow as pa

from ..clock import ManualClocks, MonotonicClocks
from ..config import MasterConfig
from ..errors import error_for_code
from ..master import MasterService
from ..messages import ReplicateConfig
from .progress import bar

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
    cfg = ReplicateConfig(**put_config)
    done = 0
    while done < objects:
        n = min(chunk, objects - done)
        keys = synthetic_keys(done, n)
        sizes = np.full(n, object_bytes, np.int64)
        res = m.batch_put_start(keys, sizes, client_id=client_id, config=cfg)
        failed = res.codes != 0
        if failed.any():
            raise error_for_code(int(res.codes[failed][0]), f"fill: {int(failed.sum())} puts failed")
        m.batch_put_end(keys, client_id=client_id)
        done += n
        if progress is not None:
            progress(n)


def build_master(objects: int, *, segments: int = 4, replicas: int = 1, object_bytes: int = 4096,
                 show_progress: bool = False, config: MasterConfig | None = None,
                 clocks: ManualClocks | None = None) -> MasterService:
    """A master holding ``objects`` complete objects spread over ``segments`` segments."""
    m = MasterService(config or MasterConfig(), clocks=clocks or ManualClocks(),
                      initial_capacity=max(1024, objects))
    seg_bytes = max(1 << 20, int(objects * object_bytes * replicas / segments * 1.25))
    mount_segments(m, segments, seg_bytes)
    with bar(objects, f"building {objects:,} objects", show_progress) as advance:
        fill(m, objects, object_bytes=object_bytes, replica_num=replicas, progress=advance)
    return m


def promoted_master(objects: int, *, segments: int = 1, replicas: int = 1, show_progress: bool = False,
                    config: MasterConfig | None = None) -> MasterService:
    """A master as standby promotion leaves it (``ha.standby.promoted_master`` of a filled one):
    N objects, every lease NEVER_LEASED, every segment unreadable (invalid endpoint, no
    allocations) until its client remounts; real clocks, so the visible window is measured. The
    filled master and the promoted one coexist for a moment: about twice the memory of either."""
    from ..ha.standby import promoted_master as promote
    source = build_master(objects, segments=segments, replicas=replicas, show_progress=show_progress,
                          config=config)
    m = promote(source, config=source.config, clocks=MonotonicClocks())
    for i in range(segments):
        m.liveness.touch(f"client-{i}", 2**62)  # the bench's clients never time out
    return m


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
