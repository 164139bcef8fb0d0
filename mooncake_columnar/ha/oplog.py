"""OpLog entries, columnar batches and the batch wire codec of the standby path.

An entry carries only what a standby needs to rebuild object metadata and replicas (lease-recovery
RFC, "Standby metadata wire model"): tenant, key, client, size, replica descriptors, data type,
group, hard_pinned, soft_pin_enabled, and the put start time (system ms: upstream's version
epoch, a timestamp rather than a deadline; absent from older records, read as 0). Segment
entries carry the segment's upstream id and host id (absent from older records: ""). Leases,
soft-pin deadlines, remaining TTLs and read times are
runtime state of the serving primary and are never logged; a promoted primary grants fresh leases.

A batch is columns (:class:`OpLogColumns`), never one Python object per entry: the primary builds
them from its engine rows with NumPy, the standby applies them with vectorized engine calls. The
per-entry dataclasses of :mod:`.oplog_entries` (:class:`OpLogOp`, :class:`OpLogEntry`, ...) serve
hand-built small batches (tests, segment ops) and the convenience view ``OpLogBatch.entries``.

Wire format of one batch (msgpack map, strict on decode)::

    {"version": STANDBY_WIRE_VERSION, "first_sequence_id": int, "count": int,
     "columns": bin(msgpack map: column name -> raw little-endian array bytes, plus the
                    string table and the segment rows), "checksum": crc32}

The columns travel as an opaque byte string so that the checksum covers the exact stored bytes.
Rows are the entries in sequence order; PUT_END-only columns hold one value per PUT_END row (in
row order) and replica columns one value per replica of those rows (``replica_count`` each).
String columns (tenant, client, group, replica segment and endpoint) are int32 codes into one
UTF-8 string table (``string_offsets`` / ``string_bytes``); keys are ``key_offsets`` / ``key_bytes``.
SEGMENT_MOUNT / SEGMENT_UNMOUNT rows are rare: their payloads travel as small maps (``segments``).
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, Sequence

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import InvalidParams, OpLogChecksumError, OpLogCorrupt, OpLogGap
from ..schema import MAX_KEY_BYTES, ObjectDataType, ReplicaKind, ReplicaStatus
# the entry model lives in .oplog_entries; its public names are re-exported from here
from .oplog_entries import (  # noqa: F401
    OpLogEntry,
    OpLogOp,
    OpType,
    Payload,
    PutEndPayload,
    ReplicaDescriptor,
    SEGMENT_OPTIONAL,
    SegmentPayload,
    FieldCheck,
    _SEGMENT_CHECKS,
    _SEQ_MAX,
    check_seq,
    check_str,
    trusted,
    _u64,
)

# The standby wire version is independent of the complete-snapshot versions ("1.0.0", "2.0.0"):
# the RFC forbids the standby path from consuming the snapshot's clock mapping. /2: columnar.
STANDBY_WIRE_VERSION = "mooncake-columnar-standby/2"



# --- columns ---------------------------------------------------------------------------------------

_PUT_END = int(OpType.PUT_END)
_SEGMENT_OPS = (int(OpType.SEGMENT_MOUNT), int(OpType.SEGMENT_UNMOUNT))

# Array columns and their wire dtypes, grouped by what their length counts.
_ROW_ARRAYS = {"op": "u1", "tenant": "<i4"}
_PUT_ARRAYS = {"client": "<i4", "size": "<u8", "data_type": "u1", "group": "<i4", "hard_pinned": "?",
               "soft_pin_enabled": "?", "replica_count": "<u4", "put_start_time_ms": "<u8"}
_REPLICA_ARRAYS = {"replica_id": "<u8", "replica_kind": "u1", "replica_segment": "<i4", "replica_offset": "<u8",
                   "replica_size": "<u8", "replica_status": "u1", "replica_endpoint": "<i4"}
_CODE_ARRAYS = ("tenant", "client", "group", "replica_segment", "replica_endpoint")  # into the string table
_ARRAYS = {**_ROW_ARRAYS, **_PUT_ARRAYS, **_REPLICA_ARRAYS}


def _lut(values: Sequence[int]) -> np.ndarray:
    """A 256-entry membership table: enum checks on uint8 columns are one gather."""
    ok = np.zeros(256, np.bool_)
    ok[list(values)] = True
    return ok


_ENUM_COLUMNS = {"op": (_lut(list(OpType)), OpType), "data_type": (_lut(list(ObjectDataType)), ObjectDataType),
                 "replica_kind": (_lut(list(ReplicaKind)), ReplicaKind),
                 "replica_status": (_lut(list(ReplicaStatus)), ReplicaStatus)}


def string_parts(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets starting at 0, uint8 bytes) of a large_string array (any slice offset)."""
    _, off_buf, data_buf = strings.buffers()
    offsets = np.frombuffer(off_buf, np.int64, count=len(strings) + 1, offset=strings.offset * 8)
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return offsets - offsets[0], data[offsets[0]:offsets[-1]]


