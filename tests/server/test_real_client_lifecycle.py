"""What a real upstream client lives through over time, against each master kind: puts past the
segment's capacity (eviction at the high watermark), a segment full of leased objects, and a master
restart on the same ports (NEED_REMOUNT, then the client remounts by itself).

The eviction scenario runs once per master and its outcome is cached, so the per-master tests and
the upstream/serve comparison share one master and one client per kind. A client that stops pinging
is covered by the SIGKILL test in test_real_client.py.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_columnar.errors import ErrorCode
from mooncake_columnar.testing.client_driver import RealClient, SeededValue
from mooncake_columnar.testing.upstream_wheel import (
    MASTER_KINDS,
    MasterKind,
    MasterProcess,
    skip_reason,
)

from .conftest import require_kind, start_client, start_master

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

OK = int(ErrorCode.OK)
NO_HANDLE = int(ErrorCode.NO_AVAILABLE_HANDLE)  # -200
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)  # -704

MiB = 1 << 20
SEGMENT_BYTES = 16 * MiB
BUFFER_BYTES = 16 * MiB
OBJECT_BYTES = 1 * MiB
SLOTS = SEGMENT_BYTES // OBJECT_BYTES  # 16: the most objects the segment can hold
PUTS = 40  # 2.5 segments' worth
OLDEST_GONE = 8  # eviction is near-LRU, so the first puts must have made room for the last ones
NEWEST_KEPT = 4
# A read lease that outlives the whole scenario: a leased object must never be evicted.
LONG_LEASE_FLAGS: tuple[str, ...] = ("--default_kv_lease_ttl=60000", "--client_ttl=10")
# Upstream answers a put that finds the segment full before its 10 ms eviction pass with -200, and the
# retry after the pass succeeds; this is how long a put keeps retrying before the failure counts.
PUT_RETRY_S = 0.5
RETRY_INTERVAL_S = 0.02


def put_retrying(client: RealClient, key: str, value: SeededValue, timeout_s: float = PUT_RETRY_S) -> list[int]:
    """Every code ``put`` returned, retrying NO_AVAILABLE_HANDLE until success or ``timeout_s``."""
    codes = [client.put(key, value)]
    deadline = time.monotonic() + timeout_s
    while codes[-1] == NO_HANDLE and time.monotonic() < deadline:
        time.sleep(RETRY_INTERVAL_S)
        codes.append(client.put(key, value))
    return codes


def unleased_value(i: int) -> SeededValue:
    return SeededValue(i, OBJECT_BYTES)


def leased_value(i: int) -> SeededValue:
    return SeededValue(1000 + i, OBJECT_BYTES)


@dataclass
class EvictionRun:
    """What one master did in the eviction scenario."""
    kind: MasterKind
    # unleased phase: index -> every code its put returned (the last one is the outcome)
    put_codes: dict[int, list[int]] = field(default_factory=dict)
    kept: list[int] = field(default_factory=list)  # indices that still existed after the last put
    mismatched: list[int] = field(default_factory=list)  # kept, but the bytes read back differ
    # leased phase: put then read at once
    leased: list[int] = field(default_factory=list)  # put and read back byte-exact
    lost_before_read: list[int] = field(default_factory=list)  # put OK, evicted before the read reached it
    wrong_bytes: list[int] = field(default_factory=list)  # put OK, read back other bytes
    full_codes: list[int] = field(default_factory=list)  # codes of the put that found everything leased
    leased_exist_after: list[int] = field(default_factory=list)
    leased_mismatched_after: list[int] = field(default_factory=list)
    put_after_force_remove: list[int] = field(default_factory=list)

    @property
    def first_try_failures(self) -> dict[int, int]:
        return {i: codes[0] for i, codes in self.put_codes.items() if codes[0] != OK}

    @property
    def failed_puts(self) -> dict[int, int]:
        return {i: codes[-1] for i, codes in self.put_codes.items() if codes[-1] != OK}

    def summary(self) -> str:
        return (f"{self.kind}: kept {len(self.kept)} of {PUTS} (indices {self.kept}), "
                f"first-try put failures {self.first_try_failures}, failed puts {self.failed_puts}; "
                f"leased phase: {len(self.leased)} leased, lost before read {self.lost_before_read}, "
                f"wrong bytes {self.wrong_bytes + self.leased_mismatched_after}, "
                f"full-segment codes {sorted(set(self.full_codes))}")


def run_eviction(client: RealClient, kind: MasterKind) -> EvictionRun:
    run = EvictionRun(kind)
    keys = [f"unleased/{i}" for i in range(PUTS)]
    for i, key in enumerate(keys):
        run.put_codes[i] = put_retrying(client, key, unleased_value(i))
    # batch_is_exist leases what it finds, so the census and the reads below see one stable set.
    present = client.batch_is_exist(keys)
    run.kept = [i for i, rc in enumerate(present) if rc == 1]
    run.mismatched = [i for i in run.kept if not client.get(keys[i]).matches(unleased_value(i))]
    client.remove_all(force=True)

    for i in range(PUTS):
        key, value = f"leased/{i}", leased_value(i)
        codes = put_retrying(client, key, value)
        if codes[-1] != OK:
            run.full_codes = codes
            break
        # The master may evict the object between its put and this read (it is unleased until read).
        read = client.get(key)
        if read.matches(value):
            run.leased.append(i)
        elif read.size == 0:
            run.lost_before_read.append(i)
        else:
            run.wrong_bytes.append(i)
    leased_keys = [f"leased/{i}" for i in run.leased]
    run.leased_exist_after = client.batch_is_exist(leased_keys)
    run.leased_mismatched_after = [i for i in run.leased
                                   if not client.get(f"leased/{i}").matches(leased_value(i))]
    if leased_keys:
        client.remove(leased_keys[0], force=True)
        run.put_after_force_remove = put_retrying(client, "leased/after-remove", leased_value(PUTS))
    return run


class EvictionRecorder:
    """Runs the eviction scenario at most once per master kind, on its own master and client."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._runs: dict[MasterKind, EvictionRun] = {}

    def run(self, kind: MasterKind) -> EvictionRun:
        if kind not in self._runs:
            master = start_master(kind, self._tmp / f"master-{kind}", LONG_LEASE_FLAGS)
            try:
                client = start_client(master, self._tmp / f"client-{kind}", f"evict-{kind}",
                                      segment_bytes=SEGMENT_BYTES, buffer_bytes=BUFFER_BYTES)
                try:
                    self._runs[kind] = run_eviction(client, kind)
                finally:
                    client.close(unmount=False)  # the master stops next
            finally:
                master.stop()
        return self._runs[kind]


