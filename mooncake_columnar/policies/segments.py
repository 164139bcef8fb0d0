"""Segments and clients: mount requests, journaled unmounts, the remount answer to NEED_REMOUNT
(RFC Phase 1 recovery of standby-restored segments) and client liveness."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Iterable, Sequence

from ..changelog import NOT_LOGGED, PendingChange
from ..config import MasterConfig
from ..errors import InvalidParams, UnavailableInCurrentStatus
from ..store.segments import Segment, SegmentTable
from ..store.upstream_ids import is_upstream_uuid
from ..validation import require_int, require_str
from .recovery import RemountReport, recover_segments
from .service import ClientLiveness  # noqa: F401  (defined beside the Service protocol; importable here too)

if TYPE_CHECKING:
    from .service import Service


def require_client(config: MasterConfig, client_id: object) -> str:
    """A client id; with ``config.require_upstream_client_ids`` it must be upstream's UUID
    string (``"<u64>-<u64>"``), which a v1 rollback snapshot needs for every client."""
    client = require_str("client_id", client_id)
    if config.require_upstream_client_ids and not is_upstream_uuid(client):
        raise InvalidParams(f"client_id {client!r} is not an upstream UUID string \"<u64>-<u64>\" "
                            "(MasterConfig.require_upstream_client_ids: v1 rollback snapshots "
                            "need upstream client ids)")
    return client


def requested_segment(config: MasterConfig, name: object, endpoint: object, client: object, base: object,
                      size: object, segment_id: object, host_id: object) -> Segment:
    """A validated mount request (segment id "" when the request names none)."""
    if segment_id is None:
        segment_id = ""
    elif not isinstance(segment_id, str) or not is_upstream_uuid(segment_id):
        raise InvalidParams(f"segment_id must be an upstream UUID string \"<u64>-<u64>\", "
                            f"got {segment_id!r}")
    return Segment(require_str("name", name), require_str("endpoint", endpoint),
                   require_client(config, client), require_int("base", base, 1),
                   require_int("size", size, 1), segment_id,
                   require_str("host_id", host_id, allow_empty=True))


def journal_segments(m: "Service", segs: list[Segment], *, mounted: bool) -> PendingChange:
    """Reserve the oplog entries of a segment change before making it; raises
    UnavailableInCurrentStatus (nothing changed) when the oplog window stays full."""
    if m.journal is None:
        return NOT_LOGGED
    pending = m.journal.segments(segs, mounted)
    if pending is None:
        m.metrics.inc("segment_oplog_backpressure")
        raise UnavailableInCurrentStatus("oplog window full: segment change not made, retry")
    return pending


def unmount(m: "Service", codes: Iterable[int]) -> None:
    """Unmount segments ``codes``, each journaled before it is made."""
    s = m.store
    for code in codes:
        journaled = journal_segments(m, [s.segments.mounted(code)], mounted=False)
        s.unmount_segment(code)
        journaled.submit()


def expire_clients(m: "Service") -> list[str]:
    """Clients silent for client_live_ttl_s: forget them and unmount their segments."""
    expired = []
    for client in m.liveness.silent(m.clocks.steady_ns()):
        try:
            unmount(m, m.store.segments.codes_of_client(client))
        except UnavailableInCurrentStatus:  # oplog window full: the next tick retries
            continue
        m.liveness.forget(client)
        expired.append(client)
    return expired


def _fresh_id(segments: SegmentTable, taken: set[str]) -> str:
    while True:
        segment_id = segments.fresh_id()
        if segment_id not in taken:
            taken.add(segment_id)
            return segment_id


def _validated_request(m: "Service", client: str,
                    segments: Sequence[Segment | dict]) -> tuple[list[Segment], list[tuple[int, Segment]]]:
    """Validate a remount request: (unknown segments to mount, (code, request) of the
    standby-restored ones). Raises InvalidParams on anything wrong, before any change."""
    table = m.store.segments
    plain: list[Segment] = []
    restored: list[tuple[int, Segment]] = []
    claimed: set[str] = set()  # segment ids this call names
    named: set[str] = set()  # segment names this call names
    restored_by_endpoint = {s.endpoint: c for c, s in enumerate(table.info)
                            if s is not None and not table.readable[c]}
    for s in segments:
        try:
            seg = s if isinstance(s, Segment) else Segment(**s) if isinstance(s, dict) else None
        except TypeError as e:  # a dict with unknown or missing fields
            raise InvalidParams(f"segment {s!r}: {e}") from None
        if seg is None:
            raise InvalidParams("segments must be Segment or dict items")
        seg = requested_segment(m.config, seg.name, seg.endpoint, seg.client, seg.base, seg.size,
                                seg.segment_id or None, seg.host_id)
        if seg.client != client:
            raise InvalidParams(f"segment {seg.name!r} belongs to client {seg.client!r}, not {client!r}")
        if seg.name in named:  # one name, one segment: two mounts under one name would split the registry
            raise InvalidParams(f"segment {seg.name!r} is named twice in one remount")
        named.add(seg.name)
        code = table.code(seg.name)
        by_endpoint = restored_by_endpoint.get(seg.endpoint, -1)
        if by_endpoint >= 0 and by_endpoint != code:
            # upstream ValidateStandbyRemountSegment: a standby segment matched by endpoint
            # must match by name too (else the real segment would stay unreadable forever)
            raise InvalidParams(f"segment {seg.name!r} has the endpoint of standby segment "
                                f"{table.mounted(by_endpoint).name!r} but another name")
        if seg.segment_id:
            by_id = table.code_of_id(seg.segment_id)
            if by_id >= 0 and by_id != code or seg.segment_id in claimed:
                # one id, one segment: a second segment under a mounted id would overlap it
                raise InvalidParams(f"segment {seg.name!r}: segment id {seg.segment_id!r} is "
                                    f"already mounted as another segment")
            claimed.add(seg.segment_id)
        existing = table.info[code] if code >= 0 else None
        if existing is None:
            plain.append(seg)
        elif not table.readable[code]:
            # standby-restored: must match the standby registry's name, endpoint and capacity;
            # the client's segment id and host id replace those the registry held
            if (existing.endpoint, existing.size) != (seg.endpoint, seg.size):
                raise InvalidParams(f"segment {seg.name!r} does not match the standby registry "
                                    f"(endpoint {existing.endpoint!r}, capacity {existing.size})")
            restored.append((code, seg))
        elif not existing.same_mount(seg):
            raise InvalidParams(f"segment {seg.name!r} is mounted with a different identity")
    # a new segment without an id gets a fresh one (the set holds the ids named above)
    return [s if s.segment_id else replace(s, segment_id=_fresh_id(table, claimed)) for s in plain], restored


def remount(m: "Service", client_id: str, segments: Sequence[Segment | dict]) -> RemountReport:
    """The client's answer to NEED_REMOUNT (see MasterService.remount_segments)."""
    t0 = time.perf_counter()
    client = require_client(m.config, client_id)
    table = m.store.segments
    plain, restored = _validated_request(m, client, segments)
    renamed: list[Segment] = []
    for c, seg in restored:
        old = table.mounted(c)
        renamed.append(replace(old, segment_id=seg.segment_id or old.segment_id, host_id=seg.host_id or old.host_id))
    table.check_room(plain)
    journaled = journal_segments(m, plain + renamed, mounted=True)
    rec = None
    if restored:
        try:
            rec = recover_segments(m, client, restored, m.remount_fault)
        except Exception:
            journaled.cancel()  # nothing was published: the entries must not hold the log back
            m.metrics.inc("remount_failures")
            raise
    m.liveness.touch(client, m.clocks.steady_ns())
    for seg in plain:
        table.mount(seg)
    journaled.submit()
    m.liveness.remounted.add(client)
    report = RemountReport(
        client, tuple(s.name for _, s in restored), len(plain), rec.matched if rec else 0,
        m.config.effective_recovery_kv_lease_ttl_ms, rec.deadline if rec else 0,
        rec.locate_seconds if rec else 0.0, rec.rebuild_seconds if rec else 0.0,
        rec.assignment_seconds if rec else 0.0, time.perf_counter() - t0, rec.visible_ttl_ms if rec else 0.0)
    if restored:
        metrics = m.metrics
        metrics.inc("remount_matched_objects", report.matched_objects)
        metrics.set("remount_assignment_seconds", report.assignment_seconds)
        metrics.set("remount_total_seconds", report.total_seconds)
        metrics.set("remount_effective_recovery_ttl_ms", report.effective_recovery_ttl_ms)
        metrics.set("remount_visible_ttl_ms", report.visible_ttl_ms)
    return report
