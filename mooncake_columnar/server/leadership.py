"""`serve --enable_ha`: every server is a candidate. One leads: it journals every change to the
etcd oplog and serves. The others follow the oplog as hot standbys (kernels warm, state applied)
and keep their RPC port closed, as upstream's standby does; when the leader's etcd lease ends
(it died, or resigned at SIGTERM), one of them wins the ``master_view`` key, promotes (final
catch-up, fence the old producer view) and serves. Clients find it through the key.

A leader stops serving data RPCs on its own once its lease is past its local validity
(``LeaderElection.lease_valid``: the lease TTL minus a safety margin of the steady clock since
the last renewal was sent), which ends before etcd can hand the key to anyone else; that is
why a winner serves at once instead of waiting another TTL. Every change is acknowledged only
once durable in etcd (server/rpc_server.py), and a fenced leader cannot make anything durable.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from ..clock import Clocks
from ..config import MasterConfig
from ..errors import MooncakeError, UnavailableInCurrentStatus
from ..ha.leader import LeaderElection
from ..ha.standby import StandbyService
from ..ha.stores import EtcdOpLogStore
from ..ha.writer import OpLogWriter
from ..master import MasterService
from ..metrics import Metrics

log = logging.getLogger(__name__)

LEADER_LEASE_TTL_S = 2      # etcd lease of the master_view key: how long a dead leader blocks a successor
CAMPAIGN_INTERVAL_S = 0.1   # how often a standby looks for an absent key
PROMOTION_TIMEOUT_S = 10.0  # final catch-up without progress before a promotion is given up
JOURNAL_WINDOW = 1 << 17    # entries reserved but not yet durable before changes are refused
ETCD_TIMEOUT_S = 1.0        # one etcd round trip of the election: a keepalive must fail fast

LeadCallback = Callable[[MasterService, OpLogWriter, LeaderElection], None]


class Leadership:
    """The candidate's loop on its own thread: follow, campaign, promote, lead until lost, repeat."""

    def __init__(self, *, etcd_endpoint: str, cluster_id: str, candidate_id: str, config: MasterConfig,
                 clocks: Clocks, metrics: Metrics, on_lead: LeadCallback, max_batch_entries: int = 1024) -> None:
        self.etcd_endpoint = etcd_endpoint
        self.cluster_id = cluster_id
        self.candidate_id = candidate_id
        self.config = config
        self.clocks = clocks
        self.metrics = metrics
        self.on_lead = on_lead
        self.max_batch_entries = max_batch_entries
        self.election: LeaderElection | None = None
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="mooncake-leadership", daemon=True)
        self._thread.start()

    def lost(self, reason: str) -> None:
        """Leadership is gone (the server noticed it first, or the keepalive did): follow again."""
        if self.election is not None and not self._lost.is_set():
            log.warning("leadership lost: %s", reason)
        self._lost.set()

    def stop(self) -> None:
        self._stop.set()
        self._lost.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._one_term()
            except Exception:  # an etcd outage or a failed promotion: follow again from scratch
                log.exception("standby or leadership term failed; following again")
                self._stop.wait(1.0)

    def _one_term(self) -> None:
        store = EtcdOpLogStore(self.etcd_endpoint, self.cluster_id)
        standby = StandbyService(store, config=self.config, clocks=self.clocks, metrics=self.metrics)
        standby.bootstrap()
        standby.start()
        election = LeaderElection(self.etcd_endpoint, self.cluster_id, self.candidate_id,
                                  lease_ttl_s=LEADER_LEASE_TTL_S, clocks=self.clocks, on_lost=self.lost,
                                  timeout_s=ETCD_TIMEOUT_S)
        log.info("hot standby of cluster %s following the oplog (as %s)", self.cluster_id, self.candidate_id)
        won = False
        try:
            while not self._stop.is_set():
                if election.current_leader() is None and election.campaign():
                    won = True
                    # renew at once: stopping the follower may wait for a poll replaying the whole
                    # log, longer than the lease lasts unrenewed
                    election.start(interval_s=LEADER_LEASE_TTL_S / 4)
                    break
                self._stop.wait(CAMPAIGN_INTERVAL_S)
        finally:
            standby.stop()
        if not won:
            return
        self._lost.clear()
        self.election = election
        t0 = time.perf_counter()
        try:
            master = standby.promote(PROMOTION_TIMEOUT_S, view=election.view_version)
            if not election.lease_valid():
                raise UnavailableInCurrentStatus("the lease ran out during the promotion")
        except MooncakeError:
            election.stop()
            election.resign()
            raise
        writer = OpLogWriter(store, window=JOURNAL_WINDOW, max_batch_entries=self.max_batch_entries,
                             clocks=self.clocks)
        master.attach_journal(writer)
        writer.start()
        log.info("leading cluster %s with view %d: promoted in %.2f s, serving %d objects", self.cluster_id,
                 election.view_version, time.perf_counter() - t0, master.object_count())
        self.on_lead(master, writer, election)
        self._lost.wait()
        election.stop()
        self.election = None
