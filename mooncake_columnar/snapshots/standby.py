"""Standby snapshot: the standby's materialized oplog state as Arrow IPC, under its own version.

Lease-recovery RFC Phase 1, "Standby metadata wire model": the payload carries tenant, key, client,
size, replica descriptors, data type, group, hard_pinned, soft_pin_enabled, the put start time
(upstream's version epoch, a timestamp, not a deadline), each segment's upstream id and host id,
and the last applied sequence id, and NEVER a lease deadline, soft-pin deadline, remaining TTL or read time (the
schemas below are the whole contract; a test checks that no column name even mentions one). The
version string is its own, independent of the complete-snapshot "1.0.0"/"2.0.0" and of their
clock mapping.

Files (stored through :class:`SnapshotRepository`, manifest last)::

    objects.arrow  replicas.arrow  segments.arrow  digest.json   (same digest as the v2 codec)
    manifest.txt   standby-arrow-ipc|mooncake-columnar-standby-snapshot/1|<snapshot_id>|<last_sequence_id>

The sequence id decides where the oplog replay starts (one off and entries are skipped or applied
twice), so ``replicas.arrow`` carries it too, in its schema metadata where the digest covers it,
and a manifest that disagrees is rejected; payloads of writers from before it was recorded
carry none.

Decoding is strict and shares the complete snapshots' reader (:func:`arrow_codec.read_ipc`:
full Arrow validation, so offsets, UTF-8 of keys and names, exact schema, no nulls) before
anything indexes a table; then the indexes the engine conversion relies on are checked. Every
failure is a typed :class:`SnapshotError` naming the file, the field and, where known, the row.
The only leniency is the RFC's compatibility rule: an older objects file without
``hard_pinned`` / ``soft_pin_enabled`` decodes with both False, and one without
``put_start_time_ms`` with 0 (not recorded); an older segments file without ``segment_id`` /
``host_id`` decodes with "" (the engine generates a segment id when it loads the segment).

The store loads the newest usable snapshot and falls back to older ones, recording why each
was rejected (:meth:`StandbySnapshotStore.load_latest_with`).
"""
from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..clock import Clocks
from ..errors import (
    ManifestError,
    NoUsableStandbySnapshot,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotPayloadError,
    SnapshotStorageUnavailable,
    StandbySnapshotError,  # noqa: F401  (re-exported: it used to be defined here)
)
from ..schema import REPLICAS_ARROW_SCHEMA
from .arrow_codec import (
    DIGEST_FILE,
    OBJECTS_FILE,
    REPLICAS_FILE,
    SEGMENTS_FILE,
    read_ipc,
    digest_of,
    verify_digest,
)
from .manifest import SnapshotIdAllocator, is_valid_snapshot_id
from .repository import SnapshotRepository
from ..store.snapshot_state import check_table

log = logging.getLogger(__name__)
T = TypeVar("T")

STANDBY_SNAPSHOT_TAG = "standby-arrow-ipc"
STANDBY_SNAPSHOT_VERSION = "mooncake-columnar-standby-snapshot/1"
STANDBY_CLUSTER_SUFFIX = "-standby"  # standby snapshots live beside, never among, complete ones

