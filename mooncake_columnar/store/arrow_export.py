"""Engine columns -> the Arrow tables of a snapshot: the whole state at once, or in row ranges.

Export is two steps so that a snapshot holds the master's lock only for memcpy-speed work:
:func:`freeze` copies the raw columns of rows [0, high_water) (and the small dictionaries) under
the lock; the tables are built from the copies afterwards, in the *encoded* layout (name columns
are the engine's codes plus its string dictionary; keys come straight out of the arena), so no
step does per-row string work.

:class:`FrozenRows` builds the tables of the live rows of one row range. :func:`frozen_state`
takes every row as one range; a forked writer (snapshots/streamed.py) takes ranges one after the
other, so that what it allocates stays about one range's worth instead of the whole state's (a
removal anywhere makes every column a gather, about 100 bytes per object). The name columns'
dictionaries must then be the same in every range (an Arrow IPC file's batches share them):
:class:`NameNeeds` says what each range needs and their union fixes them for all.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa

from ..kernels.jit import njit
from ..kernels import arena as arena_k
from ..kernels import chains as chain_k
from ..kernels import hashing as hk
from ..kernels import objects as ok
from ..kernels.predicates import memory_on_segment_mask, memory_replica_segment
from ..kernels.replica_offsets import byte_offsets_of
from ..schema import (
    CHECKSUMS_ARROW_SCHEMA,
    FLAG_GROUPED,
    FLAG_HARD_PINNED,
    FLAG_LIVE,
    FLAG_PROCESSING,
    FLAG_SOFT_PIN_ENABLED,
    KIND_LOCAL_DISK,
    KIND_MEMORY,
    OBJECTS_PAYLOAD_SCHEMA,
    REPLICAS_PAYLOAD_SCHEMA,
    ST_EMPTY,
)
from .objects import put_start_ms
from .rare_fields import GroupTable, SoftPinTable
from .segments import Segment, segments_table
from .snapshot_state import SnapshotState, layout_table, name_array

if TYPE_CHECKING:
    from .metadata import MetadataStore

# Per-object columns a snapshot needs, and the replica slot columns (engine attribute names).
FROZEN_OBJECT_COLUMNS = ("flags", "tenant", "client", "size_bytes", "data_type",
                         "lease_deadline_ns", "key_ref", "put_start_rel")
FROZEN_REPLICA_COLUMNS = ("replica_status", "replica_kind", "replica_segment", "replica_offset",
                          "replica_id")

# (name, shape, dtype) -> an array to copy into; lets a caller hand out reusable, already
# page-faulted buffers (first touches of fresh memory cost more than the copy itself).
Allocator = Callable[[str, tuple[int, ...], np.dtype], np.ndarray]


def _fresh(name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.empty(shape, dtype)


@dataclass(frozen=True)
class FrozenColumns:
    """A master's state at one instant: copies of its mutable columns, rows [0, high_water)."""

    columns: dict[str, np.ndarray]
    arena: np.ndarray             # the key arena itself, not a copy: see freeze()
    key_bytes: int                # bytes of the live keys in it (used, less garbage)
    put_start_base_ms: int | None  # put_start_rel is ms after it (ObjectTable.set_put_start)
    checksum_rows: np.ndarray      # the sparse object checksums (copies)
    checksum_values: np.ndarray
    soft_pins: tuple[np.ndarray, np.ndarray]  # (rows, deadlines) of the objects that hold one (copies)
    groups: tuple[np.ndarray, np.ndarray]     # (rows, group codes) of the grouped objects (copies)
    tenants: list[str]
    clients: list[str]
    group_names: list[str]
    segments: list[Segment | None]
    segment_readable: np.ndarray
    segment_unit_bits: np.ndarray  # memory replicas' replica_offset is in these units (allocation.offset_shift)
    replica_next_id: int

    @property
    def rows(self) -> int:
        """Rows frozen: [0, high_water)."""
        return int(self.columns["flags"].shape[0])


