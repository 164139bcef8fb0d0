"""SnapshotState: the engine-neutral content of a complete MasterService snapshot.

The engine exports one (``MasterService.export_state()``) and is rebuilt from one
(``MasterService.from_state``). Three Arrow tables with exactly the schemas of :mod:`schema`;
deadline columns are steady-clock ns of the process that produced the state, ``INT64_MIN`` meaning
never leased / no soft-pin interval (sentinels, never nulls). Validation is vectorized. It lives
in the store, which exports and loads one (arrow_export.py, arrow_io.py); the snapshot formats,
the standby and the oplog apply build on it.

Each table is in one of two layouts with the same columns and meaning: *plain* (the
``*_ARROW_SCHEMA``: name columns as strings) or *encoded* (the ``*_PAYLOAD_SCHEMA`` of the v2
payload: tenant/client/group/segment dictionary-encoded, keys large_string). The engine exports
and the v2 codec reads the encoded layout (no per-row string work); :meth:`SnapshotState.plain`
and :meth:`SnapshotState.encoded` convert, and every check below accepts either.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..kernels.jit import njit
from ..clock import INT64_MAX, NS_PER_MS
from ..errors import (
    SnapshotExtentError,
    SnapshotFieldError,
    SnapshotIntegrityError,
    SnapshotSchemaError,
)
from ..kernels import rebuild
from ..kernels.offset_allocator_v1 import multiplier_bits
from .upstream_ids import first_bad_uuid
from ..schema import (
    CHECKSUMS_ARROW_SCHEMA,
    KIND_MEMORY,
    MAX_KEY_BYTES,
    NAME_DICTIONARY,
    NAME_INDEX_TYPES,
    OBJECTS_ARROW_SCHEMA,
    OBJECTS_PAYLOAD_SCHEMA,
    REPLICA_COLUMNS,
    REPLICAS_ARROW_SCHEMA,
    REPLICAS_PAYLOAD_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    SEGMENTS_LEGACY_SCHEMA,
    ST_EMPTY,
    ST_REMOVED,
    ReplicaKind,
    ReplicaStatus,
)

MAX_PUT_START_MS = INT64_MAX // NS_PER_MS  # put start times whose ns still fit int64
# Largest replica_next_id a state may carry: the engine's int64 id counter must never wrap (2**62
# ids last 146 years at 10**9 puts/s), so a forged id near 2**63 cannot break every later put.
MAX_REPLICA_NEXT_ID = 2**62


def _canonical(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every name-dictionary index type widened to int32 (for comparison)."""
    return pa.schema([f.with_type(NAME_DICTIONARY)
                      if pa.types.is_dictionary(f.type) and f.type.index_type in NAME_INDEX_TYPES
                      and f.type.value_type == pa.string() and not f.type.ordered else f
                      for f in schema], metadata=schema.metadata)


def check_table(table: pa.Table, schema: pa.Schema | tuple[pa.Schema, ...], name: str) -> pa.Schema:
    """Exact schema (names, types, nullability; metadata ignored; any of ``schema`` when a tuple)
    and no nulls, in the values of dictionary columns too; returns the schema matched."""
    if not isinstance(table, pa.Table):
        raise SnapshotSchemaError(f"{name}: expected a pyarrow.Table, got {type(table).__name__}")
    schemas = schema if isinstance(schema, tuple) else (schema,)
    canonical = _canonical(table.schema)
    matched = next((s for s in schemas if canonical.equals(s, check_metadata=False)), None)
    if matched is None:
        raise SnapshotSchemaError(f"{name}: schema mismatch:\n{table.schema}\nexpected:\n{schemas[0]}")
    for column_field, column in zip(table.schema, table.columns):
        nulls = column.null_count
        if pa.types.is_dictionary(column_field.type):
            nulls += sum(chunk.dictionary.null_count for chunk in column.chunks)
        if nulls:
            raise SnapshotSchemaError(f"{name}.{column_field.name}: {nulls} nulls")
    return matched


def _np(table: pa.Table, column: str) -> np.ndarray:
    return column_numpy(table.column(column))


