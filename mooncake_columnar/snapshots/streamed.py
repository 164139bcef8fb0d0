"""A v2 snapshot written range by range: the forked writer's memory stays about one range's.

A forked writer (:mod:`.forked`) reads the master's columns in place, but building the tables
still allocates: key offsets, put start times, soft-pin deadlines, replica counts and object
indexes, and once any object was removed a gather of every column (about 100 bytes per object:
10 GB at 100M objects, beside the master). Here each Arrow file is written as record batches of
:data:`STREAM_ROWS` rows of the master (:class:`~..store.arrow_export.FrozenRows`), so what the
writer holds is about one range's tables. The files are the same tables a whole-state write
produces, in more record batches.

Three passes over the ranges: the first fixes the name columns' dictionaries (the batches of one
IPC file share them: :class:`~..store.arrow_export.NameNeeds`), each range's first object index
and the checksums; the objects file's pass validates each range's objects, the replicas file's
pass each range's replicas against those objects (together ``SnapshotState.validate``, as a
whole-state write does, without the checks the engine guarantees: unique keys, extents that do
not overlap, and here also replica ids unique across ranges; a restore checks all of them; each
range's replicas table is built once) and adds up the segments' used bytes that the segments
file, written after it, reports.
"""
from __future__ import annotations

from functools import reduce
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..schema import OBJECTS_PAYLOAD_SCHEMA, REPLICAS_PAYLOAD_SCHEMA
from ..store.arrow_export import FrozenColumns, FrozenRows, NameNeeds, segments_of
from .arrow_codec import DigestPayload, IpcPayload, table_payloads
from ..store.snapshot_state import SnapshotState, check_next_id, check_replicas, check_segments, check_table

STREAM_ROWS = 1 << 22  # master rows per record batch: ~400 MB of a writer's tables at most


class _Ranges:
    """The row ranges of a frozen master, what the first pass learns about them, and the
    segments' used bytes the replicas pass adds up."""

    def __init__(self, f: FrozenColumns, rows: int) -> None:
        self.f = f
        self.bounds = [(lo, min(lo + rows, f.rows)) for lo in range(0, f.rows, rows)] or [(0, 0)]
        self.firsts: list[int] = []
        needs, sums, first = [], [], 0
        for lo, hi in self.bounds:
            part = FrozenRows(f, lo, hi)
            self.firsts.append(first)
            needs.append(part.needs())
            sums.append(part.checksums(first))
            first += part.n
        self.needs: NameNeeds = reduce(NameNeeds.__or__, needs)
        self.checksums = pa.concat_tables(sums)
        self.used = np.zeros(len(f.segments), np.int64)
        self.no_usage = segments_of(f, self.used)  # what the replica checks need of the segments
        self.unit_bits = check_segments(self.no_usage)

    def parts(self) -> Iterator[tuple[FrozenRows, int]]:
        for (lo, hi), first in zip(self.bounds, self.firsts):
            yield FrozenRows(self.f, lo, hi), first

    def objects(self) -> Iterator[pa.Table]:
        no_replicas = FrozenRows(self.f, 0, 0).replicas(self.needs)[0]
        for part, _ in self.parts():
            objects = part.objects(self.needs)
            SnapshotState(objects, no_replicas, self.no_usage, self.f.replica_next_id,
                          part.checksums()).validate(check_unique_keys=False, replicas=False)
            yield objects

    def replicas(self) -> Iterator[pa.Table]:
        self.used[:] = 0  # (a second write, e.g. a backup copy, adds them up again)
        for part, first in self.parts():
            replicas, used = part.replicas(self.needs)
            check_table(replicas, REPLICAS_PAYLOAD_SCHEMA, "replicas")
            check_replicas(replicas, part.replica_count(), part.rows(self.f.columns["size_bytes"]), self.no_usage,
                           check_next_id(self.f.replica_next_id), self.unit_bits, check_overlaps=False)
            self.used += used
            yield replicas.set_column(0, replicas.schema.field(0), pc.add(replicas.column(0), first)) if first \
                else replicas

    def segments(self) -> Iterator[pa.Table]:
        yield segments_of(self.f, self.used)


def frozen_payloads(f: FrozenColumns, compression: str | None, rows: int | None = None
                    ) -> dict[str, IpcPayload | DigestPayload]:
    """The payloads of frozen master ``f``, each file written in ranges of ``rows`` master rows
    (default :data:`STREAM_ROWS`; see the module)."""
    ranges = _Ranges(f, STREAM_ROWS if rows is None else rows)
    empty = FrozenRows(f, 0, 0)
    objects_schema = empty.objects(ranges.needs).schema
    replicas_schema = empty.replicas(ranges.needs)[0].schema
    segments_schema = segments_of(f, ranges.used).schema
    return table_payloads((objects_schema, ranges.objects), (replicas_schema, ranges.replicas),
                          (segments_schema, ranges.segments),
                          ranges.checksums if ranges.checksums.num_rows else None, f.replica_next_id, compression)


def estimated_bytes(f: FrozenColumns) -> int:
    """About the files' bytes (what a writer warms before writing: see :mod:`.memory`): the
    live keys' bytes (not the arena's capacity: the excess was warmed at every periodic snapshot,
    whose recycled files already cover its payloads) and each row's fixed-width columns."""
    fixed = sum(field.type.bit_width // 8 for schema in (OBJECTS_PAYLOAD_SCHEMA, REPLICAS_PAYLOAD_SCHEMA)
                for field in schema if pa.types.is_integer(field.type))
    return f.key_bytes + f.rows * (fixed + 16)