def freeze(m: "MetadataStore", alloc: Allocator | None = _fresh) -> FrozenColumns:
    """Copy what a snapshot needs; the caller holds ``m``'s lock. Only memcpy and small lists.
    ``alloc=None``: views of the live columns, no copy (a forked writer's own copy-on-write
    memory, which nothing else changes: snapshots/forked.py).

    The key arena is referenced, not copied: it is append-only (inserts write past
    ``arena_used``; growth and compaction build a new array), so the bytes the copied
    ``key_ref`` values point at never change in the array object held here.
    """
    o = m.objects
    hw = o.high_water
    columns = {}
    for name in (*FROZEN_OBJECT_COLUMNS, *FROZEN_REPLICA_COLUMNS):
        src = getattr(o, name)[:hw]
        if alloc is None:
            columns[name] = src
        else:
            columns[name] = alloc(name, src.shape, src.dtype)
            np.copyto(columns[name], src)
    if o.replica_more.size:  # wide objects' continuation rows (kernels/chains.py): rare, a plain copy
        columns["replica_more"] = o.replica_more[:hw] if alloc is None else o.replica_more[:hw].copy()
    s = m.segments
    return FrozenColumns(
        columns=columns, arena=m.keys.arena, key_bytes=int(m.keys.arena_used - m.keys.arena_garbage),
        put_start_base_ms=o.put_start_base_ms,
        checksum_rows=o.checksum_rows.copy(), checksum_values=o.checksum_values.copy(),
        soft_pins=m.soft_pins.held(), groups=m.group_of.held(),
        tenants=[m.tenants.name(c) for c in range(len(m.tenants))],
        clients=[m.clients.name(c) for c in range(len(m.clients))],
        group_names=list(m.group_names), segments=list(s.info),
        segment_readable=s.readable[:len(s.info)].copy(), segment_unit_bits=s.unit_bits[:len(s.info)].copy(),
        replica_next_id=int(m.next_replica_id))


@dataclass(frozen=True)
class NameNeeds:
    """What the name columns' dictionaries must hold beyond the master's own name lists: ""
    for code -1 (none), the clients in the replicas' segment column (a LOCAL_DISK replica's
    "segment" is its owner client), the group names (any grouped object)."""

    empty_tenant: bool = False
    empty_client: bool = False
    grouped: bool = False
    ungrouped: bool = False
    segment_clients: bool = False
    empty_segment: bool = False

    def __or__(self, other: "NameNeeds") -> "NameNeeds":
        return NameNeeds(*(a or b for a, b in zip(self.__dict__.values(), other.__dict__.values())))

    def dictionaries(self, f: FrozenColumns) -> dict[str, list[str]]:
        """Column -> its dictionary; code -1 is the trailing "" where one is needed."""
        segments = [s.name if s else "" for s in f.segments] + (f.clients if self.segment_clients else [])
        return {"tenant": [*f.tenants, *[""][:self.empty_tenant]],
                "client": [*f.clients, *[""][:self.empty_client]],
                "group": [*f.group_names, *[""][:self.ungrouped]] if self.grouped else [""],
                "segment": [*segments, *[""][:self.empty_segment]]}


def _negative(codes: np.ndarray) -> bool:
    return bool(codes.size) and int(codes.min()) < 0


def _coded(codes: np.ndarray, dictionary: list[str]) -> pa.DictionaryArray:
    """Engine codes (-1: none, the dictionary's trailing "") as a name-dictionary array."""
    if _negative(codes):
        codes = np.where(codes < 0, len(dictionary) - 1, codes)
    return name_array(codes, dictionary)


@njit(cache=True, nogil=True)
def _contiguous_offsets(refs, out):
    """Fill out[:n + 1] with the offsets of keys ``refs`` relative to the first key's start and
    return True if they lie back to back in the arena (one slice of it), else False."""
    base = refs[0] >> hk.KEY_LENGTH_BITS
    out[0] = 0
    for i in range(refs.shape[0]):
        if (refs[i] >> hk.KEY_LENGTH_BITS) - base != out[i]:
            return False
        out[i + 1] = out[i] + (refs[i] & ((1 << hk.KEY_LENGTH_BITS) - 1))
    return True