def column_numpy(column: pa.ChunkedArray) -> np.ndarray:
    """``column`` as a read-only NumPy array (booleans as bytes). A column of one record batch
    converts zero-copy, read-only; one of several (a snapshot written range by range) is a copy,
    made read-only too: the kernels that read it then run the signature the warm-up compiled,
    instead of compiling (or loading from the cache) another one inside a restore."""
    values = column.to_numpy()
    values.flags.writeable = False
    return values


def column_chunks(column: pa.ChunkedArray) -> list[np.ndarray]:
    """The record batches of a fixed-width column without nulls as read-only NumPy views, in row
    order: read where they lie (a pass that needs no random access across batches copies nothing;
    at 10M objects each copy :func:`column_numpy` makes is tens of MB of fresh memory)."""
    chunks = [chunk.to_numpy() for chunk in column.chunks]
    for values in chunks:
        values.flags.writeable = False
    return chunks


def name_codes(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, list[str]]:
    """(codes, distinct names) of a string or name-dictionary column: ``names[codes[i]]`` is row
    i's value; codes keep the dictionary's index width (int8 is common). A dictionary column
    costs no per-row string work."""
    if isinstance(column, pa.ChunkedArray):
        if pa.types.is_dictionary(column.type) and column.num_chunks > 1:
            column = column.unify_dictionaries()
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    codes = column.indices.to_numpy(zero_copy_only=False)
    names = column.dictionary.to_pylist()
    if len(set(names)) != len(names):  # a dictionary may repeat a value: one code per name
        first = {name: i for i, name in reversed(list(enumerate(names)))}
        distinct = sorted(set(first.values()))
        lut = np.array([distinct.index(first[name]) for name in names], np.int32)
        codes, names = lut[codes], [names[i] for i in distinct]
    return codes, names


# the NumPy dtype of each index type, mapped here: DataType.to_pandas_dtype() imports pandas
_INDEX_DTYPES = tuple((t, np.dtype(f"int{t.bit_width}")) for t in NAME_INDEX_TYPES)


def name_array(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    """A name-dictionary array over ``names`` with the narrowest index type that fits."""
    index_type, dtype = next((t, d) for t, d in _INDEX_DTYPES if len(names) <= np.iinfo(d).max + 1)
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(dtype, copy=False), index_type),
                                          pa.array(names, pa.string()))


def layout_table(schema: pa.Schema, columns: dict[str, object]) -> pa.Table:
    """A table with ``schema``'s fields from ``columns`` (arrays, chunked arrays or NumPy), each
    name-dictionary field typed with its array's own index width."""
    arrays = [c if isinstance(c, (pa.Array, pa.ChunkedArray)) else pa.array(c, f.type)
              for f, c in ((f, columns[f.name]) for f in schema)]
    return pa.Table.from_arrays(arrays, schema=pa.schema([f.with_type(a.type) for f, a in zip(schema, arrays)]))


_LAYOUTS = {"objects": (OBJECTS_ARROW_SCHEMA, OBJECTS_PAYLOAD_SCHEMA),
            "replicas": (REPLICAS_ARROW_SCHEMA, REPLICAS_PAYLOAD_SCHEMA),
            "segments": (SEGMENTS_ARROW_SCHEMA,)}


def with_segment_identity(segments: pa.Table) -> pa.Table:
    """A segments table in the current layout: one without the identity columns (written before
    they existed) gets ``segment_id`` and ``host_id`` "" (unknown; the engine generates ids when
    it loads the segments). Other tables are returned unchanged (validation judges them)."""
    if not isinstance(segments, pa.Table) or segments.schema.names != SEGMENTS_LEGACY_SCHEMA.names:
        return segments
    empty = pa.array([""] * segments.num_rows, pa.string())
    for name in ("segment_id", "host_id"):
        segments = segments.append_column(SEGMENTS_ARROW_SCHEMA.field(name), empty)
    return segments


