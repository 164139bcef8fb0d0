"""Complete MasterService snapshots: write v2, restore newest-first with candidate fallback.

Restore (RFC Phase 3): for each candidate, capture (S1, C1) once, parse the manifest, decode,
validate (:meth:`SnapshotState.validate`: every field in its domain), cross-check the manifest's
clock pair with the snapshot id and the deadlines, and convert every deadline into this process's
steady domain. Any failure rejects the whole candidate (no partial state survives it) and the
next older candidate is tried; the reason is recorded as a typed
:class:`~mooncake_columnar.errors.SnapshotError` (an untyped one is mapped here). Cleanup then
follows "Complete snapshot cleanup": drop replicas that are not COMPLETE and objects left without
replicas; drop non-hard-pinned objects whose lease and soft pin are both expired at C1.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..clock import NS_PER_MS, Clocks
from ..config import MasterConfig
from ..errors import (
    ClockConversionError,
    ManifestClockError,
    ManifestError,
    MooncakeError,
    NoUsableSnapshot,
    SnapshotDecodeError,
    SnapshotError,
    SnapshotFieldError,
    SnapshotIntegrityError,
)
from ..kernels.predicates import lease_expired_mask
from ..schema import ST_COMPLETE
from .arrow_codec import DIGEST_FILE, PAYLOAD_FILES, decode_state, optional_payloads
from .convert import convert_steady_deadlines
from ..mapped import release_mapped
from .manifest import SnapshotManifest, check_clock_pair, parse_manifest
from .mooncake_v1 import V1_FILES, decode_v1
from .mooncake_v1_allocator import DEFAULT_MAX_DECOMPRESSED_BYTES
from .repository import SnapshotRepository
from ..store.snapshot_state import SnapshotState, column_chunks, with_usage
from .writer import publish_state

log = logging.getLogger(__name__)
T = TypeVar("T")

@dataclass
class RestoreStats:
    snapshot_id: str | None = None
    format_version: str | None = None
    candidates_tried: int = 0
    fallbacks: int = 0
    objects_restored: int = 0
    objects_dropped: int = 0
    conversion_failures: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (snapshot_id, "Type: message")
    rejections: list[tuple[str, SnapshotError]] = field(default_factory=list)  # (snapshot_id, typed error)
    # wall seconds of the restored candidate's phases: "decode" (read, checksums, decode,
    # validation, clock conversion), "cleanup", "build" (``build``'s: the engine rebuild)
    phase_seconds: dict[str, float] = field(default_factory=dict)


def max_granted_ttl_ns(config: MasterConfig | None = None) -> int:
    """The longest lease or soft-pin interval a master grants: the largest TTL of ``config``
    (read lease, recovery lease, soft pin default and maximum), never below the defaults' (a
    master restarted with shorter TTLs still restores what the defaults granted). A deadline
    further than this past the clock it was granted on cannot be genuine."""
    configs = (MasterConfig(),) if config is None else (config, MasterConfig())
    return max(max(c.default_kv_lease_ttl_ms, c.effective_recovery_kv_lease_ttl_ms, c.default_kv_soft_pin_ttl_ms,
                   c.max_kv_soft_pin_ttl_ms) for c in configs) * NS_PER_MS


def as_snapshot_error(e: Exception) -> SnapshotError:
    """The typed rejection reason of a candidate: a SnapshotError as it is; an engine error
    (the rebuild or its self-check refused the state) as SnapshotIntegrityError; anything else
    (Arrow, Unicode, NumPy, ValueError...) as SnapshotDecodeError; the original is the cause."""
    if isinstance(e, SnapshotError):
        return e
    cls = SnapshotIntegrityError if isinstance(e, MooncakeError) else SnapshotDecodeError
    typed = cls(f"{type(e).__name__}: {e}")
    typed.__cause__ = e
    return typed


def write_snapshot(repo: SnapshotRepository, state: SnapshotState, system_now_ns: int,
                   steady_now_ns: int, compression: str | None = None,
                   background: bool = False) -> str | Future[str]:
    """Publish ``state`` as a v2 snapshot (:func:`~.writer.publish_state`); the pair (system,
    steady) must be captured once, with the state frozen. Returns the snapshot id, or a Future of
    it when ``background``.
    """
    def write() -> str:
        return publish_state(repo, state, system_now_ns, steady_now_ns, compression=compression).snapshot_id
    return _background_writer().submit(write) if background else write()


@functools.cache
def _background_writer() -> ThreadPoolExecutor:
    """Started at the first background write, not at import. One worker: background snapshots
    publish in the order they were requested."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-snapshot")


