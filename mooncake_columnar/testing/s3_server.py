"""A real S3-compatible server for tests: ``moto.server`` in a subprocess on 127.0.0.1.

It runs from ``sys.executable``'s environment (moto[server] 5.2.5 in the project venv; the
machine-wide moto 5.2.1 fails CompleteMultipartUpload with pyarrow's S3 client). Failing to start
raises: S3 tests must fail, never skip, when the server is unavailable.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"
START_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def s3_uri(bucket: str, prefix: str, endpoint: str) -> str:
    """An ``s3://`` URI that pyarrow's ``FileSystem.from_uri`` resolves to the given endpoint."""
    return (f"s3://{ACCESS_KEY}:{SECRET_KEY}@{bucket}/{prefix}?endpoint_override={endpoint}"
            f"&scheme=http&region={REGION}")


@contextmanager
def moto_s3(bucket: str | None = None) -> Iterator[str]:
    """Start moto, create a bucket, yield an ``s3://bucket/prefix?...`` URI; stop moto after."""
    port = _free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
               AWS_DEFAULT_REGION=REGION)
    # its log goes to a file: a pipe nobody reads fills up (64 KiB) and then stalls every request
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _answers(port):
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise RuntimeError(f"moto.server exited with {proc.returncode}: {err[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto.server did not answer on port {port} in {START_TIMEOUT_S} s")
            time.sleep(0.05)  # the one wait allowed: the server process is starting
        endpoint = f"127.0.0.1:{port}"
        bucket = bucket or f"mooncake-{uuid.uuid4().hex[:12]}"
        fs = pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
                               endpoint_override=endpoint, scheme="http",
                               allow_bucket_creation=True)
        fs.create_dir(bucket)
        yield s3_uri(bucket, "snapshots", endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
