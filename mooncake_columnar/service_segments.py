"""Segments and clients: mount, unmount, ping, remount, liveness expiry (a MasterService part)."""
from __future__ import annotations

import time
from typing import Iterable, Sequence

import numpy as np

from .clock import NS_PER_S
from .errors import InvalidParams, SegmentAlreadyExists, UnavailableInCurrentStatus
from .ha.journal import NOT_JOURNALED, PendingEntries
from .kernels import objects as ok
from .recovery import RemountReport, recover_segments
from .schema import KIND_MEMORY, PingStatus
from .store.segments import Segment
from .validation import _locked, _require_int, _require_str


class SegmentsMixin:
    """Mounted segments and client liveness of a MasterService."""

    # ================================================================================ segments
    @_locked
    def mount_segment(self, name: str, *, endpoint: str, client_id: str, base: int, size: int) -> None:
        """Mount a memory segment. Re-mounting an identical segment is a no-op."""
        seg = Segment(_require_str("name", name), _require_str("endpoint", endpoint),
                      _require_str("client_id", client_id), _require_int("base", base, 1),
                      _require_int("size", size, 1))
        now = self.clocks.steady_ns()
        self._touch_client(seg.client, now)
        existing = self.segments.get(seg.name)
        if existing is not None:
            if existing == seg:
                return
            raise SegmentAlreadyExists(f"segment {seg.name!r} is mounted with different parameters")
        journaled = self._journal_segments([seg], mounted=True)
        self.segments.mount(seg)
        journaled.submit()

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
            on_seg = np.unique(o.owners(np.flatnonzero(
                ((o.replica_segment[:hw] == code) & (o.replica_kind[:hw] == int(KIND_MEMORY))
                 & (o.replica_status[:hw] != 0)).any(axis=1)))) if self._ledger_on else None
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
        client = _require_str("client_id", client_id)
        plain: list[Segment] = []
        restored: list[tuple[int, Segment]] = []
        restored_by_endpoint = {s.endpoint: c for c, s in enumerate(self.segments.info)
                                if s is not None and not self.segments.readable[c]}
        for s in segments:
            seg = s if isinstance(s, Segment) else Segment(**s) if isinstance(s, dict) else None
            if seg is None:
                raise InvalidParams("segments must be Segment or dict items")
            seg = Segment(_require_str("name", seg.name), _require_str("endpoint", seg.endpoint),
                          _require_str("client", seg.client), _require_int("base", seg.base, 1),
                          _require_int("size", seg.size, 1))
            if seg.client != client:
                raise InvalidParams(f"segment {seg.name!r} belongs to client {seg.client!r}, not {client!r}")
            code = self.segments.code(seg.name)
            by_endpoint = restored_by_endpoint.get(seg.endpoint, -1)
            if by_endpoint >= 0 and by_endpoint != code:
                # upstream ValidateStandbyRemountSegment: a standby segment matched by endpoint
                # must match by name too (else the real segment would stay unreadable forever)
                raise InvalidParams(f"segment {seg.name!r} has the endpoint of standby segment "
                                    f"{self.segments.info[by_endpoint].name!r} but another name")
            existing = self.segments.info[code] if code >= 0 else None
            if existing is None:
                plain.append(seg)
            elif not self.segments.readable[code]:
                # standby-restored: must match the standby registry's name, endpoint and capacity
                if (existing.endpoint, existing.size) != (seg.endpoint, seg.size):
                    raise InvalidParams(f"segment {seg.name!r} does not match the standby registry "
                                        f"(endpoint {existing.endpoint!r}, capacity {existing.size})")
                restored.append((code, seg))
            elif existing != seg:
                raise InvalidParams(f"segment {seg.name!r} is mounted with a different identity")
        journaled = self._journal_segments(plain + [self.segments.info[c] for c, _ in restored], mounted=True)
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