@pytest.fixture(scope="module")
def eviction(tmp_path_factory: pytest.TempPathFactory) -> EvictionRecorder:
    return EvictionRecorder(tmp_path_factory.mktemp("eviction"))


def test_puts_past_the_segment_all_succeed_by_evicting_the_oldest_unleased_objects(
        eviction: EvictionRecorder, master_kind: MasterKind) -> None:
    run = eviction.run(master_kind)
    assert not run.failed_puts, f"puts still failing after {PUT_RETRY_S} s of retries: {run.summary()}"
    assert set(run.first_try_failures.values()) <= {NO_HANDLE}, run.summary()
    assert 0 < len(run.kept) <= SLOTS, run.summary()
    assert len(run.kept) >= SLOTS // 2, f"eviction freed far more than the watermark asks: {run.summary()}"
    assert set(range(PUTS - NEWEST_KEPT, PUTS)) <= set(run.kept), f"newest objects evicted: {run.summary()}"
    assert not set(range(OLDEST_GONE)) & set(run.kept), f"oldest objects kept: {run.summary()}"
    assert not run.mismatched, f"kept objects read back wrong bytes: {run.mismatched}; {run.summary()}"


def test_puts_fail_with_no_available_handle_once_every_object_is_leased(
        eviction: EvictionRecorder, master_kind: MasterKind) -> None:
    run = eviction.run(master_kind)
    assert run.full_codes, f"every put succeeded although each object was leased: {run.summary()}"
    assert set(run.full_codes) == {NO_HANDLE}, run.summary()
    # Only leased objects fill the segment when the put fails for good: one per slot.
    assert len(run.leased) == SLOTS, run.summary()
    assert run.leased_exist_after == [1] * len(run.leased), f"a leased object was evicted: {run.summary()}"
    assert not run.wrong_bytes and not run.leased_mismatched_after, run.summary()
    assert run.put_after_force_remove[-1:] == [OK], f"no room after a force remove: {run.put_after_force_remove}"


def test_serve_evicts_like_upstream(eviction: EvictionRecorder) -> None:
    assert "serve" in MASTER_KINDS
    upstream = eviction.run(require_kind("upstream"))
    serve = eviction.run(require_kind("serve"))
    report = f"\n  {upstream.summary()}\n  {serve.summary()}"
    assert not upstream.failed_puts and not serve.failed_puts, report
    assert set(serve.full_codes) == set(upstream.full_codes), report


# -- restart ---------------------------------------------------------------------------------------
def restart_on_same_ports(old: MasterProcess, log_dir: Path, flags: tuple[str, ...]) -> MasterProcess:
    """A new master of the same kind on ``old``'s rpc, metadata and metrics ports."""
    ports = (f"--rpc_port={old.rpc_port}", f"--http_metadata_server_port={old.http_metadata_port}",
             f"--metrics_port={old.metrics_port}")
    master = start_master(old.kind, log_dir, (*flags, *ports))
    assert (master.rpc_port, master.http_metadata_port) == (old.rpc_port, old.http_metadata_port)
    return master


RESTART_FLAGS: tuple[str, ...] = ("--default_kv_lease_ttl=2000", "--client_ttl=10")
RECOVERY_S = 20.0


@pytest.fixture
def restart_masters() -> Iterator[list[MasterProcess]]:
    masters: list[MasterProcess] = []
    yield masters
    for master in masters:
        master.stop()


