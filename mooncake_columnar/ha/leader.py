"""Leadership over etcd: a lease-backed ``master_view`` key, warmup, loss detection.

Upstream's protocol (``upstream-ha.md`` 2.1, 3.2): a candidate grants an etcd lease and creates
``mooncake-store/<cluster>/master_view`` = its address with that lease in ONE txn guarded by
``create_revision == 0``, so at most one candidate holds the key. The key's create revision is the
view version: it grows with every new leader, which makes it the producer view the new primary
claims in the oplog store (fencing the deposed one). After winning, serving waits one lease TTL
(``ready()``), so a previous leader whose lease was still running has lost it before we serve.
A failed keepalive, an expired lease, or the key gone or held by someone else means leadership is
lost: ``on_lost`` is called once, and the embedding stops serving. A leader that cannot renew
(stalled, partitioned) also gives up on its own: each grant or successful keepalive is good until
the steady time it was sent plus the lease TTL minus ``safety_margin_ms``; past that,
``is_leader`` and ``ready()`` are False (and ``on_lost`` runs) without waiting for etcd, so two
leaders never both believe they lead.

Time is read only from the injected clocks (warmup), so tests drive it with ManualClocks; the
optional keepalive thread is the only real-time wait.
"""
from __future__ import annotations

import base64
import logging
import threading
from collections.abc import Callable
from typing import Any

from ..clock import NS_PER_S, Clocks
from ..errors import InvalidParams, OpLogStoreUnavailable
from .stores import EtcdOpLogStore, b64

log = logging.getLogger(__name__)

LostCallback = Callable[[str], None]


