"""`mooncake-columnar serve`: a Mooncake Store master for the real upstream client.

Takes upstream ``mooncake_master``'s flags (server/flags.py), compiles the serving kernels before
the port opens (once per machine; later starts load them from Numba's cache), then serves the RPC
port, the optional HTTP metadata server and the metrics endpoint on one asyncio loop until
SIGTERM or SIGINT.
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from prometheus_client import CollectorRegistry

from ..clock import MonotonicClocks
from ..compile_progress import compile_progress
from ..errors import MooncakeError
from ..ha.leader import LeaderElection
from ..ha.writer import OpLogWriter
from ..master import MasterService
from ..metrics import Metrics
from ..snapshots.manager import SnapshotManager, primary_snapshot_manager, restore_master
from ..snapshots.repository import SnapshotRepository
from ..warmup import warm_up_kernels
from .flags import FlagError, HelpRequested, ServeOptions, parse_flags
from .handlers import MasterHandlers
from .http_metadata import start_metadata_server
from .leadership import Leadership
from .metrics_http import ServerMetrics, start_metrics_server
from .rpc_server import RpcServer
from .rpc_types import RPCS
from .struct_pack import KeyColumn, MetaColumn

log = logging.getLogger("mooncake_columnar.serve")


def engine_stats(master: MasterService) -> dict[str, float]:
    """The scrape-time gauges: objects, bytes held, segments, clients."""
    usage = master.segment_usage()
    return {"objects": float(master.object_count()), "bytes": float(sum(u for u, _ in usage.values())),
            "capacity_bytes": float(sum(c for _, c in usage.values())), "segments": float(len(usage)),
            "clients": float(len(master.liveness.deadline_ns))}


_WILDCARDS = ("", "0.0.0.0", "::")
SNAPSHOT_LOCAL_PATH_ENV = "MOONCAKE_SNAPSHOT_LOCAL_PATH"  # upstream's, for snapshot_object_store_type=local
SNAPSHOT_S3_URI_ENV = "MOONCAKE_SNAPSHOT_S3_URI"  # ours: s3://bucket/prefix?endpoint_override=HOST:PORT&scheme=http


def unserved(options: ServeOptions) -> list[str]:
    """Why each switched-on option this command cannot honour is refused."""
    out = []
    if options.rpc_interface:
        out.append(f"--rpc_interface={options.rpc_interface} is refused: bind an address with --rpc_address")
    if options.tenant_quota_connector_uri:
        out.append("--tenant_quota_connector_uri is refused: tenant quotas are not loaded by this command yet")
    if options.config.enable_offload:
        out.append("--enable_offload=true is refused: local-disk replicas are not served over the wire")
    if options.enable_ha and not options.enable_oplog:
        out.append("--enable_ha=true needs --enable_oplog=true here: a standby without the oplog would "
                   "promote with no objects")
    if options.enable_ha and options.enable_snapshot_restore:
        out.append("--enable_snapshot_restore=true is refused with --enable_ha: an HA master starts from the oplog")
    if options.enable_snapshot or options.enable_snapshot_restore:
        try:
            snapshot_uri(options)
        except FlagError as e:
            out.append(str(e))
    if options.enable_ha and options.rpc_address in _WILDCARDS:
        out.append("--enable_ha=true needs --rpc_address set to the address clients dial: it is what the "
                   "leader publishes in etcd")
    return out


def snapshot_uri(options: ServeOptions) -> str:
    """Where snapshots live: upstream's environment variable for a local store, ours for S3."""
    env = SNAPSHOT_LOCAL_PATH_ENV if options.snapshot_object_store_type == "local" else SNAPSHOT_S3_URI_ENV
    uri = os.environ.get(env, "")
    if not uri:
        raise FlagError("snapshot_object_store_type", f"--snapshot_object_store_type="
                        f"{options.snapshot_object_store_type} needs the environment variable {env}")
    return uri


def snapshot_repository(options: ServeOptions) -> SnapshotRepository:
    return SnapshotRepository(snapshot_uri(options), options.cluster_id,
                              backup_dir=options.snapshot_backup_dir or None)