def _large_strings(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    return pa.LargeStringArray.from_buffers(offsets.size - 1, pa.py_buffer(offsets), pa.py_buffer(data))


@dataclass(frozen=True, eq=False)
class OpLogColumns:
    """The body of a batch: entries (no sequence ids yet) as columns. See the module docstring.

    Built by :meth:`from_ops` (small, hand-built), by the primary's journal from engine rows, or
    by :meth:`from_wire` (validated). Instances are immutable; :meth:`slice` shares arrays.
    """

    op: np.ndarray            # uint8 OpType, one per row
    tenant: np.ndarray        # int32 string code, one per row
    key_offsets: np.ndarray   # int64, rows + 1, from 0
    key_bytes: np.ndarray     # uint8 UTF-8
    client: np.ndarray        # PUT_END rows: int32 string code
    size: np.ndarray          # uint64
    data_type: np.ndarray     # uint8 ObjectDataType
    group: np.ndarray         # int32 string code ("" = no group)
    hard_pinned: np.ndarray   # bool
    soft_pin_enabled: np.ndarray  # bool
    replica_count: np.ndarray     # uint32
    put_start_time_ms: np.ndarray  # uint64 system ms (upstream's version epoch; 0: not recorded)
    replica_id: np.ndarray        # replicas of the PUT_END rows, in row order: uint64
    replica_kind: np.ndarray      # uint8 ReplicaKind
    replica_segment: np.ndarray   # int32 string code (segment name, "" if not in memory)
    replica_offset: np.ndarray    # uint64
    replica_size: np.ndarray      # uint64
    replica_status: np.ndarray    # uint8 ReplicaStatus
    replica_endpoint: np.ndarray  # int32 string code
    strings: pa.Array             # large_string table of the code columns
    segments: tuple[SegmentPayload, ...]  # payloads of the SEGMENT_MOUNT/UNMOUNT rows, in row order

    def __len__(self) -> int:
        return int(self.op.shape[0])

    # ---- derived positions (computed once per instance) ----
    @cached_property
    def put_prefix(self) -> np.ndarray:
        """PUT_END rows before row i (i in 0..rows): row -> index into the PUT_END columns."""
        return np.concatenate(([0], np.cumsum(self.op == _PUT_END, dtype=np.int64)))

    @cached_property
    def segment_rows(self) -> np.ndarray:
        return np.flatnonzero(self.op >= _SEGMENT_OPS[0])

    @cached_property
    def replica_starts(self) -> np.ndarray:
        """PUT_END index -> first replica (PUT_END rows + 1 values)."""
        return np.concatenate(([0], np.cumsum(self.replica_count, dtype=np.int64)))

    @property
    def keys(self) -> pa.Array:
        """The keys as a large_string array over the same bytes (no copy)."""
        return _large_strings(self.key_offsets, self.key_bytes)

    # ---- building ----
    @classmethod
    def from_ops(cls, ops: Sequence[Any]) -> OpLogColumns:
        """Columns of validated :class:`OpLogOp` / :class:`OpLogEntry` objects (small batches:
        one Python pass over them)."""
        codes: dict[str, int] = {}

        def code(s: str) -> int:
            return codes.setdefault(s, len(codes))

        rows: dict[str, list] = {name: [] for name in _ARRAYS}
        keys: list[bytes] = []
        segments: list[SegmentPayload] = []
        for o in ops:
            rows["op"].append(int(o.op))
            rows["tenant"].append(code(o.tenant))
            keys.append(o.key.encode("utf-8"))
            p = o.payload
            if isinstance(p, PutEndPayload):
                for name, value in (("client", code(p.client)), ("size", p.size), ("data_type", int(p.data_type)),
                                    ("group", code(p.group_id)), ("hard_pinned", p.hard_pinned),
                                    ("soft_pin_enabled", p.soft_pin_enabled), ("replica_count", len(p.replicas)),
                                    ("put_start_time_ms", p.put_start_time_ms)):
                    rows[name].append(value)
                for r in p.replicas:
                    for name, value in (("replica_id", r.replica_id), ("replica_kind", int(r.kind)),
                                        ("replica_segment", code(r.segment)), ("replica_offset", r.offset),
                                        ("replica_size", r.size), ("replica_status", int(r.status)),
                                        ("replica_endpoint", code(r.endpoint))):
                        rows[name].append(value)
            elif p is not None:
                segments.append(p)
        lengths = np.fromiter(map(len, keys), np.int64, len(keys))
        return cls(**{name: np.array(rows[name], np.dtype(dt)) for name, dt in _ARRAYS.items()},
                   key_offsets=np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
                   key_bytes=np.frombuffer(b"".join(keys), np.uint8),
                   strings=pa.array(list(codes), pa.large_string()), segments=tuple(segments))

    def slice(self, start: int, stop: int) -> OpLogColumns:
        """Rows ``start:stop`` (views; the string table is shared, not compacted)."""
        p0, p1 = (int(v) for v in self.put_prefix[[start, stop]])
        r0, r1 = (int(v) for v in self.replica_starts[[p0, p1]])
        k0, k1 = (int(v) for v in self.key_offsets[[start, stop]])
        s0, s1 = np.searchsorted(self.segment_rows, [start, stop])
        parts: dict[str, Any] = {name: getattr(self, name)[start:stop] for name in _ROW_ARRAYS}
        parts.update({name: getattr(self, name)[p0:p1] for name in _PUT_ARRAYS})
        parts.update({name: getattr(self, name)[r0:r1] for name in _REPLICA_ARRAYS})
        return OpLogColumns(**parts, key_offsets=self.key_offsets[start:stop + 1] - k0,
                            key_bytes=self.key_bytes[k0:k1], strings=self.strings,
                            segments=self.segments[s0:s1])

    @staticmethod
    def concat(parts: Sequence[OpLogColumns]) -> OpLogColumns:
        """Rows of ``parts`` in order, with one compact string table (each distinct string used
        by a code column once): what a batch on the wire holds."""
        if len(parts) == 1:
            p = parts[0]
            arrays = {name: getattr(p, name) for name in _ARRAYS}
            key_offsets, key_bytes, strings = p.key_offsets, p.key_bytes, p.strings
        else:
            arrays = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ARRAYS}
            # shift each part's codes past the strings of the parts before it (one add per column)
            bases = np.cumsum([0] + [len(p.strings) for p in parts[:-1]], dtype=np.int32)
            for name in _CODE_ARRAYS:
                arrays[name] += np.repeat(bases, [getattr(p, name).size for p in parts])
            key_base = np.cumsum([0] + [int(p.key_offsets[-1]) for p in parts], dtype=np.int64)
            key_offsets = np.concatenate([p.key_offsets[:-1] for p in parts] + [key_base[-1:]])
            key_offsets[:-1] += np.repeat(key_base[:-1], [len(p) for p in parts])
            key_bytes = np.concatenate([p.key_bytes for p in parts])
            strings = pa.concat_arrays([p.strings for p in parts])
        # compact: equal strings share a code, unused ones go (slices keep their parent's table)
        unique = pc.unique(strings)
        to_unique = pc.index_in(strings, value_set=unique).to_numpy(zero_copy_only=False)
        used = np.zeros(len(unique), np.bool_)
        for name in _CODE_ARRAYS:
            used[to_unique[arrays[name]]] = True
        keep = np.flatnonzero(used)
        lut = np.full(len(unique), -1, np.int32)
        lut[keep] = np.arange(keep.size, dtype=np.int32)
        lut = lut[to_unique]
        for name in _CODE_ARRAYS:
            arrays[name] = lut[arrays[name]]
        return OpLogColumns(**arrays, key_offsets=key_offsets, key_bytes=key_bytes,
                            strings=unique.take(pa.array(keep)),
                            segments=tuple(s for p in parts for s in p.segments))

    # ---- the per-entry view (small batches: tests and tools) ----
    def ops(self) -> list[OpLogOp]:
        names = self.strings.to_pylist()
        keys = self.keys.to_pylist()
        col = {name: getattr(self, name).tolist() for name in _ARRAYS}
        starts = self.replica_starts.tolist()
        segments = iter(self.segments)
        out = []
        p = 0
        for i, op in enumerate(col["op"]):
            payload: Payload = None
            if op == _PUT_END:
                replicas = tuple(trusted(ReplicaDescriptor, dict(
                    replica_id=col["replica_id"][j], kind=col["replica_kind"][j],
                    segment=names[col["replica_segment"][j]], offset=col["replica_offset"][j],
                    size=col["replica_size"][j], status=col["replica_status"][j],
                    endpoint=names[col["replica_endpoint"][j]])) for j in range(starts[p], starts[p + 1]))
                payload = trusted(PutEndPayload, dict(
                    client=names[col["client"][p]], size=col["size"][p], replicas=replicas,
                    data_type=col["data_type"][p], group_id=names[col["group"][p]],
                    hard_pinned=col["hard_pinned"][p], soft_pin_enabled=col["soft_pin_enabled"][p],
                    put_start_time_ms=col["put_start_time_ms"][p]))
                p += 1
            elif op in _SEGMENT_OPS:
                payload = next(segments)
            out.append(trusted(OpLogOp, dict(op=_OPS[op], tenant=names[col["tenant"][i]], key=keys[i],
                                               payload=payload)))
        return out

    # ---- wire ----
    def to_wire(self) -> bytes:
        offsets, data = string_parts(self.strings)
        body: dict[str, Any] = {name: np.ascontiguousarray(getattr(self, name), dt).tobytes()
                                for name, dt in _ARRAYS.items()}
        body.update(key_offsets=np.ascontiguousarray(self.key_offsets, "<i8").tobytes(),
                    key_bytes=self.key_bytes.tobytes(), string_offsets=offsets.astype("<i8").tobytes(),
                    string_bytes=data.tobytes(),
                    segments=[_segment_wire(s) for s in self.segments])
        return msgpack.packb(body, use_bin_type=True)

    @classmethod
    def from_wire(cls, blob: bytes, count: int, where: str) -> OpLogColumns:
        """Decode and validate (vectorized) ``count`` rows; OpLogCorrupt names the first bad column."""
        try:
            raw = msgpack.unpackb(blob, raw=False, strict_map_key=True)
        except Exception as exc:  # msgpack raises several unrelated types for malformed input
            raise OpLogCorrupt(where, f"not a msgpack map ({type(exc).__name__}: {exc})") from None
        f = _fields(raw, where, _COLUMNS_WIRE, _OPTIONAL_PUT_COLUMNS)
        a: dict[str, np.ndarray] = {}
        for name, dt in _WIRE_ARRAYS.items():
            dtype = np.dtype("u1" if dt == "?" else dt)  # bools arrive as bytes and are checked below
            if f[name] is None:  # a PUT_END field written before it existed: false / 0 (RFC compatibility rule)
                f[name] = bytes(int(np.count_nonzero(np.frombuffer(f["op"], "u1") == _PUT_END)) * dtype.itemsize)
            if len(f[name]) % dtype.itemsize:
                raise OpLogCorrupt(f"{where}.{name}", f"{len(f[name])} bytes is not a whole number of {dtype}")
            a[name] = np.frombuffer(f[name], dtype)

        def check(name: str, bad: np.ndarray, problem: Callable[[int], str]) -> None:
            if bad.any():
                i = int(np.argmax(bad))
                raise OpLogCorrupt(f"{where}.{name}", f"{problem(i)} (at index {i})")

        def length(name: str, want: int) -> None:
            if a[name].size != want:
                raise OpLogCorrupt(f"{where}.{name}", f"{a[name].size} values, expected {want}")

        def enum(name: str) -> None:
            ok, kind = _ENUM_COLUMNS[name]
            check(name, ~ok[a[name]], lambda i: f"{a[name][i]} is not a {kind.__name__}")

        for name in _ROW_ARRAYS:
            length(name, count)
        enum("op")  # the other lengths depend on it
        length("key_offsets", count + 1)
        length("replica_count", int(np.count_nonzero(a["op"] == _PUT_END)))
        for name in _PUT_ARRAYS:
            length(name, a["replica_count"].size)
        for name in _REPLICA_ARRAYS:
            length(name, int(a["replica_count"].sum(dtype=np.int64)))
        for name in ("data_type", "replica_kind", "replica_status"):
            enum(name)
        for name in ("hard_pinned", "soft_pin_enabled"):
            check(name, a[name] > 1, lambda i: f"expected a bool (0 or 1), got {a[name][i]}")
            a[name] = a[name].view(np.bool_)
        strings = _checked_strings(a, "string", where, nonempty=False)
        for name in _CODE_ARRAYS:
            check(name, (a[name] < 0) | (a[name] >= len(strings)),
                  lambda i: f"string code {a[name][i]} outside the table of {len(strings)}")
        lengths = np.diff(a["string_offsets"])
        check("tenant", lengths[a["tenant"]] == 0, lambda i: "must not be empty")
        _checked_strings(a, "key", where, nonempty=True)
        segment_rows = np.count_nonzero(a["op"] >= _SEGMENT_OPS[0])
        if len(f["segments"]) != segment_rows:
            raise OpLogCorrupt(f"{where}.segments", f"{len(f['segments'])} payloads for {segment_rows} segment rows")
        segments = tuple(_segment_payload(_fields(s, f"{where}.segments[{i}]", _SEGMENT_CHECKS, SEGMENT_OPTIONAL))
                         for i, s in enumerate(f["segments"]))
        return cls(**{name: a[name] for name in _ARRAYS}, key_offsets=a["key_offsets"], key_bytes=a["key_bytes"],
                   strings=strings, segments=segments)


