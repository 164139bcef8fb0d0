"""The command line of ``mooncake-columnar serve``: upstream ``mooncake_master``'s gflags flags.

Operators replace the binary and keep its command line, so every flag upstream's master defines
(``mooncake-store/src/master.cpp`` and ``utils.cpp``), the glog flags operators commonly pass and a
few flags of ours are in :data:`FLAGS`, one :class:`Flag` per name, each in one class:

* ``HONOURED``: the value reaches a :class:`~mooncake_columnar.config.MasterConfig` field
  (``config.<field>``) or a :class:`ServeOptions` field (``serve.<field>``, or derived from
  several flags: the RPC port and thread count, the snapshot store type, the log level).
* ``NO_EFFECT``: accepted and type-checked, but nothing a client observes from this engine
  depends on it (thread pools, intervals of work the engine does not do, knobs of features that
  are refused anyway); a non-default value adds a line to :attr:`ServeOptions.warnings`.
* ``REFUSED``: the engine cannot do what a non-default value asks (CXL, the cachelib allocator,
  NoF segments, KV events...): any value other than the upstream default, or than the listed
  supported ones, raises :class:`FlagError` naming the flag, the value and why.

Syntax, as gflags parses it: ``--name=value``, ``-name=value``, ``--name value``,
``-name value``; a bool flag as ``--name``, ``--noname`` or ``--name=<1|0|t|f|true|false|y|n|yes|no>``
(any case; a bool never takes the next argument as its value); ``--`` ends the flags. The last
occurrence of a flag wins. Upstream's TTL flags take a duration: a non-negative integer of
milliseconds, optionally followed by ``ms``, ``s``, ``m`` or ``h`` (any case, blanks allowed
around the number and the unit), as upstream's ``ParseDurationMs``.

``--help``, ``--helpfull`` and ``--helpshort`` (``-help``...) make :func:`parse_flags` raise
:class:`HelpRequested` carrying :func:`help_text` (upstream prints its help and exits 1);
``--version`` raises it with the version line. Help wins over errors elsewhere on the line, as
in gflags, which handles the help flags before it reports bad ones.

Deliberate differences from gflags: a positional argument is an error (upstream ignores it,
which turns ``--enable_ha false`` into ``enable_ha=true`` silently), ``--noname=value`` is an
error (gflags drops the value), and ``--flagfile``/``--fromenv``/``--tryfromenv``/``--undefok``
are refused rather than applied.
"""
from __future__ import annotations

import logging
import os
import re
import textwrap
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence, Union

from ..config import MasterConfig
from ..errors import InvalidConfig, MooncakeError

FlagValue = Union[bool, int, float, str, None]

__all__ = [
    "FLAGS", "Flag", "FlagClass", "FlagError", "FlagValue", "HelpRequested", "ServeOptions", "help_text",
    "parse_duration_ms", "parse_flags",
]


class FlagError(InvalidConfig):
    """A command-line flag cannot be used: unknown, malformed, out of range, refused, or rejected
    by MasterConfig. ``flag`` (also ``field``, as InvalidConfig) names it, ``value`` is the text
    given (None when there is none, e.g. an unknown flag's missing argument)."""

    def __init__(self, flag: str, message: str, value: str | None = None):
        self.flag = flag
        self.value = value
        self.detail = message
        self.field = flag
        # InvalidConfig's own wording ("config field ...") would misname a flag as a config field.
        MooncakeError.__init__(self, message)


class HelpRequested(Exception):
    """``--help``/``--helpfull``/``--helpshort`` (``topic`` "help") or ``--version`` (``topic``
    "version") was given: print ``text`` and exit (upstream exits 1 after its help)."""

    def __init__(self, topic: str, text: str):
        self.topic = topic
        self.text = text
        super().__init__(text)


class FlagClass(Enum):
    HONOURED = "honoured"
    NO_EFFECT = "accepted without effect"
    REFUSED = "refused unless default"


HONOURED, NO_EFFECT, REFUSED = FlagClass.HONOURED, FlagClass.NO_EFFECT, FlagClass.REFUSED

