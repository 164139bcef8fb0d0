"""The asv suite runs end to end (`asv run --quick --dry-run --python=same`) so benchmarks cannot rot.

The grid is shrunk through the suite's environment variables: the default 1e5..1e7 objects would
take far longer than the test suite may. asv missing is a failure, not a skip.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "ci"
# A status line: "[ 12.50%] ··· module.Class.name   ok" (long names are elided with "...").
# Result tables are prefixed the same way but hold no dotted name.
STATUS = re.compile(r"^\[\s*[\d.]+%\] ··· ([\w.]*\.\w+)\s+(.+?)\s*$")
# An unparameterised track_ benchmark shows its value (e.g. "1.34s") where others show "ok".
PASSED = re.compile(r"ok|-?[\d.]+(e[-+]?\d+)?\s*\S{0,3}")


def _asv(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # `python -m asv` with this interpreter: --python=same then benchmarks this very environment.
    return subprocess.run([sys.executable, "-m", "asv", *args], cwd=ROOT, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)


@pytest.mark.timeout(1200)  # every benchmark once, each forked from a server that imported the suite once
# (asv.conf.json launch_method: about 40% less than a fresh interpreter each); minutes on a busy host
def test_asv_quick_dry_run_passes(tmp_path: Path) -> None:
    assert importlib.util.find_spec("asv") is not None, "asv is not installed in this interpreter"
    env = dict(os.environ, HOME=str(tmp_path),  # asv machine writes ~/.asv-machine.json
               MOONCAKE_ASV_OBJECTS="20000", MOONCAKE_ASV_OPLOG_ENTRIES="2048")

    machine = _asv(["machine", "--yes", "--machine", MACHINE], env)
    assert machine.returncode == 0, machine.stdout

    run = _asv(["run", "--quick", "--dry-run", "--python=same", "--show-stderr", "--machine", MACHINE], env)
    out = run.stdout
    assert run.returncode == 0, out
    total = re.search(r"Running (\d+) total benchmarks", out)
    assert total is not None, out
    statuses = {m.group(1): m.group(2) for line in out.splitlines() if (m := STATUS.match(line))}
    failed = {name: status for name, status in statuses.items() if not PASSED.fullmatch(status)}
    assert not failed, f"{failed}\n\n{out}"
    assert len(statuses) == int(total.group(1)), out
    assert int(total.group(1)) >= 30, out  # every area's module was discovered