def _segment_wire(s: SegmentPayload) -> dict[str, Any]:
    """A segment payload's wire map; the identity fields only when set (a record without them
    stays readable by a reader that predates them)."""
    out: dict[str, Any] = {"name": s.name, "endpoint": s.endpoint, "capacity": s.capacity, "client": s.client}
    for name in ("segment_id", "host_id"):
        if getattr(s, name):
            out[name] = getattr(s, name)
    return out


def _segment_payload(fields: dict[str, Any]) -> SegmentPayload:
    """A decoded segment payload; identity fields a record lacks are ""."""
    return trusted(SegmentPayload, {k: "" if v is None else v for k, v in fields.items()})


def _checked_strings(a: dict[str, np.ndarray], prefix: str, where: str, *, nonempty: bool) -> pa.Array:
    """``<prefix>_offsets`` / ``<prefix>_bytes`` as a validated large_string array."""
    offsets, data = a[f"{prefix}_offsets"], a[f"{prefix}_bytes"]
    field = f"{where}.{prefix}_offsets"
    if offsets.size == 0 or offsets[0] != 0 or offsets[-1] != data.size:
        raise OpLogCorrupt(field, f"must run from 0 to the {data.size} bytes of {prefix}_bytes")
    lengths = np.diff(offsets)
    checks = [(lengths < 0, "offsets decrease")]
    if nonempty:
        checks += [(lengths == 0, "must not be empty"), (lengths > MAX_KEY_BYTES, f"longer than {MAX_KEY_BYTES} bytes")]
    for bad, what in checks:
        if bad.any():
            raise OpLogCorrupt(field, f"{what} (at index {int(np.argmax(bad))})")
    strings = _large_strings(offsets, data)
    try:
        strings.validate(full=True)  # UTF-8 of every value, in one pass
    except pa.ArrowInvalid as exc:
        raise OpLogCorrupt(f"{where}.{prefix}_bytes", f"not valid UTF-8 ({exc})") from None
    return strings


