"""The service as its policies see it.

The service (master.py: MasterService) validates, locks and calls the policies, and sits above
this package; the policies take it as ``m`` and name it by :class:`Service`, the part of it they
read and set. The client liveness it keeps (:class:`ClientLiveness`) is defined here, beside it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ..changelog import ChangeLog
    from ..clock import Clocks
    from ..config import MasterConfig
    from ..metrics import Metrics
    from ..store.metadata import MetadataStore


class ClientLiveness:
    """Clients' liveness deadlines (steady ns) and which clients have remounted (ping OK)."""

    def __init__(self, ttl_ns: int) -> None:
        self.ttl_ns = ttl_ns
        self.deadline_ns: dict[str, int] = {}
        self.remounted: set[str] = set()

    def touch(self, client: str, now_ns: int) -> None:
        """``client`` was heard from at ``now_ns``: alive for another TTL."""
        self.deadline_ns[client] = now_ns + self.ttl_ns

    def silent(self, now_ns: int) -> list[str]:
        """Clients whose deadline passed."""
        return [c for c, d in self.deadline_ns.items() if d < now_ns]

    def forget(self, client: str) -> None:
        """Drop an expired client."""
        del self.deadline_ns[client]
        self.remounted.discard(client)


class Service(Protocol):
    """A MasterService as its policies see it."""

    eviction_armed: bool  # an allocation failure eviction could fix arms the next background eviction

    @property
    def store(self) -> MetadataStore: ...
    @property
    def config(self) -> MasterConfig: ...
    @property
    def clocks(self) -> Clocks: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def journal(self) -> ChangeLog | None: ...  # an HA primary's change log
    @property
    def liveness(self) -> ClientLiveness: ...
    @property
    def remount_fault(self) -> Callable[[str], None] | None: ...  # tests: fail a remount at a named step
