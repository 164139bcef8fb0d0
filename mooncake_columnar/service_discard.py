"""Abandoned puts: their PROCESSING replicas are discarded and keep their space until
put_start + put_start_release_timeout_s (system clock, as upstream), then it is released."""
from __future__ import annotations

import numpy as np

from .kernels import allocation as ak
from .schema import KIND_MEMORY, ST_PROCESSING, ReplicaStatus
from .validation import _COMPLETE


class DiscardMixin:
    """Expired-put part of a MasterService (upstream DiscardExpiredProcessingReplicas)."""

    def _discard_expired_puts(self, now_ms: int) -> None:
        """Upstream DiscardExpiredProcessingReplicas: puts older than the release timeout lose
        their PROCESSING replicas (space released once due) and the object."""
        o = self.objects
        slots = np.flatnonzero(self.inflight.in_use)
        late = slots[self.inflight.put_start_time_ms[slots] + self.config.put_start_release_timeout_s * 1000
                     < now_ms]
        if late.size:
            rows = self.inflight.owned_rows(late, o.inflight)
            chains = o.chains(rows)
            self._discard_puts(rows[~chains.any(o.replica_status[chains.rows] == _COMPLETE)], now_ms)

    def _discard_puts(self, rows: np.ndarray, now_ms: int) -> None:
        """Abandoned puts: PROCESSING replicas keep their space until put_start + release timeout."""
        if rows.size == 0:
            return
        o = self.objects
        self._charge(rows, -1)
        chains = o.chains(rows)
        st = o.replica_status[chains.rows]
        r_idx, slot = np.nonzero((st == int(ST_PROCESSING)) & (o.replica_kind[chains.rows] == int(KIND_MEMORY)))
        held = chains.rows[r_idx]  # the object's row or a continuation row (which carries the size)
        release = self._put_start_time_ms(rows[chains.owner[r_idx]]) + self.config.put_start_release_timeout_s * 1000
        self._discarded_seg = np.concatenate((self._discarded_seg, o.replica_segment[held, slot].astype(np.int64)))
        self._discarded_off = np.concatenate((self._discarded_off, o.replica_offset[held, slot]))
        self._discarded_size = np.concatenate((self._discarded_size, o.size_bytes[held]))
        self._discarded_release_ms = np.concatenate((self._discarded_release_ms, release))
        o.replica_status[held, slot] = int(ReplicaStatus.UNDEFINED)  # not freed by the erase below
        self._erase_rows(rows, charged=False)

    def _release_discarded(self, now_ms: int) -> int:
        """Free discarded replicas whose release time came; returns how many were released."""
        due = self._discarded_release_ms <= now_ms
        if not due.any():
            return 0
        seg = self.segments
        ak.free_extent_list(self._discarded_seg[due], self._discarded_off[due], self._discarded_size[due],
                            seg.extent_starts, seg.extent_lengths, seg.extent_counts, seg.used,
                            seg.unit_bits, seg.capacity)
        self._drop_discarded(~due)
        return int(due.sum())

    def _drop_discarded(self, keep: np.ndarray) -> None:
        self._discarded_seg = self._discarded_seg[keep]
        self._discarded_off = self._discarded_off[keep]
        self._discarded_size = self._discarded_size[keep]
        self._discarded_release_ms = self._discarded_release_ms[keep]
