"""Several masters of one kind in HA mode against one etcd, plus a standalone metadata server.

``HaCluster("serve", 2, etcd.endpoint, "c1", log_dir, etcd=etcd).start()`` starts the masters
(``mooncake-columnar serve`` or the wheel's ``mooncake_master``) with ``--enable_ha=true
--enable_oplog=true`` on fixed loopback ports and the wheel's ``http_metadata_server.py``. The
leader is whoever the etcd key ``mooncake-store/<cluster>/master_view`` names; real clients find
it with :meth:`HaCluster.master_address` (``etcd://HOST:PORT``) and :meth:`HaCluster.client_env`.

``MasterProcess`` (upstream_wheel.py) cannot run these: it waits for the RPC port, which a standby
keeps closed, and picks fresh ports at every start, while a restarted master must come back with
the same flags. :class:`HaMaster` waits for the metrics port instead and keeps its ports.
"""
from __future__ import annotations

import base64
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Literal, Mapping, Sequence

from .client_driver import ReadResult, RealClient, SeededValue
from .upstream_wheel import MasterKind, MasterStartError, free_port, master_command, merge_flags, wheel_dir

CLUSTER_ENV = "MC_STORE_CLUSTER_ID"  # the real client's cluster id when its master is etcd://


def port_accepts(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def host_port(endpoint: str) -> str:
    """``http://127.0.0.1:2379`` -> ``127.0.0.1:2379`` (the form both masters' flags and etcd:// take)."""
    return endpoint.split("://", 1)[-1].rstrip("/")


def master_view_key(cluster_id: str) -> str:
    return f"mooncake-store/{cluster_id.rstrip('/')}/master_view"


def read_master_view(etcd_endpoint: str, cluster_id: str, timeout_s: float = 2.0) -> str | None:
    """The ``master_view`` value ("host:port") through etcd's v3 JSON gateway, or None when absent."""
    url = "http://" + host_port(etcd_endpoint) + "/v3/kv/range"
    body = json.dumps({"key": base64.b64encode(master_view_key(cluster_id).encode()).decode()}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        kvs = json.loads(resp.read()).get("kvs") or []
    if not kvs:
        return None
    return base64.b64decode(kvs[0].get("value", "")).decode("utf-8", "replace")


def process_pid(obj: object) -> int:
    """The pid of the process an object runs (its ``pid``, or a ``subprocess.Popen`` attribute)."""
    pid = getattr(obj, "pid", None)
    if isinstance(pid, int):
        return pid
    for value in vars(obj).values():
        if isinstance(value, subprocess.Popen) and value.poll() is None:
            return int(value.pid)
    raise ValueError(f"{obj!r} exposes no running process")


class _Process:
    """A child process in its own process group, its stdout and stderr appended to one log file."""

    def __init__(self, name: str, log_dir: Path, env: Mapping[str, str] | None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("GLOG_logtostderr", "1")
        self.command: list[str] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _spawn(self, command: list[str]) -> None:
        self.command = command
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            log.write(f"\n==== {' '.join(command)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=self.env,
                                          start_new_session=True)

    def log_text(self, tail_chars: int = 6000, *, this_run: bool = False) -> str:
        """The log's tail (``this_run``: only what the current start wrote)."""
        try:
            with open(self.log_path, "rb") as f:
                if this_run:
                    f.seek(self._log_offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return text[-tail_chars:] if tail_chars else text

    def signal(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def wait_exit(self, timeout_s: float) -> int | None:
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL and reap: no clean shutdown."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit status."""
        if self._proc is None:
            return None
        self.signal(signal.SIGTERM)
        if self.wait_exit(timeout_s) is None:
            self.kill()
        return self._proc.returncode


class HaMaster(_Process):
    """One HA master: fixed RPC and metrics ports, so :meth:`restart` brings it back with the same flags."""

    def __init__(self, kind: MasterKind, name: str, flags: Sequence[str], log_dir: Path, *,
                 rpc_port: int, metrics_port: int, env: Mapping[str, str] | None = None) -> None:
        super().__init__(name, log_dir, env)
        self.kind: MasterKind = kind
        self.flags = list(flags)
        self.rpc_port = rpc_port
        self.metrics_port = metrics_port
        self.starts = 0

    @property
    def rpc_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def spawn(self) -> HaMaster:
        """Start the process without waiting (see :meth:`wait_ready`)."""
        if self.alive():
            raise MasterStartError(f"{self.name} is still running (pid {self.pid})")
        self._spawn(master_command(self.kind, self.flags))
        self.starts += 1
        return self

    def wait_ready(self, timeout_s: float) -> HaMaster:
        """Until the metrics port accepts: serve opens it after its kernels are ready, right before it
        starts following or campaigning; a standby's RPC port stays closed, so it cannot tell."""
        deadline = time.monotonic() + timeout_s
        while not port_accepts(self.metrics_port):
            if not self.alive():
                raise MasterStartError(f"{self.name} ({self.kind}) exited with status "
                                       f"{self._proc.returncode if self._proc else None} before its metrics "
                                       f"port opened:\n{self.log_text(this_run=True)}")
            if time.monotonic() > deadline:
                raise MasterStartError(f"{self.name} ({self.kind}) did not open its metrics port {self.metrics_port} "
                                       f"within {timeout_s:.0f} s:\n{self.log_text(this_run=True)}")
            time.sleep(0.05)
        return self

    def serving(self) -> bool:
        return self.alive() and port_accepts(self.rpc_port)

    def scrape(self, timeout_s: float = 5.0) -> str:
        """The Prometheus text of its metrics endpoint."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout_s) as resp:
            return resp.read().decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"HaMaster({self.name!r}, {self.kind}, rpc={self.rpc_address}, pid={self.pid})"


class MetadataServer(_Process):
    """The wheel's standalone ``http_metadata_server.py`` (an aiohttp process) on a loopback port."""

    def __init__(self, log_dir: Path, env: Mapping[str, str] | None = None) -> None:
        super().__init__("metadata-server", log_dir, env)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metadata"

    def start(self, timeout_s: float = 30.0) -> MetadataServer:
        directory = wheel_dir()
        if directory is None or not (directory / "http_metadata_server.py").is_file():
            raise MasterStartError("the wheel has no http_metadata_server.py")
        self.port = free_port()
        self._spawn([sys.executable, str(directory / "http_metadata_server.py"), "--port", str(self.port),
                     "--host", "127.0.0.1", "--log-level", "WARNING"])
        deadline = time.monotonic() + timeout_s
        while not port_accepts(self.port):
            if not self.alive() or time.monotonic() > deadline:
                self.kill()
                raise MasterStartError(f"the metadata server did not open port {self.port}:\n{self.log_text()}")
            time.sleep(0.05)
        return self


class HaCluster:
    """``n_masters`` masters of ``kind`` electing a leader through etcd, and a metadata server.

    ``etcd`` (the :class:`~mooncake_columnar.testing.etcd_server.EtcdServer`, or anything running
    the etcd process) is only needed for :meth:`pause_etcd` and :meth:`resume_etcd`.
    """

    def __init__(self, kind: MasterKind, n_masters: int, etcd_endpoint: str, cluster_id: str,
                 log_dir: str | os.PathLike[str], extra_flags: Sequence[str] = (), *, etcd: object | None = None,
                 env: Mapping[str, str] | None = None, start_timeout_s: float = 120.0) -> None:
        if n_masters < 1:
            raise ValueError("an HA cluster needs at least one master")
        self.kind: MasterKind = kind
        self.etcd_endpoint = etcd_endpoint
        self.cluster_id = cluster_id
        self.log_dir = Path(log_dir)
        self.extra_flags = list(extra_flags)
        self.etcd = etcd
        self.env = dict(env) if env is not None else None
        self.start_timeout_s = start_timeout_s
        self.metadata = MetadataServer(self.log_dir, self.env)
        self.masters: list[HaMaster] = []
        for i in range(n_masters):
            rpc_port, metrics_port = free_port(), free_port()
            self.masters.append(HaMaster(kind, f"{kind}-{i}", self.flags_for(rpc_port, metrics_port), self.log_dir,
                                         rpc_port=rpc_port, metrics_port=metrics_port, env=self.env))
        self._etcd_paused = False

    def flags_for(self, rpc_port: int, metrics_port: int) -> list[str]:
        return merge_flags([
            "--enable_ha=true",
            "--enable_oplog=true",
            f"--etcd_endpoints={host_port(self.etcd_endpoint)}",
            f"--cluster_id={self.cluster_id}",
            "--rpc_address=127.0.0.1",
            f"--rpc_port={rpc_port}",
            f"--metrics_port={metrics_port}",
            "--metrics_host=127.0.0.1",
            "--enable_http_metadata_server=false",  # the standalone metadata server outlives any master
        ], self.extra_flags)

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self, *, wait_leader: bool = True) -> HaCluster:
        try:
            self.metadata.start()
            for m in self.masters:  # all at once: the starts overlap their kernel preparation
                m.spawn()
            for m in self.masters:
                m.wait_ready(self.start_timeout_s)
            if wait_leader:
                self.wait_for_leader(self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self._etcd_paused:
            self.resume_etcd()
        for m in self.masters:
            m.signal(signal.SIGTERM)
        for m in self.masters:
            if m.wait_exit(10.0) is None:
                m.kill()
        self.metadata.stop()

    def __enter__(self) -> HaCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- the client's view -----------------------------------------------------------------------
    def master_address(self) -> str:
        return "etcd://" + host_port(self.etcd_endpoint)

    def client_env(self) -> dict[str, str]:
        return {CLUSTER_ENV: self.cluster_id}

    @property
    def metadata_url(self) -> str:
        return self.metadata.url

    # -- leadership ------------------------------------------------------------------------------
    def leader_address(self) -> str | None:
        """What the ``master_view`` key says now (it may still name a killed leader until its lease ends)."""
        return read_master_view(self.etcd_endpoint, self.cluster_id)

    def by_address(self, address: str | None) -> HaMaster | None:
        return next((m for m in self.masters if m.rpc_address == address), None)

    def named(self, name: str) -> HaMaster:
        return next(m for m in self.masters if m.name == name)

    def leader(self) -> HaMaster | None:
        """The master the ``master_view`` key names, or None when absent (or naming none of ours)."""
        return self.by_address(self.leader_address())

    def standbys(self) -> list[HaMaster]:
        leader = self.leader()
        return [m for m in self.masters if m.alive() and m is not leader]

    def wait_for_leader(self, timeout_s: float, *, exclude: Sequence[HaMaster] = ()) -> HaMaster:
        """Until the key names a live master (not in ``exclude``) whose RPC port accepts."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = self.leader_address()
            except OSError as exc:  # etcd paused or restarting: keep polling until the deadline
                last = exc
            m = self.by_address(last) if isinstance(last, str) else None
            if m is not None and m not in exclude and m.serving():
                return m
            if time.monotonic() > deadline:
                raise TimeoutError(f"no serving leader within {timeout_s:.0f} s (master_view: {last!r}; "
                                   f"alive: {[x.name for x in self.masters if x.alive()]})")
            time.sleep(0.05)

    def wait_standby(self, master: HaMaster, timeout_s: float, marker: str | None = None) -> None:
        """Until ``master`` is up and not leading; ``marker``: also until its current run logged it."""
        deadline = time.monotonic() + timeout_s
        master.wait_ready(timeout_s)
        while marker is not None and marker not in master.log_text(0, this_run=True):
            if not master.alive() or time.monotonic() > deadline:
                raise MasterStartError(f"{master.name} never logged {marker!r}:\n{master.log_text(this_run=True)}")
            time.sleep(0.05)

    def kill_leader(self) -> HaMaster:
        """SIGKILL the current leader (reaped at once); returns it."""
        m = self._current_leader()
        m.kill()
        return m

    def term_leader(self, wait_s: float = 15.0) -> HaMaster:
        """SIGTERM the current leader (it hands the key over as it stops) and wait for its exit."""
        m = self._current_leader()
        m.signal(signal.SIGTERM)
        if m.wait_exit(wait_s) is None:
            raise TimeoutError(f"{m.name} did not exit within {wait_s:.0f} s of SIGTERM:\n{m.log_text()}")
        return m

    def _current_leader(self) -> HaMaster:
        m = self.leader()
        if m is None or not m.alive():
            raise RuntimeError(f"no live leader to stop (master_view: {self.leader_address()!r})")
        return m

    def restart(self, master: HaMaster, *, wait: bool = True) -> HaMaster:
        """Start a stopped master again with the same flags and ports; ``wait``: until it is ready."""
        if master.alive():
            master.kill()
        master.spawn()
        return master.wait_ready(self.start_timeout_s) if wait else master

    # -- etcd outages ----------------------------------------------------------------------------
    def _etcd_pid(self) -> int:
        if self.etcd is None:
            raise RuntimeError("HaCluster was built without etcd=: it cannot pause the etcd process")
        return process_pid(self.etcd)

    def pause_etcd(self) -> None:
        """SIGSTOP the etcd process: every etcd call of masters and clients hangs until resumed."""
        os.kill(self._etcd_pid(), signal.SIGSTOP)
        self._etcd_paused = True

    def resume_etcd(self) -> None:
        os.kill(self._etcd_pid(), signal.SIGCONT)
        self._etcd_paused = False

    def __repr__(self) -> str:
        return f"HaCluster({self.kind!r}, {[m.name for m in self.masters]}, cluster={self.cluster_id!r})"


def scrape_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample ``name`` in a Prometheus text scrape, or None."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{}"):
            try:
                return float(line.rsplit(" ", 1)[1])
            except ValueError:
                return None
    return None


# -- a failover under a real client's workload ----------------------------------------------------
StopHow = Literal["kill9", "sigterm"]
# what each kind logs once it follows the leader as a candidate (a restarted master is a standby then)
FOLLOW_MARKERS: dict[str, str] = {"serve": "following the oplog", "upstream": "Master runtime state -> candidate"}
WRITER_RETRY_PAUSE_S = 0.05  # a writer whose put failed waits this long before the next key (no busy loop)
POLL_INTERVAL_S = 0.05


@dataclass
class Expected:
    """What a workload left in the store: values acknowledged (key -> value) and keys it removed."""
    values: dict[str, SeededValue] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    # puts that never returned OK: afterwards each is either whole or absent, never anything else
    unacknowledged: dict[str, SeededValue] = field(default_factory=dict)

    def merge(self, other: Expected) -> None:
        self.values.update(other.values)
        self.removed.update(other.removed)
        self.unacknowledged.update(other.unacknowledged)


@dataclass
class Verdict:
    """How the store's contents compare with an :class:`Expected`."""
    kept: int = 0
    lost: list[str] = field(default_factory=list)         # acknowledged, not removed, absent now
    corrupt: list[str] = field(default_factory=list)      # bytes that are not what was put (half, or wrong)
    resurrected: list[str] = field(default_factory=list)  # removed and acknowledged, readable now
    unacknowledged_whole: int = 0
    unacknowledged_absent: int = 0

    @property
    def intact(self) -> bool:
        return not (self.lost or self.corrupt or self.resurrected)


@dataclass
class FailoverOutcome:
    """One leader stopped under a workload: timings from the stop signal, and what survived."""
    how: StopHow
    old_leader: str
    new_leader: str
    first_get_seconds: float          # stop signal -> first matching read (probe_answer: first answer) sent
                                      # after the old leader's port closed
    old_closed_seconds: float         # stop signal -> the old leader's RPC port refuses connections
    new_leader_seconds: float         # stop signal -> the key names a successor whose RPC port accepts
    acknowledged: int                 # puts that returned OK before the stop (removed ones included)
    removed: int
    remove_failures: int              # removes the client was refused before the stop (kept as values)
    in_flight: list[str]              # puts sent before the stop that answered after it
    acknowledged_after: int           # puts that returned OK after the stop (the client writes again)
    expected: Expected
    verdict: Verdict
    acknowledged_at: dict[str, float] = field(default_factory=dict)  # key -> seconds after the stop its put returned

    def lost_acknowledged_before_stop_seconds(self) -> float:
        """How long before the stop the earliest lost put was acknowledged (NaN when none was lost)."""
        times = [-self.acknowledged_at[k] for k in self.verdict.lost if k in self.acknowledged_at]
        return max(times) if times else math.nan

    def summary(self) -> str:
        v = self.verdict
        return (f"{self.how}: {self.old_leader} -> {self.new_leader}, first get {self.first_get_seconds:.2f} s, "
                f"new leader {self.new_leader_seconds:.2f} s, old port closed {self.old_closed_seconds:.2f} s; "
                f"kept {v.kept}, lost {len(v.lost)}, corrupt {len(v.corrupt)}, resurrected {len(v.resurrected)} "
                f"of {len(self.expected.removed)} removed; "
                f"{len(self.expected.unacknowledged)} unacknowledged ({v.unacknowledged_whole} whole, "
                f"{v.unacknowledged_absent} absent), in flight {self.in_flight}, {self.acknowledged_after} "
                "acknowledged after the stop")


def seeded_values(seed: int, prefix: str, count: int, max_size: int = 4096) -> dict[str, SeededValue]:
    """``count`` keys ``<prefix>-<i>`` with seeded values of sizes drawn from ``seed``."""
    rng = random.Random(seed)
    return {f"{prefix}-{i}": SeededValue(seed * 1_000_003 + i, rng.randint(1, max_size)) for i in range(count)}


def verify(reader: RealClient, expected: Expected, chunk: int = 64) -> Verdict:
    """Read every key of ``expected`` back through ``reader`` and classify it."""
    verdict = Verdict()
    keys = [*expected.values, *expected.unacknowledged]
    reads: dict[str, ReadResult] = {}
    for i in range(0, len(keys), chunk):
        part = keys[i:i + chunk]
        reads.update(zip(part, reader.get_batch(part)))
    for key, value in expected.values.items():
        r = reads[key]
        if key in expected.removed:
            if r.size:
                verdict.resurrected.append(key)
        elif r.matches(value):
            verdict.kept += 1
        elif r.size == 0:
            verdict.lost.append(key)
        else:
            verdict.corrupt.append(key)
    for key, value in expected.unacknowledged.items():
        r = reads[key]
        if r.matches(value):
            verdict.unacknowledged_whole += 1
        elif r.size == 0:
            verdict.unacknowledged_absent += 1
        else:
            verdict.corrupt.append(key)
    return verdict


def cpu_seconds(pid: int) -> float | None:
    """CPU time (user + system) a process used so far, from /proc; None where that is unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def wait_settled(masters: Sequence[HaMaster], timeout_s: float, window_s: float = 0.5,
                 busy_share: float = 0.25) -> bool:
    """Until each master used under ``busy_share`` of a core over ``window_s``: a just-started
    standby replays the whole oplog on its first poll, and a failover that lands in that replay
    is slower (see the xfail test in tests/ha/test_serve_failover.py). False on timeout or
    where /proc cannot tell."""
    deadline = time.monotonic() + timeout_s
    for m in masters:
        while True:
            before = cpu_seconds(m.pid) if m.pid is not None else None
            if before is None:
                return False
            time.sleep(window_s)  # the measuring window, not a wait for any event
            after = cpu_seconds(m.pid) if m.alive() and m.pid is not None else None
            if after is None:
                return False
            if after - before < busy_share * window_s:
                break
            if time.monotonic() > deadline:
                return False
    return True


def wait_standby_ready(cluster: HaCluster, minimum: int, timeout_s: float, *, settle: bool = False) -> list[HaMaster]:
    """Restart every stopped master (without waiting for all) and wait until ``minimum`` of them
    follow the leader; ``settle``: and until those are idle (caught up). Returns the standbys that follow."""
    for m in cluster.masters:
        if not m.alive():
            cluster.restart(m, wait=False)
    marker = FOLLOW_MARKERS.get(cluster.kind)
    deadline = time.monotonic() + timeout_s
    while True:
        leader = cluster.leader()
        ready = [m for m in cluster.masters if m is not leader and m.alive() and port_accepts(m.metrics_port)
                 and (marker is None or marker in m.log_text(0, this_run=True))]
        if len(ready) >= minimum:
            if settle:
                wait_settled(ready, max(1.0, deadline - time.monotonic()))
            return ready
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {minimum} standby(s) within {timeout_s:.0f} s: "
                               f"{[(m.name, m.alive()) for m in cluster.masters]}")
        time.sleep(POLL_INTERVAL_S)


class _SuccessorWatch(threading.Thread):
    """Polls etcd from the stop on: when does the key first name a serving master other than the old one."""

    def __init__(self, cluster: HaCluster, old: HaMaster, since: float) -> None:
        super().__init__(name="failover-successor-watch", daemon=True)
        self.cluster, self.old, self.since = cluster, old, since
        self.successor: HaMaster | None = None
        self.seconds = math.nan
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                candidate = self.cluster.leader()
            except OSError:  # etcd paused or slow: ask again
                candidate = None
            if candidate is not None and candidate is not self.old and candidate.serving():
                self.successor, self.seconds = candidate, time.monotonic() - self.since
                return
            self.halt.wait(0.02)


class _Writer(threading.Thread):
    """Single puts of fresh keys, one after the other, until told to stop (or out of keys)."""

    def __init__(self, client: RealClient, values: dict[str, SeededValue]) -> None:
        super().__init__(name="failover-writer", daemon=True)
        self.client = client
        self.values = values
        self.results: list[tuple[str, int, float, float]] = []  # key, rc, sent, answered (monotonic)
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for key, value in self.values.items():
                if self.halt.is_set():
                    return
                sent = time.monotonic()
                rc = self.client.put(key, value)
                self.results.append((key, rc, sent, time.monotonic()))
                if rc != 0:
                    self.halt.wait(WRITER_RETRY_PAUSE_S)
        except BaseException as exc:  # reported by failover_round, which owns the thread
            self.error = exc

    def acknowledged(self) -> int:
        return sum(1 for _, rc, _, _ in self.results if rc == 0)


def failover_round(cluster: HaCluster, writer: RealClient, reader: RealClient, *, how: StopHow, seed: int,
                   prefix: str, objects: int, remove_ratio: float = 0.1, batch: int = 20,
                   acknowledged_before_stop: int = 5, writer_keys: int = 400, max_size: int = 4096,
                   during_stop: Callable[[], None] | None = None,
                   after_first_get: Callable[[Expected], None] | None = None, probe_answer: bool = False,
                   timeout_s: float = 60.0) -> FailoverOutcome:
    """Put ``objects`` seeded values (``batch`` per put_batch), remove ``remove_ratio`` of them, start a
    writer thread of single puts, and once ``acknowledged_before_stop`` of those returned OK stop the
    leader (``kill9``: SIGKILL; ``sigterm``: it resigns); ``during_stop`` runs right after the signal,
    ``after_first_get`` right after the first successful read (before anything else is read back).
    The ``reader`` then polls an acknowledged object until it reads back (the client followed the new
    leader and the owner remounted), the writer runs until one put after the stop returned OK, and
    everything is read back and classified. ``writer`` owns the segment; ``reader`` should have none.
    ``probe_answer``: time the first answer of the successor (``is_exist`` of that object, found or
    not) instead of the first matching read, for a master that is not expected to keep the data.
    """
    rng = random.Random(seed ^ 0x5EED)
    first = seeded_values(seed, f"{prefix}-a", objects, max_size)
    expected = Expected()
    acked_at: dict[str, float] = {}  # monotonic time each acknowledged put returned
    keys = list(first)
    for i in range(0, len(keys), batch):
        part = keys[i:i + batch]
        if writer.put_batch(part, [first[k] for k in part]) == 0:
            expected.values.update((k, first[k]) for k in part)
            acked_at.update(dict.fromkeys(part, time.monotonic()))
        else:
            expected.unacknowledged.update((k, first[k]) for k in part)
    to_remove = rng.sample(sorted(expected.values), int(len(expected.values) * remove_ratio))
    remove_failures = 0
    for key, rc in zip(to_remove, writer.batch_remove(to_remove) if to_remove else []):
        if rc == 0:
            expected.removed.add(key)
        else:
            remove_failures += 1
    probe = next(k for k in expected.values if k not in expected.removed)

    thread = _Writer(writer, seeded_values(seed + 1, f"{prefix}-b", writer_keys, max_size))
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.acknowledged() < acknowledged_before_stop:
        if not thread.is_alive() or time.monotonic() > deadline:
            thread.halt.set()
            raise RuntimeError(f"the writer got {thread.acknowledged()} puts acknowledged before the stop "
                               f"(error: {thread.error!r}); results {thread.results[-5:]}")
        time.sleep(0.005)
    leader = cluster._current_leader()
    stopped_at = time.monotonic()
    if how == "kill9":
        leader.kill()
    else:
        leader.signal(signal.SIGTERM)
    watch = _SuccessorWatch(cluster, leader, stopped_at)
    watch.start()
    if during_stop is not None:
        during_stop()

    first_get = old_closed = math.nan
    try:
        while math.isnan(first_get):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no read of {probe} within {timeout_s:.0f} s of the {how}")
            # a SIGTERMed leader serves on until it closes its port: only reads sent after that
            # are the successor's, so only they time the hand-over
            if math.isnan(old_closed) and not leader.serving():
                old_closed = time.monotonic() - stopped_at
            successor_reads = not math.isnan(old_closed)
            if probe_answer:
                answered = reader.is_exist(probe) >= 0  # negative: the client reached no master
            else:
                answered = reader.get(probe).matches(first[probe])
            if answered and successor_reads:
                first_get = time.monotonic() - stopped_at
            else:
                time.sleep(POLL_INTERVAL_S)
        if after_first_get is not None:
            after_first_get(expected)
        while not any(rc == 0 and sent > stopped_at for _, rc, sent, _ in thread.results):
            if not thread.is_alive() or time.monotonic() > deadline:
                break
            time.sleep(POLL_INTERVAL_S)
        watch.join(max(0.0, deadline - time.monotonic()))
    finally:
        thread.halt.set()
        watch.halt.set()
        thread.join(timeout_s)
    if thread.error is not None:
        raise RuntimeError(f"the writer failed: {thread.error!r}") from thread.error
    if how == "sigterm" and leader.wait_exit(timeout_s) is None:
        raise TimeoutError(f"{leader.name} did not exit within {timeout_s:.0f} s of SIGTERM")
    successor = watch.successor or cluster.wait_for_leader(timeout_s, exclude=[leader])

    acknowledged_before = len(expected.values)
    in_flight, after = [], 0
    for key, rc, sent, done in thread.results:
        value = thread.values[key]
        if rc == 0:
            expected.values[key] = value
            acked_at[key] = done
            after += sent > stopped_at
        else:
            expected.unacknowledged[key] = value
        if sent <= stopped_at < done:
            in_flight.append(key)
        elif rc == 0 and done <= stopped_at:
            acknowledged_before += 1
    return FailoverOutcome(how, leader.name, successor.name, first_get, old_closed, watch.seconds, acknowledged_before,
                           len(expected.removed), remove_failures, in_flight, after, expected,
                           verify(reader, expected), {k: t - stopped_at for k, t in acked_at.items()})
