"""`mooncake-columnar bench endtoend`: one master's life at scale, each step beside a same-run
baseline, with the peak RSS of every step and process.

In this process: build N objects, evict 5% (every lease expired, as ``bench evict``), write a
first and a periodic complete snapshot (``SnapshotManager``; from 1M rows a forked writer, whose
peak RSS is its own), then free the master. In fresh processes (``python -m`` this module): the
restore (``restore_master``, engine self-check included), and a standby's bootstrap from the same
snapshot with every segment unreadable, then one client's remount (locate, allocator rebuild,
one recovery lease). Each fresh process restores the master, so they run one after the other
and after this one freed its own.

Peak RSS per step: the kernel's high-water mark (VmHWM), reset before each step
(``/proc/self/clear_refs``; where that is refused, the process's peak so far). Cold memory as in
``bench snapshot``: the periodic write and the restores run after a pause (freed memory goes back
to the host; see ``memory.py``), and the touch floor is measured the same way.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from typing import Callable, TypeVar

import numpy as np

from ..clock import NS_PER_S, ManualClocks, MonotonicClocks
from ..snapshots.manager import SnapshotManager, restore_master
from ..snapshots.repository import SnapshotRepository
from .bench_snapshot import settle, touch_and_free, warm_up
from .progress import steps
from .synthetic import build_master, peak_rss_bytes, segment_request

T = TypeVar("T")
EVICT_RATIO = 0.05
STEPS = ["build", "evict", "snapshot", "periodic snapshot", "restore (fresh process)",
         "bootstrap + remount (fresh process)"]


_peak_before_reset = [0]  # the process's peak over the intervals already reset


def reset_peak_rss() -> bool:
    """Restart the kernel's RSS high-water mark of this process (Linux >= 4.0)."""
    _peak_before_reset[0] = process_peak_rss()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_since_reset() -> int:
    """VmHWM in bytes: the peak RSS since :func:`reset_peak_rss` (or since the process began)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return peak_rss_bytes()


def process_peak_rss() -> int:
    """The peak RSS of this process so far, across resets (getrusage's figure drops with them)."""
    return max(_peak_before_reset[0], peak_rss_since_reset())


def _step(out: dict, name: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` as step ``name``: its seconds and peak RSS into ``out``."""
    reset_peak_rss()
    t0 = time.perf_counter()
    value = fn()
    out[f"{name}_seconds"] = time.perf_counter() - t0
    out[f"{name}_peak_rss_bytes"] = peak_rss_since_reset()
    return value


def _copy_seconds(a: np.ndarray) -> float:
    t0 = time.perf_counter()
    np.array(a)
    return time.perf_counter() - t0


def bench_endtoend(objects: int, *, segments: int = 4, replicas: int = 1, show_progress: bool = False) -> dict:
    """Build, evict, snapshot twice here; restore, bootstrap and remount in fresh processes."""
    warm_up()
    out: dict = {"area": "endtoend", "objects": objects, "segments": segments, "replicas": replicas}
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-endtoend-") as tmp, \
            steps(STEPS, show_progress) as step:
        step("build")
        clocks = ManualClocks()
        m = _step(out, "build", partial(build_master, objects, segments=segments, replicas=replicas, clocks=clocks))
        o = m.objects
        hw = o.high_water
        lease = o.lease_deadline_ns[:hw]
        out["baseline_lease_copy_seconds"] = min(_copy_seconds(lease) for _ in range(3))
        lease[:] = clocks.steady_ns() - np.random.default_rng(11).integers(1, 10**12, hw)  # all expired

        step("evict")
        report = _step(out, "evict", partial(m.evict, target=EVICT_RATIO))
        out["evicted_objects"] = report.evicted_objects
        out["evict_ratio_to_baseline"] = out["evict_seconds"] / out["baseline_lease_copy_seconds"]
        lease[:] = clocks.steady_ns() + 3600 * NS_PER_S  # the rest stay leased: a restore keeps them
        clocks.advance(ms=1)

        repo = SnapshotRepository(tmp)
        manager = SnapshotManager(m, repo)
        for name in ("snapshot", "periodic_snapshot"):
            step(name.replace("_", " "))
            if name == "periodic_snapshot":
                settle(hw * 100)  # minutes after the last one: its freed memory is cold again
            _step(out, name, manager.snapshot_now)
            out[f"{name}_lock_held_seconds"] = m.metrics.get("snapshot_lock_held_seconds")
            out[f"{name}_writer_peak_rss_bytes"] = m.metrics.get("snapshot_writer_peak_rss_bytes")
            out[f"{name}_writer_private_bytes"] = m.metrics.get("snapshot_writer_private_bytes")
            clocks.advance(ms=1)
        manager.stop()
        out["snapshot_bytes"] = repo.stored_bytes(repo.latest() or "")
        out["snapshot_ratio_to_baseline"] = out["periodic_snapshot_seconds"] / out["baseline_lease_copy_seconds"]
        out["master_process_peak_rss_bytes"] = process_peak_rss()
        engine_bytes = sum(m.metadata_bytes().values())
        out["engine_bytes"] = engine_bytes
        system_ns = clocks.system_ns()
        del m, o, lease, manager
        gc.collect()

        settle(engine_bytes)
        out["baseline_fresh_memory_seconds"] = touch_and_free(engine_bytes)  # the cold-touch floor
        for mode, name in (("restore", "restore"), ("remount", "bootstrap_remount")):
            step({"restore": STEPS[4], "remount": STEPS[5]}[mode])
            settle(engine_bytes)
            out.update({f"{name}_{k}": v for k, v in _fresh_process(mode, tmp, system_ns).items()})
        if "restore_seconds" in out:
            out["restore_ratio_to_fresh_memory"] = out["restore_seconds"] / out["baseline_fresh_memory_seconds"]
    return out


def _fresh_process(mode: str, root: str, system_ns: int) -> dict:
    """Run :func:`_in_fresh_process` in a new interpreter: its JSON result, or ``error`` (how it
    ended and its last stderr) and ``exit_status`` when it failed, e.g. killed for memory at a
    size this machine cannot hold: the steps before it keep their figures."""
    done = subprocess.run([sys.executable, "-m", __name__, mode, root, str(system_ns)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if done.returncode:
        return {"error": done.stderr[-2000:] or "no output", "exit_status": done.returncode}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _in_fresh_process(mode: str, root: str, system_ns: int) -> dict:
    """``restore``: restore_master, timed. ``remount``: a standby's bootstrap from the snapshot
    (segments unreadable) and the first client's remount. Kernels are loaded first (a serving
    process has them: MasterService.start warms them up), then the peak RSS is reset."""
    from ..warmup import warm_up_kernels
    warm_up_kernels()
    repo = SnapshotRepository(root)
    # a restart 1 s after the snapshot, in an unrelated steady epoch
    clocks = ManualClocks(steady_ns=3 * NS_PER_S, system_ns=system_ns + NS_PER_S)
    out: dict = {}
    if mode == "restore":
        m, stats = _step(out, "restore", lambda: restore_master(repo, clocks=clocks))
        out["objects"] = m.object_count()
        out["engine_bytes"] = sum(m.metadata_bytes().values())
        out["process_peak_rss_bytes"] = process_peak_rss()
        return {k.removeprefix("restore_"): v for k, v in out.items()}
    from ..master import MasterService
    from ..snapshots.complete import restore_latest_with

    def bootstrap() -> MasterService:  # restore_master's decode and checks, segments left unreadable
        return restore_latest_with(repo, clocks, lambda state: MasterService.from_state(
            state, clocks=MonotonicClocks(), segments_readable=False, validated=True),
            build_checks_unique_keys=True)[0]
    m = _step(out, "bootstrap", bootstrap)
    lease = m.objects.lease_deadline_ns[:m.objects.high_water]
    out["baseline_lease_copy_seconds"] = min(_copy_seconds(lease) for _ in range(3))
    m.liveness.touch("client-0", 2**62)  # the bench's client never times out
    report = _step(out, "remount", lambda: m.remount_segments("client-0", [segment_request(m, 0)]))
    out.update(matched_objects=report.matched_objects,
               refresh_seconds=report.locate_seconds + report.assignment_seconds,
               allocator_rebuild_seconds=report.rebuild_seconds, visible_ttl_ms=report.visible_ttl_ms,
               process_peak_rss_bytes=process_peak_rss())
    out["refresh_ratio_to_baseline"] = out["refresh_seconds"] / out["baseline_lease_copy_seconds"]
    return out


if __name__ == "__main__":
    print(json.dumps(_in_fresh_process(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
