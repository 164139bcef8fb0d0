from __future__ import annotations

import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService

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
