"""The upstream Mooncake wheel as a test dependency: where it is, whether it can run here, and a
master process (the wheel's ``mooncake_master`` or ``mooncake-columnar serve``) on loopback ports.

Nothing here imports ``mooncake.store``: the client module is heavy and needs ``libibverbs``, so it
is only loaded in subprocesses (``client_driver``), and its availability is probed in one too.
"""
from __future__ import annotations

import ctypes.util
import functools
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Literal, Mapping, Sequence

WHEEL_REQUIREMENT = "mooncake-transfer-engine-non-cuda==0.3.13.post1"
INSTALL_WHEEL = f"pip install {WHEEL_REQUIREMENT}"
INSTALL_IBVERBS = "apt-get install libibverbs1"

MasterKind = Literal["upstream", "serve"]
MASTER_KINDS: tuple[MasterKind, ...] = ("upstream", "serve")

# The client's transfer engine listens in this range; a test server there can steal its port.
TRANSFER_ENGINE_PORTS = range(15000, 17001)


class MasterStartError(RuntimeError):
    pass


def wheel_dir() -> Path | None:
    """The installed ``mooncake`` package directory, found without importing the package."""
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location)
        if (path / "mooncake_master").is_file():
            return path
    return Path(next(iter(spec.submodule_search_locations)))


def master_binary() -> Path | None:
    """Path of the wheel's ``mooncake_master``, or None when the wheel is missing."""
    directory = wheel_dir()
    if directory is None:
        return None
    candidate = directory / "mooncake_master"
    return candidate if candidate.is_file() and os.access(candidate, os.X_OK) else None


