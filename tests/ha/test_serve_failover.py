"""`serve --enable_ha` failing over under the real upstream client.

Three ``mooncake-columnar serve`` candidates share one etcd and one cluster id for the whole
module; a writer client (it owns the segment) and a reader client (no segment, reads cross the TCP
transport) reach the leader through ``etcd://``. Each test stops the leader in the middle of a
workload (failover_round in mooncake_columnar/testing/ha_cluster.py) and reads everything back:
acknowledged puts byte-exact, removed keys still gone, unacknowledged puts whole or absent.
Before each round every stopped candidate is restarted (in the background) and at least one
standby follows the leader and has caught up (its first poll replays the whole oplog); the SIGTERM
timing round waits for all of them, so no start-up competes with it for the cores.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import pytest

from mooncake_columnar.clock import MonotonicClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.ha import standby as standby_module
from mooncake_columnar.ha.leader import LeaderElection
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.master import MasterService
from mooncake_columnar.metrics import Metrics
from mooncake_columnar.server.leadership import LEADER_LEASE_TTL_S, Leadership
from mooncake_columnar.testing.client_driver import ClientDriverError, RealClient
from mooncake_columnar.testing.etcd_server import EtcdServer
from mooncake_columnar.testing.ha_cluster import (
    FOLLOW_MARKERS,
    Expected,
    FailoverOutcome,
    HaCluster,
    StopHow,
    failover_round,
    host_port,
    scrape_value,
    verify,
    wait_settled,
    wait_standby_ready,
)
from mooncake_columnar.testing.upstream_wheel import MasterStartError, skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

MASTERS = 3
LEASE_TTL_MS = 2000
RECOVERY_TTL_MS = 5000  # longer than the read lease, so a refused remove right after a remount is the recovery's
FLAGS = (f"--default_kv_lease_ttl={LEASE_TTL_MS}", f"--recovery_kv_lease_ttl={RECOVERY_TTL_MS}")
OBJECTS = 150
STANDBY_WAIT_S = 90.0
OBJECT_HAS_LEASE = -706  # the client's code for a remove refused while a lease holds the object


@pytest.fixture(scope="module")
def cluster(etcd: EtcdServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HaCluster]:
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    ha = HaCluster("serve", MASTERS, etcd.endpoint, "failover-tests", tmp_path_factory.mktemp("ha-serve"), FLAGS,
                   etcd=etcd)
    try:
        ha.start()
    except (MasterStartError, TimeoutError) as exc:
        pytest.fail(f"cannot start the serve HA cluster: {exc}", pytrace=False)
    yield ha
    ha.stop()


@pytest.fixture(scope="module")
def clients(cluster: HaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealClient, RealClient]]:
    log_dir = tmp_path_factory.mktemp("ha-clients")
    writer = RealClient(cluster.master_address(), cluster.metadata_url, env=cluster.client_env(),
                        segment_bytes=64 << 20, buffer_bytes=32 << 20, log_dir=log_dir, name="writer")
    reader = RealClient(cluster.master_address(), cluster.metadata_url, env=cluster.client_env(),
                        segment_bytes=0, buffer_bytes=32 << 20, memcpy=False, log_dir=log_dir, name="reader")
    try:
        writer.start()
        reader.start()
    except ClientDriverError as exc:
        writer.kill()
        pytest.fail(f"real client could not set up through {cluster.master_address()}: {exc}", pytrace=False)
    yield writer, reader
    for c in (writer, reader):
        c.close(unmount=False)  # the masters stop right after


@pytest.fixture(scope="module")
def kill9_first_gets() -> list[float]:
    """Seconds from SIGKILL to the first successful get, of every kill -9 round in this module."""
    return []


_rounds = iter(range(1 << 30))


def run_round(cluster: HaCluster, clients: tuple[RealClient, RealClient], how: StopHow, seed: int, *,
              objects: int = OBJECTS, standbys: int = 1, during_stop: Callable[[], None] | None = None,
              after_first_get: Callable[[Expected], None] | None = None) -> FailoverOutcome:
    """One failover round once ``standbys`` candidates follow the leader and have caught up (every
    stopped one is restarted first); fails with the masters' and clients' logs on error."""
    if standbys:
        wait_standby_ready(cluster, standbys, STANDBY_WAIT_S, settle=True)
    writer, reader = clients
    try:
        outcome = failover_round(cluster, writer, reader, how=how, seed=seed, prefix=f"r{next(_rounds)}-s{seed}",
                                 objects=objects, during_stop=during_stop, after_first_get=after_first_get)
    except (RuntimeError, TimeoutError, ClientDriverError) as exc:
        pytest.fail(f"{how} round failed: {exc}\n{diagnostics(cluster, clients)}", pytrace=False)
    print(outcome.summary())
    return outcome


def diagnostics(cluster: HaCluster, clients: tuple[RealClient, RealClient]) -> str:
    parts = [f"--- {m.name} (alive={m.alive()}):\n{m.log_text(3000)}" for m in cluster.masters]
    parts += [f"--- client {c.name}:\n{c.stderr_text(2000)}" for c in clients]
    return "\n".join(parts)


def assert_intact(outcome: FailoverOutcome) -> None:
    v = outcome.verdict
    assert not v.lost, f"acknowledged puts lost: {v.lost[:10]} ({outcome.summary()})"
    assert not v.corrupt, f"objects read back neither whole nor absent: {v.corrupt[:10]} ({outcome.summary()})"
    assert not v.resurrected, f"removed keys readable again: {v.resurrected[:10]} ({outcome.summary()})"
    assert outcome.remove_failures == 0, outcome.summary()
    assert v.kept == len(outcome.expected.values) - len(outcome.expected.removed)
    assert outcome.acknowledged_after >= 1, f"the client never wrote again after the {outcome.how}"


def single_leader_serves(cluster: HaCluster) -> list[str]:
    """Names of the masters whose RPC port accepts; one, the key's holder, when all is well."""
    return [m.name for m in cluster.masters if m.serving()]