STANDBY_OBJECTS_SCHEMA = pa.schema([
    pa.field("tenant", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("client", pa.string(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    pa.field("data_type", pa.uint8(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("hard_pinned", pa.bool_(), nullable=False),
    pa.field("soft_pin_enabled", pa.bool_(), nullable=False),
    pa.field("put_start_time_ms", pa.int64(), nullable=False),  # system ms; 0: not recorded
])
# the complete snapshot's replica columns without readability (a standby serves nothing yet)
STANDBY_REPLICAS_SCHEMA = REPLICAS_ARROW_SCHEMA.remove(REPLICAS_ARROW_SCHEMA.get_field_index("readable"))
STANDBY_SEGMENTS_SCHEMA = pa.schema([
    pa.field("name", pa.string(), nullable=False),
    pa.field("endpoint", pa.string(), nullable=False),
    pa.field("client", pa.string(), nullable=False),
    pa.field("capacity", pa.int64(), nullable=False),
    pa.field("segment_id", pa.string(), nullable=False),  # upstream segment UUID; "": not recorded
    pa.field("host_id", pa.string(), nullable=False),
])
# Columns an older payload may lack, and the value they take (RFC "Standby/oplog compatibility").
_OPTIONAL_OBJECT_COLUMNS = {"hard_pinned": False, "soft_pin_enabled": False, "put_start_time_ms": 0}
_OPTIONAL_SEGMENT_COLUMNS = {"segment_id": "", "host_id": ""}


def _schemas_without(schema: pa.Schema, optional: dict) -> tuple[pa.Schema, ...]:
    """``schema``, and it without any combination of the ``optional`` fields."""
    return tuple(pa.schema([f for f in schema if f.name not in missing])
                 for k in range(len(optional) + 1) for missing in itertools.combinations(optional, k))


_OBJECTS_SCHEMAS = _schemas_without(STANDBY_OBJECTS_SCHEMA, _OPTIONAL_OBJECT_COLUMNS)
_SEGMENTS_SCHEMAS = _schemas_without(STANDBY_SEGMENTS_SCHEMA, _OPTIONAL_SEGMENT_COLUMNS)

_SEQ_KEY = b"mooncake.last_sequence_id"  # replicas.arrow schema metadata, canonical decimal
_MANIFEST = re.compile(r"([^|]+)\|([^|]+)\|([^|]+)\|(0|[1-9][0-9]{0,18})\Z")
_SEQ_MAX = 2**63 - 1


@dataclass(frozen=True)
class StandbySnapshot:
    """Objects, replicas and segments with exactly the STANDBY_* schemas, plus the last applied
    oplog sequence id (0: nothing applied)."""

    objects: pa.Table
    replicas: pa.Table
    segments: pa.Table
    last_sequence_id: int

    def validate(self) -> StandbySnapshot:
        """Schemas, the sequence id, and what the conversion into an engine state indexes by
        (object_index inside objects; sizes, capacities non-negative; distinct segment names);
        raises a typed SnapshotError naming the file, field and row. Deeper checks (unique keys,
        extents inside capacity, no overlap, id domains) run when the snapshot is loaded into an
        engine: SnapshotState.validate, the key index and MasterService.verify own them."""
        for table, schema, name in ((self.objects, STANDBY_OBJECTS_SCHEMA, OBJECTS_FILE),
                                    (self.replicas, STANDBY_REPLICAS_SCHEMA, REPLICAS_FILE),
                                    (self.segments, STANDBY_SEGMENTS_SCHEMA, SEGMENTS_FILE)):
            check_table(table, schema, name)
        if type(self.last_sequence_id) is not int or not 0 <= self.last_sequence_id <= _SEQ_MAX:
            raise SnapshotIntegrityError(f"last_sequence_id {self.last_sequence_id!r} is not in [0, 2**63)")
        _check_range(self.replicas, REPLICAS_FILE, "object_index", self.objects.num_rows - 1)
        _check_range(self.objects, OBJECTS_FILE, "size")
        _check_range(self.segments, SEGMENTS_FILE, "capacity")
        codes = pc.dictionary_encode(self.segments.column("name").combine_chunks()).indices.to_numpy()
        # codes number names in order of first appearance: a row is a repeat unless it opens a new code
        repeat = codes <= np.maximum.accumulate(np.concatenate(([-1], codes[:-1])))
        if repeat.any():
            row = int(np.argmax(repeat))
            raise SnapshotIntegrityError(f"{SEGMENTS_FILE}: name {self.segments.column('name')[row].as_py()!r} "
                                         f"at row {row} repeats an earlier segment")
        return self


def _check_range(table: pa.Table, file: str, field: str, high: int | None = None) -> None:
    """Every value of the int64 column ``field`` in [0, high] (no upper bound when None)."""
    values = table.column(field).to_numpy()
    bad = values < 0 if high is None else (values < 0) | (values > high)
    if bad.any():
        row = int(np.argmax(bad))
        bounds = "is negative" if high is None else f"is outside [0, {high}]"
        raise SnapshotIntegrityError(f"{file}: {field} {int(values[row])} at row {row} {bounds}")


# --- payloads ------------------------------------------------------------------------------------


def _ipc(table: pa.Table, metadata: dict[bytes, bytes] | None = None) -> pa.Buffer:
    table = table.replace_schema_metadata(metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def encode_standby(snapshot: StandbySnapshot) -> dict[str, bytes | pa.Buffer]:
    """The three Arrow files and their digest (the manifest carries the sequence id)."""
    snapshot.validate()
    payloads: dict[str, bytes | pa.Buffer] = {
        OBJECTS_FILE: _ipc(snapshot.objects),
        REPLICAS_FILE: _ipc(snapshot.replicas, {_SEQ_KEY: str(snapshot.last_sequence_id).encode()}),
        SEGMENTS_FILE: _ipc(snapshot.segments)}
    payloads[DIGEST_FILE] = digest_of(payloads, version=1)  # sha256: the standby wire's own digest
    return payloads


def _read(data: bytes | pa.Buffer, schemas: pa.Schema | tuple[pa.Schema, ...], name: str) -> pa.Table:
    """One payload through the complete snapshots' reader (full Arrow validation, exact schema)."""
    try:
        return read_ipc(data, schemas, name)
    except pa.ArrowException as e:  # what the reader does not map (an unsupported type or codec)
        raise SnapshotPayloadError(f"{name}: unreadable Arrow IPC file: {type(e).__name__}: {e}") from None


def _with_defaults(table: pa.Table, schema: pa.Schema, optional: dict) -> pa.Table:
    """Add the ``optional`` columns an older payload lacks, with their defaults, at their
    schema positions."""
    for name, default in optional.items():
        if name not in table.column_names:
            at = min(schema.get_field_index(name), table.num_columns)
            field = schema.field(name)
            table = table.add_column(at, field, pa.array([default] * table.num_rows, field.type))
    return table


def decode_standby(payloads: dict[str, bytes | pa.Buffer], last_sequence_id: int) -> StandbySnapshot:
    """Verify the digest, fully validate every table, then its indexes; raise a typed
    SnapshotError on any deviation."""
    verify_digest(payloads)
    replicas = _read(payloads[REPLICAS_FILE], STANDBY_REPLICAS_SCHEMA, REPLICAS_FILE)
    recorded = (replicas.schema.metadata or {}).get(_SEQ_KEY)
    if recorded is not None and recorded != str(last_sequence_id).encode():
        raise ManifestError(f"the manifest says last_sequence_id {last_sequence_id}, {REPLICAS_FILE} "
                            f"(covered by the digest) says {recorded[:24]!r}")
    return StandbySnapshot(
        objects=_with_defaults(_read(payloads[OBJECTS_FILE], _OBJECTS_SCHEMAS, OBJECTS_FILE)
                               .replace_schema_metadata(None), STANDBY_OBJECTS_SCHEMA, _OPTIONAL_OBJECT_COLUMNS),
        replicas=replicas.replace_schema_metadata(None),
        segments=_with_defaults(_read(payloads[SEGMENTS_FILE], _SEGMENTS_SCHEMAS, SEGMENTS_FILE)
                                .replace_schema_metadata(None), STANDBY_SEGMENTS_SCHEMA, _OPTIONAL_SEGMENT_COLUMNS),
        last_sequence_id=last_sequence_id,
    ).validate()


# --- manifest ------------------------------------------------------------------------------------


def standby_manifest(snapshot_id: str, last_sequence_id: int) -> str:
    return f"{STANDBY_SNAPSHOT_TAG}|{STANDBY_SNAPSHOT_VERSION}|{snapshot_id}|{last_sequence_id}"


def parse_standby_manifest(raw: bytes) -> tuple[str, int]:
    """(snapshot_id, last_sequence_id); anything else (a complete-snapshot manifest included)
    raises ManifestError."""
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ManifestError("standby manifest is not ASCII") from None
    m = _MANIFEST.match(text)
    if m is None:
        raise ManifestError(f"not a standby manifest: {text[:120]!r}")
    tag, version, snapshot_id, seq = m.groups()
    if (tag, version) != (STANDBY_SNAPSHOT_TAG, STANDBY_SNAPSHOT_VERSION):
        raise ManifestError(f"standby manifest names {tag}|{version}, expected "
                            f"{STANDBY_SNAPSHOT_TAG}|{STANDBY_SNAPSHOT_VERSION}")
    if not is_valid_snapshot_id(snapshot_id):
        raise ManifestError(f"standby manifest: invalid snapshot id {snapshot_id!r}")
    if int(seq) > _SEQ_MAX:
        raise ManifestError(f"standby manifest: last_sequence_id {seq} is outside int64")
    return snapshot_id, int(seq)


# --- repository ----------------------------------------------------------------------------------


class StandbySnapshotStore:
    """Publishes and loads standby snapshots through a :class:`SnapshotRepository`.

    Use a repository whose cluster id is the cluster's plus :data:`STANDBY_CLUSTER_SUFFIX`
    (:meth:`open`): standby and complete snapshots must never be candidates for each other.
    """

    def __init__(self, repo: SnapshotRepository) -> None:
        self.repo = repo
        self._ids = SnapshotIdAllocator(repo.list)

    @classmethod
    def open(cls, uri: str, cluster_id: str) -> StandbySnapshotStore:
        return cls(SnapshotRepository(uri, cluster_id + STANDBY_CLUSTER_SUFFIX))

    def _next_id(self, system_ns: int) -> str:
        return self._ids.next_id(system_ns)

    def publish(self, snapshot: StandbySnapshot, clocks: Clocks) -> str:
        """Payloads first, manifest (version + last_sequence_id) last; returns the snapshot id."""
        payloads = encode_standby(snapshot)
        sid = self._next_id(clocks.system_ns())
        self.repo.publish(sid, payloads, standby_manifest(sid, snapshot.last_sequence_id))
        return sid

    def load(self, snapshot_id: str) -> StandbySnapshot:
        """One snapshot, fully checked; a typed SnapshotError names what is wrong."""
        files = self.repo.read(snapshot_id)
        manifest_id, seq = parse_standby_manifest(files.manifest)
        if manifest_id != snapshot_id:
            raise ManifestError(f"manifest of {snapshot_id} names snapshot {manifest_id}")
        extra = set(files.payloads) - {OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE, DIGEST_FILE}
        if extra:
            raise SnapshotPayloadError(f"standby snapshot {snapshot_id} holds unexpected files {sorted(extra)}")
        return decode_standby(files.payloads, seq)

    def load_latest(self, notes: list[str] | None = None) -> tuple[str, StandbySnapshot] | None:
        """The newest snapshot that loads, falling back to older candidates; None if there is
        none (see :meth:`load_latest_with`)."""
        return self.load_latest_with(lambda sid, snap: snap, notes)

    def load_latest_with(self, accept: Callable[[str, StandbySnapshot], T],
                         notes: list[str] | None = None) -> tuple[str, T] | None:
        """(id, ``accept(id, snapshot)``) of the newest candidate that loads and that ``accept``
        takes, falling back to older ones; None if there is no candidate at all.

        ``accept`` (e.g. building and checking an engine) runs inside the candidate's failure
        scope: a SnapshotError it raises rejects the candidate like a decode error does; any
        other error propagates. Each rejection, and why latest.txt was not followed, is appended
        to ``notes``. A storage error (SnapshotStorageUnavailable) propagates: falling back to an
        older snapshot only because the storage was flaky would silently lose state.
        Raises NoUsableStandbySnapshot (with the notes) when candidates exist but none is taken:
        starting a standby from nothing while its history may have been compacted away must
        not be silent.
        """
        notes = [] if notes is None else notes
        plan = self.repo.candidate_plan()
        notes.extend(plan.notes)
        for sid in plan.ids:
            try:
                return sid, accept(sid, self.load(sid))
            except SnapshotStorageUnavailable:
                raise
            except SnapshotError as exc:
                note = f"standby snapshot {sid} rejected: {type(exc).__name__}: {exc}"
                log.warning("%s", note)
                notes.append(note)
        if plan.ids:
            raise NoUsableStandbySnapshot(
                f"none of the {len(plan.ids)} standby snapshots is usable: " + "; ".join(notes), notes)
        return None