@dataclass(frozen=True)
class SnapshotState:
    objects: pa.Table
    replicas: pa.Table
    segments: pa.Table
    replica_next_id: int
    # upstream's object checksums, sparse (CHECKSUMS_ARROW_SCHEMA): objects without one have no row
    checksums: pa.Table = field(default_factory=CHECKSUMS_ARROW_SCHEMA.empty_table)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", with_segment_identity(self.segments))

    def with_objects_kept(self, keep: np.ndarray, objects: pa.Table, replicas: pa.Table) -> "SnapshotState":
        """This state with only the objects ``keep`` (a mask over its objects) left: ``objects``
        and ``replicas`` are the filtered tables (object_index renumbered); the checksums follow."""
        sums = self.checksums
        if sums.num_rows:
            idx = sums.column("object_index").to_numpy()
            kept = keep[idx]
            sums = pa.table({"object_index": (np.cumsum(keep, dtype=np.int64) - 1)[idx[kept]],
                             "checksum": sums.column("checksum").to_numpy()[kept]}, schema=CHECKSUMS_ARROW_SCHEMA)
        return replace(self, objects=objects, replicas=replicas, checksums=sums)

    def plain(self) -> "SnapshotState":
        """This state with string name columns (the ``*_ARROW_SCHEMA`` layout)."""
        return replace(self, objects=self.objects.cast(OBJECTS_ARROW_SCHEMA),
                       replicas=self.replicas.cast(REPLICAS_ARROW_SCHEMA))

    def encoded(self) -> "SnapshotState":
        """This state in the v2 payload layout (dictionary name columns, large_string keys)."""
        def encode(table: pa.Table, schema: pa.Schema) -> pa.Table:
            if _canonical(table.schema).equals(schema, check_metadata=False):
                return table
            return layout_table(schema, {
                f.name: name_array(*name_codes(table.column(f.name))) if pa.types.is_dictionary(f.type)
                else table.column(f.name).cast(f.type) for f in schema})
        return replace(self, objects=encode(self.objects, OBJECTS_PAYLOAD_SCHEMA),
                       replicas=encode(self.replicas, REPLICAS_PAYLOAD_SCHEMA))

    def validate(self, *, check_unique_keys: bool = True, check_overlaps: bool | None = None,
                 replicas: bool = True) -> "SnapshotState":
        """Raise a typed error if the state is not internally consistent or a value lies outside
        its domain; return self. Every loader runs it (v2 and v1 restore, standby snapshots, oplog
        apply, ``from_state``), so what passes loads into an engine that passes
        ``MasterService.verify()``:

        * objects: ``size_bytes`` > 0; keys 1..MAX_KEY_BYTES bytes; ``put_start_time_ms`` in
          [0, the ms whose ns fit int64]; (tenant, key) unique.
        * segments: names non-empty and unique; ``size`` > 0; ``base + size`` within int64;
          0 <= ``used`` <= ``size``.
        * replicas: ``object_index`` in range and each object's ``replica_count`` matched; ids in
          [1, ``replica_next_id``) and unique, ``replica_next_id`` at most 2**62; known status
          (never UNDEFINED, the engine's empty slot) and kind; ``size`` equal to the object's
          ``size_bytes`` (the engine holds the object size at the offset); offsets >= 0; memory
          extents on a known segment, inside it, starting on its allocation unit (the
          ``kernels.allocation.held_end`` rule) and not overlapping one another.

        Errors are :class:`~..errors.SnapshotFieldError` (``SnapshotExtentError`` for overlaps)
        naming table, field and row, or ``SnapshotSchemaError``. ``check_unique_keys=False`` skips
        the (tenant, key) uniqueness check and, unless ``check_overlaps`` says otherwise, the
        extent-overlap sort: both are what the engine guarantees on export (key index, allocator)
        and checks again on load (index insert, allocator rebuild), so a state on its way into or
        out of an engine skips them here. ``replicas=False`` leaves out the replica checks beyond
        the table's schema: a writer that builds the replicas table later checks it then
        (:func:`check_replicas`).
        """
        for name, schemas in _LAYOUTS.items():
            check_table(getattr(self, name), schemas, name)
        next_id = self._validate_next_id()
        size_bytes = _np(self.objects, "size_bytes")  # once: a column of several batches converts by a copy
        self._validate_objects(size_bytes, check_unique_keys)
        self._validate_checksums()
        unit_bits = self._validate_segments()
        if replicas:
            check_replicas(self.replicas, _np(self.objects, "replica_count"), size_bytes, self.segments, next_id,
                           unit_bits,
                           check_unique_keys if check_overlaps is None else check_overlaps)
        return self

    def _validate_next_id(self) -> int:
        return check_next_id(self.replica_next_id)

    def _validate_objects(self, size_bytes: np.ndarray, check_unique_keys: bool = True) -> None:
        objs = self.objects
        if check_unique_keys and objs.num_rows:
            pairs = pa.table({"tenant": name_codes(objs.column("tenant"))[0], "key": objs.column("key")})
            # use_threads=False: Acero's worker threads may drop the last reference to these
            # NumPy-backed buffers after the call returns, and one doing so while the interpreter
            # exits aborts the process ("terminate called without an active exception")
            if pairs.group_by(["tenant", "key"], use_threads=False).aggregate([]).num_rows != objs.num_rows:
                raise SnapshotIntegrityError("objects: duplicate (tenant, key)")
        # Arrow columns: range checks over their batches where they lie, no NumPy copy
        check_object_columns(size_bytes, objs.column("put_start_time_ms"), pc.binary_length(objs.column("key")))

    def _validate_checksums(self) -> None:
        check_table(self.checksums, CHECKSUMS_ARROW_SCHEMA, "checksums")
        idx = _np(self.checksums, "object_index")
        _check_range("checksums", "object_index", idx, 0, self.objects.num_rows - 1)
        _first_bad("checksums", "object_index", np.concatenate(([False], idx[1:] <= idx[:-1])), idx,
                   "does not follow the previous row's (increasing: one checksum per object)")

    def _validate_segments(self) -> np.ndarray:
        return check_segments(self.segments)

    def check_deadline_horizon(self, now_ns: int, max_ttl_ns: int) -> None:
        """Every lease and soft-pin deadline (sentinels aside) at most ``max_ttl_ns`` past
        ``now_ns`` (same clock): no master grants a longer one, so a later deadline means the
        clock it is measured against is wrong. Raises SnapshotFieldError naming the first."""
        limit = int(now_ns) + int(max_ttl_ns)
        if limit >= INT64_MAX:
            return
        for deadline in ("lease_deadline_ns", "soft_pin_deadline_ns"):
            column = self.objects.column(deadline)
            top = pc.max(column).as_py()  # an aggregate over the batches where they lie: no copy
            if top is not None and top > limit:
                values = column_numpy(column)
                row = int(np.argmax(values > limit))
                raise SnapshotFieldError("objects", deadline, row,
                                         f"{int(values[row])} is {int(values[row]) - int(now_ns)} ns past the "
                                         f"clock's {int(now_ns)}, more than the longest TTL ({int(max_ttl_ns)} ns)")