@functools.lru_cache(maxsize=1)
def _client_import_error() -> str | None:
    """Why ``import mooncake.store`` fails in a fresh interpreter, or None when it works."""
    try:
        proc = subprocess.run([sys.executable, "-c", "import mooncake.store"],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "import mooncake.store timed out after 120 s"
    if proc.returncode == 0:
        return None
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {proc.returncode}"


@functools.lru_cache(maxsize=1)
def skip_reason() -> str | None:
    """None when the real client and master can run here, else what is missing and how to install it."""
    if wheel_dir() is None:
        return f"the upstream Mooncake wheel is not installed: {INSTALL_WHEEL}"
    if master_binary() is None:
        return f"the installed mooncake package has no executable mooncake_master: {INSTALL_WHEEL}"
    if ctypes.util.find_library("ibverbs") is None:
        return f"the upstream Mooncake client needs the system library libibverbs: {INSTALL_IBVERBS}"
    error = _client_import_error()
    if error is not None:
        hint = INSTALL_IBVERBS if "ibverbs" in error else INSTALL_WHEEL
        return f"import mooncake.store fails ({error}): {hint}"
    return None


_handed_out: set[int] = set()


def free_port() -> int:
    """A free loopback TCP port outside the transfer engine's range, not handed out before by this process."""
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port in TRANSFER_ENGINE_PORTS or port in _handed_out:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free loopback port outside 15000-17000 after 200 tries")


def _port_accepts(port: int, timeout_s: float = 0.2) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def _flag_name(flag: str) -> str:
    return flag.lstrip("-").split("=", 1)[0]


def merge_flags(base: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``base`` with each ``--name=value`` of ``extra`` replacing the same-named flag (or appended)."""
    merged = {_flag_name(f): f for f in base}
    for flag in extra:
        merged[_flag_name(flag)] = flag
    return list(merged.values())


def master_command(kind: MasterKind, flags: Sequence[str]) -> list[str]:
    """The argv that starts a master of ``kind`` with ``flags`` (both kinds take upstream's flags)."""
    if kind == "upstream":
        binary = master_binary()
        if binary is None:
            raise MasterStartError(f"no mooncake_master: {INSTALL_WHEEL}")
        return [str(binary), *flags]
    if kind == "serve":
        return [sys.executable, "-m", "mooncake_columnar.tools.cli", "serve", *flags]
    raise ValueError(f"unknown master kind {kind!r}")


class MasterProcess:
    """A master of ``kind`` on fresh loopback ports: ``with MasterProcess("upstream") as m: m.rpc_address``.

    The default flags enable the embedded HTTP metadata server and set a 5 s kv lease; ``extra_flags``
    (``--name=value``) override or extend them. stderr goes to ``stderr_path`` for diagnostics.
    """

    DEFAULT_FLAGS: tuple[str, ...] = (
        "--enable_http_metadata_server=true",
        "--http_metadata_server_host=127.0.0.1",
        "--default_kv_lease_ttl=5000",
        "--rpc_address=127.0.0.1",
        "--metrics_host=127.0.0.1",
    )

    def __init__(self, kind: MasterKind = "upstream", extra_flags: Sequence[str] = (), *,
                 log_dir: str | os.PathLike[str] | None = None, start_timeout_s: float = 30.0,
                 env: Mapping[str, str] | None = None) -> None:
        self.kind: MasterKind = kind
        self.extra_flags = list(extra_flags)
        self.start_timeout_s = start_timeout_s
        self.env = dict(env) if env is not None else None
        self.log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix=f"master-{kind}-"))
        self.rpc_port = 0
        self.http_metadata_port = 0
        self.metrics_port = 0
        self.command: list[str] = []
        self.stderr_path = self.log_dir / f"master-{kind}.stderr"
        self._proc: subprocess.Popen[bytes] | None = None

    # -- addresses -------------------------------------------------------------------------------
    @property
    def rpc_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://127.0.0.1:{self.http_metadata_port}/metadata"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stderr_text(self, tail_chars: int = 6000) -> str:
        try:
            text = self.stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-tail_chars:]

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> MasterProcess:
        """Start and wait until the RPC and metadata ports accept connections.

        Ports are taken by bind-and-release, so another process can race for one; a start that fails
        while the process is still young is retried on fresh ports.
        """
        last: MasterStartError | None = None
        for _ in range(3):
            try:
                self._start_once()
                return self
            except MasterStartError as exc:
                self.kill()
                last = exc
        assert last is not None
        raise last

    def _given_port(self, flag: str) -> int:
        """The port ``--flag=N`` in the extra flags names, or a fresh one (a restart reuses its ports)."""
        for f in self.extra_flags:
            if _flag_name(f) == flag and "=" in f:
                return int(f.split("=", 1)[1])
        return free_port()

    def _start_once(self) -> None:
        self.rpc_port, self.http_metadata_port, self.metrics_port = (
            self._given_port(f) for f in ("rpc_port", "http_metadata_server_port", "metrics_port"))
        flags = merge_flags([
            f"--rpc_port={self.rpc_port}",
            f"--http_metadata_server_port={self.http_metadata_port}",
            f"--metrics_port={self.metrics_port}",
            *self.DEFAULT_FLAGS,
        ], self.extra_flags)
        self.command = master_command(self.kind, flags)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("GLOG_logtostderr", "1")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "ab") as err:
            err.write(f"\n==== {' '.join(self.command)}\n".encode())
            err.flush()
            self._proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                          env=env, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        waiting = [self.rpc_port, self.http_metadata_port]
        while waiting:
            if self._proc.poll() is not None:
                raise MasterStartError(
                    f"{self.kind} master exited with status {self._proc.returncode} before its ports opened:\n"
                    f"{self.stderr_text()}")
            if time.monotonic() > deadline:
                raise MasterStartError(
                    f"{self.kind} master did not open port(s) {waiting} within {self.start_timeout_s:.0f} s:\n"
                    f"{self.stderr_text()}")
            if _port_accepts(waiting[0]):
                waiting.pop(0)
            else:
                time.sleep(0.05)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL if the process has not exited after ``timeout_s``; returns its exit status."""
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL (no clean shutdown), and reap the process."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def __enter__(self) -> MasterProcess:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"MasterProcess({self.kind!r}, rpc={self.rpc_address}, pid={self.pid})"