@njit(cache=True, nogil=True)
def _flag_bits(flags, bit):
    """An Arrow boolean buffer (LSB-first bits) of ``flags & bit != 0``: no byte-per-row mask."""
    out = np.zeros((flags.shape[0] + 7) // 8, np.uint8)
    for i in range(flags.shape[0]):
        if flags[i] & bit:
            out[i >> 3] |= np.uint8(1 << (i & 7))
    return out


@njit(cache=True, nogil=True)
def _iota(out, first):
    for i in range(out.shape[0]):
        out[i] = first + i
    return out


def _flag(flags: np.ndarray, bit: np.uint8) -> pa.Array:
    return pa.Array.from_buffers(pa.bool_(), flags.shape[0], [None, pa.py_buffer(_flag_bits(flags, bit))])


def _keys(arena: np.ndarray, refs: np.ndarray, alloc: Allocator) -> pa.Array:
    """The keys of ``refs`` as a large_string array. Keys laid out back to back in the arena (a
    bulk load or a restore, with no removal since) are one slice of it, else gathered."""
    n = refs.shape[0]
    offsets = alloc("key_offsets", (n + 1,), np.dtype(np.int64))
    if n and _contiguous_offsets(refs, offsets):
        start = int(refs[0] >> hk.KEY_LENGTH_BITS)
        data = arena[start:start + offsets[-1]]
    else:
        offsets, data = arena_k.gather_keys(arena, refs, np.arange(n, dtype=np.int64))
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))