def check_replicas(replicas: pa.Table, replica_count: np.ndarray, size_bytes: np.ndarray, segments: pa.Table,
                   next_id: int, unit_bits: np.ndarray, check_overlaps: bool = True) -> None:
    """The replica checks of :meth:`SnapshotState.validate` on a replicas table (either layout),
    against its objects' ``replica_count`` and ``size_bytes`` and a checked ``segments`` table
    (``unit_bits``: :func:`check_segments`'s); ``check_overlaps``: also the extent-overlap sort.
    The columns are read record batch by record batch where they lie (no copy)."""
    codes, names = name_codes(replicas.column("segment"))
    seg_rows = _segment_lut(names, segments)
    batches = [{name: values for name, values in zip(_REPLICA_COLUMNS, parts)}
               for parts in zip(*(column_chunks(replicas.column(name)) for name in _REPLICA_COLUMNS))]
    check_replica_columns(batches, codes, names, seg_rows, replica_count, size_bytes, _np(segments, "size"),
                          unit_bits, next_id)
    if check_overlaps:
        _check_overlaps(replicas, segments, seg_rows[codes] if codes.size else codes, _np(replicas, "offset"),
                        _np(replicas, "size"), unit_bits)


def _check_overlaps(reps: pa.Table, segments: pa.Table, seg: np.ndarray, off: np.ndarray, sz: np.ndarray,
                    unit_bits: np.ndarray) -> None:
    # REMOVED replicas no longer own their extent; every other memory replica does: the
    # allocator rebuild's check, naming the table rows
    held = np.flatnonzero((_np(reps, "kind") == KIND_MEMORY) & (_np(reps, "status") != ST_REMOVED))
    size = _np(segments, "size")
    status, fault, *_ = rebuild.free_extents_sorted(seg[held], off[held], sz[held],
                                                    np.ones(size.size, np.bool_), size, unit_bits)
    if status == rebuild.OVERLAP:
        first, second = (int(held[i]) for i in fault[5:])
        raise SnapshotExtentError("replicas", "offset", second,
                                  f"extent [{fault[3]}, {fault[4]}) overlaps row {first}'s "
                                  f"[{fault[1]}, {fault[2]}) on one segment")
    if status != rebuild.OK:
        raise SnapshotExtentError("replicas", "offset", int(held[fault[6]]),
                                  rebuild.fault_message(status, fault, unit_bits, size))


