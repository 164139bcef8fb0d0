"""The single-key read kernel bound to a store's current columns.

kernels/reads.read_one takes the columns as one object (kernels/read_columns.py), built from
the arrays the store holds at that moment. The store replaces arrays when it grows (columns,
replica slots and chains, key table, arena, segment table) or compacts the arena; a read
through an object built before would see the old arrays. So every read first checks that no
array of the store's holders was replaced since the object was built (store/array_epoch.py: one
integer comparison, where testing each of the 14 arrays was a tenth of the read) and builds a
new object when one was: no path that replaces an array has to remember to say so.
"""
from __future__ import annotations

from operator import is_
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from ..kernels import reads as rk
from ..kernels.dispatch import compiled
from ..kernels.read_columns import FIELDS, read_columns
from .array_epoch import ArrayEpoch

if TYPE_CHECKING:
    from .metadata import MetadataStore


class SingleKeyReader:
    """``read(key bytes, tenant code, now, ttl_ns)``: kernels/reads.read_one on the store's
    columns. Between reads the object keeps the arrays it was built from alive; :meth:`release`
    drops it when they were replaced (the master's background round calls it)."""

    def __init__(self, store: "MetadataStore") -> None:
        self._store = store
        self._built_from: tuple[Any, ...] = (None,) * len(FIELDS)  # _columns' arrays, in FIELDS order
        self._columns: Any = None
        self._epoch = -1  # ArrayEpoch.replaced when _columns was built (-1: never)
        self._kernel: Callable[..., tuple] = rk.read_one

    def sources(self) -> tuple[np.ndarray, ...]:
        """The arrays read_one reads now, in kernels/read_columns.FIELDS order."""
        s = self._store
        o, k = s.objects, s.keys
        return (k.table, k.arena, o.key_ref, o.tenant, o.flags, o.lease_deadline_ns, o.replica_status,
                o.replica_kind, o.replica_segment, s.segments.readable, o.replica_more, o.replica_id,
                o.replica_offset, o.size_bytes)

    def current(self) -> bool:
        """True when the object holds the store's arrays of now (every one of :meth:`sources`)."""
        return all(map(is_, self.sources(), self._built_from))

    def read(self, key: bytes, tenant: int, now: int, ttl_ns: int) -> tuple:
        """read_one's answer for ``key`` (its UTF-8 bytes) of tenant code ``tenant``; the caller
        holds the master lock."""
        if ArrayEpoch.replaced != self._epoch:  # some holder's array was replaced: maybe ours
            self._refresh()
        return self._kernel(self._columns, key, tenant, now, ttl_ns)

    def release(self) -> None:
        """Drop the object when the store replaced one of its arrays (the old ones are freed
        now, not at the next read)."""
        if self._columns is not None and not self.current():
            self._columns, self._built_from, self._epoch = None, (None,) * len(FIELDS), -1

    def _refresh(self) -> None:
        epoch = ArrayEpoch.replaced  # first: a replacement from here on makes the next read look again
        sources = self.sources()
        if self._columns is None or not all(map(is_, sources, self._built_from)):  # else another holder's
            self._rebuild(sources)
        self._epoch = epoch

    def _rebuild(self, sources: tuple[np.ndarray, ...]) -> None:
        columns = read_columns(*sources)
        # the machine code for exactly this object's type (its arrays' dtypes and layouts), called
        # without the dispatcher's per-call typing of the object (dispatch.compiled)
        self._kernel = compiled(rk.read_one, columns, b"", 0, 0, 0)
        self._columns, self._built_from = columns, sources
