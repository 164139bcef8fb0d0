"""Fixtures that run the real upstream client against a master: the wheel's ``mooncake_master`` or
``mooncake-columnar serve``, both started with the same upstream flags."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Iterator, Sequence, cast

import pytest

from mooncake_columnar.testing.client_driver import ClientDriverError, RealClient
from mooncake_columnar.testing.upstream_wheel import (
    MASTER_KINDS,
    MasterKind,
    MasterProcess,
    MasterStartError,
    skip_reason,
)

SERVE_MODULE = "mooncake_columnar.server.serve"

# Short enough that a lease-expiry check waits about 2 s, long enough that a remove issued right
# after a read always lands inside the lease.
LEASE_TTL_MS = 2000
MASTER_FLAGS: tuple[str, ...] = (f"--default_kv_lease_ttl={LEASE_TTL_MS}", "--client_ttl=10")
SEGMENT_BYTES = 128 << 20  # room for the 16 MiB values and a 300-key batch at once
BUFFER_BYTES = 64 << 20


def serve_missing_reason() -> str | None:
    if importlib.util.find_spec(SERVE_MODULE) is None:
        return f"{SERVE_MODULE} does not exist yet: `mooncake-columnar serve` cannot start"
    return None


def require_kind(kind: str) -> MasterKind:
    """Skip when the real client cannot run here, or for ``serve`` until its module exists."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    if kind == "serve":
        reason = serve_missing_reason()
        if reason is not None:
            pytest.skip(reason)
    assert kind in MASTER_KINDS
    return cast(MasterKind, kind)


def start_master(kind: MasterKind, log_dir: Path, extra_flags: Sequence[str] = MASTER_FLAGS) -> MasterProcess:
    try:
        return MasterProcess(kind, extra_flags, log_dir=log_dir).start()
    except MasterStartError as exc:
        pytest.fail(f"cannot start the {kind} master: {exc}", pytrace=False)


def start_client(master: MasterProcess, log_dir: Path, name: str, *, segment_bytes: int = SEGMENT_BYTES,
                 buffer_bytes: int = BUFFER_BYTES, memcpy: bool | None = None) -> RealClient:
    client = RealClient(master.rpc_address, master.metadata_url, segment_bytes=segment_bytes,
                        buffer_bytes=buffer_bytes, memcpy=memcpy, log_dir=log_dir, name=name)
    try:
        return client.start()
    except ClientDriverError as exc:
        pytest.fail(f"real client {name} could not set up against the {master.kind} master: {exc}\n"
                    f"master stderr:\n{master.stderr_text()}", pytrace=False)


@pytest.fixture(scope="module", params=list(MASTER_KINDS), ids=list(MASTER_KINDS))
def master_kind(request: pytest.FixtureRequest) -> MasterKind:
    return require_kind(request.param)


@pytest.fixture(scope="module")
def live_master(master_kind: MasterKind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    master = start_master(master_kind, tmp_path_factory.mktemp(f"master-{master_kind}"))
    yield master
    master.stop()


@pytest.fixture(scope="module")
def store_client(live_master: MasterProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealClient]:
    """The module's main client: it owns a 128 MiB segment and reads its own objects by memcpy."""
    client = start_client(live_master, tmp_path_factory.mktemp("client"), "store-client")
    yield client
    client.close(unmount=False)  # the master stops right after; the client's close() costs 2 s


@pytest.fixture(scope="module")
def reader_client(live_master: MasterProcess, store_client: RealClient,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealClient]:
    """A second client process with no segment of its own and ``MC_STORE_MEMCPY=0``: everything it
    reads or writes lives in another process's segment and crosses the TCP transport."""
    client = start_client(live_master, tmp_path_factory.mktemp("reader"), "reader-client", segment_bytes=0,
                          memcpy=False)
    yield client
    client.close(unmount=False)