def check_segments(segs: pa.Table) -> np.ndarray:
    """Checks a segments table's values (names, sizes, bases, ids); returns each row's
    allocation-unit bits."""
    if pc.count_distinct(segs.column("name")).as_py() != segs.num_rows:
        raise SnapshotFieldError("segments", "name", None, "duplicate segment name")
    if not segs.num_rows:
        return np.zeros(0, np.int64)
    _check_range("segments", "name", pc.binary_length(segs.column("name")).to_numpy(), 1, INT64_MAX,
                 "bytes long")
    size, used, base = _np(segs, "size"), _np(segs, "used"), _np(segs, "base")
    _check_range("segments", "size", size, 1, INT64_MAX)
    _first_bad("segments", "used", (used < 0) | (used > size), used, "outside [0, size]")
    # size >= 1 here, so INT64_MAX - size fits uint64: base + size stays within int64
    _first_bad("segments", "base", base > (INT64_MAX - size).astype(np.uint64), base,
               "puts base + size past int64")
    ids = segs.column("segment_id")
    named = pc.not_equal(ids, "")
    bad = first_bad_uuid(ids.filter(named))
    if bad >= 0:
        row = int(np.flatnonzero(named.to_numpy(zero_copy_only=False))[bad])
        raise SnapshotFieldError("segments", "segment_id", row,
                                 f"{ids[row].as_py()!r} is not an upstream UUID string")
    if pc.count_distinct(ids.filter(named)).as_py() != pc.sum(named).as_py():
        raise SnapshotFieldError("segments", "segment_id", None, "duplicate segment id")
    return multiplier_bits(size)


def check_next_id(value: int) -> int:
    """``value`` as a replica_next_id: an int in [1, 2**62], else SnapshotFieldError."""
    try:
        next_id = operator.index(value)
    except TypeError:
        next_id = -1
    if isinstance(value, bool) or not 1 <= next_id <= MAX_REPLICA_NEXT_ID:
        raise SnapshotFieldError("state", "replica_next_id", None, f"{value!r} is not in [1, 2**62]")
    return next_id


def check_object_columns(size_bytes: np.ndarray | pa.ChunkedArray, put_start_ms: np.ndarray | pa.ChunkedArray,
                         key_bytes: np.ndarray | pa.ChunkedArray) -> None:
    """The objects' domains on columns (row i: object i; ``key_bytes``: each key's length), each
    an array or an Arrow column: SnapshotFieldError("objects", field, row) naming the first value
    outside its domain."""
    _check_range("objects", "size_bytes", size_bytes, 1, INT64_MAX)
    _check_range("objects", "put_start_time_ms", put_start_ms, 0, MAX_PUT_START_MS)
    _check_range("objects", "key", key_bytes, 1, MAX_KEY_BYTES, "bytes long")