# --- batches --------------------------------------------------------------------------------------


class OpLogBatch:
    """Entries with contiguous sequence ids from ``first_sequence_id`` (never empty), as columns.

    ``body``: an :class:`OpLogColumns`, or (small, hand-built batches) a sequence of
    :class:`OpLogEntry` whose ids must run from ``first_sequence_id``. Two batches are equal when
    they start at the same id and encode to the same bytes.
    """

    def __init__(self, first_sequence_id: int, body: OpLogColumns | Sequence[OpLogEntry]) -> None:
        problem = check_seq(first_sequence_id)
        if problem is not None:
            raise InvalidParams(f"OpLogBatch.first_sequence_id: {problem}")
        if not isinstance(body, OpLogColumns):
            entries = tuple(body)
            for i, e in enumerate(entries):
                if not isinstance(e, OpLogEntry):
                    raise InvalidParams(f"OpLogBatch.entries[{i}]: {type(e).__name__} is not an OpLogEntry")
                if e.sequence_id != first_sequence_id + i:
                    raise OpLogGap(f"OpLogBatch.entries[{i}]: sequence id {e.sequence_id}, "
                                   f"expected {first_sequence_id + i}")
            body = OpLogColumns.from_ops(entries)
        if len(body) == 0:
            raise InvalidParams("OpLogBatch.entries: a batch holds at least one entry")
        if first_sequence_id + len(body) - 1 > _SEQ_MAX:
            raise InvalidParams(f"OpLogBatch: {len(body)} entries from {first_sequence_id} overflow the sequence space")
        self.first_sequence_id = first_sequence_id
        self.columns = body

    @property
    def count(self) -> int:
        return len(self.columns)

    @property
    def last_sequence_id(self) -> int:
        return self.first_sequence_id + self.count - 1

    @property
    def sequence_ids(self) -> range:
        return range(self.first_sequence_id, self.last_sequence_id + 1)

    @cached_property
    def blob(self) -> bytes:
        """The encoded columns: what the checksum covers."""
        return self.columns.to_wire()

    @cached_property
    def checksum(self) -> int:
        return _checksum(self.first_sequence_id, self.count, self.blob)

    @cached_property
    def entries(self) -> tuple[OpLogEntry, ...]:
        """A per-entry view for small batches (tests, tools); never on the hot path."""
        return tuple(op.at(self.first_sequence_id + i) for i, op in enumerate(self.columns.ops()))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, OpLogBatch):
            return NotImplemented
        return (self.first_sequence_id, self.count, self.blob) == (other.first_sequence_id, other.count, other.blob)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"OpLogBatch({self.first_sequence_id}..{self.last_sequence_id})"


