"""pandas is not a dependency: the Arrow export, a snapshot write and a restore run where it
cannot be imported (pyarrow's ``DataType.to_pandas_dtype()`` imports it on some versions, e.g.
on Python 3.10). Run in a fresh interpreter so that no earlier test has imported pandas: this
one, and the lowest Python the package declares when ``MOONCAKE_LOWEST_PYTHON`` names an
interpreter that has the package installed (``.ci/run`` builds one with Python 3.10)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import mooncake_columnar

_SCRIPT = textwrap.dedent("""
    import sys


    class NoPandas:  # every `import pandas` from here on raises ImportError
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "pandas":
                raise ImportError(f"{name} is made unimportable by this test")


    sys.meta_path.insert(0, NoPandas())

    from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
    from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
    from mooncake_columnar.snapshots.repository import SnapshotRepository

    clocks = ManualClocks()
    m = MasterService(MasterConfig(), clocks=clocks)
    m.mount_segment("seg", endpoint="10.0.0.1:17777", client_id="client-0", base=1 << 40, size=1 << 26)
    for i in range(300):  # past 127 distinct names would need an int16 index; one group per key
        m.put_start(f"k{i}", 4096, client_id="client-0", config=ReplicateConfig(group_id=f"g{i}"))
        m.put_end(f"k{i}", client_id="client-0")
    assert m.to_arrow().num_rows == 300
    repo = SnapshotRepository(sys.argv[1])
    SnapshotManager(m, repo, prefault=False).snapshot_now()
    restored, _ = restore_master(repo, config=m.config, clocks=clocks, drop_expired=False, prefault=False)
    restored.verify()
    assert restored.to_arrow().num_rows == 300
    assert not any(name.split(".")[0] == "pandas" for name in sys.modules)
    print("ok")
""")


LOWEST_PYTHON = os.environ.get("MOONCAKE_LOWEST_PYTHON", "")


@pytest.mark.parametrize("python", [
    pytest.param(sys.executable, id="this-python"),
    pytest.param(LOWEST_PYTHON, id="lowest-declared-python", marks=pytest.mark.skipif(
        not LOWEST_PYTHON, reason="MOONCAKE_LOWEST_PYTHON is not set (.ci/run sets it)")),
])
def test_to_arrow_snapshot_and_restore_run_without_pandas(tmp_path: Path, python: str) -> None:
    out = subprocess.run([python, "-c", _SCRIPT, str(tmp_path / "snapshots")], check=False,
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.strip().splitlines()[-1] == "ok"


def test_the_package_calls_no_pandas_conversion() -> None:
    """The subprocess above cannot catch a pyarrow version that needs pandas for a call this one
    answers without it: ``to_pandas*()`` (``DataType.to_pandas_dtype()`` included) is not called."""
    root = Path(mooncake_columnar.__file__).parent
    calls = [f"{path.relative_to(root)}:{node.lineno}" for path in sorted(root.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Attribute) and node.attr.startswith("to_pandas")]
    assert calls == []
