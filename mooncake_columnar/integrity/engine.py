"""What the self-check reads of a master: the service (master.py: MasterService) calls
``verify_engine`` and sits above this package, so the checks name it by this shape."""
from __future__ import annotations

from typing import Protocol

from ..config import MasterConfig
from ..store.metadata import MetadataStore
from ..store.replica_ids import ReplicaIdIndex


class Engine(Protocol):
    """A MasterService as its self-check sees it."""

    @property
    def store(self) -> MetadataStore: ...
    @property
    def config(self) -> MasterConfig: ...
    @property
    def standby_replica_ids(self) -> ReplicaIdIndex | None: ...  # a standby's container only
