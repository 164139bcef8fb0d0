"""The single-key read kernel bound to a store's current columns.

kernels/reads.read_one takes the columns as the address of one table (kernels/read_columns.py),
built from the arrays the store holds at that moment; the reader keeps those arrays alive. The
store replaces arrays when it grows (columns, replica slots and chains, key table, arena,
segment table) or compacts the arena; a read through a table built before would see the old
arrays. So every read first checks that no array of the store's holders was replaced since the
table was built (store/array_epoch.py: one integer comparison, where testing each of the 15
arrays was a tenth of the read) and builds a new table when one was: no path that replaces an
array has to remember to say so.
"""
from __future__ import annotations

from operator import is_
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
from numba import config

from ..errors import InvalidParams
from ..kernels import reads as rk
from ..kernels.dispatch import compiled
from ..kernels.leases import grant_group_read_lease
from ..kernels.read_columns import FIELDS, column_table
from ..schema import CODE_DTYPE, MAX_KEY_BYTES
from ..validation import require_str
from .array_epoch import ArrayEpoch

if TYPE_CHECKING:
    from .metadata import MetadataStore


def _key_bytes(key: object) -> bytes:
    """The UTF-8 bytes of a single-key read's key, or InvalidParams (not a str, empty, a lone
    surrogate, longer than MAX_KEY_BYTES)."""
    b = require_str("key", key).encode()
    if len(b) > MAX_KEY_BYTES:
        raise InvalidParams(f"key longer than {MAX_KEY_BYTES} bytes")
    return b


class SingleKeyReader:
    """``read(key, tenant_id, now, ttl_ns)``: kernels/reads.read_one on the store's columns.
    Between reads the object keeps the arrays its column table describes alive; :meth:`release`
    drops them when they were replaced (the master's background round calls it)."""

    def __init__(self, store: "MetadataStore") -> None:
        self._store = store
        self._built_from: tuple[Any, ...] = (None,) * len(FIELDS)  # the table's arrays, in FIELDS order
        self._table: np.ndarray | None = None  # their column table (kept alive with them)
        self._address = 0  # ... its address, read_one's argument
        self._epoch = -1  # ArrayEpoch.replaced when the table was built (-1: never)
        self._kernel: Callable[..., tuple] = rk.read_one

    def sources(self) -> tuple[np.ndarray, ...]:
        """The arrays read_one reads now, in kernels/read_columns.FIELDS order."""
        s = self._store
        o, k = s.objects, s.keys
        return (k.table, k.arena, o.key_ref, o.tenant, o.flags, o.lease_deadline_ns, o.replica_status,
                o.replica_kind, o.replica_segment, s.segments.readable, o.replica_more, o.replica_id,
                o.replica_offset, o.size_bytes, s.segments.unit_bits)

    def current(self) -> bool:
        """True when the object holds the store's arrays of now (every one of :meth:`sources`)."""
        return all(map(is_, self.sources(), self._built_from))

    def read(self, key: str, tenant_id: str, now: int, ttl_ns: int) -> tuple:
        """read_one's answer for ``key`` of tenant ``tenant_id`` (InvalidParams for a bad key or
        tenant), with the read lease granted on OK, the group's too; the caller holds the master
        lock. One Python frame between the master's call and the kernel: its body is most of a
        single get's time (no NumPy array or Arrow object per call)."""
        # the common key (a non-empty ASCII str: as many bytes as characters) checked in one test
        b = key.encode() if type(key) is str and key.isascii() and 0 < len(key) <= MAX_KEY_BYTES else _key_bytes(key)
        s = self._store
        tenant = (s.tenants.lookup(tenant_id, -1) if type(tenant_id) is str
                  else s.tenants.find(require_str("tenant_id", tenant_id)))
        if ArrayEpoch.replaced != self._epoch:  # some holder's array was replaced: maybe ours
            self._refresh()
        answer = self._kernel(self._address, b, tenant, now, ttl_ns)
        if answer[2]:  # a grouped object whose group awaits the lease
            o = s.objects
            grant_group_read_lease(answer[1], now, ttl_ns, o.lease_deadline_ns, o.flags, s.group_of.links())
        return answer

    def release(self) -> None:
        """Drop the table and its arrays when the store replaced one of them (the old ones are
        freed now, not at the next read)."""
        if self._table is not None and not self.current():
            self._table, self._address, self._built_from, self._epoch = None, 0, (None,) * len(FIELDS), -1

    def _refresh(self) -> None:
        epoch = ArrayEpoch.replaced  # first: a replacement from here on makes the next read look again
        sources = self.sources()
        if self._table is None or not all(map(is_, sources, self._built_from)):  # else another holder's
            self._rebuild(sources)
        self._epoch = epoch

    def _rebuild(self, sources: tuple[np.ndarray, ...]) -> None:
        if getattr(config, "DISABLE_JIT", False):  # the kernels as plain Python (make test): no addresses to view
            self._kernel, self._built_from, self._table = self._read_in_python, sources, np.zeros(0, np.int64)
            return
        table = column_table(*sources)
        # the machine code for read_one's argument types, called without the dispatcher's per-call
        # typing of each argument (dispatch.compiled)
        self._kernel = compiled(rk.read_one, 0, b"", 0, 0, 0)
        self._built_from, self._table, self._address = sources, table, table.ctypes.data

    def _read_in_python(self, _: int, key: bytes, tenant: int, now: int, ttl_ns: int) -> tuple:
        return rk._read_one(*self._built_from, np.frombuffer(key, np.uint8), CODE_DTYPE.type(tenant), now, ttl_ns)
