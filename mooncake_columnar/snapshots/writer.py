"""The one complete-snapshot writer: encode a state (v2 Arrow payloads, or upstream's v1 for a
rollback), name it with the repository's id allocator, publish it (payloads, manifest last).

:class:`~.manager.SnapshotManager` (periodic, frozen from a live master), its v2 fallback for a
refused v1 snapshot, :func:`~.complete.write_snapshot` and :func:`~.mooncake_v1.write_v1` (a
given state) all write through :func:`publish_state`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol

from ..memory import warm_free_memory
from .arrow_codec import state_payloads
from .manifest import SnapshotIdAllocator, v1_manifest, v2_manifest
from .repository import Data, SnapshotRepository, stored_size
from ..store.snapshot_state import SnapshotState


class IdSource(Protocol):
    """Names the next snapshot (:class:`SnapshotIdAllocator`; a forked writer's
    :class:`~.forked.IdFromParent`)."""

    def next_id(self, system_ns: int) -> str: ...


@dataclass(frozen=True)
class Published:
    snapshot_id: str
    stored_bytes: int  # payloads and manifest


def publish_state(repo: SnapshotRepository, state: SnapshotState, system_now_ns: int, steady_now_ns: int, *,
                  ids: IdSource | None = None, v1: bool = False, compression: str | None = None,
                  keys_known_unique: bool = False, prefault: bool = False) -> Published:
    """Publish ``state`` under the next id of ``ids`` (default: a fresh allocator over ``repo``:
    the id sorts above every snapshot there). The (system, steady) pair must have been captured
    once, with the state frozen. ``v1``: upstream's format (raises
    :class:`~mooncake_columnar.errors.RollbackRefused`, nothing published, for what upstream
    could not load). ``keys_known_unique``: the state comes from an engine, whose key index
    guarantees unique keys. ``prefault``: warm about the payloads' bytes of fresh memory before
    writing to a local repository (see :mod:`..memory`)."""
    payloads: Mapping[str, Data]
    if v1:
        from .mooncake_v1 import encode_v1  # the v1 codec imports this module for write_v1
        payloads = encode_v1(state.plain(), system_now_ns=system_now_ns, steady_now_ns=steady_now_ns)
    else:
        payloads = state_payloads(state, compression, keys_known_unique=keys_known_unique)
    warm = sum(t.nbytes for t in (state.objects, state.replicas, state.segments)) if prefault and not v1 else 0
    return publish_payloads(repo, payloads, system_now_ns, steady_now_ns, ids=ids, v1=v1, warm_bytes=warm)


def publish_payloads(repo: SnapshotRepository, payloads: Mapping[str, Data], system_now_ns: int,
                     steady_now_ns: int, *, ids: IdSource | None = None, v1: bool = False,
                     warm_bytes: int = 0) -> Published:
    """Publish encoded ``payloads`` (see :func:`publish_state`). ``warm_bytes``: about the files'
    bytes, warmed in fresh memory before writing to a local repository, less what recycled
    files cover (see :mod:`..memory`)."""
    sid = (ids or SnapshotIdAllocator(repo.list)).next_id(system_now_ns)
    manifest = (v1_manifest(sid) if v1 else v2_manifest(sid, system_now_ns, steady_now_ns)).encode()
    if warm_bytes and repo.is_local:
        warm_free_memory(warm_bytes - repo.recycled_bytes())
    repo.publish(sid, payloads, manifest)
    return Published(sid, sum(map(stored_size, payloads.values())) + len(manifest))
