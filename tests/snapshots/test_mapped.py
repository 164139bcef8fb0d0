"""mapped.py: a restore reads local payloads through memory maps whose pages it lets go
once read, so the file never stays resident beside the engine it fills; the bytes stay intact."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mooncake_columnar.mapped import map_file, release_mapped


def _rss_file_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def test_released_pages_leave_the_resident_set_and_read_back_the_same(tmp_path) -> None:
    values = np.random.default_rng(0).integers(0, 1 << 40, 4 << 20)  # 32 MiB
    path = tmp_path / "objects.arrow"
    table = pa.table({"v": values})
    with pa.OSFile(str(path), "wb") as out, pa.ipc.new_file(out, table.schema) as writer:
        writer.write_table(table)
    buffer = map_file(str(path))
    column = pa.ipc.open_file(buffer).read_all().column("v")
    del buffer  # the decoded table alone keeps the mapping, and its pages are still let go
    before = _rss_file_bytes()
    total = pc.sum(column).as_py()  # reads every page
    assert _rss_file_bytes() - before > 24 << 20
    release_mapped()
    assert _rss_file_bytes() - before < 8 << 20
    assert pc.sum(column).as_py() == total == int(values.sum())


def test_an_empty_file_maps_to_an_empty_buffer(tmp_path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert map_file(str(path)) == pa.py_buffer(b"")
    release_mapped()  # nothing mapped from it: nothing to do