_INT_RANGES = {
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "uint32": (0, (1 << 32) - 1),
    "uint64": (0, (1 << 64) - 1),
}
_TYPES = ("bool", "string", "double", "duration", *_INT_RANGES)
_TRUE = ("1", "t", "true", "y", "yes")
_FALSE = ("0", "f", "false", "n", "no")
# gflags reads integers with strtoll: optional blanks and sign, decimal, or hex after a leading "0x"
# (a leading 0 alone is still decimal). Python's int() would also take "1_000", which gflags does not.
_DECIMAL = re.compile(r"\s*[+-]?[0-9]+")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+")
_DOUBLE = re.compile(r"\s*[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
# upstream's ParseDurationMs: ASCII blanks trimmed, digits, optional blanks, an optional unit
_DURATION = re.compile(r"[ \t\n\r\f\v]*([0-9]+)[ \t\n\r\f\v]*([A-Za-z]*)[ \t\n\r\f\v]*")
_DURATION_UNITS_MS = {"": 1, "ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration_ms(text: str) -> int:
    """Milliseconds of an upstream duration string ("5000", "5s", "500ms", "2m", "1h", "10 S");
    raises ValueError saying why otherwise (no sign, fraction or compound like "1m30s")."""
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError("expected a non-negative integer of milliseconds, optionally followed by ms, s, m or h")
    unit = m.group(2).lower()
    if unit not in _DURATION_UNITS_MS:
        raise ValueError(f"unsupported duration unit {unit!r}; supported units are ms, s, m and h")
    ms = int(m.group(1)) * _DURATION_UNITS_MS[unit]
    if int(m.group(1)) >= 1 << 64 or ms >= 1 << 64:
        raise ValueError("duration is too large")
    return ms


@dataclass(frozen=True)
class Flag:
    """One command-line flag. ``default`` is upstream's default as text (what its --help prints,
    ours for origin "ours"); ``target`` is "config.<MasterConfig field>", "serve.<ServeOptions
    field>" or "" (no effect, refused, or a derived serve value); ``supported``: the values, as
    text, that a REFUSED flag accepts (empty: only the default) or an honoured one honours
    (empty: every valid value); ``choices``: the only spellings accepted at all (others are bad
    values, as upstream fails on them); ``why``: the reason a value is refused or has no effect."""

    name: str
    type: str
    default: str
    kind: FlagClass
    help: str
    target: str = ""
    origin: str = "master"
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    supported: tuple[str, ...] = ()
    why: str = ""
    deprecated_for: str = ""

    def __post_init__(self) -> None:
        assert self.type in _TYPES, self.type
        assert self.origin in ("master", "utils", "glog", "gflags", "ours"), self.origin

    def parse(self, text: str) -> FlagValue:
        """The typed value of ``text``; raises FlagError naming this flag and the text."""
        try:
            if self.type == "duration" and text == "" and self.default != "":
                raise ValueError("duration is empty")
            value = _convert(self.type, text)
        except ValueError as e:
            raise FlagError(self.name, f"illegal value {text!r} specified for {self.type} flag {self.name!r}: {e}",
                            text) from None
        if self.choices and text not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise FlagError(self.name, f"illegal value {text!r} specified for flag {self.name!r}: must be one of "
                                       f"{allowed}", text)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
                raise FlagError(self.name, f"illegal value {text!r} specified for flag {self.name!r}: must be in "
                                           f"[{_fmt(self.lo)}, {_fmt(self.hi)}]", text)
        return value

    @property
    def default_value(self) -> FlagValue:
        return self.parse(self.default)

    def supported_values(self) -> tuple[FlagValue, ...]:
        """Values the engine honours (empty tuple: any valid value)."""
        if self.supported:
            return tuple(self.parse(s) for s in self.supported)
        return (self.default_value,) if self.kind is REFUSED else ()


def _fmt(bound: float | None) -> str:
    return "-inf" if bound is None else (str(int(bound)) if float(bound).is_integer() else str(bound))


def _convert(type_: str, text: str) -> FlagValue:
    if type_ == "bool":
        low = text.lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise ValueError("expected one of 1, 0, t, f, true, false, y, n, yes, no")
    if type_ == "string":
        return text
    if type_ == "duration":
        # ours: an empty recovery TTL means "the read lease TTL" (MasterConfig None)
        return None if text == "" else parse_duration_ms(text)
    if type_ == "double":
        if _DOUBLE.fullmatch(text) is None:
            raise ValueError("not a finite decimal number")
        return float(text)
    lo, hi = _INT_RANGES[type_]
    if _HEX.fullmatch(text):
        n = int(text, 16)
    elif _DECIMAL.fullmatch(text):
        n = int(text)
    else:
        raise ValueError("not an integer")
    if type_.startswith("uint") and text.lstrip().startswith("-"):
        raise ValueError("negative value for an unsigned flag")
    if not lo <= n <= hi:
        raise ValueError(f"out of the {type_} range")
    return n


# --- the table ----------------------------------------------------------------------------------

_CXL = "only read with --enable_cxl, which is refused"
_KV_EVENTS = "only read with --enable_kv_events, which is refused"
_PROMOTION = "only read with --promotion_on_hit, which is refused"
_DYN_REPL = "only read when --dynamic_replication_mode is not off, which is refused"
_TASKS = "bounds upstream's replica copy/move task manager, which this engine does not run"
_NOF = "the engine has no NoF (NVMe-oF SSD) segments"
_LOG = "serve logs through Python logging to stderr"
_STORE_TYPES = ("", "local", "LOCAL", "s3", "S3")  # upstream matches these spellings exactly
_GFLAGS = "gflags built-in; pass the flags themselves on the command line"

_TABLE: tuple[Flag, ...] = (
    # -- RPC server -------------------------------------------------------------------------------
    Flag("rpc_port", "int32", "0", HONOURED, "TCP port of the RPC server; 0 means take --port.", "serve.rpc_port",
         lo=0, hi=65535),
    Flag("port", "int32", "50051", HONOURED, "Older spelling of the RPC port, used when --rpc_port is 0.",
         "serve.rpc_port", lo=1, hi=65535, deprecated_for="rpc_port"),
    Flag("rpc_address", "string", "0.0.0.0", HONOURED,
         "Address the RPC server binds; in HA mode also the address the leader advertises.",
         "serve.rpc_address"),
    Flag("rpc_interface", "string", "", HONOURED,
         "Network interface whose IPv4 address replaces --rpc_address when set.", "serve.rpc_interface"),
    Flag("rpc_thread_num", "int32", "0", HONOURED,
         "Threads serving RPCs; 0 means --max_threads capped at the CPU count.", "serve.rpc_thread_num",
         lo=0),
    Flag("max_threads", "int32", "16", HONOURED, "Older spelling of the RPC thread count, used when "
         "--rpc_thread_num is 0 (capped at the CPU count).", "serve.rpc_thread_num", lo=1,
         deprecated_for="rpc_thread_num"),
    Flag("rpc_conn_timeout_seconds", "int32", "0", HONOURED,
         "Idle RPC connections are closed after this many seconds; 0 keeps them open.",
         "serve.rpc_conn_timeout_seconds", lo=0),
    Flag("rpc_enable_tcp_no_delay", "bool", "true", HONOURED, "Set TCP_NODELAY on RPC connections.",
         "serve.rpc_enable_tcp_no_delay"),
    # -- metrics / admin and HTTP metadata servers ------------------------------------------------
    Flag("metrics_host", "string", "0.0.0.0", HONOURED,
         "Address of the HTTP metrics and admin server (\"::\" for IPv6).", "serve.metrics_host"),
    Flag("metrics_port", "int32", "9003", HONOURED, "Port of the HTTP metrics and admin server.",
         "serve.metrics_port", lo=1, hi=65535),
    Flag("enable_metric_reporting", "bool", "true", HONOURED,
         "Log a summary of the master's metrics periodically.", "serve.enable_metric_reporting"),
    Flag("enable_http_metadata_server", "bool", "false", HONOURED,
         "Run the transfer engine's HTTP metadata store inside the master (instead of etcd).",
         "serve.enable_http_metadata_server"),
    Flag("http_metadata_server_host", "string", "0.0.0.0", HONOURED, "Bind address of the HTTP metadata store.",
         "serve.http_metadata_server_host"),
    Flag("http_metadata_server_port", "int32", "8080", HONOURED, "Port of the HTTP metadata store.",
         "serve.http_metadata_server_port", lo=1, hi=65535),
    Flag("enable_metadata_cleanup_on_timeout", "bool", "false", REFUSED,
         "Delete a client's HTTP metadata entries when its heartbeat times out.",
         why="removing a timed-out client's transfer-engine metadata is not implemented"),
    # -- leases, pins, eviction, puts, clients ----------------------------------------------------
    Flag("default_kv_lease_ttl", "duration", "10000", HONOURED,
         "Read lease granted on an object: milliseconds, or a number with ms, s, m or h.",
         "config.default_kv_lease_ttl_ms"),
    Flag("default_kv_soft_pin_ttl", "duration", "1800000", HONOURED,
         "Soft pin length of a put that asks for one without a TTL (duration, as above).",
         "config.default_kv_soft_pin_ttl_ms"),
    Flag("max_kv_soft_pin_ttl", "duration", "86400000", HONOURED,
         "Longest soft pin a put may request (duration, as above).", "config.max_kv_soft_pin_ttl_ms"),
    Flag("recovery_kv_lease_ttl", "duration", "", HONOURED, "Lease granted to objects a remount recovers "
         "(duration, as above); empty means --default_kv_lease_ttl.", "config.recovery_kv_lease_ttl_ms",
         origin="ours"),
    Flag("allow_evict_soft_pinned_objects", "bool", "true", HONOURED,
         "Let eviction take soft-pinned objects once unpinned ones are exhausted.",
         "config.allow_evict_soft_pinned_objects"),
    Flag("eviction_ratio", "double", "0.05", HONOURED, "Share of memory an eviction pass frees when space is short.",
         "config.eviction_ratio"),
    Flag("eviction_high_watermark_ratio", "double", "0.9", HONOURED,
         "Memory use (as a share of capacity) above which eviction starts.", "config.eviction_high_watermark_ratio"),
    Flag("client_ttl", "int64", "10", HONOURED,
         "Seconds without a heartbeat after which a client counts as gone and its segments are unmounted.",
         "config.client_live_ttl_s"),
    Flag("put_start_discard_timeout_sec", "uint64", "30", HONOURED,
         "Seconds after which an unfinished put may be discarded by a new put of the same key.",
         "config.put_start_discard_timeout_s"),
    Flag("put_start_release_timeout_sec", "uint64", "600", HONOURED,
         "Seconds after which the space of an unfinished put is reclaimed.", "config.put_start_release_timeout_s"),
    Flag("max_replica_num", "uint32", "4", HONOURED, "Largest replica_num a put may ask for (1..64).",
         "config.max_replica_num", origin="ours"),
    Flag("require_upstream_client_ids", "bool", "false", HONOURED,
         "Refuse client ids that are not upstream's \"<u64>-<u64>\" UUID form (needed for a v1 rollback).",
         "config.require_upstream_client_ids", origin="ours"),
    # -- allocation --------------------------------------------------------------------------------
    Flag("memory_allocator", "string", "offset", REFUSED, "Allocator of segment memory: offset or cachelib.",
         choices=("offset", "cachelib"), why="the engine allocates segment space with its own offset allocator"),
    Flag("allocation_strategy", "string", "random", REFUSED, "How replicas are placed across segments.",
         why="the engine places replicas on preferred segments first, then the freest; no other strategy exists"),
    Flag("enable_cxl", "bool", "false", REFUSED, "Use CXL memory as a segment.", why="CXL memory is not supported"),
    Flag("cxl_path", "string", "/dev/dax0.0", NO_EFFECT, "DAX device of the CXL memory.", why=_CXL),
    Flag("cxl_size", "uint64", "8589934592", NO_EFFECT, "Size of the CXL memory in bytes.", why=_CXL),
    Flag("mmap_arena_pool_size", "uint64", "8589934592", NO_EFFECT, "Pool size of the mmap arena allocator.",
         origin="utils", why="the master process has no mmap transfer buffers"),
    Flag("use_mmap_arena_allocator", "bool", "false", NO_EFFECT, "Allocate mmap buffers from a lock-free arena.",
         origin="utils", why="the master process has no mmap transfer buffers"),
    # -- offload to local disk and promotion -------------------------------------------------------
    Flag("enable_offload", "bool", "false", HONOURED, "Let clients offload objects to their local disk.",
         "config.enable_offload"),
    Flag("offload_on_evict", "bool", "false", HONOURED,
         "Offload to local disk when an object is evicted rather than when its put completes.",
         "config.offload_on_evict"),
    Flag("offload_force_evict", "bool", "false", HONOURED,
         "Evict objects past the per-cycle offload cap without offloading them.", "config.offload_force_evict"),
    Flag("offloading_queue_limit", "uint64", "50000", HONOURED,
         "Most objects queued for offload per local-disk segment (1..100000000).", "config.offloading_queue_limit"),
    Flag("offload_cap_ratio", "double", "0.5", REFUSED,
         "Share of the offload queue limit one eviction cycle may queue.", lo=0.0, hi=1.0,
         why="the engine's per-cycle offload cap is fixed at half the queue limit"),
    Flag("promotion_on_hit", "bool", "false", REFUSED, "Copy disk-only objects back to memory when read.",
         why="promotion of disk-only objects to memory is not implemented"),
    Flag("promotion_admission_threshold", "uint32", "2", NO_EFFECT,
         "Reads of a key needed before it is promoted.", why=_PROMOTION),
    Flag("promotion_queue_limit", "uint32", "50000", NO_EFFECT, "Most promotions in flight.", why=_PROMOTION),
    Flag("promotion_max_per_heartbeat", "uint32", "1", NO_EFFECT,
         "Most promotion tasks handed to one client per heartbeat.", why=_PROMOTION),
    # -- upstream storage backend (persisting to a shared file system) ----------------------------
    Flag("root_fs_dir", "string", "", REFUSED, "Shared directory where upstream persists objects to files.",
         why="objects are never persisted to a file system (disk replicas are not supported)"),
    Flag("global_file_segment_size", "int64", "9223372036854775807", NO_EFFECT,
         "Capacity of the shared file segment in bytes.", why="only read with --root_fs_dir, which is refused"),
    Flag("enable_disk_eviction", "bool", "true", HONOURED,
         "Storage-backend eviction switch, reported to clients by GetStorageConfig.", "serve.enable_disk_eviction"),
    Flag("quota_bytes", "uint64", "0", HONOURED,
         "Storage-backend quota in bytes (0: 90% of capacity), reported to clients by GetStorageConfig.",
         "serve.quota_bytes"),
    # -- NoF SSD segments --------------------------------------------------------------------------
    Flag("nof_eviction_ratio", "double", "0.05", REFUSED, "Share of NoF SSD space an eviction pass frees.",
         lo=0.0, hi=1.0, why=_NOF),
    Flag("nof_eviction_high_watermark_ratio", "double", "0.9", REFUSED, "NoF SSD use above which eviction starts.",
         lo=0.0, hi=1.0, why=_NOF),
    Flag("nof_heartbeat_interval_sec", "int64", "10", REFUSED, "Seconds between probes of a NoF segment.", why=_NOF),
    Flag("nof_heartbeat_probe_timeout_ms", "uint32", "1000", REFUSED, "Timeout of one NoF probe in milliseconds.",
         why=_NOF),
    Flag("nof_heartbeat_failures_threshold", "uint32", "3", REFUSED,
         "Failed probes in a row before a NoF segment is unmounted.", why=_NOF),
    # -- dynamic replication, KV events, task manager ---------------------------------------------
    Flag("dynamic_replication_mode", "string", "off", REFUSED, "Add memory replicas of hot keys: off, observe "
         "or enforce.", choices=("off", "observe", "enforce"), why="dynamic replication is not implemented"),
    Flag("dynamic_replication_heat_window_seconds", "uint32", "10", NO_EFFECT,
         "Window over which key heat is measured.", why=_DYN_REPL),
    Flag("dynamic_replication_admission_qps_threshold", "double", "0.8", NO_EFFECT,
         "Per-key access rate from which a key counts as hot.", why=_DYN_REPL),
    Flag("dynamic_replication_max_memory_replicas", "uint64", "2", NO_EFFECT,
         "Most memory replicas dynamic replication gives one key.", why=_DYN_REPL),
    Flag("enable_kv_events", "bool", "false", REFUSED, "Publish KV cache events over ZMQ.",
         why="the KV event publisher is not implemented"),
    Flag("kv_events_bind_endpoint", "string", "", NO_EFFECT, "ZMQ endpoint the KV events are published on.",
         why=_KV_EVENTS),
    Flag("kv_events_backend_id", "string", "", NO_EFFECT, "Cache owner named in KV events.", why=_KV_EVENTS),
    Flag("kv_events_queue_capacity", "uint32", "65536", NO_EFFECT, "KV events kept before the oldest are dropped.",
         why=_KV_EVENTS),
    Flag("kv_events_emit_legacy_compat", "bool", "true", NO_EFFECT, "Add vLLM/SGLang-style fields to KV events.",
         why=_KV_EVENTS),
    Flag("kv_events_emit_object_key", "bool", "true", NO_EFFECT, "Add the object key to KV events.", why=_KV_EVENTS),
    Flag("kv_events_model_name", "string", "", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("kv_events_tenant_id", "string", "default", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("kv_events_additional_salt", "string", "", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("kv_events_lora_name", "string", "", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("kv_events_block_size", "uint32", "0", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("kv_events_dp_rank", "uint32", "0", NO_EFFECT, "Deprecated upstream; not sent.", why=_KV_EVENTS),
    Flag("max_total_finished_tasks", "uint32", "10000", NO_EFFECT, "Finished tasks kept in memory.", why=_TASKS),
    Flag("max_total_pending_tasks", "uint32", "10000", NO_EFFECT, "Pending tasks kept in memory.", why=_TASKS),
    Flag("max_total_processing_tasks", "uint32", "10000", NO_EFFECT, "Running tasks kept in memory.", why=_TASKS),
    Flag("pending_task_timeout_sec", "uint64", "300", NO_EFFECT, "Seconds a task may wait (0: forever).", why=_TASKS),
    Flag("processing_task_timeout_sec", "uint64", "300", NO_EFFECT, "Seconds a task may run (0: forever).",
         why=_TASKS),
    Flag("max_retry_attempts", "uint32", "10", NO_EFFECT, "Retries of a failed task.", why=_TASKS),
    # -- multi-tenancy -----------------------------------------------------------------------------
    Flag("enable_multi_tenants", "bool", "false", HONOURED,
         "Separate tenants' key namespaces and admit puts against per-tenant quotas.", "config.enable_multi_tenants"),
    Flag("tenant_quota_connector_type", "string", "file", HONOURED,
         "Where tenant quotas are read from: file (a YAML file named by --tenant_quota_connector_uri).",
         "serve.tenant_quota_connector_type", choices=("file", "etcd"), supported=("file",),
         why="tenant quotas are only read from a file"),
    Flag("tenant_quota_connector_uri", "string", "", HONOURED,
         "Path of the tenant quota file; required with --enable_multi_tenants.", "serve.tenant_quota_connector_uri"),
    # -- high availability -------------------------------------------------------------------------
    Flag("enable_ha", "bool", "false", HONOURED, "Run as one of several masters with a leader elected via etcd.",
         "serve.enable_ha"),
    Flag("ha_backend_type", "string", "etcd", HONOURED, "Coordination service of HA mode.", "serve.ha_backend_type",
         supported=("etcd",), why="HA mode coordinates through etcd only"),
    Flag("ha_backend_connstring", "string", "", HONOURED,
         "Connection string of the HA coordination service; empty means --etcd_endpoints.",
         "serve.ha_backend_connstring"),
    Flag("etcd_endpoints", "string", "", HONOURED, "etcd endpoints separated by ';' (HA mode).",
         "serve.etcd_endpoints"),
    Flag("cluster_id", "string", "mooncake_cluster", HONOURED,
         "Names this cluster in etcd keys and snapshot paths.", "serve.cluster_id"),
    Flag("pod_name", "string", "", NO_EFFECT, "Kubernetes pod name for label-based routing.",
         why="only read with --ha_backend_type=k8s, which is refused"),
    Flag("pod_namespace", "string", "", NO_EFFECT, "Kubernetes pod namespace for label-based routing.",
         why="only read with --ha_backend_type=k8s, which is refused"),
    Flag("enable_oplog", "bool", "false", HONOURED, "Replicate metadata changes to standbys through an "
         "operation log in etcd (needs --enable_ha).", "serve.enable_oplog"),
    Flag("oplog_poll_interval_ms", "int32", "1000", HONOURED, "Milliseconds between a standby's reads of the "
         "operation log.", "serve.oplog_poll_interval_ms", lo=1),
    Flag("oplog_batch_max_entries", "uint32", "1024", HONOURED, "Most entries in one operation-log batch.",
         "serve.oplog_batch_max_entries", lo=1),
    Flag("batch_oplog_retry_timeout_sec", "uint32", "180", NO_EFFECT,
         "How long a standby retries transient operation-log errors.",
         why="the standby retries its reads at every poll, without a deadline"),
    Flag("oplog_admission_timeout_ms", "uint32", "50", HONOURED, "Milliseconds a change waits for operation-log "
         "window space before it is refused (0..60000).", "config.oplog_admission_timeout_ms", origin="ours"),
    # -- snapshots ---------------------------------------------------------------------------------
    Flag("enable_snapshot", "bool", "false", HONOURED, "Write snapshots of the metadata periodically.",
         "serve.enable_snapshot"),
    Flag("enable_snapshot_restore", "bool", "false", HONOURED, "Restore the newest usable snapshot at start.",
         "serve.enable_snapshot_restore"),
    Flag("snapshot_interval_seconds", "uint64", "600", HONOURED, "Seconds between snapshots.",
         "serve.snapshot_interval_seconds", lo=1),
    Flag("snapshot_retention_count", "uint32", "2", HONOURED, "Published snapshots kept; older ones are deleted.",
         "serve.snapshot_retention_count"),
    Flag("snapshot_backup_dir", "string", "", HONOURED,
         "Local directory that also receives each snapshot and serves restores; empty: none.",
         "serve.snapshot_backup_dir"),
    Flag("snapshot_object_store_type", "string", "", HONOURED, "Where snapshots are stored: local or s3 "
         "(required when snapshots are written or restored).", "serve.snapshot_object_store_type",
         choices=_STORE_TYPES),
    Flag("snapshot_payload_store_type", "string", "", HONOURED, "Older spelling of --snapshot_object_store_type.",
         "serve.snapshot_object_store_type", choices=_STORE_TYPES, deprecated_for="snapshot_object_store_type"),
    Flag("snapshot_payload_backend_type", "string", "", HONOURED, "Older spelling of --snapshot_object_store_type.",
         "serve.snapshot_object_store_type", choices=_STORE_TYPES, deprecated_for="snapshot_object_store_type"),
    Flag("snapshot_catalog_store_type", "string", "", REFUSED, "Where the snapshot catalog lives: embedded "
         "(beside the snapshots) or redis.", choices=("", "embedded", "payload", "redis"),
         supported=("", "embedded", "payload"), why="the snapshot catalog is always kept beside the snapshots"),
    Flag("snapshot_catalog_backend_type", "string", "", REFUSED, "Older spelling of --snapshot_catalog_store_type.",
         choices=("", "embedded", "payload", "redis"), supported=("", "embedded", "payload"),
         why="the snapshot catalog is always kept beside the snapshots", deprecated_for="snapshot_catalog_store_type"),
    Flag("snapshot_catalog_store_connstring", "string", "", NO_EFFECT, "Connection string of a redis catalog.",
         why="only read with a redis snapshot catalog, which is refused"),
    Flag("snapshot_catalog_backend_connstring", "string", "", NO_EFFECT,
         "Older spelling of --snapshot_catalog_store_connstring.",
         why="only read with a redis snapshot catalog, which is refused",
         deprecated_for="snapshot_catalog_store_connstring"),
    Flag("snapshot_child_timeout_seconds", "uint64", "300", NO_EFFECT,
         "Seconds upstream's forked snapshot writer may run.", why="the engine's snapshot writer has no deadline"),
    Flag("snapshot_max_decompressed_bytes", "uint64", "4294967296", HONOURED, "Most bytes one payload of an "
         "upstream (v1) snapshot may decompress to at restore.", "config.snapshot_max_decompressed_bytes",
         origin="ours"),
    # -- configuration file and gflags built-ins ---------------------------------------------------
    Flag("config_path", "string", "", REFUSED, "File of master settings read before the flags.",
         why="configuration files are not read; pass the settings as flags"),
    Flag("flagfile", "string", "", REFUSED, "Read more flags from a file.", origin="gflags", why=_GFLAGS),
    Flag("fromenv", "string", "", REFUSED, "Read the named flags from FLAGS_<name> variables.", origin="gflags",
         why=_GFLAGS),
    Flag("tryfromenv", "string", "", REFUSED, "As --fromenv, skipping unset variables.", origin="gflags",
         why=_GFLAGS),
    Flag("undefok", "string", "", REFUSED, "Flag names that may be given although undefined.", origin="gflags",
         why=_GFLAGS),
    Flag("help", "bool", "false", HONOURED, "Print this help and exit.", origin="gflags"),
    Flag("helpfull", "bool", "false", HONOURED, "Print this help and exit.", origin="gflags"),
    Flag("helpshort", "bool", "false", HONOURED, "Print this help and exit.", origin="gflags"),
    Flag("version", "bool", "false", HONOURED, "Print the version and exit.", origin="gflags"),
    # -- glog ----------------------------------------------------------------------------------------
    Flag("minloglevel", "int32", "0", HONOURED, "Least severity logged: 0 INFO, 1 WARNING, 2 ERROR, 3 FATAL.",
         "serve.log_level", origin="glog", lo=0),
    Flag("v", "int32", "0", HONOURED, "Verbose logging level; above 0 serve logs DEBUG (with --minloglevel=0).",
         "serve.log_level", origin="glog"),
    Flag("log_dir", "string", "", HONOURED, "Directory of the log file; empty: log to stderr only.",
         "serve.log_dir", origin="glog"),
    Flag("logtostderr", "bool", "false", NO_EFFECT, "Log to stderr instead of files.", origin="glog", why=_LOG),
    Flag("alsologtostderr", "bool", "false", NO_EFFECT, "Log to stderr as well as files.", origin="glog", why=_LOG),
    Flag("stderrthreshold", "int32", "2", NO_EFFECT, "Least severity also copied to stderr.", origin="glog",
         why=_LOG),
    Flag("colorlogtostderr", "bool", "false", NO_EFFECT, "Colour stderr logs.", origin="glog", why=_LOG),
    Flag("vmodule", "string", "", NO_EFFECT, "Per-module verbose levels.", origin="glog", why=_LOG),
    Flag("max_log_size", "int32", "1800", NO_EFFECT, "Log file size in MB before rotation.", origin="glog",
         why=_LOG),
    Flag("logbuflevel", "int32", "0", NO_EFFECT, "Highest severity buffered before writing.", origin="glog",
         why=_LOG),
    Flag("logbufsecs", "int32", "30", NO_EFFECT, "Seconds log output may stay buffered.", origin="glog", why=_LOG),
    Flag("log_prefix", "bool", "true", NO_EFFECT, "Start log lines with glog's prefix.", origin="glog", why=_LOG),
    Flag("log_link", "string", "", NO_EFFECT, "Directory of links to the log files.", origin="glog", why=_LOG),
    Flag("logfile_mode", "int32", "436", NO_EFFECT, "Permissions of log files.", origin="glog", why=_LOG),
    Flag("stop_logging_if_full_disk", "bool", "false", NO_EFFECT, "Stop writing logs on a full disk.",
         origin="glog", why=_LOG),
    Flag("drop_log_memory", "bool", "true", NO_EFFECT, "Drop written log pages from the page cache.",
         origin="glog", why=_LOG),
    Flag("symbolize_stacktrace", "bool", "true", NO_EFFECT, "Symbolize crash stack traces.", origin="glog",
         why=_LOG),
    Flag("log_backtrace_at", "string", "", NO_EFFECT, "Log a backtrace at file:line.", origin="glog", why=_LOG),
    Flag("alsologtoemail", "string", "", NO_EFFECT, "Also mail logs to these addresses.", origin="glog", why=_LOG),
    Flag("logemaillevel", "int32", "999", NO_EFFECT, "Least severity mailed.", origin="glog", why=_LOG),
    Flag("logmailer", "string", "/bin/mail", NO_EFFECT, "Mail program for logs.", origin="glog", why=_LOG),
)

FLAGS: Mapping[str, Flag] = {f.name: f for f in _TABLE}
assert len(FLAGS) == len(_TABLE), "duplicate flag name in the table"

_HELP_FLAGS = ("help", "helpfull", "helpshort")
_GLOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
_STORE_TYPE_FLAGS = ("snapshot_object_store_type", "snapshot_payload_store_type", "snapshot_payload_backend_type")


def _config_field_flags() -> dict[str, str]:
    return {f.target.split(".", 1)[1]: f.name for f in _TABLE if f.target.startswith("config.")}


# --- the result ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOptions:
    """What ``serve`` runs with: ``config`` for the engine, the rest for the servers around it.
    ``parse_flags([])`` gives upstream's defaults. Derived fields: ``rpc_port`` (--rpc_port, or
    --port when that is 0), ``rpc_thread_num`` (--rpc_thread_num, or --max_threads capped at the
    CPU count when that is 0), ``ha_backend_connstring`` (itself, or --etcd_endpoints when empty
    and the backend is etcd), ``snapshot_object_store_type`` ("", "local" or "s3": the first of
    it and its two older spellings given on the command line), ``log_level`` (a ``logging``
    level from --minloglevel and --v). ``explicit``: the flags the command line set;
    ``warnings``: deprecated spellings and no-effect flags set to other than their default, for
    serve to log; ``values``: every flag's typed value, by name."""

    config: MasterConfig
    rpc_address: str
    rpc_interface: str
    rpc_port: int
    rpc_thread_num: int
    rpc_conn_timeout_seconds: int
    rpc_enable_tcp_no_delay: bool
    metrics_host: str
    metrics_port: int
    enable_metric_reporting: bool
    enable_http_metadata_server: bool
    http_metadata_server_host: str
    http_metadata_server_port: int
    cluster_id: str
    enable_ha: bool
    ha_backend_type: str
    ha_backend_connstring: str
    etcd_endpoints: str
    enable_oplog: bool
    oplog_poll_interval_ms: int
    oplog_batch_max_entries: int
    enable_snapshot: bool
    enable_snapshot_restore: bool
    snapshot_interval_seconds: int
    snapshot_retention_count: int
    snapshot_backup_dir: str
    snapshot_object_store_type: str
    tenant_quota_connector_type: str
    tenant_quota_connector_uri: str
    enable_disk_eviction: bool
    quota_bytes: int
    log_level: int
    log_dir: str
    explicit: frozenset[str] = frozenset()
    warnings: tuple[str, ...] = ()
    values: Mapping[str, FlagValue] = field(default_factory=dict, hash=False, compare=True)


# --- parsing ------------------------------------------------------------------------------------


def _scan(argv: Sequence[str]) -> tuple[dict[str, FlagValue], dict[str, str], str | None]:
    """The typed values of the flags given (the last occurrence wins; keys in order of first
    appearance), the text each was given as, and the help topic asked for ("help", "version" or
    None). Raises the first error, unless help was asked for: gflags answers help first."""
    given: dict[str, FlagValue] = {}
    texts: dict[str, str] = {}
    first_error: FlagError | None = None
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not isinstance(arg, str):
            raise TypeError(f"argv items must be str, got {type(arg).__name__}")
        if arg == "--":
            if i < len(argv):
                first_error = first_error or FlagError(argv[i], f"unexpected argument {argv[i]!r}: serve takes "
                                                                f"only flags", argv[i])
            break
        if not arg.startswith("-") or arg == "-":
            hint = " (a bool flag takes its value as --name=value)" if arg.lower() in _TRUE + _FALSE else ""
            first_error = first_error or FlagError(arg, f"unexpected argument {arg!r}: serve takes only flags{hint}",
                                                   arg)
            continue
        body = arg[2:] if arg.startswith("--") else arg[1:]
        name, eq, text = body.partition("=")
        flag = FLAGS.get(name)
        if flag is None and name.startswith("no") and name[2:] in FLAGS:
            negated = FLAGS[name[2:]]
            if negated.type != "bool":
                first_error = first_error or FlagError(
                    name, f"boolean value ({name}) specified for {negated.type} command line flag")
            elif eq:
                first_error = first_error or FlagError(negated.name, f"flag {arg!r}: --{name} takes no value", text)
            else:
                given[negated.name], texts[negated.name] = False, "false"
            continue
        if flag is None:
            first_error = first_error or FlagError(name, f"unknown command line flag {name!r}")
            continue
        if not eq:
            if flag.type == "bool":
                text = "true"
            elif i < len(argv):
                text = argv[i]
                i += 1
            else:
                first_error = first_error or FlagError(flag.name, f"flag {arg!r} is missing its argument")
                break
        try:
            given[flag.name] = flag.parse(text)
        except FlagError as e:
            first_error = first_error or e
            continue
        texts[flag.name] = text
    topic = "help" if any(given.get(h) for h in _HELP_FLAGS) else "version" if given.get("version") else None
    if topic is None and first_error is not None:
        raise first_error
    return given, texts, topic


def parse_flags(argv: Sequence[str]) -> ServeOptions:
    """Parse ``argv`` (the arguments after ``serve``, no program name) into ServeOptions.

    Raises :class:`HelpRequested` for --help/--helpfull/--helpshort/--version, and
    :class:`FlagError` for an unknown flag, a malformed or out-of-range value, a refused value,
    an inconsistent combination upstream also refuses at start, or a value MasterConfig rejects
    (named by the upstream flag, not the config field)."""
    given, texts, topic = _scan(argv)
    if topic == "help":
        raise HelpRequested("help", help_text())
    if topic == "version":
        raise HelpRequested("version", _version_line())
    values: dict[str, FlagValue] = {f.name: (given[f.name] if f.name in given else f.default_value) for f in _TABLE}

    for f in _TABLE:
        allowed = f.supported_values()
        if allowed and values[f.name] not in allowed:
            shown = " or ".join(repr(s) for s in (f.supported or (f.default,)))
            raise FlagError(f.name, f"--{f.name}={_show(texts, f.name)} is refused: {f.why} (accepted: {shown})",
                            texts.get(f.name))

    warnings: list[str] = []
    for name in given:
        f = FLAGS[name]
        if f.deprecated_for:
            warnings.append(f"--{name} is deprecated upstream; use --{f.deprecated_for}")
        if f.kind is NO_EFFECT and values[name] != f.default_value:
            warnings.append(f"--{name}={_show(texts, name)} is accepted without effect: {f.why}")

    serve: dict[str, Any] = {f.target.split(".", 1)[1]: values[f.name] for f in _TABLE
                             if f.target.startswith("serve.")}
    serve["rpc_port"] = values["rpc_port"] or values["port"]
    rpc_threads = values["rpc_thread_num"]
    serve["rpc_thread_num"] = rpc_threads if rpc_threads else min(_int(values["max_threads"]), os.cpu_count() or 1)
    connstring = values["ha_backend_connstring"]
    if not connstring and values["ha_backend_type"] == "etcd":
        connstring = values["etcd_endpoints"]
    serve["ha_backend_connstring"] = connstring
    store_flag = next((n for n in _STORE_TYPE_FLAGS if n in given), _STORE_TYPE_FLAGS[0])
    serve["snapshot_object_store_type"] = str(values[store_flag]).lower()
    minloglevel, verbose = _int(values["minloglevel"]), _int(values["v"])
    serve["log_level"] = logging.DEBUG if minloglevel == 0 and verbose > 0 else _GLOG_LEVELS[min(minloglevel, 3)]

    # Combinations upstream's master refuses at start.
    if serve["enable_ha"] and not connstring:
        raise FlagError("etcd_endpoints", "--enable_ha needs --etcd_endpoints (or --ha_backend_connstring)",
                        texts.get("etcd_endpoints"))
    if serve["enable_oplog"] and not serve["enable_ha"]:
        raise FlagError("enable_oplog", "--enable_oplog requires --enable_ha=true", texts.get("enable_oplog"))
    if serve["enable_snapshot"] and serve["snapshot_retention_count"] == 0:
        raise FlagError("snapshot_retention_count", "--snapshot_retention_count must be > 0 with --enable_snapshot",
                        texts.get("snapshot_retention_count"))
    if (serve["enable_snapshot"] or serve["enable_snapshot_restore"]) and not serve["snapshot_object_store_type"]:
        raise FlagError(store_flag, f"--{store_flag} must be 'local' or 's3' when snapshots are written or restored",
                        texts.get(store_flag))
    if values["enable_multi_tenants"] and serve["tenant_quota_connector_type"] == "file" \
            and not serve["tenant_quota_connector_uri"]:
        raise FlagError("tenant_quota_connector_uri", "--enable_multi_tenants with the file connector needs "
                        "--tenant_quota_connector_uri", texts.get("tenant_quota_connector_uri"))
    if serve["enable_ha"] and serve["rpc_address"] == "0.0.0.0" and not serve["rpc_interface"]:
        warnings.append("--enable_ha with --rpc_address=0.0.0.0: the leader advertises 0.0.0.0 to clients")

    config_kwargs: dict[str, Any] = {f.target.split(".", 1)[1]: values[f.name] for f in _TABLE
                                     if f.target.startswith("config.")}
    try:
        config = MasterConfig(**config_kwargs)
    except InvalidConfig as e:
        by_field = _config_field_flags()
        flag_name = by_field.get(e.field, e.field)
        # The engine's message names config fields; name the flags the operator wrote instead.
        detail = re.sub(r"\b\w+\b", lambda m: f"--{by_field[m.group(0)]}" if m.group(0) in by_field else m.group(0),
                        str(e).removeprefix(f"{e.code.name}: config field {e.field!r}: "))
        raise FlagError(flag_name, f"--{flag_name}={_show(texts, flag_name)} rejected: {detail}",
                        texts.get(flag_name)) from e

    return ServeOptions(config=config, explicit=frozenset(given), warnings=tuple(warnings), values=values, **serve)


def _int(value: FlagValue) -> int:
    assert isinstance(value, int)
    return value


def _show(texts: Mapping[str, str], name: str) -> str:
    """The value of ``name`` as the command line gave it, or its default."""
    if name in texts:
        return texts[name]
    return FLAGS[name].default if name in FLAGS else "<unset>"


def _version_line() -> str:
    try:
        from importlib.metadata import version
        return f"mooncake-columnar {version('mooncake-columnar')}"
    except Exception:  # not installed as a distribution (a source checkout)
        return "mooncake-columnar"


def help_text() -> str:
    """Every flag with its type, default, class and meaning, grouped by class."""
    lines = ["usage: mooncake-columnar serve [--flag=value ...]",
             "Flags of upstream's mooncake_master, a few glog/gflags ones, and ours (marked [ours]).",
             "Durations: milliseconds, or a number followed by ms, s, m or h.", ""]
    headings = {
        HONOURED: "Honoured:",
        NO_EFFECT: "Accepted without effect (a non-default value is logged as such):",
        REFUSED: "Refused when set to anything but the default (or the accepted values shown):",
    }
    for kind in (HONOURED, NO_EFFECT, REFUSED):
        lines.append(headings[kind])
        for f in sorted((f for f in _TABLE if f.kind is kind), key=lambda f: f.name):
            mark = f" [{f.origin}]" if f.origin in ("ours", "glog", "gflags") else ""
            lines.append(f"  --{f.name} ({f.type}, default {f.default!r}){mark}")
            notes = [f.help]
            if f.target:
                notes.append(f"-> {f.target}")
            if f.supported and f.kind is not NO_EFFECT:
                notes.append(f"accepted: {', '.join(repr(s) for s in f.supported)}")
            if f.why and (f.kind is not HONOURED or f.supported):
                notes.append(f"({f.why})")
            if f.deprecated_for:
                notes.append(f"[deprecated: use --{f.deprecated_for}]")
            lines.append(textwrap.fill(" ".join(notes), width=100, initial_indent=" " * 6, subsequent_indent=" " * 6))
        lines.append("")
    return "\n".join(lines)