def restored_master(options: ServeOptions) -> MasterService:
    """``--enable_snapshot_restore``: the newest usable snapshot, its leases mapped onto this
    process's steady clock; an empty master only when the repository holds no snapshot at all
    (a repository whose every snapshot fails refuses the start rather than lose them)."""
    repo = snapshot_repository(options)
    if not repo.list():
        log.warning("no snapshot in %s: starting empty", repo.base)
        return MasterService(options.config)
    # expired leases are kept as evictable cache: dropping them would empty a cache whose leases
    # ran out while it was down (what upstream's restore does, its issue #3761)
    master, stats = restore_master(repo, config=options.config, snapshot_restore_drop_expired=False)
    log.info("restored snapshot %s from %s: %d objects, %d segments (their clients remount)", stats.snapshot_id,
             repo.base, master.object_count(), len(master.segment_usage()))
    return master


class _ServingEngineMetrics:
    """The engine counters of whichever master serves now (a new one at every promotion)."""

    def __init__(self, server: "MasterServer") -> None:
        self.server = server

    def collect(self) -> Iterator[Any]:
        master = self.server.master
        return iter(master.metrics.families()) if master is not None else iter(())


class MasterServer:
    """The running parts of one ``serve``: the engine and its RPC port (while it leads, in HA
    mode), the metadata server and the metrics endpoint (always)."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.master: MasterService | None = None
        self.rpc: RpcServer | None = None
        self.journal: OpLogWriter | None = None
        self.election: LeaderElection | None = None
        self.leadership: Leadership | None = None
        self.registry = CollectorRegistry()
        self.metrics = ServerMetrics(self.registry, stats=self._stats)
        self.registry.register(_ServingEngineMetrics(self))
        self._closers: list[Any] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self.snapshots: SnapshotManager | None = None
        self.rpc_port = 0

    def _stats(self) -> dict[str, float]:
        return engine_stats(self.master) if self.master is not None else {}

    async def start(self) -> None:
        o = self.options
        self._loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        log.info("preparing the serving kernels (compiled once per machine, then loaded from the Numba cache)")
        with compile_progress(logger=log):
            await asyncio.to_thread(warm_up_kernels)
            await asyncio.to_thread(warm_up_wire)
        log.info("kernels ready in %.1f s", time.perf_counter() - t0)
        if o.enable_http_metadata_server:
            self._closers.append(await start_metadata_server(o.http_metadata_server_host,
                                                             o.http_metadata_server_port))
        self._closers.append(await start_metrics_server(o.metrics_host, o.metrics_port, self.registry))
        if not o.enable_ha:
            restore = o.enable_snapshot_restore
            master = await asyncio.to_thread(restored_master, o) if restore else MasterService(o.config)
            await self._serve(master, None, None)
            if o.enable_snapshot:
                self.snapshots = primary_snapshot_manager(master, snapshot_repository(o), enable_snapshot=True,
                                                          enable_oplog=False, interval_s=o.snapshot_interval_seconds,
                                                          retention=o.snapshot_retention_count)
            return
        if o.enable_snapshot:  # upstream's gate: in oplog mode the primary writes no complete snapshots
            log.info("--enable_snapshot: no complete snapshots from an HA master (the oplog is its persistence)")
        endpoints = [e for e in o.ha_backend_connstring.replace(",", ";").split(";") if e.strip()]
        if len(endpoints) > 1:
            log.warning("several etcd endpoints given: this master talks to the first, %s", endpoints[0])
        self.leadership = Leadership(etcd_endpoint=endpoints[0].strip(), cluster_id=o.cluster_id,
                                     candidate_id=f"{o.rpc_address}:{o.rpc_port}", config=o.config,
                                     clocks=MonotonicClocks(), metrics=Metrics(), on_lead=self._on_lead,
                                     max_batch_entries=o.oplog_batch_max_entries)
        self.leadership.start()

    def _on_lead(self, master: MasterService, journal: OpLogWriter, election: LeaderElection) -> None:
        """Leadership's thread won and promoted: serve, and return once the port is open."""
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self._serve(master, journal, election), self._loop).result(60)

    async def _serve(self, master: MasterService, journal: OpLogWriter | None,
                     election: LeaderElection | None) -> None:
        o = self.options
        master.start()
        handlers = MasterHandlers(master, view_version=(lambda: election.view_version) if election else (lambda: 0),
                                  storage_config=("", o.enable_disk_eviction, o.quota_bytes))
        handlers.journal_writer = journal
        rpc = RpcServer(handlers, observer=self.metrics, tcp_no_delay=o.rpc_enable_tcp_no_delay,
                        idle_timeout_s=o.rpc_conn_timeout_seconds or None)
        if election is not None:
            rpc.gate = election.lease_valid
        self.master, self.rpc, self.journal, self.election = master, rpc, journal, election
        self.rpc_port = await rpc.start(o.rpc_address, o.rpc_port)
        log.info("master serving on %s:%d", o.rpc_address, self.rpc_port)
        if election is not None:
            self._watchdog = asyncio.create_task(self._watch_lease(election))

    async def _watch_lease(self, election: LeaderElection) -> None:
        while election.lease_valid():
            await asyncio.sleep(0.05)
        await self._stop_serving("the leader lease is no longer valid")
        if self.leadership is not None:
            self.leadership.lost("the leader lease is no longer valid")

    async def _stop_serving(self, reason: str) -> None:
        """Close the RPC port and every connection first, then make the journal's tail durable."""
        rpc, master, journal = self.rpc, self.master, self.journal
        self.rpc = None
        if rpc is None:
            return
        log.info("stopping serving: %s", reason)
        await rpc.close()
        if master is not None:
            master.stop()
        if journal is not None:
            try:
                await asyncio.to_thread(journal.stop)
            except MooncakeError as e:  # fenced or unreachable: what is not durable was never acknowledged
                log.warning("oplog tail not flushed: %s", e)
        self.master = None

    async def close(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        snapshots, self.snapshots = self.snapshots, None
        await self._stop_serving("shutting down")
        if snapshots is not None:  # a last snapshot once no call can change the state: a restart keeps it all
            try:
                await asyncio.to_thread(snapshots.snapshot_now)
            except Exception:  # counted by the manager; the periodic ones before it stand
                log.exception("final snapshot failed")
            await asyncio.to_thread(snapshots.stop)
        election = self.election
        if self.leadership is not None:
            self.leadership.stop()
        if election is not None:  # hand over at once: deleting the key lets a standby win now
            election.stop()
            await asyncio.to_thread(election.resign)
            log.info("leadership released")
        for c in reversed(self._closers):
            await c.close()
        log.info("master stopped")


def warm_up_wire() -> None:
    """Every batch RPC once, as frames through a server over a throwaway master, so the wire
    kernels are compiled (or loaded) before the first client, not under its request."""
    server = RpcServer(MasterHandlers(MasterService()))
    uuid = (1, 2)
    keys = KeyColumn(np.array([0, 1, 2], np.int64), np.frombuffer(b"ab", np.uint8))
    metas = MetaColumn(keys, np.zeros(2, np.bool_), np.zeros(2, np.uint64))
    config: tuple = (1, 0, 0, 0, None, False, [], "", [], False, 0, "", None)
    for name, args in (("MountSegment", (((3, 4), "warmup:1", 1 << 20, 1 << 20, "warmup:1", "tcp", ""), uuid)),
                       ("BatchPutStart", (uuid, keys, np.array([8, 8], np.uint64), config, "default")),
                       ("BatchPutEnd", (uuid, metas, 4, "default")),
                       ("BatchGetReplicaList", (keys, "default")),
                       ("BatchExistKey", (keys, "default")),
                       ("BatchRemove", (keys, True, "default"))):
        rpc = RPCS[name]
        assert rpc.request is not None
        server.dispatch(0, rpc.function_id, memoryview(rpc.request.encode(args)))


async def _run(options: ServeOptions) -> int:
    server = MasterServer(options)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await server.start()
    except (OSError, MooncakeError) as e:
        log.error("cannot start: %s", e)
        await server.close()
        return 1
    await stop.wait()
    log.info("signal received: stopping")
    await server.close()
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        options = parse_flags(argv)
    except HelpRequested as e:
        print(e.text)
        return 0
    except FlagError as e:
        print(f"mooncake-columnar serve: {e}", file=sys.stderr)
        return 2
    refused = unserved(options)
    if refused:
        print("\n".join(f"mooncake-columnar serve: {r}" for r in refused), file=sys.stderr)
        return 2
    logging.getLogger().setLevel(options.log_level)
    if options.log_dir:  # as glog: a log file in that directory besides stderr
        handler = logging.FileHandler(Path(options.log_dir) / "mooncake-columnar-serve.log")
        handler.setFormatter(logging.getLogger().handlers[0].formatter)
        logging.getLogger().addHandler(handler)
    for warning in options.warnings:
        log.warning("%s", warning)
    try:  # libuv's event loop: less server CPU per call than asyncio's own (about 15% on a single-key call)
        import uvloop
    except ImportError:
        return asyncio.run(_run(options))
    return uvloop.run(_run(options))
