"""HA state machine: a journaling primary and a following standby under store outages, a
window smaller than the batches, kills at random points, promotions and remounts.

After a promotion that follows a healed log (store up, everything flushed) the promoted master
holds exactly the old primary's complete objects (minus deadlines): nothing acknowledged is lost,
nothing diverges. After a promotion with an un-durable tail it holds exactly what replaying the
durable log gives. Every master passes the engine self-check after every step.
"""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import hypothesis.strategies as st
import numpy as np
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import ErrorCode, MooncakeError, OpLogStoreUnavailable, UnavailableInCurrentStatus
from mooncake_columnar.ha.apply import apply_batch
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter

WINDOW = 6
KEYS = [f"k{i}" for i in range(16)]
SEG = dict(name="seg0", endpoint="10.0.0.1:1", client="c0", base=1 << 32, size=1 << 16)


class FlakyStore:
    """A FileOpLogStore whose appends fail while ``down`` (an injected outage); reads work."""

    def __init__(self, root: Path) -> None:
        self.inner = FileOpLogStore(root)
        self.down = False

    def append_batch(self, batch) -> None:
        if self.down:
            raise OpLogStoreUnavailable("injected store outage")
        self.inner.append_batch(batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def canonical(m: MasterService) -> dict:
    """Complete objects minus deadlines and readability: what the oplog carries."""
    t = m.export_state()
    reps: dict[int, list] = {}
    for r in t.replicas.to_pylist():
        if r["status"] == 3:
            reps.setdefault(r["object_index"], []).append((r["replica_id"], r["segment"], r["offset"], r["size"]))
    return {(o["tenant"], o["key"]): (o["size_bytes"], o["hard_pinned"], tuple(sorted(reps.get(i, []))))
            for i, o in enumerate(t.objects.to_pylist()) if not o["processing"]}


class Failover(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.root = Path(tempfile.mkdtemp(prefix="ha-sm-"))
        self.clocks = ManualClocks()
        self.config = MasterConfig(default_kv_lease_ttl_ms=1_000, oplog_admission_timeout_ms=0)
        self.store = FlakyStore(self.root)
        self.writer = OpLogWriter(self.store, window=WINDOW, max_batch_entries=4, clocks=self.clocks)
        self.p = MasterService(self.config, clocks=self.clocks, journal=self.writer)
        self.p.mount_segment(SEG["name"], endpoint=SEG["endpoint"], client_id="c0", base=SEG["base"],
                             size=SEG["size"])
        self.standby = self._new_standby()
        self.promotions = 0

    def _new_standby(self) -> StandbyService:
        return StandbyService(FlakyStore(self.root), config=self.config, clocks=self.clocks,
                              sleep=lambda s: self.clocks.advance(s=s))

    def _in_flight(self, keys) -> set[str]:
        return {k for k in keys if self.p.object_info(k).processing} if keys else set()

    def _check_refused_put_ends(self, keys, codes, in_flight: set[str]) -> None:
        first: dict[str, int] = {}
        for key, code in zip(keys, codes):  # a key named twice completes at its first position
            first.setdefault(key, int(code))
        for key, code in first.items():
            if code == ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS and key in in_flight:
                assert self.p.object_info(key).processing  # refused: never visible

    @rule(key=st.sampled_from(KEYS), size=st.integers(1, 2048), hard=st.booleans())
    def put(self, key, size, hard):
        try:
            self.p.put_start(key, size, client_id="c0", config=ReplicateConfig(hard_pin=hard))
        except MooncakeError:
            return
        try:
            self.p.put_end(key, client_id="c0")
        except UnavailableInCurrentStatus:
            self._check_refused_put_ends([key], [ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS], {key})

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=12), size=st.integers(1, 1024))
    def batch_put(self, keys, size):
        started = self.p.batch_put_start(keys, np.full(len(keys), size), client_id="c0").codes
        in_flight = self._in_flight([k for k, c in zip(keys, started) if c == 0])
        codes = self.p.batch_put_end(keys, client_id="c0").codes
        self._check_refused_put_ends(keys, codes, in_flight)

    @rule(key=st.sampled_from(KEYS))
    def retry_put_end(self, key):
        try:
            self.p.put_end(key, client_id="c0")
        except MooncakeError:
            pass

    @rule(key=st.sampled_from(KEYS), force=st.booleans())
    def remove(self, key, force):
        try:
            self.p.remove(key, force=force)
        except MooncakeError:
            pass

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=12))
    def batch_remove(self, keys):
        self.p.batch_remove(keys, force=True)

    @rule(ratio=st.sampled_from([0.2, 1.0]))
    def evict(self, ratio):
        self.p.evict(target=ratio)

    @rule(ms=st.integers(0, 3_000))
    def advance(self, ms):
        self.clocks.advance(ms=ms)

    @rule(down=st.booleans())
    def outage(self, down):
        self.store.down = down

    @rule()
    def flush(self):
        try:
            self.writer.flush()
        except OpLogStoreUnavailable:
            pass

    @rule()
    def flush_while_a_call_holds_the_lock(self):
        """The durable callbacks find the master lock busy: the next call that may mutate frees
        their removals (MasterLock.run_or_defer)."""
        errors: list[BaseException] = []

        def flush() -> None:
            try:
                self.flush()
            except BaseException as e:  # noqa: BLE001 - reported below, in the test's thread
                errors.append(e)
        with self.p.lock:
            writer_thread = threading.Thread(target=flush)
            writer_thread.start()
            writer_thread.join(30)
        assert not writer_thread.is_alive() and not errors, errors

    @rule()
    def tick(self):
        self.p.tick()

    @rule()
    def poll(self):
        self.standby.poll()

    @rule(heal=st.booleans())
    def kill_and_promote(self, heal):
        if heal:  # the log recovers before the primary dies: everything acknowledged is durable
            self.store.down = False
            self.writer.flush()
            expected = canonical(self.p)
        else:     # the primary dies with whatever tail was not durable
            replay = MasterService(self.config, clocks=self.clocks)
            for batch in self.store.inner.read_batches(0):
                apply_batch(replay, batch)
            expected = canonical(replay)
        promoted = self.standby.promote(timeout_s=1.0, journal_window=WINDOW)
        assert canonical(promoted) == expected
        promoted.verify()
        promoted.remount_segments("c0", [SEG])
        promoted.verify()
        self.p, self.writer = promoted, promoted.journal.writer
        self.store = FlakyStore(self.root)  # the new primary's own handle (it claimed the new view)
        self.store.inner = promoted.journal.writer.store
        self.writer.store = self.store
        self.standby = self._new_standby()
        self.promotions += 1

    def teardown(self):
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)

    @invariant()
    def self_checks_pass(self):
        if hasattr(self, "p"):
            self.p.verify()


Failover.TestCase.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
test_failover_state_machine_promoted_master_equals_the_durable_view = Failover.TestCase
