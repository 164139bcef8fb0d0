"""`make demo`: a master on embedded defaults, driven by a simulated clock, narrated step by step."""
from __future__ import annotations

import time

import numpy as np

from .clock import ManualClocks
from .config import MasterConfig
from .errors import ObjectHasLease
from .master import MasterService
from .synthetic import fill, mount_segments, synthetic_keys


def _say(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def run_demo(objects: int = 200_000) -> int:
    clocks = ManualClocks()
    m = MasterService(MasterConfig(), clocks=clocks, initial_capacity=objects)
    mount_segments(m, 4, objects * 4096)
    t0 = time.perf_counter()
    fill(m, objects, chunk=min(objects, 100_000))
    _say(f"primary holds {m.object_count():,} objects on 4 segments "
         f"({time.perf_counter() - t0:.2f} s to put and complete them)")
    mem = m.metadata_bytes()
    _say(f"metadata: {(mem['columns'] + mem['index'] + mem['inflight']) / objects:.1f} bytes/object "
         f"+ {mem['key_bytes'] / objects:.0f} key bytes")

    hot = synthetic_keys(0, 1000)
    res = m.batch_get_replica_list(hot)
    _say(f"read 1,000 hot keys: {int((res.codes == 0).sum())} readable, leases granted for "
         f"{m.config.default_kv_lease_ttl_ms} ms (steady clock)")
    clocks.jump_system(s=-3600)
    try:
        m.remove(hot[0].as_py())
    except ObjectHasLease:
        _say("the system clock jumped back 1 h; leases do not care: remove -> OBJECT_HAS_LEASE")
    clocks.advance(ms=m.config.default_kv_lease_ttl_ms)
    m.remove(hot[0].as_py())
    _say("10 s of steady time later the lease expired and remove succeeded")

    for i in range(4):
        m.ping(f"client-{i}")
    clocks.advance(s=m.config.client_live_ttl_s + 1)
    m.ping("client-0")
    m.ping("client-1")
    m.tick()
    _say(f"clients 2 and 3 went silent for {m.config.client_live_ttl_s + 1} s: their segments were unmounted; "
         f"{m.object_count():,} objects remain")
    alive = m.batch_exist_key(synthetic_keys(0, objects))
    _say(f"{int(np.count_nonzero(alive)):,} objects still readable")
    return 0
