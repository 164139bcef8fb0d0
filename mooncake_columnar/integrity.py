"""The engine's self-check: every structural invariant of a MasterService, in columnar passes."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .master import MasterService


def verify_engine(m: "MasterService") -> None:
    """Raise EngineInvariantError naming the first broken invariant (caller holds the lock)."""