# the replica columns check_replica_columns reads (the replicas table's names)
_REPLICA_COLUMNS = ("object_index", "replica_id", "kind", "status", "offset", "size")


def check_replica_columns(replicas: dict[str, np.ndarray] | list[dict[str, np.ndarray]], segment: np.ndarray,
                          segment_names: list[str], segment_rows: np.ndarray, replica_count: np.ndarray,
                          size_bytes: np.ndarray, capacity: np.ndarray, unit_bits: np.ndarray, next_id: int) -> None:
    """The replicas' domains on columns: ``replicas`` holds the columns of _REPLICA_COLUMNS (or a
    list of such, the record batches of a table in row order); replica i is on segment name
    ``segment_names[segment[i]]``, at row ``segment_rows[segment[i]]`` (-1: unknown) of
    ``capacity``/``unit_bits``; ``replica_count``/``size_bytes`` are the objects'.
    Raises SnapshotFieldError("replicas", field, row) naming the first bad replica (see
    :meth:`SnapshotState.validate`), ids included (in [1, next_id), unique)."""
    batches = replicas if isinstance(replicas, list) else [replicas]
    n = sum(b["object_index"].size for b in batches)
    carry = np.array([-1, 0, 1], np.int64)  # _check_replicas' run state across batches
    err, at, start = 0, n, 0
    for b in batches:
        size = b["object_index"].size
        err, at = _check_replicas(b["object_index"], replica_count, size_bytes, b["replica_id"], b["offset"],
                                  b["size"], b["kind"], b["status"], segment[start:start + size], segment_rows,
                                  capacity, unit_bits, np.uint64(next_id), carry)
        if err:
            break
        start += size
    if not err and not _counts_match(replica_count, carry, batches):
        err, at = _COUNT_MISMATCH, n
    if err:
        field, what = _REPLICA_ERRORS[err]
        value = (None if at >= n else segment_names[int(segment[start + at])] if field == "segment"
                 else b[field][at].item())
        row = start + at if at < n else None
        raise SnapshotFieldError("replicas", field, row,
                                 f"{value!r}: {what.format(n=replica_count.size, next_id=next_id)}")
    dup = _first_duplicate([b["replica_id"] for b in batches], next_id)
    if dup >= 0:
        raise SnapshotFieldError("replicas", "replica_id", dup,
                                 f"{_row_value(batches, 'replica_id', dup)} is used twice")


def _row_value(batches: list[dict[str, np.ndarray]], name: str, row: int) -> int:
    """Column ``name``'s value at ``row`` of a table given as its record batches."""
    for b in batches:
        if row < b[name].size:
            return int(b[name][row])
        row -= b[name].size
    raise IndexError(row)


def _counts_match(replica_count: np.ndarray, carry: np.ndarray, batches: list[dict[str, np.ndarray]]) -> bool:
    """After every batch passed _check_replicas: each object's replica_count is its number of
    replicas (the run state ``carry`` settles it when object_index was sorted, else a count)."""
    prev, run, runs = (int(v) for v in carry)
    if runs:
        return run == (int(replica_count[prev]) if prev >= 0 else 0) and not replica_count[prev + 1:].any()
    counts = np.zeros(replica_count.size, np.int64)
    for b in batches:
        counts += np.bincount(b["object_index"], minlength=replica_count.size)
    return bool((counts == replica_count).all())


def _check_range(table: str, field: str, values: np.ndarray | pa.ChunkedArray, lo: int, hi: int, unit: str = "",
                 start: int = 0) -> None:
    """SnapshotFieldError naming the first row of an int64 column outside [lo, hi] (two
    reductions; the row is searched only on failure). ``values``: an array whose first element
    is row ``start``, or an Arrow column, checked batch by batch where it lies (no copy)."""
    if isinstance(values, pa.ChunkedArray):
        for chunk in values.chunks:
            _check_range(table, field, chunk.to_numpy(), lo, hi, unit, start)
            start += len(chunk)
    elif values.size and (int(values.min()) < lo or int(values.max()) > hi):
        _first_bad(table, field, (values < lo) | (values > hi), values,
                   f"{unit + ', ' if unit else ''}outside [{lo}, {hi}]", start)


