"""SnapshotState: the engine-neutral content of a complete MasterService snapshot.

The engine exports one (``MasterService.export_state()``) and is rebuilt from one
(``MasterService.from_state``). Three Arrow tables with exactly the schemas of :mod:`schema`;
deadline columns are steady-clock ns of the process that produced the state, ``INT64_MIN`` meaning
never leased / no soft-pin interval (sentinels, never nulls). Validation is vectorized.

Each table is in one of two layouts with the same columns and meaning: *plain* (the
``*_ARROW_SCHEMA``: name columns as strings) or *encoded* (the ``*_PAYLOAD_SCHEMA`` of the v2
payload: tenant/client/group/segment dictionary-encoded, keys large_string). The engine exports
and the v2 codec reads the encoded layout (no per-row string work); :meth:`SnapshotState.plain`
and :meth:`SnapshotState.encoded` convert, and every check below accepts either.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from ..errors import SnapshotIntegrityError, SnapshotSchemaError
from ..schema import (
    KIND_MEMORY,
    NAME_DICTIONARY,
    NAME_INDEX_TYPES,
    OBJECTS_ARROW_SCHEMA,
    OBJECTS_PAYLOAD_SCHEMA,
    REPLICAS_ARROW_SCHEMA,
    REPLICAS_PAYLOAD_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    ST_REMOVED,
)

UINT64_MAX = 2**64 - 1


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
    for field, column in zip(table.schema, table.columns):
        nulls = column.null_count
        if pa.types.is_dictionary(field.type):
            nulls += sum(chunk.dictionary.null_count for chunk in column.chunks)
        if nulls:
            raise SnapshotSchemaError(f"{name}.{field.name}: {nulls} nulls")
    return matched


def _np(table: pa.Table, column: str) -> np.ndarray:
    return table.column(column).to_numpy()



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


def name_array(codes: np.ndarray, names: list[str]) -> pa.DictionaryArray:
    """A name-dictionary array over ``names`` with the narrowest index type that fits."""
    index_type = next(t for t in NAME_INDEX_TYPES if len(names) <= np.iinfo(t.to_pandas_dtype()).max + 1)
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(index_type.to_pandas_dtype(), copy=False)),
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


@dataclass(frozen=True)
class SnapshotState:
    objects: pa.Table
    replicas: pa.Table
    segments: pa.Table
    replica_next_id: int

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

    def validate(self, *, check_unique_keys: bool = True, check_overlaps: bool | None = None) -> "SnapshotState":
        """Raise a typed error if the state is not internally consistent; return self.

        ``check_unique_keys=False`` skips the (tenant, key) uniqueness check and, unless
        ``check_overlaps`` says otherwise, the extent-overlap sort: both are what the engine
        guarantees on export (key index, allocator) and checks again on load (index insert,
        allocator rebuild), so a state on its way into or out of an engine skips them here.
        """
        for name, schemas in _LAYOUTS.items():
            check_table(getattr(self, name), schemas, name)
        self._validate_objects(check_unique_keys)
        self._validate_segments()
        self._validate_replicas(check_unique_keys if check_overlaps is None else check_overlaps)
        return self

    def _validate_objects(self, check_unique_keys: bool = True) -> None:
        objs = self.objects
        if check_unique_keys and objs.num_rows:
            pairs = pa.table({"tenant": name_codes(objs.column("tenant"))[0], "key": objs.column("key")})
            if pairs.group_by(["tenant", "key"]).aggregate([]).num_rows != objs.num_rows:
                raise SnapshotIntegrityError("objects: duplicate (tenant, key)")
        if objs.num_rows and int(pc.min(objs.column("size_bytes")).as_py()) < 0:
            raise SnapshotIntegrityError("objects: negative size_bytes")

    def _validate_segments(self) -> None:
        segs = self.segments
        if pc.count_distinct(segs.column("name")).as_py() != segs.num_rows:
            raise SnapshotIntegrityError("segments: duplicate segment name")
        if segs.num_rows and (int(pc.min(segs.column("size")).as_py()) < 0
                              or int(pc.min(segs.column("used")).as_py()) < 0):
            raise SnapshotIntegrityError("segments: negative size or used")

    def _validate_replicas(self, check_overlaps: bool = True) -> None:
        reps, n_obj = self.replicas, self.objects.num_rows
        try:
            next_id = operator.index(self.replica_next_id)
        except TypeError:
            next_id = -1
        if isinstance(self.replica_next_id, bool) or not 0 <= next_id <= UINT64_MAX:
            raise SnapshotIntegrityError(f"replica_next_id {self.replica_next_id!r} is not a uint64")
        codes, names = name_codes(reps.column("segment"))
        seg_rows = _segment_lut(names, self.segments)
        offset, size = _np(reps, "offset"), _np(reps, "size")
        err, at = _check_replicas(_np(reps, "object_index"), _np(self.objects, "replica_count"),
                                  _np(reps, "replica_id"), offset, size, _np(reps, "kind"), codes,
                                  seg_rows, _np(self.segments, "size"), np.uint64(next_id))
        if err == _UNKNOWN_SEGMENT:
            raise SnapshotIntegrityError(f"replicas: memory replica on unknown segment "
                                         f"{reps.column('segment')[at].as_py()!r}")
        if err:
            raise SnapshotIntegrityError(_REPLICA_ERRORS[err].format(n=n_obj))
        if check_overlaps:
            self._check_overlaps(seg_rows[codes] if codes.size else codes, offset, size)

    def _check_overlaps(self, seg: np.ndarray, off: np.ndarray, sz: np.ndarray) -> None:
        # REMOVED replicas no longer own their extent; every other memory replica does.
        reps = self.replicas
        held = (_np(reps, "kind") == KIND_MEMORY) & (_np(reps, "status") != ST_REMOVED) & (sz > 0)
        seg, off, sz = seg[held].astype(np.int64), off[held], sz[held]
        if seg.size and int(off.max()) < (1 << 62) >> int(seg.max()).bit_length():
            # one int64 sort key (segment code in the high bits): about 2x faster than lexsort
            order = np.argsort((seg << (62 - int(seg.max()).bit_length())) | off)
        else:
            order = np.lexsort((off, seg))
        seg, off, sz = seg[order], off[order], sz[order]
        same = seg[1:] == seg[:-1]
        if (same & (off[1:] < off[:-1] + sz[:-1])).any():
            raise SnapshotIntegrityError("replicas: overlapping memory extents on one segment")


_UNKNOWN_SEGMENT = 5
_REPLICA_ERRORS = {
    1: "replicas: object_index outside [0, {n})",
    2: "objects.replica_count disagrees with the replicas table",
    3: "replica_next_id is not above every replica_id",
    4: "replicas: negative offset or size",
    6: "replicas: memory extent beyond segment capacity",
}


@njit(cache=True, nogil=True)
def _check_replicas(object_index, replica_count, replica_id, offset, size, kind, seg_codes,
                    seg_rows, capacity, next_id):
    """The per-replica checks in one pass, no temporaries when object_index is sorted (as the
    engine writes it): (error, replica index), error 0 when consistent, else a key of
    _REPLICA_ERRORS or _UNKNOWN_SEGMENT."""
    n_obj = replica_count.shape[0]
    runs = True  # sorted object_index: compare run lengths with replica_count as we go
    prev, run, expect = -1, 0, 0
    for i in range(object_index.shape[0]):
        oi = object_index[i]
        if oi < 0 or oi >= n_obj:
            return 1, i
        if replica_id[i] >= next_id:
            return 3, i
        if offset[i] < 0 or size[i] < 0:
            return 4, i
        if kind[i] == KIND_MEMORY:
            row = seg_rows[seg_codes[i]]
            if row < 0:
                return _UNKNOWN_SEGMENT, i
            if offset[i] > capacity[row] - size[i]:  # off + size > capacity, without overflow
                return 6, i
        if runs:
            if oi == prev:
                run += 1
            elif oi > prev:
                if run != (replica_count[prev] if prev >= 0 else 0):
                    return 2, i
                for skipped in range(prev + 1, oi):  # objects without a replica
                    if replica_count[skipped] != 0:
                        return 2, i
                prev, run = oi, 1
            else:
                runs = False
    if runs:
        expect = replica_count[prev] if prev >= 0 else 0
        if run != expect:
            return 2, object_index.shape[0]
        for skipped in range(prev + 1, n_obj):
            if replica_count[skipped] != 0:
                return 2, object_index.shape[0]
        return 0, 0
    counts = np.zeros(n_obj, np.int64)
    for i in range(object_index.shape[0]):
        counts[object_index[i]] += 1
    for o in range(n_obj):
        if counts[o] != replica_count[o]:
            return 2, 0
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
    """Bytes held per segment row: memory replicas that still own their extent (not REMOVED)."""
    held = ((replicas.column("kind").to_numpy() == KIND_MEMORY)
            & (replicas.column("status").to_numpy() != ST_REMOVED))
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
