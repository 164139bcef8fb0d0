"""`mooncake-columnar serve`: a Mooncake Store master for the real upstream client.

Takes upstream ``mooncake_master``'s flags (server/flags.py), compiles the serving kernels before
the port opens (once per machine; later starts load them from Numba's cache), then serves the RPC
port, the optional HTTP metadata server and the metrics endpoint on one asyncio loop until
SIGTERM or SIGINT.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from ..master import MasterService
from .flags import FlagError, HelpRequested, ServeOptions, parse_flags
from .handlers import MasterHandlers
from .http_metadata import start_metadata_server
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


# switches the flag table accepts that this command does not run yet: refused at start, naming them
_NOT_SERVED = {
    "enable_ha": "leadership over etcd is not served by this command yet",
    "enable_oplog": "the etcd oplog is not served by this command yet",
    "enable_snapshot": "periodic snapshots are not served by this command yet",
    "enable_snapshot_restore": "restore at start is not served by this command yet",
}


def unserved(options: ServeOptions) -> list[str]:
    """Why each switched-on option this command cannot honour is refused."""
    out = [f"--{name}=true is refused: {why}" for name, why in _NOT_SERVED.items() if getattr(options, name)]
    if options.rpc_interface:
        out.append(f"--rpc_interface={options.rpc_interface} is refused: bind an address with --rpc_address")
    if options.tenant_quota_connector_uri:
        out.append("--tenant_quota_connector_uri is refused: tenant quotas are not loaded by this command yet")
    if options.config.enable_offload:
        out.append("--enable_offload=true is refused: local-disk replicas are not served over the wire")
    return out


class MasterServer:
    """The running parts of one ``serve``: engine, RPC port, metadata server, metrics."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.master = MasterService(options.config)
        self.registry = CollectorRegistry()
        self.metrics = ServerMetrics(self.registry, stats=lambda: engine_stats(self.master),
                                     engine_metrics=self.master.metrics)
        self.handlers = MasterHandlers(self.master, storage_config=("", options.enable_disk_eviction,
                                                                    options.quota_bytes))
        self.rpc = RpcServer(self.handlers, observer=self.metrics, tcp_no_delay=options.rpc_enable_tcp_no_delay,
                             idle_timeout_s=options.rpc_conn_timeout_seconds or None)
        self._closers: list[Any] = []
        self.rpc_port = 0

    async def start(self) -> None:
        o = self.options
        t0 = time.perf_counter()
        log.info("preparing the serving kernels (compiled once per machine, then loaded from the Numba cache)")
        self.master.start()  # compiles or loads every serving-path kernel, then runs the background thread
        warm_up_wire()
        log.info("kernels ready in %.1f s", time.perf_counter() - t0)
        if o.enable_http_metadata_server:
            self._closers.append(await start_metadata_server(o.http_metadata_server_host,
                                                             o.http_metadata_server_port))
        self._closers.append(await start_metrics_server(o.metrics_host, o.metrics_port, self.registry))
        self.rpc_port = await self.rpc.start(o.rpc_address, o.rpc_port)
        log.info("master serving on %s:%d", o.rpc_address, self.rpc_port)

    async def close(self) -> None:
        await self.rpc.close()
        for c in reversed(self._closers):
            await c.close()
        self.master.stop()
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
    except OSError as e:
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
    return asyncio.run(_run(options))
