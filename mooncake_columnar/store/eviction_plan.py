"""EvictionPlan: what one eviction decision removes, before anything is freed.

Eviction (policies/eviction.py) makes one; the store drops it (MetadataStore.drop_planned) and
the journal writes it (changelog.ChangeLog.hide_then_free), which is why it lives down here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .objects import Chains


@dataclass(frozen=True)
class EvictionPlan:
    """What one eviction decision removes, before anything is freed (the oplog hook).

    ``removed[k, j]`` marks replica slot j of row ``chains.rows[k]`` (object ``rows[i]``'s row or
    a continuation row of it, i = chains.owner[k]) that eviction drops; ``remaining[k, j]`` the
    slots that stay (PUT_END(remaining) or, when none, REMOVE).
    """

    rows: np.ndarray
    chains: Chains
    removed: np.ndarray
    remaining: np.ndarray

    @property
    def erased(self) -> np.ndarray:
        """Rows left without any replica: the whole object goes."""
        return self.rows[~self.chains.any(self.remaining)]

    def part(self, lo: int, hi: int) -> "EvictionPlan":
        """The plan for ``rows[lo:hi]`` (slices: chain rows are grouped by object, in order)."""
        a, b = np.searchsorted(self.chains.owner, (lo, hi))
        return EvictionPlan(self.rows[lo:hi], Chains(self.chains.owner[a:b] - lo, self.chains.rows[a:b], hi - lo),
                            self.removed[a:b], self.remaining[a:b])

    def subset(self, objects: np.ndarray) -> "EvictionPlan":
        """The plan for ``rows[objects]`` only (a boolean mask or ascending indices)."""
        take = np.zeros(self.rows.size, np.bool_)
        take[objects] = True
        if take.all():
            return self
        on = take[self.chains.owner]
        owner = (np.cumsum(take) - 1)[self.chains.owner[on]]
        return EvictionPlan(self.rows[take], Chains(owner, self.chains.rows[on], int(take.sum())),
                            self.removed[on], self.remaining[on])
