"""`mooncake-columnar bench startup`: what a fresh process pays before its first put and get.

Each figure is one fresh interpreter (``subprocess``) that imports the package, builds a
``MasterService``, mounts one segment and runs ``put_start``, ``put_end`` and
``get_replica_list`` once: with an empty Numba cache (every kernel those calls take compiles),
with the cache that process left, and with a cache ``mooncake-columnar warmup`` filled. Same-run
baselines: the import alone, and the floor of any compile (the import plus one trivial kernel:
Numba's one-time start of its compiler). Each process's own CPU seconds are beside its wall
seconds: on a shared host they move less than the wall time does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Callable

import mooncake_columnar

from .progress import bar

# Runs in the child: times from before the package's import; the compile events name each
# kernel that compiled (outermost only: a kernel's callees compile inside it), with its wall and
# its CPU seconds (this process's: on a shared host the wall seconds count the waits for a core).
_FIRST_CALL = textwrap.dedent("""
    import json, resource, time
    t0 = time.perf_counter()
    from numba.core import event
    compiled, compiled_cpu, specialisations = {}, {}, {}
    class Kernels(event.Listener):
        depth = 0
        def on_start(self, e):
            self.depth += 1
            if self.depth == 1:
                self.t, self.cpu = time.perf_counter(), time.process_time()
        def on_end(self, e):
            self.depth -= 1
            fn = e.data["dispatcher"].py_func
            name = f"{fn.__module__}.{fn.__qualname__}"  # (None: an overload made by exec)
            specialisations[name] = specialisations.get(name, 0) + 1
            if self.depth == 0:
                compiled[name] = compiled.get(name, 0.0) + time.perf_counter() - self.t
                compiled_cpu[name] = compiled_cpu.get(name, 0.0) + time.process_time() - self.cpu
    event.register("numba:compile", Kernels())
    import mooncake_columnar as mc
    t1 = time.perf_counter()
    at_import = len(specialisations)
    m = mc.MasterService(mc.MasterConfig())
    m.mount_segment("seg", endpoint="10.0.0.1:17777", client_id="client-0", base=1 << 40, size=1 << 26)
    m.put_start("key", 4096, client_id="client-0")
    after_put = set(compiled)
    m.put_end("key", client_id="client-0")
    assert m.get_replica_list("key")
    t2 = time.perf_counter()
    use = resource.getrusage(resource.RUSAGE_SELF)
    from mooncake_columnar.compile_helper import last_run as helper
    print(json.dumps({"import": t1 - t0, "first_call": t2 - t0, "cpu": use.ru_utime + use.ru_stime,
                      "kernels": compiled, "kernels_cpu": compiled_cpu, "specialisations": specialisations,
                      "at_import": at_import, "after_put": sorted(set(compiled) - after_put),
                      "helper": [helper.outcome, helper.waited_s, helper.helper_s, helper.helper_cpu_s]}))
""")

_FLOOR = textwrap.dedent("""
    import json, resource, time
    t0 = time.perf_counter()
    import mooncake_columnar
    import numpy as np
    from numba import njit
    t1 = time.perf_counter()
    njit(lambda a, i: a[i] + 1)(np.zeros(2, np.int64), 1)
    t2 = time.perf_counter()
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"import": t1 - t0, "first_call": t2 - t0, "cpu": use.ru_utime + use.ru_stime}))
""")

_WARMUP = textwrap.dedent("""
    import json, resource, time
    t0 = time.perf_counter()
    from mooncake_columnar.warmup import warm_up_kernels
    warm_up_kernels()
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"first_call": time.perf_counter() - t0, "cpu": use.ru_utime + use.ru_stime}))
""")


def run_fresh(script: str, cache_dir: Path) -> dict:
    """``script`` in a fresh interpreter on this package with ``NUMBA_CACHE_DIR=cache_dir``: its
    printed JSON, plus ``process`` (the process's wall seconds, interpreter start included)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    root = str(Path(mooncake_columnar.__file__).resolve().parents[1])
    env.update(NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    # cwd: `python -c` puts it first on sys.path; only this package's copy must be found
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=cache_dir.parent, capture_output=True,
                          text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if done.returncode:
        raise RuntimeError(f"startup probe failed:\n{done.stderr[-4000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process": wall}


def first_call_figures(tmp: Path, advance: Callable[[int], None] = lambda n: None) -> dict:
    """The floor, an empty-cache and a filled-cache first call, each in a fresh process (Numba
    caches under ``tmp``); ``advance(1)`` after each."""
    def fresh(script: str, cache: str) -> dict:
        ran = run_fresh(script, tmp / cache)
        advance(1)
        return ran
    floor = fresh(_FLOOR, "floor")
    empty = fresh(_FIRST_CALL, "cache")
    filled = fresh(_FIRST_CALL, "cache")  # the cache the previous process left
    out = {"import_seconds": empty["import"], "floor_seconds_import_and_one_kernel": floor["first_call"]}
    for cache, ran in (("empty_cache", empty), ("filled_cache", filled)):
        out |= {f"first_call_seconds_{cache}": ran["first_call"], f"first_call_cpu_seconds_{cache}": ran["cpu"],
                f"first_call_process_seconds_{cache}": ran["process"]}
    return out | {
        "first_call_ratio_empty_to_floor": empty["first_call"] / floor["first_call"],
        "first_call_ratio_filled_to_import": filled["first_call"] / empty["import"],
        "kernels_compiled_at_import": empty["at_import"],
        "kernels_compiled_empty_cache": len(empty["kernels"]),
        "most_specialisations_of_one_kernel": max(n for name, n in empty["specialisations"].items()
                                                  if name.startswith("mooncake_columnar.")),
        "kernels_compiled_filled_cache": len(filled["kernels"]),
        "kernels_compiled_after_the_put_empty_cache": empty["after_put"],
        "compile_helper_outcome_empty_cache": empty["helper"][0],
        "compile_helper_seconds_empty_cache": empty["helper"][2],
        "compile_helper_cpu_seconds_empty_cache": empty["helper"][3],
        "compile_helper_waited_seconds_empty_cache": empty["helper"][1],
        "compile_helper_outcome_filled_cache": filled["helper"][0],
        "compile_seconds_by_kernel_empty_cache": _by_kernel(empty["kernels"]),
        "compile_cpu_seconds_by_kernel_empty_cache": _by_kernel(empty["kernels_cpu"]),
    }


def _by_kernel(seconds: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def bench_startup(objects: int = 1, *, segments: int = 1, replicas: int = 1, show_progress: bool = False,
                  warmup: bool = True) -> dict:
    """The first put and get of fresh processes (one object: ``objects``, ``segments`` and
    ``replicas`` are the CLI's common arguments and do not apply). ``warmup``: also time
    ``mooncake-columnar warmup`` on an empty cache and a first call after it (a minute or more)."""
    with tempfile.TemporaryDirectory(prefix="mooncake-startup-") as tmp, \
            bar(5 if warmup else 3, "fresh processes", show_progress) as advance:
        out = {"area": "startup", "objects": 1, **first_call_figures(Path(tmp), advance)}
        if warmup:
            warm = run_fresh(_WARMUP, Path(tmp) / "warm")
            advance(1)
            after = run_fresh(_FIRST_CALL, Path(tmp) / "warm")
            advance(1)
            out.update({
                "warmup_seconds": warm["first_call"],
                "warmup_cpu_seconds": warm["cpu"],
                "first_call_seconds_after_warmup": after["first_call"],
                "kernels_compiled_after_warmup": len(after["kernels"]),
            })
        return out