@pytest.mark.parametrize("seed,objects", [(11, OBJECTS), (23, 100)], ids=["seed11-150-objects", "seed23-100-objects"])
def test_kill9_mid_workload_keeps_acknowledged_puts_and_removes(cluster, clients, kill9_first_gets, seed, objects):
    outcome = run_round(cluster, clients, "kill9", seed, objects=objects)
    assert_intact(outcome)
    assert outcome.new_leader != outcome.old_leader
    kill9_first_gets.append(outcome.first_get_seconds)


def test_sigterm_hands_over_faster_than_kill9(cluster, clients, kill9_first_gets, record_property):
    if not kill9_first_gets:  # run alone: measure the kill -9 figure it is compared with
        kill9_first_gets.append(run_round(cluster, clients, "kill9", 31).first_get_seconds)
    outcome = run_round(cluster, clients, "sigterm", 37, standbys=MASTERS - 1)
    assert_intact(outcome)
    record_property("sigterm_first_get_seconds", round(outcome.first_get_seconds, 3))
    record_property("kill9_first_get_seconds", [round(s, 3) for s in kill9_first_gets])
    print(f"first successful get: SIGTERM {outcome.first_get_seconds:.2f} s, kill -9 {kill9_first_gets}")
    assert outcome.first_get_seconds < min(kill9_first_gets), \
        f"SIGTERM hand-over {outcome.first_get_seconds:.2f} s is not faster than kill -9 {kill9_first_gets}"


def test_etcd_paused_during_kill9_failover_loses_no_acknowledged_put(cluster, clients):
    def outage() -> None:
        cluster.pause_etcd()
        try:
            time.sleep(1.5)  # the outage itself: etcd frozen this long while the leader is gone
        finally:
            cluster.resume_etcd()

    outcome = run_round(cluster, clients, "kill9", 41, during_stop=outage)
    assert_intact(outcome)
    leader = cluster.wait_for_leader(10.0)
    assert single_leader_serves(cluster) == [leader.name]