class LeaderElection:
    """One candidate's view of the ``master_view`` election of ``cluster_id``."""

    def __init__(self, endpoint: str, cluster_id: str, candidate_id: str, *, lease_ttl_s: int = 5,
                 clocks: Clocks, on_lost: LostCallback | None = None, timeout_s: float = 5.0,
                 safety_margin_ms: int | None = None) -> None:
        if type(lease_ttl_s) is not int or lease_ttl_s < 1:
            raise InvalidParams(f"lease_ttl_s must be a positive int, got {lease_ttl_s!r}")
        if safety_margin_ms is None:
            safety_margin_ms = lease_ttl_s * 1000 // 5
        if type(safety_margin_ms) is not int or not 0 <= safety_margin_ms < lease_ttl_s * 1000:
            raise InvalidParams(f"safety_margin_ms must be an int in [0, lease TTL), got {safety_margin_ms!r}")
        if not isinstance(candidate_id, str) or not candidate_id:
            raise InvalidParams("candidate_id must be a non-empty string")
        # The oplog store's etcd handle is the gateway transport (endpoint normalization, cluster
        # id validation, error mapping): shared with the store rather than copied.
        self._etcd = EtcdOpLogStore(endpoint, cluster_id, timeout_s=timeout_s)
        self.key = f"mooncake-store/{cluster_id.rstrip('/')}/master_view"
        self.candidate_id = candidate_id
        self.lease_ttl_s = lease_ttl_s
        self.safety_margin_ns = safety_margin_ms * (NS_PER_S // 1000)
        self.clocks = clocks
        self.on_lost = on_lost
        self._lock = threading.Lock()
        self._lease_id: str | None = None
        self._granted_ttl_s = 0
        self._won_at_ns = 0
        self._valid_until_ns = 0  # steady time past which our lease may be gone in etcd
        self.view_version = 0  # create revision of our master_view key while we lead
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._etcd._post(path, body)

    @property
    def is_leader(self) -> bool:
        return self._lease_id is not None and not self._expired_locally()

    def lease_valid(self) -> bool:
        """Whether our lease is still good by the steady clock, without taking the lock a
        keepalive holds through its etcd round trip: a serving path checks this on every call,
        so it stops serving at local expiry even while etcd does not answer."""
        return self._lease_id is not None and self.clocks.steady_ns() < self._valid_until_ns

    def _good_until(self, sent_at_ns: int, ttl_s: int) -> int:
        return sent_at_ns + ttl_s * NS_PER_S - self.safety_margin_ns

    def _expired_locally(self) -> bool:
        """True (and leadership dropped, ``on_lost`` called once) when no grant or keepalive
        renewed the lease within TTL - safety margin of the steady clock."""
        with self._lock:
            if self._lease_id is None or self.clocks.steady_ns() < self._valid_until_ns:
                return self._lease_id is None
            self._lease_id = None  # no revoke: etcd may be unreachable; the lease expires there anyway
        self._lost("no lease renewal within the lease TTL minus the safety margin (local expiry)")
        return True

    # ---- election ----------------------------------------------------------------------------------
    def campaign(self) -> bool:
        """Try once to become leader; True if this candidate holds the key (now or already)."""
        with self._lock:
            if self._lease_id is not None:
                return True
            sent_at = self.clocks.steady_ns()
            grant = self._post("/v3/lease/grant", {"TTL": self.lease_ttl_s})
            lease_id = grant["ID"]
            key = b64(self.key)
            resp = self._post("/v3/kv/txn", {
                "compare": [{"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
                "success": [{"request_put": {"key": key, "value": b64(self.candidate_id), "lease": lease_id}}],
            })
            if not resp.get("succeeded"):
                self._revoke(lease_id)  # do not leave an unused lease behind
                return False
            self._lease_id = lease_id
            # etcd may raise a TTL below its minimum: warm up for what was actually granted.
            self._granted_ttl_s = max(self.lease_ttl_s, int(grant.get("TTL", 0)))
            self.view_version = int(resp["header"]["revision"])  # == the key's create revision
            self._won_at_ns = self.clocks.steady_ns()
            self._valid_until_ns = self._good_until(sent_at, self._granted_ttl_s)
        log.info("%s won master_view of %s with view %d", self.candidate_id, self.key, self.view_version)
        return True

    def current_leader(self) -> tuple[str, int] | None:
        """(holder's candidate id, view version) of the key as etcd has it now, or None."""
        kvs = self._post("/v3/kv/range", {"key": b64(self.key)}).get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", "")).decode("utf-8", "replace"), int(kvs[0]["create_revision"])

    def ready(self) -> bool:
        """Leader for at least one lease TTL (warmup): only then may the service start."""
        return self.is_leader and self.clocks.steady_ns() - self._won_at_ns >= self._granted_ttl_s * NS_PER_S

    # ---- keeping it --------------------------------------------------------------------------------
    def keepalive(self) -> bool:
        """Renew the lease and check we still hold the key; on loss call ``on_lost`` and return False."""
        if not self.is_leader:
            return False
        with self._lock:
            lease_id = self._lease_id
            if lease_id is None:
                return False
            sent_at = self.clocks.steady_ns()
            try:
                result = self._post("/v3/lease/keepalive", {"ID": lease_id}).get("result", {})
                if int(result.get("TTL", 0)) <= 0:  # etcd omits TTL for an expired or revoked lease
                    reason = "lease expired or revoked"
                else:
                    holder = self._post("/v3/kv/range", {"key": b64(self.key)}).get("kvs") or []
                    if not holder:
                        reason = "master_view key is gone"
                    elif (holder[0].get("lease") != lease_id
                          or int(holder[0]["create_revision"]) != self.view_version):
                        reason = "master_view key is held by another leader"
                    else:
                        self._valid_until_ns = self._good_until(sent_at, int(result["TTL"]))
                        return True
            except OpLogStoreUnavailable as exc:
                reason = f"keepalive failed: {exc}"
            self._lease_id = None
            self._revoke(lease_id)
        self._lost(reason)
        return False

    def _lost(self, reason: str) -> None:
        log.warning("%s lost leadership of %s (view %d): %s", self.candidate_id, self.key, self.view_version, reason)
        if self.on_lost is not None:
            self.on_lost(reason)

    def _revoke(self, lease_id: str) -> None:
        try:
            self._post("/v3/lease/revoke", {"ID": lease_id})
        except OpLogStoreUnavailable:
            pass  # best effort: the lease then simply expires on its own

    def resign(self) -> None:
        """Give leadership up (revoking the lease deletes the key); ``on_lost`` is not called."""
        with self._lock:
            lease_id, self._lease_id = self._lease_id, None
            if lease_id is not None:
                self._revoke(lease_id)

    # ---- optional background renewal -----------------------------------------------------------------
    def start(self, interval_s: float | None = None) -> None:
        """Renew from a daemon thread every ``interval_s`` (default a third of the TTL) until lost."""
        interval = interval_s if interval_s is not None else self.lease_ttl_s / 3

        def loop() -> None:
            while not self._stop.wait(interval) and self.keepalive():
                pass

        self._stop.clear()
        self._thread = threading.Thread(target=loop, name="mooncake-leader-keepalive", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