def _first_bad(table: str, field: str, bad: np.ndarray, values: np.ndarray, what: str, start: int = 0) -> None:
    if bad.any():
        row = int(np.argmax(bad))
        raise SnapshotFieldError(table, field, start + row, f"{int(values[row])} {what}")


def _first_duplicate(ids: list[np.ndarray], next_id: int) -> int:
    """Row of a replica id an earlier row already has (ids, given as the arrays of consecutive
    row ranges, are in [1, next_id)), or -1."""
    n = sum(part.size for part in ids)
    if n < 2:
        return -1
    if next_id <= 64 * (n + (1 << 20)):  # a bitmap of at most ~8 bytes per replica
        seen, start = np.zeros((next_id + 63) // 64, np.uint64), 0
        for part in ids:
            at = int(_first_repeat_in_bitmap(part, seen))
            if at >= 0:
                return start + at
            start += part.size
        return -1
    flat = np.concatenate(ids)
    order = np.argsort(flat, kind="stable")
    repeat = np.flatnonzero(flat[order][1:] == flat[order][:-1])
    return int(order[repeat[0] + 1]) if repeat.size else -1


@njit(cache=True, nogil=True)
def _first_repeat_in_bitmap(ids, seen):
    """First i whose id ``seen`` (a bitmap, updated) already holds, or -1."""
    for i in range(ids.shape[0]):
        w = np.int64(ids[i] >> np.uint64(6))
        b = np.uint64(1) << (ids[i] & np.uint64(63))
        if seen[w] & b:
            return i
        seen[w] |= b
    return -1


# _check_replicas' results (0: consistent); module-level ints, which Numba compiles in
(_BAD_OBJECT_INDEX, _COUNT_MISMATCH, _ID_TOO_LARGE, _NEGATIVE_OFFSET, _UNKNOWN_SEGMENT, _BEYOND_CAPACITY,
 _ZERO_ID, _BAD_STATUS, _BAD_KIND, _SIZE_MISMATCH, _UNALIGNED_OFFSET, _OFFSET_TOO_LARGE) = range(1, 13)
# kernel error -> (replicas field, what is wrong)
_REPLICA_ERRORS = {
    _BAD_OBJECT_INDEX: ("object_index", "outside [0, {n})"),
    _COUNT_MISMATCH: ("object_index", "objects.replica_count disagrees with the replicas table"),
    _ID_TOO_LARGE: ("replica_id", "not below replica_next_id {next_id}"),
    _NEGATIVE_OFFSET: ("offset", "negative"),
    _UNKNOWN_SEGMENT: ("segment", "memory replica on an unknown segment"),
    _BEYOND_CAPACITY: ("offset", "memory extent beyond segment capacity"),
    _ZERO_ID: ("replica_id", "0 is not a replica id"),
    _BAD_STATUS: ("status", f"not a replica status (1..{int(max(ReplicaStatus))})"),
    _BAD_KIND: ("kind", f"not a replica kind (0..{int(max(ReplicaKind))})"),
    _SIZE_MISMATCH: ("size", "differs from its object's size_bytes (the extent the engine holds)"),
    _UNALIGNED_OFFSET: ("offset", "not a multiple of its segment's allocation unit"),
    _OFFSET_TOO_LARGE: ("offset", "above 2**32 - 1 (a replica not in memory: the engine keeps its offset in 32 bits)"),
}
# a non-memory replica's offset: the object table's replica_offset column holds it in bytes
_MAX_OTHER_OFFSET = np.int64(np.iinfo(REPLICA_COLUMNS["replica_offset"]).max)
_MAX_STATUS = np.uint8(max(ReplicaStatus))
_ST_EMPTY = int(ST_EMPTY)
_MAX_KIND = np.uint8(max(ReplicaKind))


@njit(cache=True, nogil=True)
def _check_replicas(object_index, replica_count, obj_size, replica_id, offset, size, kind, status, seg_codes,
                    seg_rows, capacity, unit_bits, next_id, carry):
    """The per-replica checks of one record batch in one pass: (error, replica index in the
    batch), error 0 when consistent, else a key of _REPLICA_ERRORS. ``carry`` (prev object, its
    run of replicas so far, object_index sorted so far) carries the comparison of run lengths
    with replica_count from batch to batch; _counts_match finishes it."""
    n_obj = replica_count.shape[0]
    prev, run, runs = carry[0], carry[1], carry[2]
    for i in range(object_index.shape[0]):
        oi = object_index[i]
        if oi < 0 or oi >= n_obj:
            return _BAD_OBJECT_INDEX, i
        if replica_id[i] == 0:
            return _ZERO_ID, i
        if replica_id[i] >= next_id:
            return _ID_TOO_LARGE, i
        if status[i] == _ST_EMPTY or status[i] > _MAX_STATUS:
            return _BAD_STATUS, i
        if kind[i] > _MAX_KIND:
            return _BAD_KIND, i
        if size[i] != obj_size[oi]:
            return _SIZE_MISMATCH, i
        if offset[i] < 0:
            return _NEGATIVE_OFFSET, i
        if kind[i] == KIND_MEMORY:
            row = seg_rows[seg_codes[i]]
            if row < 0:
                return _UNKNOWN_SEGMENT, i
            if offset[i] > capacity[row] - size[i]:  # off + size > capacity, without overflow
                return _BEYOND_CAPACITY, i
            if offset[i] & ((np.int64(1) << unit_bits[row]) - 1):
                return _UNALIGNED_OFFSET, i
        elif offset[i] > _MAX_OTHER_OFFSET:
            return _OFFSET_TOO_LARGE, i
        if runs:  # sorted object_index: compare run lengths with replica_count as we go
            if oi == prev:
                run += 1
            elif oi > prev:
                if run != (replica_count[prev] if prev >= 0 else 0):
                    return _COUNT_MISMATCH, i
                for skipped in range(prev + 1, oi):  # objects without a replica
                    if replica_count[skipped] != 0:
                        return _COUNT_MISMATCH, i
                prev, run = oi, 1
            else:
                runs = 0
    carry[0], carry[1], carry[2] = prev, run, runs
    return 0, 0


def _segment_lut(names: list[str], segments: pa.Table) -> np.ndarray:
    """Row in ``segments`` of each name (-1: none), int64."""
    lut = pc.fill_null(pc.index_in(pa.array(names, pa.string()), value_set=segments.column("name")), -1)
    return lut.to_numpy(zero_copy_only=False).astype(np.int64)


def segment_rows(replicas: pa.Table, segments: pa.Table) -> np.ndarray:
    """Each replica's row in ``segments`` by name (-1: no such segment), int64."""
    codes, names = name_codes(replicas.column("segment"))
    return _segment_lut(names, segments)[codes] if codes.size else np.zeros(0, np.int64)


def segment_usage(replicas: pa.Table, segments: pa.Table) -> np.ndarray:
    """Bytes per segment row as upstream counts them (its allocator's cur_size, what
    QuerySegments reports): the sizes of the memory replicas on it, exact, not rounded to
    allocation units; a REMOVED one counts until its buffer is freed."""
    held = replicas.column("kind").to_numpy() == KIND_MEMORY
    code = segment_rows(replicas, segments)
    held &= code >= 0
    return np.bincount(code[held], weights=replicas.column("size").to_numpy()[held],
                       minlength=segments.num_rows).astype(np.int64)


def with_usage(state: SnapshotState) -> SnapshotState:
    """``state`` with segments.used recomputed from its replicas."""
    segments = state.segments
    idx = segments.schema.get_field_index("used")
    used = pa.array(segment_usage(state.replicas, segments), pa.int64())
    return replace(state, segments=segments.set_column(idx, segments.schema.field("used"), used))


def empty_state() -> SnapshotState:
    return SnapshotState(OBJECTS_ARROW_SCHEMA.empty_table(), REPLICAS_ARROW_SCHEMA.empty_table(),
                         SEGMENTS_ARROW_SCHEMA.empty_table(), replica_next_id=1)
