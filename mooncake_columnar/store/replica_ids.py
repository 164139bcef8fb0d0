"""The standby's replica-id index: every replica id its container's objects hold, as an int64
hash set (:mod:`..kernels.id_set`), so that oplog apply can refuse a PUT_END whose replica id
another object already holds (upstream: replica ids are unique among held replicas).

A PUT_END's ids cannot be judged by the engine's next id: PUT_ENDs arrive in the order puts end,
not the order their ids were handed out, so an id below it is often fresh. The index answers
the real question, "is this id held now?". It is built in one columnar pass when the standby's
container is loaded (``of_master``) and kept exact by apply (:mod:`.apply`), the only writer of
the container: ids leave with every object apply erases or replaces and with every replica a
segment unmount drops, and the ids of inserted objects join. ``verify`` compares it with the
columns (the engine self-check runs it while a container holds an index). A promoted master
is built anew and holds none.

About 11-21 bytes per held replica (one int64 slot at a load of 3/8 to 3/4); no per-object
Python work. It lives in the store, beside the columns it indexes: the service holds one on a
standby's container and its self-check (integrity/) verifies it, both below ha/.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import EngineInvariantError
from ..kernels import id_set
from ..schema import ST_EMPTY
from .objects import ObjectTable


class HasObjects(Protocol):
    """A master (MasterService) as the index reads it: its object table."""

    @property
    def objects(self) -> ObjectTable: ...


def held_ids(o: ObjectTable, rows: np.ndarray | None = None) -> np.ndarray:
    """The replica ids (int64) held by the objects ``rows`` (all objects when None): every in-use
    slot of their chains, continuation rows included."""
    if rows is None:
        hw = o.high_water  # continuation rows are rows of the table: one pass covers them
        status, ids = o.replica_status[:hw], o.replica_id[:hw]
    else:
        chain = o.chains(rows).rows
        status, ids = o.replica_status[chain], o.replica_id[chain]
    return ids[status != ST_EMPTY].view(np.int64)


class ReplicaIdIndex:
    """The set of replica ids a standby container holds; ``count`` members in ``table``."""

    def __init__(self, expected: int = 0) -> None:
        self.table = np.zeros(id_set.capacity_for(expected), np.int64)
        self.count = 0

    @classmethod
    def of_master(cls, m: HasObjects) -> "ReplicaIdIndex":
        """The index of every id ``m``'s objects hold; EngineInvariantError (replica_id_unique)
        if one is held twice."""
        ids = held_ids(m.objects)
        index = cls(ids.size)
        dup = int(id_set.insert(index.table, ids))
        if dup >= 0:
            raise EngineInvariantError("replica_id_unique", f"replica id {int(ids[dup])} is held twice")
        index.count = ids.size
        return index

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def first_taken(self, ids: np.ndarray, freed: np.ndarray) -> tuple[int, int]:
        """See :func:`..kernels.id_set.first_taken` (``ids`` as held in the replica columns)."""
        k, why = id_set.first_taken(self.table, _as_i64(ids), _as_i64(freed))
        return int(k), int(why)

    def replace(self, freed: np.ndarray, added: np.ndarray) -> None:
        """Remove the ids ``freed`` (all members), then add ``added`` (none a member); an id
        missing or present against that means the index drifted from the columns:
        EngineInvariantError."""
        freed, added = _as_i64(freed), _as_i64(added)
        if freed.size:
            removed = int(id_set.remove(self.table, freed))
            self.count -= removed
            if removed != freed.size:
                raise EngineInvariantError("standby_replica_ids", f"{freed.size - removed} freed replica "
                                                                  "ids were not in the standby's index")
        if added.size:
            if 4 * (self.count + added.size) > 3 * self.table.size:
                self._grow(self.count + added.size)
            dup = int(id_set.insert(self.table, added))
            if dup >= 0:
                self.count += dup
                raise EngineInvariantError("standby_replica_ids", f"replica id {int(added[dup])} was already "
                                                                  "in the standby's index")
            self.count += added.size

    def _grow(self, need: int) -> None:
        table = np.zeros(id_set.capacity_for(2 * need), np.int64)  # to a load of 3/8: room to grow
        id_set.insert(table, id_set.members(self.table))
        self.table = table

    def verify(self, m: HasObjects) -> None:
        """EngineInvariantError (standby_replica_ids) unless the index holds exactly the ids of
        ``m``'s held replicas (sorted comparison: one pass each)."""
        want = np.sort(held_ids(m.objects))
        have = np.sort(id_set.members(self.table))
        if self.count != have.size or not np.array_equal(want, have):
            missing = np.setdiff1d(want, have)
            extra = np.setdiff1d(have, want)
            raise EngineInvariantError(
                "standby_replica_ids",
                f"the standby's replica-id index holds {have.size} ids (count {self.count}), the objects "
                f"{want.size}: missing {missing[:5].tolist()}, extra {extra[:5].tolist()}")


def _as_i64(ids: np.ndarray) -> np.ndarray:
    """Replica ids (uint64 columns, checked below 2**63 before they get here) as int64."""
    ids = np.ascontiguousarray(ids)
    return ids.view(np.int64) if ids.dtype == np.uint64 else ids.astype(np.int64, copy=False)