def _held_in(held: tuple[np.ndarray, np.ndarray], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """A side table's (rows, values) of the rows in [lo, hi), rows made relative to ``lo``."""
    rows, values = held
    inside = (rows >= lo) & (rows < hi)
    return rows[inside] - lo, values[inside]


class FrozenRows:
    """The live rows of rows [lo, hi) of a frozen master, in row order, and the snapshot tables
    of those objects (their replicas: one row per used slot, in object order)."""

    def __init__(self, f: FrozenColumns, lo: int, hi: int, alloc: Allocator = _fresh) -> None:
        self.f, self.lo, self.hi, self.alloc = f, lo, hi, alloc
        c = f.columns
        flags = c["flags"][lo:hi]
        is_live = (flags & FLAG_LIVE) != 0
        # None: every row of the range is live, so columns are views (no gather)
        self.live = None if is_live.all() else lo + np.flatnonzero(is_live)
        self.flags = self.rows(c["flags"])
        self.n = int(self.flags.shape[0])
        self.grouped = (self.flags & FLAG_GROUPED) != 0
        self.chains = None
        if "replica_more" in c:  # an object's slots: its row's, then its continuation rows'
            owner, chain = chain_k.expand(
                _iota(np.empty(self.n, np.int64), lo) if self.live is None else self.live, c["replica_more"])
            self.chains = (owner, chain, c["replica_status"][chain] != ST_EMPTY)
        status = self.rows(c["replica_status"])
        self.used = status != ST_EMPTY
        self.one_slot = self.chains is None and bool(self.used.all()) and status.shape[1] == 1

    def rows(self, a: np.ndarray) -> np.ndarray:
        """Column ``a`` (rows [0, high_water)) at this range's live rows."""
        return a[self.lo:self.hi] if self.live is None else a[self.live]

    @cached_property
    def _slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(r_idx, slot, src, src_size): which slots the replicas table takes (``src`` rows,
        ``slot``), each one's object (``r_idx``, from 0 in this range) and its size. Built on
        first use: the passes that need no replica columns (names, checksums, objects) skip it."""
        c, alloc = self.f.columns, self.alloc
        if self.chains is not None:
            k, slot = np.nonzero(self.chains[2])
            src = self.chains[1][k]
            return self.chains[0][k], slot, src, c["size_bytes"][src]  # a continuation row carries the size
        if self.one_slot:  # one replica per object: every column is a view, object i is row i's
            r_idx = _iota(alloc("object_index", (self.n,), np.dtype(np.int64)), 0)
            src = _iota(np.empty(self.n, np.int64), self.lo) if self.live is None else self.live
            return r_idx, np.zeros(self.n, np.int64), src, self.rows(c["size_bytes"])
        r_idx, slot = np.nonzero(self.used)
        src = (_iota(np.empty(self.n, np.int64), self.lo) if self.live is None else self.live)[r_idx]
        return r_idx, slot, src, self.rows(c["size_bytes"])[r_idx]

    def _rep(self, name: str) -> np.ndarray:
        """Replica slot column ``name`` at the replicas table's slots."""
        column = self.f.columns[name]
        if self.one_slot:
            return self.rows(column)[:, 0]
        r_idx, slot, src, _ = self._slots
        if self.chains is not None:
            return column[src, slot]
        return self.rows(column)[r_idx, slot]

    def _segment_codes(self, with_clients: bool) -> np.ndarray:
        """Each replica's code in the segment column's dictionary (segment codes, then with
        ``with_clients`` the client codes after them; -1: none)."""
        kind, seg = self._rep("replica_kind"), self._rep("replica_segment")
        if not with_clients:
            return seg
        owner = np.where((kind == KIND_LOCAL_DISK) & (seg >= 0), len(self.f.segments) + seg, -1)
        return np.where(memory_on_segment_mask(kind, seg), seg, owner)

    def needs(self) -> NameNeeds:
        """What this range's name columns need (see :class:`NameNeeds`)."""
        c = self.f.columns
        kind, seg = self._rep("replica_kind"), self._rep("replica_segment")
        clients = not (bool((kind == KIND_MEMORY).all()) and not _negative(seg))
        return NameNeeds(_negative(self.rows(c["tenant"])), _negative(self.rows(c["client"])),
                         bool(self.grouped.any()), not bool(self.grouped.all()), clients,
                         _negative(self._segment_codes(clients)))

    def objects(self, needs: NameNeeds) -> pa.Table:
        """The objects table of this range, its name columns over ``needs``' dictionaries."""
        f, c, fl = self.f, self.f.columns, self.flags
        names = needs.dictionaries(f)
        if needs.grouped:
            groups = GroupTable.dense(*_held_in(f.groups, self.lo, self.hi), self.hi - self.lo)
            group = np.where(self.grouped, self.rows_relative(groups), -1)
        else:
            group = np.zeros(self.n, np.int8)
        soft = SoftPinTable.dense(*_held_in(f.soft_pins, self.lo, self.hi), self.hi - self.lo)
        return layout_table(OBJECTS_PAYLOAD_SCHEMA, {
            "tenant": _coded(self.rows(c["tenant"]), names["tenant"]),
            "key": _keys(f.arena, self.rows(c["key_ref"]), self.alloc),
            "client": _coded(self.rows(c["client"]), names["client"]),
            "size_bytes": self.rows(c["size_bytes"]),
            "data_type": self.rows(c["data_type"]),
            "group": _coded(group, names["group"]),
            "hard_pinned": _flag(fl, FLAG_HARD_PINNED),
            "soft_pin_enabled": _flag(fl, FLAG_SOFT_PIN_ENABLED),
            "lease_deadline_ns": self.rows(c["lease_deadline_ns"]),
            "soft_pin_deadline_ns": self.rows_relative(soft),
            "put_start_time_ms": put_start_ms(self.rows(c["put_start_rel"]), f.put_start_base_ms),
            "processing": _flag(fl, FLAG_PROCESSING),
            "replica_count": self.replica_count(),
        })

    def replica_count(self) -> np.ndarray:
        """Each object's replicas (int32; in an ``alloc`` buffer)."""
        if self.chains is None:
            return np.sum(self.used, axis=1, dtype=np.int32,
                          out=self.alloc("replica_count", (self.n,), np.dtype(np.int32)))
        return np.bincount(self.chains[0], self.chains[2].sum(axis=1), minlength=self.n).astype(np.int32)

    def rows_relative(self, a: np.ndarray) -> np.ndarray:
        """``a`` (one value per row of [lo, hi)) at this range's live rows."""
        return a if self.live is None else a[self.live - self.lo]

    def replicas(self, needs: NameNeeds) -> tuple[pa.Table, np.ndarray]:
        """(the replicas table, object_index from 0, its segment column over ``needs``'
        dictionary; the bytes of memory replicas per segment code)."""
        c, f = self.f.columns, self.f
        kind, rep_status = self._rep("replica_kind"), self._rep("replica_status")
        seg_code = self._segment_codes(needs.segment_clients)
        r_idx, slot, src, src_size = self._slots
        used = _used_bytes(rep_status, kind, self._rep("replica_segment"), np.asarray(src_size), len(f.segments))
        readable = ok.readable_mask(src, slot.astype(np.int64, copy=False), c["replica_status"],
                                    c["replica_kind"], c["replica_segment"], f.segment_readable)
        index = r_idx.astype(np.int64, copy=False)
        table = layout_table(REPLICAS_PAYLOAD_SCHEMA, {
            "object_index": index,
            "replica_id": self._rep("replica_id"),
            "kind": kind,
            "status": rep_status,
            "segment": _coded(seg_code, needs.dictionaries(f)["segment"]),
            "offset": byte_offsets_of(self._rep("replica_offset"), kind, self._rep("replica_segment"),
                                      f.segment_unit_bits),
            "size": src_size,
            "readable": readable,
        })
        return table, used

    def checksums(self, first_index: int = 0) -> pa.Table:
        """The checksums of this range's objects (object_index from ``first_index``)."""
        rows, values = self.f.checksum_rows, self.f.checksum_values
        inside = (rows >= self.lo) & (rows < self.hi)
        rows = rows[inside]
        index = rows - self.lo if self.live is None else np.searchsorted(self.live, rows)
        return pa.table({"object_index": index + first_index, "checksum": values[inside]},
                        schema=CHECKSUMS_ARROW_SCHEMA)


def segments_of(f: FrozenColumns, used: np.ndarray) -> pa.Table:
    """The segments table of the mounted segments, with ``used`` bytes per segment code."""
    codes = np.array([code for code, s in enumerate(f.segments) if s is not None], np.int64)
    return segments_table([f.segments[c] for c in codes], used[codes], f.segment_readable[codes])


def frozen_state(f: FrozenColumns, alloc: Allocator = _fresh) -> SnapshotState:
    """The encoded-layout SnapshotState of a frozen master, every row as one range (no lock
    needed: only copies are read). Columns are zero-copy views of the frozen copies where every
    row is live (the usual case); the larger derived arrays come from ``alloc`` (reused buffers:
    the tables reference them until published)."""
    rows = FrozenRows(f, 0, f.rows, alloc)
    needs = rows.needs()
    replicas, used = rows.replicas(needs)
    return SnapshotState(rows.objects(needs), replicas, segments_of(f, used), f.replica_next_id, rows.checksums())


@njit(cache=True, nogil=True)
def _used_bytes(status, kind, seg, size, n_codes):
    """Bytes of the memory replicas on each segment code: the exact figure upstream reports
    (its allocator's cur_size sums the buffers' sizes; a replica whose removal awaits durability
    still holds its buffer). The engine's own ``SegmentTable.used`` counts whole allocation
    units instead (above 3.75 GiB a unit is more than a byte). One pass, no masks."""
    out = np.zeros(n_codes, np.int64)
    for i in range(kind.shape[0]):
        s = memory_replica_segment(status[i], kind[i], seg[i])
        if s >= 0:
            out[s] += size[i]
    return out


def export_tables(m: "MetadataStore") -> SnapshotState:
    """The live state (encoded layout); the caller holds ``m``'s lock."""
    return frozen_state(freeze(m))