def _checksum(first: int, count: int, blob: bytes) -> int:
    # The header ids are covered too: a batch re-labelled to another position must not verify.
    return zlib.crc32(blob, zlib.crc32(struct.pack(">QQ", first, count)))


# --- encode ---------------------------------------------------------------------------------------


def encode_batch(batch: OpLogBatch) -> bytes:
    return msgpack.packb(
        {"version": STANDBY_WIRE_VERSION, "first_sequence_id": batch.first_sequence_id,
         "count": batch.count, "columns": batch.blob, "checksum": batch.checksum},
        use_bin_type=True,
    )


# --- decode (strict) ------------------------------------------------------------------------------


def _bin(v: Any) -> str | None:
    return None if type(v) is bytes else f"expected bytes, got {type(v).__name__}"


def _list(v: Any) -> str | None:
    return None if type(v) is list else f"expected a list, got {type(v).__name__}"


def _fields(m: Any, where: str, checks: dict[str, FieldCheck],
            optional: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The checked fields of wire map ``m``; missing (unless ``optional``: None), extra or
    ill-typed -> OpLogCorrupt."""
    if type(m) is not dict:
        raise OpLogCorrupt(where, f"expected a map, got {type(m).__name__}")
    extra = sorted(map(repr, set(m) - set(checks)))
    if extra:
        raise OpLogCorrupt(where, f"unknown field(s) {', '.join(extra)}")
    out: dict[str, Any] = {}
    for name, check in checks.items():
        if name not in m:
            if name not in optional:
                raise OpLogCorrupt(f"{where}.{name}", "missing field")
            out[name] = None
            continue
        problem = check(m[name])
        if problem is not None:
            raise OpLogCorrupt(f"{where}.{name}", problem)
        out[name] = m[name]
    return out


_WIRE_ARRAYS = {**_ARRAYS, "key_offsets": "<i8", "key_bytes": "u1", "string_offsets": "<i8", "string_bytes": "u1"}
_COLUMNS_WIRE: dict[str, FieldCheck] = {**{name: _bin for name in _WIRE_ARRAYS}, "segments": _list}
_BATCH_WIRE: dict[str, FieldCheck] = {"version": check_str, "first_sequence_id": check_seq, "count": check_seq,
                                       "columns": _bin,
                                       "checksum": lambda v: _u64(v) or (None if v <= 0xFFFFFFFF else "not a crc32")}
_OPTIONAL_PUT_COLUMNS = frozenset({"hard_pinned", "soft_pin_enabled", "put_start_time_ms"})  # optional PUT_END columns
_OPS = {int(op): op for op in OpType}


def decode_batch(data: bytes) -> OpLogBatch:
    """Decode and verify one batch; any deviation raises a subclass of OpLogCorrupt naming it."""
    try:
        top = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for malformed input
        raise OpLogCorrupt("batch", f"not a msgpack document ({type(exc).__name__}: {exc})") from None
    if type(top) is dict and "version" in top and top["version"] != STANDBY_WIRE_VERSION:
        raise OpLogCorrupt("batch.version", f"{top['version']!r} is not {STANDBY_WIRE_VERSION!r}")
    f = _fields(top, "batch", _BATCH_WIRE)
    first, count, blob = f["first_sequence_id"], f["count"], f["columns"]
    if first + count - 1 > _SEQ_MAX:
        raise OpLogCorrupt("batch.count", f"{count} entries from {first} overflow the sequence space")
    actual = _checksum(first, count, blob)
    if actual != f["checksum"]:
        raise OpLogChecksumError("batch.checksum", f"stored {f['checksum']:#010x}, computed {actual:#010x}")
    batch = OpLogBatch(first, OpLogColumns.from_wire(blob, count, "batch.columns"))
    # keep the verified bytes: re-encoding returns them unchanged
    batch.__dict__.update(blob=blob, checksum=actual)
    return batch