def convert_v2_state(state: SnapshotState, manifest: SnapshotManifest, *,
                     restore_system_ns: int, restore_steady_ns: int) -> SnapshotState:
    """Map lease and soft-pin deadlines from the snapshot's steady domain into (S1, C1)'s."""
    if manifest.system_now_ns is None or manifest.steady_now_ns is None:
        raise ManifestError("v2 manifest without a clock pair")
    objects = state.objects
    for name in ("lease_deadline_ns", "soft_pin_deadline_ns"):
        converted = convert_steady_deadlines(
            column_chunks(objects.column(name)), snapshot_system_ns=manifest.system_now_ns,
            snapshot_steady_ns=manifest.steady_now_ns, restore_system_ns=restore_system_ns,
            restore_steady_ns=restore_steady_ns)
        objects = objects.set_column(objects.schema.get_field_index(name),
                                     objects.schema.field(name), pa.array(converted, pa.int64()))
    return dataclasses.replace(state, objects=objects)


def cleanup_state(state: SnapshotState, now_ns: int, drop_expired: bool = True
                  ) -> tuple[SnapshotState, int]:
    """Apply complete-snapshot cleanup at steady time ``now_ns``; returns (state, objects dropped).

    When nothing is dropped (every replica COMPLETE, no expired object to drop) the tables are
    returned as they are: no filtered copies.
    """
    objects, replicas = state.objects, state.replicas
    n = objects.num_rows
    rep_keep = replicas.column("status").to_numpy() == ST_COMPLETE
    all_complete = bool(rep_keep.all())
    # (a column of several record batches converts by a copy: object_index only when it is needed)
    obj_index = None if all_complete else replicas.column("object_index").to_numpy()
    complete_count = (objects.column("replica_count").to_numpy() if obj_index is None
                      else np.bincount(obj_index[rep_keep], minlength=n))
    keep = complete_count > 0  # hard pin does not hide unrecoverable in-progress state
    if drop_expired:
        lease = objects.column("lease_deadline_ns").to_numpy()
        soft = objects.column("soft_pin_deadline_ns").to_numpy()
        hard = objects.column("hard_pinned").to_numpy(zero_copy_only=False)
        expired = lease_expired_mask(lease, now_ns) & lease_expired_mask(soft, now_ns)
        keep &= hard | ~expired
    if all_complete and keep.all():
        if not pc.any(objects.column("processing")).as_py():
            return state, 0
        # only flags to clear: a processing object whose replicas are all complete
        idx = objects.schema.get_field_index("processing")
        return dataclasses.replace(state, objects=objects.set_column(
            idx, objects.schema.field("processing"), pa.array(np.zeros(n, np.bool_)))), 0
    new_index = np.cumsum(keep, dtype=np.int64) - 1
    if obj_index is None:
        obj_index = replicas.column("object_index").to_numpy()
    rep_keep &= keep[obj_index]
    replicas = replicas.filter(pa.array(rep_keep))
    replicas = replicas.set_column(
        0, replicas.schema.field("object_index"),
        pa.array(new_index[replicas.column("object_index").to_numpy()], pa.int64()))
    objects = objects.filter(pa.array(keep))
    for name, values in (("replica_count", pa.array(complete_count[keep].astype(np.int32))),
                         ("processing", pa.array(np.zeros(objects.num_rows, dtype=bool)))):
        idx = objects.schema.get_field_index(name)
        objects = objects.set_column(idx, objects.schema.field(name), values)
    cleaned = with_usage(state.with_objects_kept(keep, objects, replicas))
    return cleaned, int(n - objects.num_rows)