def test_remount_shows_visible_recovery_ttl_and_protects_recovered_objects(cluster, clients):
    _, reader = clients
    refused: dict[str, int] = {}

    def try_remove(expected: Expected) -> None:
        # right after the remount, inside the recovery lease: an object nobody read since must hold
        key = next(k for k in reversed(list(expected.values)) if k not in expected.removed)
        refused[key] = reader.remove(key)

    outcome = run_round(cluster, clients, "sigterm", 43, objects=100, after_first_get=try_remove)
    assert_intact(outcome)  # the refused remove's object among them: still readable, byte-exact
    assert list(refused.values()) == [OBJECT_HAS_LEASE], f"remove inside the recovery lease answered {refused}"
    scrape = cluster.named(outcome.new_leader).scrape()
    remount_lines = [line for line in scrape.splitlines() if "remount" in line and not line.startswith("#")]
    effective = scrape_value(scrape, "mooncake_remount_effective_recovery_ttl_ms")
    visible = scrape_value(scrape, "mooncake_remount_visible_ttl_ms")
    matched = scrape_value(scrape, "mooncake_remount_matched_objects_total")
    print("\n".join(remount_lines))
    assert effective == RECOVERY_TTL_MS, remount_lines
    assert visible is not None and visible >= 0.99 * RECOVERY_TTL_MS, remount_lines
    acknowledged_live = outcome.acknowledged - outcome.removed
    assert matched is not None and matched >= acknowledged_live, (acknowledged_live, remount_lines)


def test_restarted_old_leader_follows_then_takes_over_on_sigterm(cluster, clients):
    _, reader = clients
    first = run_round(cluster, clients, "kill9", 53)
    assert_intact(first)
    old, current = cluster.named(first.old_leader), cluster.named(first.new_leader)
    cluster.restart(old)
    cluster.wait_standby(old, STANDBY_WAIT_S, FOLLOW_MARKERS["serve"])
    wait_settled([old], STANDBY_WAIT_S)  # its first poll replays the whole oplog
    assert cluster.leader() is current, f"master_view names {cluster.leader_address()} after {old.name} came back"
    assert not old.serving(), f"{old.name} opened its RPC port as a follower"
    assert single_leader_serves(cluster) == [current.name]

    # leave the restarted master the only candidate, so the hand-over can only go to it
    others = [m for m in cluster.masters if m is not old and m is not current]
    for m in others:
        m.stop()
    second = run_round(cluster, clients, "sigterm", 59, objects=100, standbys=0)
    assert_intact(second)
    assert second.new_leader == old.name, f"SIGTERM of {current.name} handed over to {second.new_leader}"
    both = Expected()
    both.merge(first.expected)
    both.merge(second.expected)
    again = verify(reader, both)
    assert again.intact and again.kept == len(both.values) - len(both.removed), \
        f"after two failovers: lost {again.lost[:5]}, corrupt {again.corrupt[:5]}, resurrected {again.resurrected[:5]}"


def test_a_winner_keeps_its_lease_while_its_follower_thread_stops(etcd: EtcdServer,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    original_stop = standby_module.StandbyService.stop

    def slow_stop(self: standby_module.StandbyService) -> None:
        original_stop(self)
        time.sleep(LEADER_LEASE_TTL_S + 0.5)  # the injected fault: a poll (a big batch, a slow read) this long

    monkeypatch.setattr(standby_module.StandbyService, "stop", slow_stop)
    monkeypatch.setattr(standby_module, "warm_up", lambda: None, raising=False)  # kernels are not under test
    lease_at_lead: list[bool] = []
    led = threading.Event()

    def on_lead(master: MasterService, journal: OpLogWriter, election: LeaderElection) -> None:
        lease_at_lead.append(election.lease_valid())
        led.set()

    leadership = Leadership(etcd_endpoint=host_port(etcd.endpoint), cluster_id="slow-follower-stop",
                            candidate_id="127.0.0.1:1", config=MasterConfig(), clocks=MonotonicClocks(),
                            metrics=Metrics(), on_lead=on_lead)
    leadership.start()
    try:
        assert led.wait(60), "the only candidate never led"
    finally:
        leadership.stop()
    assert lease_at_lead[0], "the winner's lease had lapsed before it could serve"
