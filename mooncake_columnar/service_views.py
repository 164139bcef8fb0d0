"""Read-only views of a MasterService: object_info, Arrow tables, state export/import, descriptors."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from .clock import Clocks
from .config import MasterConfig
from .errors import ErrorCode
from .kernels import objects as ok
from .kernels import predicates as pk
from .messages import DEFAULT_TENANT, ObjectInfo, ReplicaDescriptor, SegmentInfo
from .schema import (
    FLAG_GROUPED,
    FLAG_HARD_PINNED,
    FLAG_PROCESSING,
    FLAG_SOFT_PIN_ENABLED,
    KIND_MEMORY,
    OBJECTS_ARROW_SCHEMA,
    ReplicaKind,
)
from .store.arrow_io import export_tables, load_tables
from .validation import _COMPLETE, _KINDS, _STATUSES, _locked, _raise_code, _single_key

if TYPE_CHECKING:
    from .master import MasterService
    from .snapshots.state import SnapshotState


class ViewsMixin:
    """Inspection and state export/import part of a MasterService."""

    # ================================================================================ inspection
    @_locked
    def object_info(self, key: str, tenant_id: str = DEFAULT_TENANT) -> ObjectInfo:
        """Deadlines (steady ns), flags and every replica with its readability."""
        offsets, data = _single_key(key)
        row = int(self._lookup(offsets, data, tenant_id)[0])
        if row < 0:
            _raise_code(ErrorCode.OBJECT_NOT_FOUND, f"object_info {key!r}")
        o = self.objects
        f = int(o.flags[row])
        return ObjectInfo(
            tenant=self.tenants.name(int(o.tenant[row])), key=key,
            client=self.clients.name(int(o.client[row])), size=int(o.size_bytes[row]),
            data_type=int(o.data_type[row]),
            group_id=self._group_name(row),
            hard_pinned=bool(f & FLAG_HARD_PINNED), soft_pin_enabled=bool(f & FLAG_SOFT_PIN_ENABLED),
            lease_deadline_ns=int(o.lease_deadline_ns[row]),
            soft_pin_deadline_ns=int(o.soft_pin_deadline_ns[row]),
            processing=bool(f & FLAG_PROCESSING),
            put_start_time_ms=int(self._put_start_time_ms(np.array([row]))[0]),
            replicas=tuple(self._descriptors(row, readable_only=False)),
            object_checksum=self._object_checksum(row))

    def _object_checksum(self, row: int) -> int | None:
        o = self.objects
        i = int(np.searchsorted(o.checksum_rows, row))
        return int(o.checksum_values[i]) if i < o.checksum_rows.size and o.checksum_rows[i] == row else None

    @_locked
    def to_arrow(self) -> pa.Table:
        """The object table (one row per object, ordered by row) as a pyarrow Table."""
        return self._objects_table()

    @_locked
    def export_state(self) -> "SnapshotState":
        """The whole state as Arrow tables (plain layout: string name columns), steady-ns
        deadlines of this process. Snapshots use the encoded layout straight from
        ``store.arrow_io`` instead (no per-row strings)."""
        return export_tables(self).plain()

    @classmethod
    def from_state(cls, state: "SnapshotState", *, config: MasterConfig | None = None,
                   clocks: Clocks | None = None, segments_readable: bool = True,
                   validated: bool = False) -> "MasterService":
        """A master rebuilt from a SnapshotState (either layout) whose deadlines are already in
        this process's steady domain. ``segments_readable=False`` restores every segment with an
        invalid endpoint (standby promotion: unreadable until its client remounts).
        ``validated``: the caller already ran ``state.validate`` on it (a snapshot decode)."""
        if not validated:
            state.validate(check_unique_keys=False)  # loading the key index checks uniqueness
        m = cls(config, clocks=clocks, initial_capacity=max(1024, state.objects.num_rows))
        load_tables(m, state, segments_readable=segments_readable)
        m.next_replica_id = max(m.next_replica_id, int(state.replica_next_id))
        if m._ledger_on:  # rebuild tenant usage from the restored replicas
            m._charge(m.objects.live_rows(), +1)
        if segments_readable:  # a restart: restored clients must ping within client_live_ttl_s
            now = m.clocks.steady_ns()
            for client in set(state.segments.column("client").to_pylist()):
                m._touch_client(client, now)
        # a promotion: a client's liveness starts at its first contact with the new primary; until
        # then its segments and objects stay, unreadable and protected (the guard has no TTL)
        return m

    def _group_name(self, row: int) -> str:
        return self._group_names[int(self.objects.group[row])] if self.objects.flags[row] & FLAG_GROUPED else ""

    def _objects_table(self) -> pa.Table:
        return export_tables(self).objects.cast(OBJECTS_ARROW_SCHEMA)

    @_locked
    def object_count(self) -> int:
        return self.objects.live_count

    @_locked
    def segment_usage(self) -> dict[str, tuple[int, int]]:
        """name -> (held bytes, capacity bytes). Held bytes are the engine allocator's: each
        replica rounded up to the segment's allocation unit; :meth:`segment_info` also reports
        the exact bytes upstream would (they differ above 3.75 GiB of capacity)."""
        s = self.segments
        return {info.name: (int(s.used[c]), int(s.capacity[c])) for c, info in enumerate(s.info) if info}

    @_locked
    def segment_info(self) -> dict[str, SegmentInfo]:
        """name -> :class:`SegmentInfo` of every mounted segment: its upstream identity, and both
        usage figures (``used_bytes`` exact as upstream's QuerySegments, ``held_bytes`` in whole
        allocation units). One vectorized pass over the replica slots; also sets the gauges
        ``segment_used_bytes`` and ``segment_held_bytes`` (label ``segment``)."""
        s, o = self.segments, self.objects
        hw = o.high_water
        memory = pk.memory_replica_mask(o.replica_status[:hw], o.replica_kind[:hw], o.replica_segment[:hw])
        r, j = np.nonzero(memory)
        n = len(s.info)
        used = (np.bincount(o.replica_segment[r, j], weights=o.size_bytes[r], minlength=n)
                + np.bincount(self._discarded_seg, weights=self._discarded_size, minlength=n)).astype(np.int64)
        out = {}
        for c, seg in enumerate(s.info):
            if seg is None:
                continue
            out[seg.name] = SegmentInfo(seg.name, seg.segment_id, seg.host_id, seg.endpoint, seg.client, seg.base,
                                        seg.size, int(used[c]), int(s.used[c]), 1 << int(s.unit_bits[c]),
                                        bool(s.readable[c]))
            self.metrics.set("segment_used_bytes", float(used[c]), segment=seg.name)
            self.metrics.set("segment_held_bytes", float(s.used[c]), segment=seg.name)
        return out

    @_locked
    def metadata_bytes(self) -> dict[str, int]:
        """Resident bytes of the metadata (columns, index, dictionaries), key bytes separately."""
        return {"columns": self.objects.resident_bytes(), "index": self.keys.resident_bytes(),
                "inflight": self.inflight.resident_bytes(), "key_bytes": int(self.keys.arena_used)}

    def _descriptors(self, row: int, *, readable_only: bool) -> list[ReplicaDescriptor]:
        # on the single-key read path: plain lists and tuple lookups, no per-slot NumPy scalars
        o = self.objects
        out: list[ReplicaDescriptor] = []
        more = o.replica_more
        while row >= 0:  # the object's row, then its continuation rows (kernels/chains.py)
            self._row_descriptors(row, readable_only, out)
            row = int(more[row]) if row < more.size else -1
        return out

    def _row_descriptors(self, row: int, readable_only: bool, out: list[ReplicaDescriptor]) -> None:
        o = self.objects
        statuses = o.replica_status[row].tolist()
        seg_codes = o.replica_segment[row].tolist()
        readable_mask = self.segments.readable
        for j, st in enumerate(statuses):
            if st == 0:
                continue
            code = seg_codes[j]
            kind = _KINDS[o.replica_kind[row, j]]
            if kind != ReplicaKind.MEMORY:  # LOCAL_DISK: the segment column holds the owner client
                if st == _COMPLETE or not readable_only:
                    out.append(ReplicaDescriptor(int(o.replica_id[row, j]), kind, _STATUSES[st], "",
                                                 self.clients.name(code), 0, int(o.size_bytes[row]),
                                                 st == _COMPLETE))
                continue
            readable = bool(pk.readable_replica(st, kind, code, readable_mask))
            if readable_only and not readable:
                continue
            seg = self.segments.info[code]
            out.append(ReplicaDescriptor(int(o.replica_id[row, j]), kind, _STATUSES[st], seg.name, seg.endpoint,
                                         seg.base + int(o.replica_offset[row, j]), int(o.size_bytes[row]),
                                         readable))

    def _replica_columns(self, batch_idx: np.ndarray, rows: np.ndarray, *, readable_only: bool,
                         codes: np.ndarray | None = None) -> "ReplicaColumns":
        """Flat replica descriptors of rows[batch_idx] (readable ones only, or all slots in use),
        as NumPy gathers under the master lock; :func:`replica_table` builds the Arrow table
        from them later, outside it."""
        o = self.objects
        if codes is None:
            codes = np.zeros(rows.size, np.int32)
        sel = np.zeros(rows.size, np.int32) - 1
        sel[batch_idx] = codes[batch_idx]
        if readable_only:
            ki, r, j = ok.readable_slots(rows, sel, o.replica_status, o.replica_kind, o.replica_segment,
                                         self.segments.readable, o.replica_more)
        else:
            chains = o.chains(rows[batch_idx])
            ri, j = np.nonzero(o.replica_status[chains.rows] != 0)
            ki, r = batch_idx[chains.owner[ri]], chains.rows[ri]
        # non-memory replicas (LOCAL_DISK) map to the trailing "" entry
        infos = self.segments.info
        seg_codes = np.where(o.replica_kind[r, j] == int(KIND_MEMORY), o.replica_segment[r, j], len(infos))
        names = [s.name if s else "" for s in infos] + [""]
        endpoints = [s.endpoint if s else "" for s in infos] + [""]
        bases = np.array([s.base if s else 0 for s in infos] + [0], np.int64)
        return ReplicaColumns(ki, o.replica_id[r, j], seg_codes, names, endpoints,
                              bases[seg_codes] + o.replica_offset[r, j], o.size_bytes[r])


@dataclass(frozen=True)
class ReplicaColumns:
    """Replica descriptors gathered under the lock: the columns of a replica table, segments
    as codes into the ``names``/``endpoints`` of that moment."""

    key_index: np.ndarray
    replica_id: np.ndarray
    segment_code: np.ndarray
    names: list[str]
    endpoints: list[str]
    address: np.ndarray
    size: np.ndarray


def replica_table(parts: list[tuple[int, ReplicaColumns]]) -> pa.Table:
    """One replica table from chunks' columns, ``key_index`` counted from the start of the
    whole batch (each part: the batch position of its first key, its columns)."""
    names: list[str] = []
    endpoints: list[str] = []
    codes = []
    for _, c in parts:  # per chunk, not per replica: segment codes into one joined name list
        codes.append(c.segment_code + len(names))
        names += c.names
        endpoints += c.endpoints
    joined = pa.array(np.concatenate(codes) if codes else np.empty(0, np.int64))
    return pa.table({
        "key_index": np.concatenate([c.key_index + lo for lo, c in parts]),
        "replica_id": np.concatenate([c.replica_id for _, c in parts]),
        "segment": pa.array(names, pa.string()).take(joined),
        "endpoint": pa.array(endpoints, pa.string()).take(joined),
        "address": np.concatenate([c.address for _, c in parts]),
        "size": np.concatenate([c.size for _, c in parts]),
    })

