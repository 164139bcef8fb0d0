"""Segments and clients: mount, unmount, ping, remount, liveness expiry (a MasterService part)."""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterable, Sequence

import numpy as np

from .clock import NS_PER_S
from .errors import InvalidParams, SegmentAlreadyExists, UnavailableInCurrentStatus
from .ha.journal import NOT_JOURNALED, PendingEntries
from .kernels import objects as ok
from .recovery import RemountReport, recover_segments
from .schema import PingStatus
from .store.segments import Segment
from .upstream_ids import is_upstream_uuid
from .validation import _locked, _require_int, _require_str


class SegmentsMixin:
    """Mounted segments and client liveness of a MasterService."""

    # ================================================================================ segments
    @_locked
    def mount_segment(self, name: str, *, endpoint: str, client_id: str, base: int, size: int,
                      segment_id: str | None = None, host_id: str = "") -> str:
        """Mount a memory segment; returns its segment id. Re-mounting an identical segment is a
        no-op. ``segment_id``: upstream's segment UUID (``"<u64>-<u64>"``) as the client's
        ``Segment`` carries it; without one the master generates one (as upstream's client does)
        and keeps it, so a v1 rollback snapshot names the segment by the id it is known by."""
        seg = self._requested_segment(name, endpoint, client_id, base, size, segment_id, host_id)
        now = self.clocks.steady_ns()
        self._touch_client(seg.client, now)
        existing = self.segments.get(seg.name)
        if existing is not None:
            if existing.same_mount(seg):
                return existing.segment_id
            raise SegmentAlreadyExists(f"segment {seg.name!r} is mounted with different parameters")
        if seg.segment_id in self.segments.by_id:
            raise SegmentAlreadyExists(f"segment id {seg.segment_id!r} is already mounted as "
                                       f"{self.segments.info[self.segments.by_id[seg.segment_id]].name!r}")
        seg = replace(seg, segment_id=seg.segment_id or self.segments.fresh_id())
        journaled = self._journal_segments([seg], mounted=True)
        self.segments.mount(seg)
        journaled.submit()
        return seg.segment_id

    def _requested_segment(self, name: object, endpoint: object, client: object, base: object,
                           size: object, segment_id: object, host_id: object) -> Segment:
        """A validated mount request (segment id "" when the request names none)."""
        if segment_id is not None and not is_upstream_uuid(segment_id):
            raise InvalidParams(f"segment_id must be an upstream UUID string \"<u64>-<u64>\", "
                                f"got {segment_id!r}")
        return Segment(_require_str("name", name), _require_str("endpoint", endpoint),
                       self._require_client(client), _require_int("base", base, 1),
                       _require_int("size", size, 1), segment_id or "",
                       _require_str("host_id", host_id, allow_empty=True))

    @_locked
    def unmount_segment(self, name: str) -> None:
        """Unmount: its replicas are dropped at once; objects left without replicas are removed."""
        code = self.segments.code(_require_str("name", name))
        if code < 0:
            return  # idempotent, as upstream
        self._unmount_codes([code])

    def _journal_segments(self, segs: list[Segment], *, mounted: bool) -> PendingEntries:
        """Reserve the oplog entries of a segment change before making it; raises
        UnavailableInCurrentStatus (nothing changed) when the oplog window stays full."""
        if self.journal is None:
            return NOT_JOURNALED
        pending = self.journal.segments(segs, mounted)
        if pending is None:
            self.metrics.inc("segment_oplog_backpressure")
            raise UnavailableInCurrentStatus("oplog window full: segment change not made, retry")
        return pending

    def _unmount_codes(self, codes: Iterable[int]) -> None:
        o = self.objects
        for code in codes:
            journaled = self._journal_segments([self.segments.info[code]], mounted=False)
            self.segments.allocatable[code] = False  # allocator dropped: nothing on it is freed
            hw = o.high_water
            on_seg = (np.unique(o.owners(np.flatnonzero(o.memory_slots_on(code).any(axis=1))))
                      if self._ledger_on else None)
            if on_seg is not None:
                self._charge(on_seg, -1)
            emptied = ok.drop_slots_on_segment(code, hw, o.flags, o.replica_segment,
                                               o.replica_status, o.replica_kind, o.replica_more)
            if on_seg is not None:
                self._charge(np.setdiff1d(on_seg, emptied), +1)
            self._erase_rows(emptied, charged=False)
            keep = self._discarded_seg != code
            self._drop_discarded(keep)
            journaled.submit()
            self.segments.unmount(code)

    @_locked
    def ping(self, client_id: str) -> PingStatus:
        """OK for a client that has remounted; NEED_REMOUNT otherwise (upstream Ping)."""
        client = _require_str("client_id", client_id)
        self._touch_client(client, self.clocks.steady_ns())
        return PingStatus.OK if client in self._ok_clients else PingStatus.NEED_REMOUNT

    @_locked
    def remount_segments(self, client_id: str, segments: Sequence[Segment | dict]) -> RemountReport:
        """The client's answer to NEED_REMOUNT.

        Identical already-mounted segments are a no-op; unknown ones are mounted; segments restored
        from a standby (unreadable, invalid endpoint) are recovered in RFC Phase 1 order and their
        objects get ONE recovery lease. Everything is validated first; a failure mounts, publishes
        and grants nothing (retry later) and the client stays NEED_REMOUNT.
        """
        t0 = time.perf_counter()
        client = self._require_client(client_id)
        plain: list[Segment] = []
        restored: list[tuple[int, Segment]] = []
        claimed: set[str] = set()  # segment ids this call names
        restored_by_endpoint = {s.endpoint: c for c, s in enumerate(self.segments.info)
                                if s is not None and not self.segments.readable[c]}
        for s in segments:
            try:
                seg = s if isinstance(s, Segment) else Segment(**s) if isinstance(s, dict) else None
            except TypeError as e:  # a dict with unknown or missing fields
                raise InvalidParams(f"segment {s!r}: {e}") from None
            if seg is None:
                raise InvalidParams("segments must be Segment or dict items")
            seg = self._requested_segment(seg.name, seg.endpoint, seg.client, seg.base, seg.size,
                                          seg.segment_id or None, seg.host_id)
            if seg.client != client:
                raise InvalidParams(f"segment {seg.name!r} belongs to client {seg.client!r}, not {client!r}")
            code = self.segments.code(seg.name)
            by_endpoint = restored_by_endpoint.get(seg.endpoint, -1)
            if by_endpoint >= 0 and by_endpoint != code:
                # upstream ValidateStandbyRemountSegment: a standby segment matched by endpoint
                # must match by name too (else the real segment would stay unreadable forever)
                raise InvalidParams(f"segment {seg.name!r} has the endpoint of standby segment "
                                    f"{self.segments.info[by_endpoint].name!r} but another name")
            if seg.segment_id:
                by_id = self.segments.code_of_id(seg.segment_id)
                if by_id >= 0 and by_id != code or seg.segment_id in claimed:
                    # one id, one segment: a second segment under a mounted id would overlap it
                    raise InvalidParams(f"segment {seg.name!r}: segment id {seg.segment_id!r} is "
                                        f"already mounted as another segment")
                claimed.add(seg.segment_id)
            existing = self.segments.info[code] if code >= 0 else None
            if existing is None:
                plain.append(seg)
            elif not self.segments.readable[code]:
                # standby-restored: must match the standby registry's name, endpoint and capacity;
                # the client's segment id and host id replace those the registry held
                if (existing.endpoint, existing.size) != (seg.endpoint, seg.size):
                    raise InvalidParams(f"segment {seg.name!r} does not match the standby registry "
                                        f"(endpoint {existing.endpoint!r}, capacity {existing.size})")
                restored.append((code, seg))
            elif not existing.same_mount(seg):
                raise InvalidParams(f"segment {seg.name!r} is mounted with a different identity")
        # a new segment without an id gets a fresh one (the set holds the ids named above)
        plain = [s if s.segment_id else replace(s, segment_id=self._fresh_id(claimed)) for s in plain]
        renamed = [replace(self.segments.info[c], segment_id=seg.segment_id or self.segments.info[c].segment_id,
                           host_id=seg.host_id or self.segments.info[c].host_id) for c, seg in restored]
        journaled = self._journal_segments(plain + renamed, mounted=True)
        rec = None
        if restored:
            try:
                rec = recover_segments(self, client, restored, self.remount_fault)
            except Exception:
                journaled.cancel()  # nothing was published: the entries must not hold the log back
                self.metrics.inc("remount_failures")
                raise
        self._touch_client(client, self.clocks.steady_ns())
        for seg in plain:
            self.segments.mount(seg)
        journaled.submit()
        self._ok_clients.add(client)
        report = RemountReport(
            client, tuple(s.name for _, s in restored), len(plain), rec.matched if rec else 0,
            self.config.effective_recovery_kv_lease_ttl_ms, rec.deadline if rec else 0,
            rec.locate_seconds if rec else 0.0, rec.rebuild_seconds if rec else 0.0,
            rec.assignment_seconds if rec else 0.0, time.perf_counter() - t0, rec.visible_ttl_ms if rec else 0.0)
        if restored:
            m = self.metrics
            m.inc("remount_matched_objects", report.matched_objects)
            m.set("remount_assignment_seconds", report.assignment_seconds)
            m.set("remount_total_seconds", report.total_seconds)
            m.set("remount_effective_recovery_ttl_ms", report.effective_recovery_ttl_ms)
            m.set("remount_visible_ttl_ms", report.visible_ttl_ms)
        return report

    def _fresh_id(self, taken: set[str]) -> str:
        while True:
            segment_id = self.segments.fresh_id()
            if segment_id not in taken:
                taken.add(segment_id)
                return segment_id

    def _require_client(self, client_id: object) -> str:
        """A client id; with ``config.require_upstream_client_ids`` it must be upstream's UUID
        string (``"<u64>-<u64>"``), which a v1 rollback snapshot needs for every client."""
        client = _require_str("client_id", client_id)
        if self.config.require_upstream_client_ids and not is_upstream_uuid(client):
            raise InvalidParams(f"client_id {client!r} is not an upstream UUID string \"<u64>-<u64>\" "
                                "(MasterConfig.require_upstream_client_ids: v1 rollback snapshots "
                                "need upstream client ids)")
        return client

    def _touch_client(self, client: str, now: int) -> None:
        self._client_deadline_ns[client] = now + self.config.client_live_ttl_s * NS_PER_S

    @_locked
    def expire_clients(self) -> list[str]:
        """Clients silent for client_live_ttl_s: forget them and unmount their segments."""
        now = self.clocks.steady_ns()
        expired = []
        for client in [c for c, d in self._client_deadline_ns.items() if d < now]:
            try:
                self._unmount_codes(self.segments.codes_of_client(client))
            except UnavailableInCurrentStatus:  # oplog window full: the next tick retries
                continue
            del self._client_deadline_ns[client]
            self._ok_clients.discard(client)
            expired.append(client)
        return expired

