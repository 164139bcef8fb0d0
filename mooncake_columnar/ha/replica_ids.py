"""Moved to store/replica_ids.py (the service holds the index and its self-check verifies it,
both below ha/); its names stay importable from here."""
from ..store.replica_ids import ReplicaIdIndex, held_ids

__all__ = ["ReplicaIdIndex", "held_ids"]
