"""Soak: client threads, the background thread, a snapshot writer and a standby all at once.

Bounded (MOONCAKE_SOAK_SECONDS, default 20 s; `make soak` runs it for 10 minutes). Fails on any
unexpected exception in any thread, a failing background tick, a self-check violation during or
after the run, or a standby that does not hold exactly the primary's complete objects.
"""
from __future__ import annotations

import os
import random
import threading
import time
import traceback

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import (IllegalClient, InvalidWrite, NoAvailableHandle, ObjectAlreadyExists,
                                      ObjectHasLease, ObjectNotFound, ReplicaNotReady,
                                      UnavailableInCurrentStatus)
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.builders import drain

SOAK_SECONDS = float(os.environ.get("MOONCAKE_SOAK_SECONDS", "20"))
SOAK_TIMEOUT_S = SOAK_SECONDS + 300  # the soak itself, then stopping, catching up and restoring
# the answers a client of a busy cache master gets and handles; anything else fails the soak
EXPECTED = (ObjectNotFound, ObjectAlreadyExists, ObjectHasLease, ReplicaNotReady, NoAvailableHandle,
            InvalidWrite, IllegalClient, UnavailableInCurrentStatus)
CLIENTS = 3
SEGMENTS = 4
OBJECT_BYTES = 16 << 10


class Soak:
    def __init__(self, tmp_path) -> None:
        self.clocks = ManualClocks()
        self.config = MasterConfig(default_kv_lease_ttl_ms=200, put_start_discard_timeout_s=1,
                                   put_start_release_timeout_s=2, client_live_ttl_s=3600,
                                   eviction_high_watermark_ratio=0.8, eviction_ratio=0.1)
        self.store = FileOpLogStore(tmp_path / "log")
        self.writer = OpLogWriter(self.store, window=1 << 16, clocks=self.clocks)
        self.m = MasterService(self.config, clocks=self.clocks, journal=self.writer)
        for i in range(SEGMENTS):  # small segments: eviction runs all the time
            self.m.mount_segment(f"seg{i}", endpoint=f"10.0.0.{i}:1", client_id=f"client{i % CLIENTS}",
                                 base=(i + 1) << 32, size=4 << 20)
        self.standby = StandbyService(self.store, clocks=self.clocks, config=self.config)
        self.snapshots = SnapshotManager(self.m, SnapshotRepository(tmp_path / "snap"), retention=2,
                                         prefault=False)
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.counts = {"ops": 0, "verify": 0, "snapshots": 0}
        self._count_lock = threading.Lock()

    def _guard(self, name, body) -> threading.Thread:
        def run() -> None:
            try:
                body()
            except BaseException:  # noqa: BLE001 - the soak reports every failure of every thread
                self.failures.append(f"{name}:\n{traceback.format_exc()}")
                self.stop.set()
        return threading.Thread(target=run, name=name, daemon=True)

    def _count(self, what: str, n: int = 1) -> None:
        with self._count_lock:
            self.counts[what] += n

    def client(self, idx: int) -> None:
        r = random.Random(idx)
        m, me = self.m, f"client{idx}"
        shared = [f"shared/{i}" for i in range(200)]
        own = [f"{me}/{i}" for i in range(2000)]
        while not self.stop.is_set():
            op = r.random()
            key = r.choice(shared if r.random() < 0.3 else own)
            try:
                if op < 0.30:
                    m.get_replica_list(key)
                elif op < 0.45:
                    m.exist_key(key)
                elif op < 0.65:
                    m.put_start(key, OBJECT_BYTES, client_id=me,
                                config=ReplicateConfig(replica_num=r.choice([1, 1, 2]),
                                                       group_id=r.choice(["", "", "g"])))
                    if r.random() < 0.8:
                        m.put_end(key, client_id=me)
                    elif r.random() < 0.5:
                        m.put_revoke(key, client_id=me)
                    # else: left in flight, for the discard of abandoned puts
                elif op < 0.75:
                    m.remove(key, force=r.random() < 0.5)
                elif op < 0.80:
                    keys = r.sample(own, 64)
                    m.batch_put_start(keys, np.full(64, OBJECT_BYTES), client_id=me)
                    m.batch_put_end(keys, client_id=me)
                elif op < 0.85:
                    m.batch_get_replica_list(r.sample(own + shared, 64))
                elif op < 0.90:
                    m.batch_remove(r.sample(own, 32), force=r.random() < 0.5)
                elif op < 0.95:
                    m.ping(me)
                else:
                    m.object_info(key)
            except EXPECTED:
                pass
            self._count("ops")

    def clock(self) -> None:
        while not self.stop.is_set():  # 20 ms of master time per real ms: leases and puts expire
            self.clocks.advance(ms=20)
            time.sleep(0.001)

    def checker(self) -> None:
        while not self.stop.wait(0.25):
            self.m.verify()
            self._count("verify")

    def snapshotter(self) -> None:
        while not self.stop.wait(1.0):
            self.snapshots.snapshot_now()
            self._count("snapshots")

    def run(self, seconds: float) -> None:
        self.writer.start()
        self.standby.start(interval_s=0.005)
        self.m.start(interval_s=0.002)
        threads = [self._guard(f"client{i}", lambda i=i: self.client(i)) for i in range(CLIENTS)]
        threads += [self._guard("clock", self.clock), self._guard("checker", self.checker),
                    self._guard("snapshots", self.snapshotter)]
        for t in threads:
            t.start()
        self.stop.wait(seconds)
        self.stop.set()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), f"{t.name} did not stop"
        self.m.stop()
        self.standby.stop()
        self.snapshots.stop()
        self.writer.flush()


@pytest.mark.timeout(SOAK_TIMEOUT_S)
def test_soak_clients_background_snapshots_and_standby_keep_every_invariant(tmp_path):
    s = Soak(tmp_path)
    s.run(SOAK_SECONDS)
    assert not s.failures, "\n".join(s.failures)
    h = s.m.health()
    assert h.healthy and h.background.failures == 0 and h.background.rounds > 0, h
    assert s.m.metrics.get("snapshot_failure") == 0
    assert s.counts["ops"] > 1000 and s.counts["verify"] > 0 and s.counts["snapshots"] > 0, s.counts
    s.m.verify()

    # the standby catches up to the durable log and holds exactly the primary's complete objects
    drain(s.standby)
    assert s.standby.applied_sequence_id == s.store.durable_prefix()
    s.standby.master.verify()
    primary = s.m.to_arrow()
    complete = primary.filter(primary.column("processing").to_numpy(zero_copy_only=False) == False)  # noqa: E712
    assert sorted(s.standby.master.to_arrow().column("key").to_pylist()) == \
        sorted(complete.column("key").to_pylist())

    # the last snapshot restores into an engine that passes the self-check
    restored, _ = restore_master(SnapshotRepository(tmp_path / "snap"), config=s.config, clocks=s.clocks,
                                 drop_expired=False, prefault=False)
    restored.verify()
