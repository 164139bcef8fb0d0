"""Abandoned puts (upstream DiscardExpiredProcessingReplicas): puts older than the release
timeout lose their PROCESSING replicas, whose space stays held until it is due, and the object."""
from __future__ import annotations

import numpy as np

from ..schema import ST_COMPLETE
from ..store.metadata import MetadataStore


def discard_expired_puts(store: MetadataStore, release_timeout_ms: int, now_ms: int) -> None:
    """Discard the puts started more than ``release_timeout_ms`` before ``now_ms`` that hold
    no COMPLETE replica."""
    o, inflight = store.objects, store.inflight
    slots = np.flatnonzero(inflight.in_use)
    late = slots[inflight.put_start_time_ms[slots] + release_timeout_ms < now_ms]
    if late.size:
        rows = inflight.owned_rows(late)
        chains = o.chains(rows)
        store.discard_puts(rows[~chains.any(o.replica_status[chains.rows] == ST_COMPLETE)], release_timeout_ms)
