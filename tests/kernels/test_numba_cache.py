"""A read-only install keeps a working Numba cache: the kernels' machine code goes to the user
cache directory, and the next process loads it instead of compiling (9-22 s against about 1 s).
Each test runs fresh interpreters on a read-only copy of the package (runtime.py acts at import)."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

import mooncake_columnar

pytestmark = pytest.mark.timeout(1200)  # an empty-cache first call: ~10 s alone, minutes on a busy shared host

_SCRIPT = textwrap.dedent("""
    import json
    import os
    import sys

    import mooncake_columnar as mc

    m = mc.MasterService(mc.MasterConfig())
    m.mount_segment("seg", endpoint="10.0.0.1:17777", client_id="client-0", base=1 << 40, size=1 << 26)
    m.put_start("key", 4096, client_id="client-0")
    m.put_end("key", client_id="client-0")
    assert m.get_replica_list("key")

    from numba.core.registry import CPUDispatcher
    kernels = [obj for name, mod in list(sys.modules.items()) if name.startswith("mooncake_columnar")
               for obj in vars(mod).values() if isinstance(obj, CPUDispatcher)]
    print(json.dumps({
        "package": os.path.dirname(mc.__file__),
        "package_writable": os.access(os.path.dirname(mc.__file__), os.W_OK),
        "cache_dir": os.environ.get("NUMBA_CACHE_DIR"),
        "hits": sum(sum(k.stats.cache_hits.values()) for k in kernels),
        "misses": sum(sum(k.stats.cache_misses.values()) for k in kernels),
        "helper": mc.compile_helper.last_run.outcome,
    }))
""")


def _read_only_prefix() -> list[str]:
    """root writes through file modes; drop the capabilities that let it (util-linux setpriv)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: a read-only directory cannot be made")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search"]


def _chmod_tree(root: Path, writable: bool) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


@pytest.fixture
def read_only_package(tmp_path) -> Iterator[Path]:
    """A copy of the package on PYTHONPATH that the test's interpreters cannot write to."""
    copy = tmp_path / "site"
    shutil.copytree(Path(mooncake_columnar.__file__).parent, copy / "mooncake_columnar",
                    ignore=shutil.ignore_patterns("__pycache__"))
    _chmod_tree(copy, writable=False)
    yield copy
    _chmod_tree(copy, writable=True)  # so that tmp_path can be removed


def _run(copy: Path, home: Path, script: str = _SCRIPT, **env_vars: str) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update({"PYTHONPATH": str(copy), "XDG_CACHE_HOME": str(home / "cache"), "HOME": str(home), **env_vars})
    # cwd: `python -c` puts it first on sys.path, and the checkout's own package must not be found
    done = subprocess.run([*_read_only_prefix(), sys.executable, "-c", script], env=env, cwd=home,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_read_only_package_caches_kernels_in_the_user_cache_directory(read_only_package, tmp_path):
    first = _run(read_only_package, tmp_path)
    index = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.nbi")}
    second = _run(read_only_package, tmp_path)

    assert first["package"] == str(read_only_package / "mooncake_columnar") and not first["package_writable"]
    assert first["cache_dir"] == str(tmp_path / "cache" / "mooncake-columnar" / "numba")
    assert index and not list(read_only_package.rglob("*.nbi"))
    # the first process compiles; what it loads is only what its compile helper cached for it
    assert first["misses"] > 0 and (first["hits"] == 0 or first["helper"] == "done"), first
    # the second process loads every kernel it runs from the cache: nothing compiled, no index rewritten
    assert second["hits"] > 0 and second["misses"] == 0, second
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").rglob("*.nbi")} == index


def test_explicit_numba_cache_dir_wins(read_only_package, tmp_path):
    explicit = tmp_path / "explicit"
    import_only = ("import json, os, numba, mooncake_columnar as mc\n"
                   "print(json.dumps([os.path.dirname(mc.__file__), numba.config.CACHE_DIR]))")
    ran = _run(read_only_package, tmp_path, import_only, NUMBA_CACHE_DIR=str(explicit))
    assert ran == [str(read_only_package / "mooncake_columnar"), str(explicit)]
    assert not (tmp_path / "cache").exists()


def test_without_a_writable_cache_directory_the_import_still_works(read_only_package, tmp_path):
    """Numba alone raises "no locator available" at import here (e.g. an arbitrary uid with HOME=/)."""
    import_only = ("import json, os, numba, mooncake_columnar as mc\n"
                   "print(json.dumps([os.path.dirname(mc.__file__), numba.config.CACHE_DIR]))")
    ran = _run(read_only_package, tmp_path, import_only, XDG_CACHE_HOME=str(read_only_package))
    assert ran[0] == str(read_only_package / "mooncake_columnar")
    assert Path(ran[1]).name.startswith("mooncake-columnar-numba-") and not Path(ran[1]).exists()


def test_a_cache_index_naming_a_type_that_no_longer_exists_recompiles_instead_of_raising(tmp_path, monkeypatch):
    """A cache left by an older version can name a type the package no longer has (the single
    read's StructRef type, since removed): the kernel's first call compiles, not raises."""
    import importlib.util
    import pickle

    source = tmp_path / "kernel_module.py"
    source.write_text("from numba import njit\n\n\n@njit(cache=True)\ndef add_one(x):\n    return x + 1\n")

    def fresh_kernel(name: str):
        spec = importlib.util.spec_from_file_location(name, source)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.add_one

    assert fresh_kernel("kernel_module_first")(1) == 2  # writes the cache index
    (index,) = (tmp_path / "__pycache__").glob("*.nbi")
    with index.open("rb") as f:
        version = pickle.load(f)
        stamp, overloads = pickle.loads(f.read())
    gone = type("RemovedType", (), {"__module__": __name__})
    monkeypatch.setitem(globals(), "RemovedType", gone)  # picklable by reference only while it exists
    overloads[("an older signature", gone)] = "kernel_module.add_one-5.py311.9.nbc"
    index.write_bytes(pickle.dumps(version) + pickle.dumps((stamp, overloads)))
    monkeypatch.delitem(globals(), "RemovedType")

    kernel = fresh_kernel("kernel_module_second")
    assert kernel(41) == 42
    assert kernel(1.5) == 2.5  # another signature: the index is written afresh, without the stale entry
    with index.open("rb") as f:
        pickle.load(f)
        assert ("an older signature",) not in {key[:1] for key in pickle.loads(f.read())[1]}
