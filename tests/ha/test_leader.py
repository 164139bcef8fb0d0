"""Leadership over a real etcd: one winner, takeover after revocation, warmup, loss callbacks."""
from __future__ import annotations

import itertools
import os

import pytest

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.errors import FencedWrite, InvalidParams
from mooncake_columnar.ha.leader import LeaderElection
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogEntry, OpType
from mooncake_columnar.ha.stores import EtcdOpLogStore, b64
from mooncake_columnar.testing.etcd_server import EtcdServer


_clusters = itertools.count()


@pytest.fixture
def cluster() -> str:
    return f"lead{os.getpid()}-{next(_clusters)}"


class Lost:
    def __init__(self) -> None:
        self.reasons: list[str] = []

    def __call__(self, reason: str) -> None:
        self.reasons.append(reason)


def candidate(etcd: EtcdServer, cluster: str, name: str, clocks: ManualClocks, lost: Lost | None = None,
              ttl: int = 5) -> LeaderElection:
    return LeaderElection(etcd.endpoint, cluster, name, lease_ttl_s=ttl, clocks=clocks, on_lost=lost)


def test_two_candidates_one_wins_the_other_waits(etcd: EtcdServer, cluster: str) -> None:
    clocks = ManualClocks()
    a, b = candidate(etcd, cluster, "a:1", clocks), candidate(etcd, cluster, "b:1", clocks)
    assert a.campaign() is True
    assert b.campaign() is False
    assert a.is_leader and not b.is_leader
    assert b.current_leader() == ("a:1", a.view_version)
    assert a.campaign() is True  # idempotent for the holder
    assert a.keepalive() is True
    assert b.keepalive() is False  # not a leader: nothing to keep


def test_revoking_the_winners_lease_lets_the_other_win_with_a_newer_view(etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a, b = candidate(etcd, cluster, "a:1", clocks, lost), candidate(etcd, cluster, "b:1", clocks)
    assert a.campaign() and not b.campaign()
    a._post("/v3/lease/revoke", {"ID": a._lease_id})  # what lease expiry does, without waiting for it
    assert b.campaign() is True
    assert b.view_version > a.view_version  # the producer view grows with each leader
    assert a.keepalive() is False
    assert len(lost.reasons) == 1 and "lease" in lost.reasons[0]
    assert not a.is_leader
    assert a.keepalive() is False and len(lost.reasons) == 1  # reported once


def test_warmup_waits_one_lease_ttl_on_the_injected_steady_clock(etcd: EtcdServer, cluster: str) -> None:
    clocks = ManualClocks()
    a = candidate(etcd, cluster, "a:1", clocks, ttl=5)
    assert not a.ready()
    assert a.campaign()
    assert not a.ready()
    clocks.advance(3 * NS_PER_S)
    assert a.keepalive()  # the keepalive thread renews during the warmup (every TTL / 3)
    clocks.advance(2 * NS_PER_S - 1)
    assert not a.ready()
    clocks.advance(1)
    assert a.ready()
    a.resign()
    assert not a.ready()


def test_a_stalled_leader_expires_locally_one_safety_margin_before_the_etcd_lease(
        etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a = candidate(etcd, cluster, "a:1", clocks, lost, ttl=5)  # default margin: TTL / 5 = 1 s
    assert a.campaign()
    clocks.advance(3 * NS_PER_S)
    assert a.keepalive() and a.is_leader
    clocks.advance(4 * NS_PER_S - 1)  # 1 ns before renewal + TTL - margin: still leading
    assert a.is_leader and a.ready()
    clocks.advance(1)  # no renewal since: it stops leading before etcd could hand the key over
    assert not a.is_leader and not a.ready()
    assert len(lost.reasons) == 1 and "local expiry" in lost.reasons[0]
    assert not a.is_leader and a.keepalive() is False and len(lost.reasons) == 1  # called once
    with pytest.raises(InvalidParams):
        LeaderElection(etcd.endpoint, cluster, "b:1", lease_ttl_s=1, clocks=clocks, safety_margin_ms=1000)


def test_key_taken_by_another_holder_calls_on_lost(etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a, b = candidate(etcd, cluster, "a:1", clocks, lost), candidate(etcd, cluster, "b:1", clocks)
    assert a.campaign()
    # An operator (or a split brain) deletes the key; another candidate creates it.
    a._post("/v3/kv/deleterange", {"key": b64(a.key)})
    assert b.campaign()
    assert a.keepalive() is False
    assert lost.reasons == ["master_view key is held by another leader"]


def test_key_gone_calls_on_lost(etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a = candidate(etcd, cluster, "a:1", clocks, lost)
    assert a.campaign()
    a._post("/v3/kv/deleterange", {"key": b64(a.key)})
    assert a.keepalive() is False
    assert lost.reasons == ["master_view key is gone"]


def test_unreachable_etcd_is_loss_of_leadership(etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a = candidate(etcd, cluster, "a:1", clocks, lost)
    assert a.campaign()
    a._etcd.endpoint = "http://127.0.0.1:9"  # discard port: connection refused
    assert a.keepalive() is False
    assert lost.reasons and lost.reasons[0].startswith("keepalive failed")


def test_resign_frees_the_key_without_on_lost(etcd: EtcdServer, cluster: str) -> None:
    clocks, lost = ManualClocks(), Lost()
    a, b = candidate(etcd, cluster, "a:1", clocks, lost), candidate(etcd, cluster, "b:1", clocks)
    assert a.campaign()
    a.resign()
    assert b.campaign()
    assert lost.reasons == []
    assert b.current_leader() == ("b:1", b.view_version)


def test_view_version_fences_the_deposed_primarys_oplog_writes(etcd: EtcdServer, cluster: str) -> None:
    clocks = ManualClocks()
    a, b = candidate(etcd, cluster, "a:1", clocks), candidate(etcd, cluster, "b:1", clocks)
    assert a.campaign()
    old = EtcdOpLogStore(etcd.endpoint, cluster)
    old.set_producer_view(a.view_version)
    old.append_batch(OpLogBatch(1, (OpLogEntry(1, OpType.REMOVE, "default", "k1"),)))
    a.resign()
    assert b.campaign()
    new = EtcdOpLogStore(etcd.endpoint, cluster)
    new.set_producer_view(b.view_version)
    with pytest.raises(FencedWrite):
        old.append_batch(OpLogBatch(2, (OpLogEntry(2, OpType.REMOVE, "default", "k2"),)))
    new.append_batch(OpLogBatch(2, (OpLogEntry(2, OpType.REMOVE, "default", "k2"),)))
    assert new.durable_prefix() == 2


def test_bad_arguments(etcd: EtcdServer, cluster: str) -> None:
    with pytest.raises(InvalidParams):
        LeaderElection(etcd.endpoint, cluster, "", clocks=ManualClocks())
    with pytest.raises(InvalidParams):
        LeaderElection(etcd.endpoint, cluster, "a", lease_ttl_s=0, clocks=ManualClocks())
    with pytest.raises(InvalidParams):
        LeaderElection(etcd.endpoint, "bad/cluster id", "a", clocks=ManualClocks())
