"""`mooncake-columnar bench server`: ``mooncake-columnar serve`` against the wheel's own
``mooncake_master`` (the baseline), both on loopback with the same flags, started one after the
other so they never share the host's cores.

Against each master:

* the real upstream client (``mooncake.store.MooncakeDistributedStore``) runs ``put_batch`` of 256
  keys, ``get_batch`` of 256, ``batch_is_exist`` of 1,000, ``is_exist`` and ``get`` (32-byte keys,
  64-byte values), each for :data:`WORKLOAD_SECONDS`, from 1 and from 8 client processes at once
  (each with its own keys; throughputs summed), plus the p50/p99 latency of the single-key calls
  from one client. Each client process times its own loop and prints one JSON line, so the figure
  is the client and the master, not this harness.
* a wire-level fill (``WireClient``: ``MountSegment`` per segment, then rounds of
  ``BatchPutStart`` + ``BatchPutEnd`` of 1,000 keys, their request bodies encoded before the clock
  starts) stores ``objects`` objects in a fresh master: keys/s, and the master's RSS growth per
  stored object (VmRSS after the fill minus before it).

Ratios are serve / upstream: above 1 is better for throughput, worse for latency and RSS.
The area is meant for about 200,000 objects (``--objects 200000``).

The client processes load this file by path in a bare interpreter: importing the package costs a
second and a half of CPU per process, eight at once on a small host, and the worker needs none of
it. So the package's own imports sit inside the functions that use them.
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from ..testing.upstream_wheel import MasterKind

WORKLOADS: tuple[str, ...] = ("put_batch", "get_batch", "batch_is_exist", "is_exist", "get")
BATCH = {"put_batch": 256, "get_batch": 256, "batch_is_exist": 1000, "is_exist": 1, "get": 1}
UNIT = {"put_batch": "keys_per_s", "get_batch": "keys_per_s", "batch_is_exist": "keys_per_s",
        "is_exist": "calls_per_s", "get": "calls_per_s"}
SINGLE_KEY = ("is_exist", "get")
KEY_BYTES, VALUE_BYTES = 32, 64
WORKLOAD_SECONDS = 2.0
PHASE_GAP_S = 0.3  # between workload windows: a call that overran the last window ends before the next one
MAX_PUT_KEYS = 200_000  # per client process: keeps its puts well inside the segments, under any watermark
CLIENT_SEGMENT_BYTES = 128 << 20
CLIENT_BUFFER_BYTES = 16 << 20
FILL_ROUND = 1000
FILL_PING_S = 1.0  # the fill's client pings this often, well inside upstream's client_ttl (10 s)
MASTER_FLAGS: tuple[str, ...] = ()  # MasterProcess's defaults, identical for both kinds
READY_TIMEOUT_S = 120.0


# ---- the client process -------------------------------------------------------------------------
def _wait_until(t: float) -> None:
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


def _timed_loop(call: Callable[[int], int], window_start: float, seconds: float, max_calls: int,
                latencies: list[float] | None) -> tuple[int, float, int]:
    """(calls, seconds, errors): calls started inside the window, the time until the last one ended.

    ``time.monotonic`` is CLOCK_MONOTONIC, one clock for every process on the host, so each process
    of a run starts the window together from the start time the parent sent."""
    _wait_until(window_start)
    calls = errors = 0
    began = now = time.monotonic()
    stop = window_start + seconds
    while now < stop and calls < max_calls:
        errors += call(calls)
        calls += 1
        after = time.monotonic()
        if latencies is not None:
            latencies.append(after - now)
        now = after
    return calls, now - began, errors


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return float(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))])


def _run_workloads(store: Any, keys: list[str], start: float, seconds: float, gap: float,
                   latency: bool) -> dict[str, Any]:
    value = bytes(range(VALUE_BYTES))
    out: dict[str, Any] = {}

    def window(k: int) -> float:
        return start + k * (seconds + gap)

    put_n = BATCH["put_batch"]
    values = [value] * put_n

    def put_batch(i: int) -> int:
        return put_n if store.put_batch(keys[i * put_n:(i + 1) * put_n], values) != 0 else 0

    calls, spent, errors = _timed_loop(put_batch, window(0), seconds, len(keys) // put_n, None)
    out["put_batch"] = {"keys": calls * put_n, "seconds": spent, "errors": errors}
    stored = keys[:max(calls * put_n, 1)]

    def windows_of(n: int) -> list[list[str]]:
        return [stored[j:j + n] for j in range(0, max(len(stored) - n + 1, 1), n)]

    get_batches = windows_of(BATCH["get_batch"])

    def get_batch(i: int) -> int:
        return sum(len(v) != VALUE_BYTES for v in store.get_batch(get_batches[i % len(get_batches)]))

    exist_batches = windows_of(BATCH["batch_is_exist"])

    def batch_is_exist(i: int) -> int:
        batch = exist_batches[i % len(exist_batches)]
        return len(batch) - list(store.batch_is_exist(batch)).count(1)

    def is_exist(i: int) -> int:
        return int(store.is_exist(stored[i % len(stored)]) != 1)

    def get(i: int) -> int:
        return int(len(store.get(stored[i % len(stored)])) != VALUE_BYTES)

    loops: dict[str, Callable[[int], int]] = {"get_batch": get_batch, "batch_is_exist": batch_is_exist,
                                              "is_exist": is_exist, "get": get}
    for k, (name, call) in enumerate(loops.items(), start=1):
        lat: list[float] | None = [] if latency and name in SINGLE_KEY else None
        calls, spent, errors = _timed_loop(call, window(k), seconds, 1 << 62, lat)
        out[name] = {"keys": calls * BATCH[name], "seconds": spent, "errors": errors}
        if lat is not None:
            lat.sort()
            out[name].update(p50_seconds=_percentile(lat, 0.50), p99_seconds=_percentile(lat, 0.99))
    return out


def worker_main(argv: Sequence[str]) -> int:
    """One client process: setup, ``{"ready": ...}``, wait for ``{"start": t}`` on stdin, run every
    workload in its window, print the figures as one JSON line, close the store."""
    p = argparse.ArgumentParser()
    p.add_argument("--master", required=True)
    p.add_argument("--metadata", required=True)
    p.add_argument("--prefix", required=True)
    p.add_argument("--seconds", type=float, default=WORKLOAD_SECONDS)
    p.add_argument("--gap", type=float, default=PHASE_GAP_S)
    p.add_argument("--max-put-keys", type=int, default=MAX_PUT_KEYS)
    p.add_argument("--latency", action="store_true")
    args = p.parse_args(argv)
    # The figures own the original stdout; whatever the native client prints goes to stderr.
    proto: IO[str] = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def answer(obj: dict[str, Any]) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    from mooncake.store import MooncakeDistributedStore
    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", args.metadata, CLIENT_SEGMENT_BYTES, CLIENT_BUFFER_BYTES, "tcp", "", args.master)
    width = KEY_BYTES - len(args.prefix)
    keys = [f"{args.prefix}{i:0{width}d}" for i in range(args.max_put_keys)]
    answer({"ready": rc == 0, "setup_rc": rc})
    if rc != 0:
        os._exit(1)
    start = float(json.loads(sys.stdin.readline())["start"])
    answer(_run_workloads(store, keys, start, args.seconds, args.gap, args.latency))
    store.close()  # unmounts now, so the next run's puts are never placed in this process's segment
    os._exit(0)  # the native client's destructors are slow and add nothing here


# ---- the parent: client runs --------------------------------------------------------------------
class _Worker:
    def __init__(self, master_address: str, metadata_url: str, prefix: str, latency: bool, log_dir: Path) -> None:
        # -P: the script's directory (tools/) stays off sys.path, its module names shadow nothing.
        cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--master", master_address,
               "--metadata", metadata_url, "--prefix", prefix, "--seconds", str(WORKLOAD_SECONDS),
               "--gap", str(PHASE_GAP_S), *(["--latency"] if latency else [])]
        self.prefix = prefix
        self.stderr_path = log_dir / f"client-{prefix.rstrip('-')}.stderr"
        with open(self.stderr_path, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                                         bufsize=1, env={**os.environ, "GLOG_logtostderr": "1"},
                                         start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip():
                self.lines.put(line)
        self.lines.put(None)

    def receive(self, timeout_s: float, what: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"client {self.prefix}: no {what} within {timeout_s:.0f} s\n{self.stderr()}") from None
        if line is None:
            raise RuntimeError(f"client {self.prefix} exited before its {what}\n{self.stderr()}")
        return dict(json.loads(line))

    def send(self, obj: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj) + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def finish(self, timeout_s: float = 30.0) -> None:
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_clients(master_address: str, metadata_url: str, clients: int, log_dir: Path) -> dict[str, Any]:
    """Every workload from ``clients`` processes at once: summed keys (or calls) per second per
    workload, the errors the clients saw, and with one client the single-key latencies."""
    workers = [_Worker(master_address, metadata_url, f"c{clients}w{i}-", clients == 1, log_dir)
               for i in range(clients)]
    try:
        for w in workers:
            ready = w.receive(READY_TIMEOUT_S, "setup")
            if not ready.get("ready"):
                raise RuntimeError(f"client {w.prefix}: setup returned {ready.get('setup_rc')}\n{w.stderr()}")
        start = time.monotonic() + 0.2
        for w in workers:
            w.send({"start": start})
        run_s = len(WORKLOADS) * (WORKLOAD_SECONDS + PHASE_GAP_S) + 60.0
        results = [w.receive(run_s, "figures") for w in workers]
        for w in workers:
            w.finish()
    finally:
        for w in workers:
            w.kill()
    out: dict[str, Any] = {"errors": 0}
    for name in WORKLOADS:
        out[name] = sum(r[name]["keys"] / r[name]["seconds"] for r in results if r[name]["seconds"] > 0)
        out["errors"] += sum(int(r[name]["errors"]) for r in results)
        if clients == 1 and name in SINGLE_KEY:
            out[f"{name}_p50_seconds"] = results[0][name]["p50_seconds"]
            out[f"{name}_p99_seconds"] = results[0][name]["p99_seconds"]
    return out


# ---- the parent: wire-level fill ----------------------------------------------------------------
def vm_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def _fill_keys(first: int, n: int) -> list[str]:
    return [f"fill-{i:0{KEY_BYTES - 5}d}" for i in range(first, first + n)]


def _key_column(keys: list[str]) -> Any:
    import numpy as np

    from ..server.struct_pack import KeyColumn
    raw = [k.encode() for k in keys]
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return KeyColumn(offsets, np.frombuffer(b"".join(raw), np.uint8))


def _request_body(name: str, args: Any) -> bytes:
    from ..server.rpc_types import RPCS
    request = RPCS[name].request
    assert request is not None, f"{name} takes no arguments"
    return bytes(request.encode(args))


def _round_bodies(client: tuple[int, int], keys: list[str], config: tuple[Any, ...]) -> tuple[bytes, bytes]:
    import numpy as np

    from ..server.struct_pack import MetaColumn
    col = _key_column(keys)
    start = _request_body("BatchPutStart", (client, col, np.full(len(keys), VALUE_BYTES, np.uint64), config, "default"))
    metas = MetaColumn(col, np.zeros(len(keys), np.bool_), np.zeros(len(keys), np.uint64))
    end = _request_body("BatchPutEnd", (client, metas, 4, "default"))  # 4: the memory replica type
    return start, end


def wire_fill(host: str, port: int, pid: int, objects: int, *, segments: int = 1, replicas: int = 1,
              advance: Callable[[int], None] = lambda n: None) -> dict[str, float]:
    """Fill a fresh master with ``objects`` objects of :data:`VALUE_BYTES` over the wire: keys/s and
    the master's RSS growth per object. One warm-up round (its own keys) runs before the first RSS
    reading, so lazily built structures and compiled kernels are not charged to the objects."""
    from ..server.rpc_types import RPCS
    from ..testing.wire_client import WireClient
    client = (0xB0E, 0xF111)
    # The master never touches segment memory: base and size are numbers. Each segment could hold
    # every replica at twice the value size, so no allocator rounding or watermark gets near it.
    size = 1 << max(20, (objects * 2 * VALUE_BYTES * replicas - 1).bit_length())
    config: tuple[Any, ...] = (replicas, 0, 0, 0, None, False, [], "", [], False, 0, "", None)  # upstream's defaults
    start_id, end_id = RPCS["BatchPutStart"].function_id, RPCS["BatchPutEnd"].function_id
    ping_id, ping_body = RPCS["Ping"].function_id, _request_body("Ping", client)
    with WireClient(host, port, timeout_s=120.0) as w:
        w.call("ServiceReady")
        w.call("Ping", client)
        for i in range(segments):
            name = f"127.0.0.1:{20000 + i}"
            w.call("MountSegment", (((0x5E6, i + 1), name, (1 << 40) + i * size, size, name, "tcp", ""), client))
        warm = _fill_keys(objects, FILL_ROUND)
        body_start, body_end = _round_bodies(client, warm, config)
        w.call_raw(start_id, body_start)
        errc, out = w.call_raw(end_id, body_end)
        decoded = RPCS["BatchPutEnd"].response.decode(memoryview(out)) if errc == 0 else None
        if decoded != [None] * FILL_ROUND:
            raise RuntimeError(f"warm-up BatchPutEnd answered errc={errc}: {str(decoded)[:500]}")
        ok_end = out  # every later round of FILL_ROUND keys must answer these same bytes
        rounds = [_round_bodies(client, _fill_keys(first, min(FILL_ROUND, objects - first)), config)
                  for first in range(0, objects, FILL_ROUND)]
        rss_before = vm_rss_bytes(pid)
        next_ping = time.monotonic() + FILL_PING_S
        t0 = time.perf_counter()
        for k, (body_start, body_end) in enumerate(rounds):
            errc_s, _ = w.call_raw(start_id, body_start)
            errc, out = w.call_raw(end_id, body_end)
            if errc_s or errc or (out != ok_end and k * FILL_ROUND + FILL_ROUND <= objects):
                decoded = RPCS["BatchPutEnd"].response.decode(memoryview(out)) if errc == 0 else None
                raise RuntimeError(f"fill round {k}: errc {errc_s}/{errc}: {str(decoded)[:500]}")
            if time.monotonic() >= next_ping:
                w.call_raw(ping_id, ping_body)
                next_ping = time.monotonic() + FILL_PING_S
            advance(FILL_ROUND)
        fill_s = time.perf_counter() - t0
        rss_after = vm_rss_bytes(pid)
        sample = _fill_keys(0, objects)[:: max(1, objects // 1000)]
        found = w.call("BatchExistKey", (_key_column(sample), "default"))
        if found != [True] * len(sample):
            raise RuntimeError(f"after the fill {found.count(True)} of {len(sample)} sampled keys exist")
    return {"fill_keys_per_s": objects / fill_s, "fill_seconds": fill_s,
            "rss_bytes_per_object": (rss_after - rss_before) / objects,
            "rss_before_fill_bytes": float(rss_before), "rss_after_fill_bytes": float(rss_after)}


# ---- the bench ----------------------------------------------------------------------------------
def _one_master(kind: MasterKind, objects: int, segments: int, replicas: int, clients: Sequence[int], log_dir: Path,
                step: Callable[[str], None]) -> dict[str, float]:
    from ..testing.upstream_wheel import MasterProcess
    out: dict[str, float] = {}
    master = MasterProcess(kind, MASTER_FLAGS, log_dir=log_dir / kind)
    t0 = time.perf_counter()
    master.start()
    out["start_seconds"] = time.perf_counter() - t0
    try:
        for c in clients:
            step(f"{kind}: {c} client process(es)")
            got = run_clients(master.rpc_address, master.metadata_url, c, log_dir / kind)
            out["client_errors"] = out.get("client_errors", 0) + got.pop("errors")
            out.update({f"{name}_{c}c": v for name, v in got.items()})
    finally:
        master.stop()
    # A fresh master for the fill: the client runs' objects and segments are gone, and a real
    # client's put is never placed in a segment that has no memory behind it.
    step(f"{kind}: wire fill of {objects:,} objects")
    master = MasterProcess(kind, MASTER_FLAGS, log_dir=log_dir / kind)
    master.start()
    try:
        assert master.pid is not None
        out.update(wire_fill("127.0.0.1", master.rpc_port, master.pid, objects, segments=segments,
                             replicas=replicas))
    finally:
        master.stop()
    return out


def bench_server(objects: int, *, segments: int = 1, replicas: int = 1, show_progress: bool = False,
                 clients: Sequence[int] = (1, 8)) -> dict:
    """serve vs the wheel's ``mooncake_master``: real-client workloads from each count of ``clients``
    processes, and a wire-level fill of ``objects`` objects into ``segments`` segments with
    ``replicas`` replicas each (the real clients put one replica into their own segments)."""
    from ..testing.upstream_wheel import MASTER_KINDS, skip_reason
    from .progress import steps
    reason = skip_reason()
    if reason is not None:
        raise RuntimeError(f"bench server needs the real upstream client and master: {reason}")
    labels = [f"{kind}: {label}" for kind in MASTER_KINDS
              for label in [*(f"{c} client process(es)" for c in clients), f"wire fill of {objects:,} objects"]]
    t0 = time.perf_counter()
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp, steps(labels, show_progress) as step:
        for kind in MASTER_KINDS:
            figures[kind] = _one_master(kind, objects, segments, replicas, clients, Path(tmp), step)
    serve, upstream = figures["serve"], figures["upstream"]
    out: dict[str, Any] = {"area": "server", "objects": objects, "segments": segments, "replicas": replicas,
                           "clients": list(clients), "workload_seconds": WORKLOAD_SECONDS}

    def pair(figure: str, name: str, ratio_name: str) -> None:
        out[f"serve_{name}"] = serve[figure]
        out[f"baseline_upstream_{name}"] = upstream[figure]
        out[ratio_name] = serve[figure] / upstream[figure] if upstream[figure] else float("nan")

    for c in clients:
        for w in WORKLOADS:
            pair(f"{w}_{c}c", f"{w}_{c}c_{UNIT[w]}", f"{w}_{c}c_ratio_to_baseline")
    if 1 in clients:
        for w in SINGLE_KEY:
            for q in ("p50", "p99"):
                pair(f"{w}_{q}_seconds_1c", f"{w}_1c_{q}_seconds", f"{w}_1c_{q}_ratio_to_baseline")
    pair("fill_keys_per_s", "fill_keys_per_s", "fill_ratio_to_baseline")
    pair("rss_bytes_per_object", "rss_bytes_per_object", "rss_per_object_ratio_to_baseline")
    pair("start_seconds", "start_seconds", "start_ratio_to_baseline")
    for kind, prefix in (("serve", "serve_"), ("upstream", "baseline_upstream_")):
        out[f"{prefix}client_errors"] = int(figures[kind].get("client_errors", 0))
        out[f"{prefix}rss_before_fill_bytes"] = int(figures[kind]["rss_before_fill_bytes"])
    out["bench_seconds"] = time.perf_counter() - t0
    return out


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