def decode_candidate(repo: SnapshotRepository, snapshot_id: str, clocks: Clocks, *,
                     check_unique_keys: bool = True, max_ttl_ns: int | None = None,
                     max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                     ) -> tuple[SnapshotState, SnapshotManifest, int]:
    """Decode one candidate into the current steady domain; returns (state, manifest, C1).

    (S1, C1) is read once, before anything is downloaded or decoded, so the time decoding takes
    keeps reducing every lease (RFC Phase 3). Raises on any problem with the candidate. The
    decoded state is validated (by its decoder), and its deadlines may lie at most
    ``max_ttl_ns`` (default :func:`max_granted_ttl_ns`) past the clock they are measured on: a
    v2 manifest's steady time (else :class:`ManifestClockError`: a steady time moved back would
    lengthen every lease), a v1 snapshot's converted deadlines past C1. A v1 payload file may
    decompress to at most ``max_decompressed_bytes`` (besides its per-frame ratio cap).
    """
    restore_system_ns, restore_steady_ns = clocks.system_ns(), clocks.steady_ns()
    max_ttl_ns = max_granted_ttl_ns() if max_ttl_ns is None else max_ttl_ns
    manifest = parse_manifest(repo.read_manifest(snapshot_id))
    if manifest.snapshot_id != snapshot_id:
        raise ManifestError(f"manifest names {manifest.snapshot_id}, directory is {snapshot_id}")
    if manifest.is_v2:
        payloads = repo.read_payloads(snapshot_id, (*PAYLOAD_FILES, DIGEST_FILE))
        extra = optional_payloads(payloads[DIGEST_FILE])
        if extra:  # the sparse checksums file, when some object has one
            payloads.update(repo.read_payloads(snapshot_id, extra))
        decoded = decode_state(payloads, check_unique_keys=check_unique_keys)
        state = convert_v2_state(decoded, manifest, restore_system_ns=restore_system_ns,
                                 restore_steady_ns=restore_steady_ns)
        # after the conversion, so a pair that overflows it still counts as a conversion failure
        check_clock_pair(manifest)
        assert manifest.steady_now_ns is not None  # set exactly for v2
        try:
            decoded.check_deadline_horizon(manifest.steady_now_ns, max_ttl_ns)
        except SnapshotFieldError as e:
            raise ManifestClockError(f"{snapshot_id}: steady_now_ns {manifest.steady_now_ns} contradicts "
                                     f"the deadlines: {e}") from e
        release_mapped()  # the deadline columns' pages (now converted copies)
    else:
        payloads = {k: bytes(v) for k, v in repo.read_payloads(snapshot_id, V1_FILES).items()}
        state = decode_v1(payloads, restore_system_ns=restore_system_ns,
                          restore_steady_ns=restore_steady_ns, max_decompressed_bytes=max_decompressed_bytes)
        state.check_deadline_horizon(restore_steady_ns, max_ttl_ns)
    return state, manifest, restore_steady_ns


def restore_latest(repo: SnapshotRepository, clocks: Clocks, drop_expired: bool = True, *,
                   max_ttl_ns: int | None = None) -> tuple[SnapshotState, SnapshotManifest, RestoreStats]:
    """Restore the newest usable candidate, converted into ``clocks``' steady domain.

    Raises :class:`NoUsableSnapshot` (with ``.stats``) when there is no candidate or all fail.
    """
    return restore_latest_with(repo, clocks, lambda state: state, drop_expired, max_ttl_ns=max_ttl_ns)


def restore_latest_with(repo: SnapshotRepository, clocks: Clocks,
                        build: Callable[[SnapshotState], T], drop_expired: bool = True, *,
                        build_checks_unique_keys: bool = False, max_ttl_ns: int | None = None,
                        max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES
                        ) -> tuple[T, SnapshotManifest, RestoreStats]:
    """:func:`restore_latest`, with ``build`` (e.g. rebuilding the engine) run on each cleaned
    candidate inside the candidate's failure scope: if ``build`` raises, the candidate fails as a
    whole and the next one is tried. The state ``build`` gets is validated already (cleanup keeps
    it so). ``build_checks_unique_keys``: the builder rejects duplicate (tenant, key) itself
    (MasterService.from_state does, while loading its key index). ``max_ttl_ns``: see
    :func:`decode_candidate`, as ``max_decompressed_bytes``. Each rejection is recorded typed
    in ``stats.rejections`` (and as
    text in ``stats.failures``)."""
    stats = RestoreStats()
    for snapshot_id in repo.candidates():
        stats.candidates_tried += 1
        try:
            t0 = time.perf_counter()
            state, manifest, now_ns = decode_candidate(repo, snapshot_id, clocks,
                                                       check_unique_keys=not build_checks_unique_keys,
                                                       max_ttl_ns=max_ttl_ns,
                                                       max_decompressed_bytes=max_decompressed_bytes)
            t1 = time.perf_counter()
            state, dropped = cleanup_state(state, now_ns, drop_expired)
            t2 = time.perf_counter()
            built = build(state)
            stats.phase_seconds = {"decode": t1 - t0, "cleanup": t2 - t1, "build": time.perf_counter() - t2}
        except Exception as e:  # any failure rejects the whole candidate (RFC invariant 8)
            error = as_snapshot_error(e)
            stats.fallbacks += 1
            stats.conversion_failures += isinstance(error, ClockConversionError)
            stats.failures.append((snapshot_id, f"{type(error).__name__}: {error}"))
            stats.rejections.append((snapshot_id, error))
            log.warning("snapshot candidate %s rejected: %s", snapshot_id, error)
            continue
        stats.snapshot_id, stats.format_version = snapshot_id, manifest.version
        stats.objects_restored, stats.objects_dropped = state.objects.num_rows, dropped
        return built, manifest, stats
    raise NoUsableSnapshot(f"no usable snapshot among {stats.candidates_tried} candidates", stats)
