"""Per-tenant memory ledger: pending bytes (PROCESSING replicas) and committed bytes (COMPLETE).

The ledger is derived from replica statuses: a mutation on some rows un-charges them first and
re-charges them after (``charge(rows, -1)`` / ``charge(rows, +1)``), so put_end, revoke, remove,
eviction and unmount keep it exact without per-path arithmetic.
"""
from __future__ import annotations

import numpy as np

from ..schema import KIND_MEMORY, ReplicaStatus
from .objects import ObjectTable

_PROCESSING = int(ReplicaStatus.PROCESSING)
_COMPLETE = int(ReplicaStatus.COMPLETE)


class TenantLedger:
    def __init__(self) -> None:
        self.pending = np.zeros(8, np.int64)
        self.committed = np.zeros(8, np.int64)

    def _ensure(self, tenants: int) -> None:
        if tenants > self.pending.size:
            size = max(tenants, 2 * self.pending.size)
            for name in ("pending", "committed"):
                grown = np.zeros(size, np.int64)
                old = getattr(self, name)
                grown[: old.size] = old
                setattr(self, name, grown)

    def charge(self, objects: ObjectTable, rows: np.ndarray, sign: int) -> None:
        """Add (sign=+1) or remove (sign=-1) the memory bytes that ``rows`` hold now."""
        if rows.size == 0:
            return
        chains = objects.chains(rows)  # an object's replicas: its row's slots and its continuation rows'
        st = objects.replica_status[chains.rows]
        mem = objects.replica_kind[chains.rows] == int(KIND_MEMORY)
        size = objects.size_bytes[rows]
        tenant = objects.tenant[rows]
        self._ensure(int(tenant.max()) + 1)
        np.add.at(self.pending, tenant, sign * size * chains.count((st == _PROCESSING) & mem))
        np.add.at(self.committed, tenant, sign * size * chains.count((st == _COMPLETE) & mem))

    def used(self, tenant: int) -> int:
        if tenant >= self.pending.size:
            return 0
        return int(self.pending[tenant] + self.committed[tenant])
