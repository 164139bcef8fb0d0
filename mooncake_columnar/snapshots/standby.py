"""Standby snapshot: the standby's materialized oplog state as Arrow IPC, under its own version.

Lease-recovery RFC Phase 1, "Standby metadata wire model": the payload carries tenant, key, client,
size, replica descriptors, data type, group, hard_pinned, soft_pin_enabled and the last applied
sequence id, and NEVER a lease deadline, soft-pin deadline, remaining TTL or read time (the
schemas below are the whole contract; a test checks that no column name even mentions one). The
version string is its own, independent of the complete-snapshot "1.0.0"/"2.0.0" and of their
clock mapping.

Files (stored through :class:`SnapshotRepository`, manifest last)::

    objects.arrow  replicas.arrow  segments.arrow  digest.json   (same digest as the v2 codec)
    manifest.txt   standby-arrow-ipc|mooncake-columnar-standby-snapshot/1|<snapshot_id>|<last_sequence_id>

Decoding is strict (exact schema, no nulls, consistent indexes); the only leniency is the RFC's
compatibility rule: an older objects file without ``hard_pinned`` / ``soft_pin_enabled`` decodes
with both False.
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..clock import NS_PER_MS, Clocks
from ..schema import REPLICAS_ARROW_SCHEMA
from ..errors import (
    ManifestError,
    SnapshotError,
    SnapshotIntegrityError,
    SnapshotPayloadError,
)
from .arrow_codec import (
    DIGEST_FILE,
    OBJECTS_FILE,
    REPLICAS_FILE,
    SEGMENTS_FILE,
    digest_of,
    verify_digest,
)
from .manager import _id_ms
from .manifest import is_valid_snapshot_id, snapshot_id_for
from .repository import SnapshotRepository
from .state import check_table

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
])
# the complete snapshot's replica columns without readability (a standby serves nothing yet)
STANDBY_REPLICAS_SCHEMA = REPLICAS_ARROW_SCHEMA.remove(REPLICAS_ARROW_SCHEMA.get_field_index("readable"))
STANDBY_SEGMENTS_SCHEMA = pa.schema([
    pa.field("name", pa.string(), nullable=False),
    pa.field("endpoint", pa.string(), nullable=False),
    pa.field("client", pa.string(), nullable=False),
    pa.field("capacity", pa.int64(), nullable=False),
])
# Fields an older payload may lack, and the value they take (RFC "Standby/oplog compatibility").
_OPTIONAL_OBJECT_FLAGS = ("hard_pinned", "soft_pin_enabled")

_MANIFEST = re.compile(r"([^|]+)\|([^|]+)\|([^|]+)\|(0|[1-9][0-9]{0,18})\Z")
_SEQ_MAX = 2**63 - 1


class StandbySnapshotError(SnapshotError):
    """A standby snapshot cannot be used (bad manifest, payload or consistency)."""


@dataclass(frozen=True)
class StandbySnapshot:
    """Objects, replicas and segments with exactly the STANDBY_* schemas, plus the last applied
    oplog sequence id (0: nothing applied)."""

    objects: pa.Table
    replicas: pa.Table
    segments: pa.Table
    last_sequence_id: int

    def validate(self) -> StandbySnapshot:
        for table, schema, name in ((self.objects, STANDBY_OBJECTS_SCHEMA, OBJECTS_FILE),
                                    (self.replicas, STANDBY_REPLICAS_SCHEMA, REPLICAS_FILE),
                                    (self.segments, STANDBY_SEGMENTS_SCHEMA, SEGMENTS_FILE)):
            check_table(table, schema, name)
        if type(self.last_sequence_id) is not int or not 0 <= self.last_sequence_id <= _SEQ_MAX:
            raise SnapshotIntegrityError(f"last_sequence_id {self.last_sequence_id!r} is not in [0, 2**63)")
        n = self.objects.num_rows
        oi = self.replicas.column("object_index").to_numpy()
        if oi.size and (oi.min() < 0 or oi.max() >= n):
            raise SnapshotIntegrityError(f"replicas: object_index outside [0, {n})")
        if n and int(pc.min(self.objects.column("size")).as_py()) < 0:
            raise SnapshotIntegrityError("objects: negative size")
        if pc.count_distinct(self.segments.column("name")).as_py() != self.segments.num_rows:
            raise SnapshotIntegrityError("segments: duplicate segment name")
        # Deeper checks (unique keys, extents inside capacity, no overlap) run when the state is
        # loaded into a MasterService: SnapshotState.validate and the key index own them.
        return self


# --- payloads ------------------------------------------------------------------------------------


def _ipc(table: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table.replace_schema_metadata(None))
    return sink.getvalue()


def encode_standby(snapshot: StandbySnapshot) -> dict[str, bytes | pa.Buffer]:
    """The three Arrow files and their digest (the manifest carries the sequence id)."""
    snapshot.validate()
    payloads: dict[str, bytes | pa.Buffer] = {OBJECTS_FILE: _ipc(snapshot.objects), REPLICAS_FILE: _ipc(snapshot.replicas),
                                    SEGMENTS_FILE: _ipc(snapshot.segments)}
    payloads[DIGEST_FILE] = digest_of(payloads, version=1)  # sha256: the standby wire's own digest
    return payloads


def _read(data: bytes | pa.Buffer, name: str) -> pa.Table:
    try:
        return pa.ipc.open_file(pa.py_buffer(data)).read_all().replace_schema_metadata(None)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise SnapshotPayloadError(f"{name}: not a complete Arrow IPC file: {e}") from None


def _with_default_flags(objects: pa.Table) -> pa.Table:
    """Add the pin flags an older payload lacks, as False, at their schema positions."""
    for flag in _OPTIONAL_OBJECT_FLAGS:
        if flag not in objects.column_names:
            at = min(STANDBY_OBJECTS_SCHEMA.get_field_index(flag), objects.num_columns)
            objects = objects.add_column(at, STANDBY_OBJECTS_SCHEMA.field(flag),
                                         pa.array(np.zeros(objects.num_rows, np.bool_)))
    return objects


def decode_standby(payloads: dict[str, bytes | pa.Buffer], last_sequence_id: int) -> StandbySnapshot:
    """Verify the digest and schemas; raise a typed SnapshotError on any deviation."""
    verify_digest(payloads)
    return StandbySnapshot(
        objects=_with_default_flags(_read(payloads[OBJECTS_FILE], OBJECTS_FILE)),
        replicas=_read(payloads[REPLICAS_FILE], REPLICAS_FILE),
        segments=_read(payloads[SEGMENTS_FILE], SEGMENTS_FILE),
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
        self._id_lock = threading.Lock()
        self._last_id: str | None = None

    @classmethod
    def open(cls, uri: str, cluster_id: str) -> StandbySnapshotStore:
        return cls(SnapshotRepository(uri, cluster_id + STANDBY_CLUSTER_SUFFIX))

    def _next_id(self, system_ns: int) -> str:
        # Ids order the candidates, so bump by 1 ms past the newest one if the wall clock did not move.
        sid = snapshot_id_for(system_ns)
        with self._id_lock:
            if self._last_id is None:
                existing = self.repo.list()
                self._last_id = existing[0] if existing else None
            if self._last_id is not None and sid <= self._last_id:
                sid = snapshot_id_for((_id_ms(self._last_id) + 1) * NS_PER_MS)
            self._last_id = sid
        return sid

    def publish(self, snapshot: StandbySnapshot, clocks: Clocks) -> str:
        """Payloads first, manifest (version + last_sequence_id) last; returns the snapshot id."""
        payloads = encode_standby(snapshot)
        sid = self._next_id(clocks.system_ns())
        self.repo.publish(sid, payloads, standby_manifest(sid, snapshot.last_sequence_id))
        return sid

    def load(self, snapshot_id: str) -> StandbySnapshot:
        files = self.repo.read(snapshot_id)
        manifest_id, seq = parse_standby_manifest(files.manifest)
        if manifest_id != snapshot_id:
            raise ManifestError(f"manifest of {snapshot_id} names snapshot {manifest_id}")
        extra = set(files.payloads) - {OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE, DIGEST_FILE}
        if extra:
            raise SnapshotPayloadError(f"standby snapshot {snapshot_id} holds unexpected files {sorted(extra)}")
        return decode_standby(files.payloads, seq)

    def load_latest(self) -> tuple[str, StandbySnapshot] | None:
        """The newest usable snapshot, falling back to older candidates; None if there is none.

        Raises StandbySnapshotError when candidates exist but none loads: starting a standby
        from nothing while its history may have been compacted away must not be silent.
        """
        failures: list[str] = []
        for sid in self.repo.candidates():
            try:
                return sid, self.load(sid)
            except SnapshotError as exc:
                failures.append(f"{sid}: {exc}")
        if failures:
            raise StandbySnapshotError("no usable standby snapshot: " + "; ".join(failures))
        return None
