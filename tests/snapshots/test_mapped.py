"""snapshots/mapped.py: a restore reads local payloads through memory maps whose pages it lets go
once read, so the file never stays resident beside the engine it fills; the bytes stay intact."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from mooncake_columnar.snapshots.mapped import map_file, release_mapped


def _rss_file_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_released_pages_leave_the_resident_set_and_read_back_the_same(tmp_path) -> None:
    data = np.random.default_rng(0).integers(0, 256, 32 << 20, np.uint8)
    path = tmp_path / "payload.arrow"
    path.write_bytes(data.tobytes())
    buffer = map_file(str(path))
    view = np.frombuffer(buffer, np.uint8)
    before = _rss_file_bytes()
    checksum = int(view.sum(dtype=np.uint64))  # reads every page
    assert _rss_file_bytes() - before > 24 << 20
    release_mapped()
    assert _rss_file_bytes() - before < 8 << 20
    assert int(view.sum(dtype=np.uint64)) == checksum == int(data.sum(dtype=np.uint64))


def test_an_empty_file_maps_to_an_empty_buffer(tmp_path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert map_file(str(path)) == pa.py_buffer(b"")
    release_mapped()  # nothing mapped from it: nothing to do
