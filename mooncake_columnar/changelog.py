"""What a journaled MasterService needs from its change log, as protocols (ha/journal.py
implements them over an oplog writer): the service never imports the HA package.

Every change reserves its entries before it mutates anything, so nothing becomes visible
without its entry; removals hide first and are freed once their entries are durable.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from .store.eviction_plan import EvictionPlan
    from .store.metadata import MetadataStore
    from .store.segments import Segment

# the service's durable-callback of hidden removals: (rows, replica ids) to free if unchanged
RemovalFinalizer = Callable[[np.ndarray, np.ndarray], None]


class PendingChange(Protocol):
    """Reserved entries of a change being made: exactly one of submit() or cancel()."""

    def submit(self) -> None: ...

    def cancel(self) -> None: ...


class ChangeLog(Protocol):
    """The hooks a journaled master calls under its lock."""

    @property
    def window(self) -> int:
        """Most entries one reservation may hold."""
        ...

    @property
    def terminal_error(self) -> BaseException | None:
        """Why the log stopped for good (None while it works)."""
        ...

    def reserve(self, n: int) -> Any | None:
        """``n`` entries, or None (nothing reserved) when the window stayed full."""
        ...

    def submit_put_ends(self, reservation: Any, rows: np.ndarray) -> None:
        """PUT_END of ``rows``, whose puts just completed, into ``reservation``."""
        ...

    def hide_then_free(self, rows: np.ndarray, plan: "EvictionPlan | None" = None) -> int:
        """Hide the replicas ``plan`` removes (default: all) of ``rows``, free once durable;
        returns how many of ``rows`` (a prefix) were hidden."""
        ...

    def segments(self, segs: Sequence["Segment"], mounted: bool) -> PendingChange | None:
        """Reserve the entries of a segment change; None when the window stayed full."""
        ...


class ChangeLogSink(Protocol):
    """What ``MasterService(journal=...)`` takes (an ``OpLogWriter``): it binds a change log
    to the master's store."""

    def change_log(self, store: "MetadataStore", finalize: RemovalFinalizer,
                   admission_timeout_s: float) -> ChangeLog: ...


class _Unlogged:
    """The pending change of a master without a journal: nothing to submit or cancel."""

    def submit(self) -> None:
        pass

    def cancel(self) -> None:
        pass


NOT_LOGGED: PendingChange = _Unlogged()