def test_client_remounts_by_itself_after_a_master_restart_and_old_keys_are_gone(
        master_kind: MasterKind, tmp_path: Path, restart_masters: list[MasterProcess]) -> None:
    first = start_master(master_kind, tmp_path / "first", RESTART_FLAGS)
    restart_masters.append(first)
    owner = start_client(first, tmp_path, "owner", segment_bytes=SEGMENT_BYTES, buffer_bytes=BUFFER_BYTES)
    # No segment of its own and no memcpy: its reads cross the TCP transport into the owner's segment.
    reader = start_client(first, tmp_path, "reader", segment_bytes=0, buffer_bytes=BUFFER_BYTES, memcpy=False)
    late_reader: RealClient | None = None
    try:
        old_keys = [f"before/{i}" for i in range(3)]
        for i, key in enumerate(old_keys):
            assert owner.put(key, SeededValue(i, 1000)) == OK
        assert reader.get(old_keys[0]).matches(SeededValue(0, 1000))

        assert first.stop() == 0, f"SIGTERM did not stop the {master_kind} master cleanly"
        second = restart_on_same_ports(first, tmp_path / "second", RESTART_FLAGS)
        restart_masters.append(second)

        # The owner's ping now answers NEED_REMOUNT (or fails and reconnects); it remounts its segment
        # and puts work again without anything done on the client side.
        new = SeededValue(100, 4000)
        codes: list[int] = []

        def put_new(client: RealClient) -> bool:
            codes.append(client.put("after/0", new))
            return codes[-1] == OK

        recovered = owner.wait_until(put_new, timeout_s=RECOVERY_S, interval_s=0.25)
        assert recovered, f"owner could not put {RECOVERY_S:.0f} s after the restart: codes {codes}"
        assert owner.get("after/0").matches(new)
        # Nothing is persisted across the restart.
        assert owner.batch_is_exist(old_keys) == [0, 0, 0]
        assert owner.get_size(old_keys[0]) == NOT_FOUND

        # The segment-less client reconnects too and reads the owner's segment across processes.
        assert reader.wait_until(lambda c: c.get("after/0").matches(new), timeout_s=RECOVERY_S, interval_s=0.25), \
            f"reader cannot read the owner's new object after the restart\n{second.stderr_text()}"
        from_reader = SeededValue(101, 3000)
        assert reader.wait_until(lambda c: put_retrying(c, "after/reader", from_reader)[-1] == OK,
                                 timeout_s=RECOVERY_S, interval_s=0.25)
        assert owner.get("after/reader").matches(from_reader)
        # A client that first connects after the restart needs the owner's segment descriptor from the
        # new master's metadata server: the owner must have published it again.
        late_reader = start_client(second, tmp_path, "late-reader", segment_bytes=0, buffer_bytes=BUFFER_BYTES,
                                   memcpy=False)
        assert late_reader.get("after/0").matches(new)
    finally:
        for client in (late_reader, reader, owner):
            if client is not None:
                client.close(unmount=False)  # the masters stop next


# -- restart from a snapshot -----------------------------------------------------------------------
SNAPSHOT_FLAGS: tuple[str, ...] = (*RESTART_FLAGS, "--enable_snapshot=true", "--snapshot_interval_seconds=60",
                                   "--snapshot_object_store_type=local", "--enable_snapshot_restore=true")


def test_serve_restarted_from_its_snapshot_keeps_every_object_and_the_client_remounts(
        tmp_path: Path, restart_masters: list[MasterProcess]) -> None:
    require_kind("serve")
    env = {**os.environ, "MOONCAKE_SNAPSHOT_LOCAL_PATH": str(tmp_path / "snapshots")}
    first = MasterProcess("serve", SNAPSHOT_FLAGS, log_dir=tmp_path / "first", env=env).start()
    restart_masters.append(first)
    owner = start_client(first, tmp_path, "owner", segment_bytes=SEGMENT_BYTES, buffer_bytes=BUFFER_BYTES)
    try:
        keys = [f"kept/{i}" for i in range(50)]
        for i, key in enumerate(keys):
            assert owner.put(key, SeededValue(i, 500 + i)) == OK
        assert owner.get(keys[0]).matches(SeededValue(0, 500))
        # SIGTERM: the port closes, then a last snapshot; the restart restores it (leases mapped)
        assert first.stop() == 0
        ports = (f"--rpc_port={first.rpc_port}", f"--http_metadata_server_port={first.http_metadata_port}",
                 f"--metrics_port={first.metrics_port}")
        second = MasterProcess("serve", (*SNAPSHOT_FLAGS, *ports), log_dir=tmp_path / "second", env=env).start()
        restart_masters.append(second)
        assert "restored snapshot" in second.stderr_text()
        assert owner.wait_until(lambda c: c.get(keys[1]).matches(SeededValue(1, 501)), timeout_s=RECOVERY_S,
                                interval_s=0.25), f"no read after the restart\n{second.stderr_text()}"
        assert all(owner.get(k).matches(SeededValue(i, 500 + i)) for i, k in enumerate(keys))
        assert owner.put("after/0", SeededValue(99, 100)) == OK
    finally:
        owner.close(unmount=False)
