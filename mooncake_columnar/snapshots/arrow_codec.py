"""v2 payloads: one Arrow IPC *file* per table plus ``digest.json`` (size + checksum per payload).

Layout: the tables are in the encoded layout of :mod:`state` (``*_PAYLOAD_SCHEMA``: tenant,
client, group and segment dictionary-encoded, keys large_string); ``replica_next_id`` travels in
the replicas file's schema metadata. Digest version 2 checksums each file with xxh3-128 (a
non-cryptographic checksum: it detects corruption at memory speed, where sha256 took ~0.5 s per
GB); version 1 (sha256) is still verified, and standby snapshots still write it.

Writing streams each IPC file straight into its destination, checksumming the bytes on the way
(:class:`IpcPayload`): no in-memory copy of the file is made. Decoding is strict and zero-copy
over the payload buffers (memory-mapped local files): a missing or extra payload, a size or
checksum mismatch, a truncated or non-IPC file, invalid offsets or dictionary indices, or a schema
that differs from the payload schemas fails the candidate. Nothing here loops over objects.
"""
from __future__ import annotations

import functools
import hashlib
import json
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Callable, Iterable, TypeAlias

import pyarrow as pa
import xxhash

from ..errors import SnapshotDigestError, SnapshotPayloadError, SnapshotSchemaError
from ..schema import (
    CHECKSUMS_ARROW_SCHEMA,
    OBJECTS_PAYLOAD_SCHEMA,
    REPLICAS_PAYLOAD_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    SEGMENTS_LEGACY_SCHEMA,
)
from ..mapped import release_mapped
from ..store.snapshot_state import SnapshotState, check_table

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

OBJECTS_FILE = "objects.arrow"
REPLICAS_FILE = "replicas.arrow"
SEGMENTS_FILE = "segments.arrow"
DIGEST_FILE = "digest.json"
PAYLOAD_FILES = (OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE)
# Written only when some object has an upstream checksum (SnapshotState.checksums), so a state
# without any is byte-for-byte what readers from before it expect; the digest lists it when present.
CHECKSUMS_FILE = "checksums.arrow"
OPTIONAL_PAYLOAD_FILES = (CHECKSUMS_FILE,)
DIGEST_VERSION = 2
# digest version -> (entry field, checksum of a bytes-like)
_CHECKSUMS: dict[int, tuple[str, Callable[[Buffer], str]]] = {
    1: ("sha256", lambda data: _hexdigest(hashlib.sha256(), data)),
    2: ("xxh3_128", lambda data: _hexdigest(xxhash.xxh3_128(), data)),
}
_CHECKSUM_CHUNK = 64 << 20  # bytes checksummed between two releases of the mapped pages


def _hexdigest(hasher, data: Buffer) -> str:
    """``hasher``'s digest of ``data``, fed in chunks; the pages of mapped files are let go
    after each (:func:`.mapped.release_mapped`): checking a payload keeps little of it resident."""
    view = memoryview(data).cast("B")
    for start in range(0, len(view), _CHECKSUM_CHUNK):
        hasher.update(view[start:start + _CHECKSUM_CHUNK])
        release_mapped()
    return hasher.hexdigest()
_NEXT_ID_KEY = b"mooncake.replica_next_id"
_COMPRESSIONS = (None, "zstd", "lz4")


class _Checksummed:
    """A write-only file object that checksums and counts what passes through to ``sink``."""

    def __init__(self, sink: pa.NativeFile) -> None:
        self.sink, self.hasher, self.size, self.closed = sink, xxhash.xxh3_128(), 0, False

    def write(self, data) -> int:
        self.hasher.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class IpcPayload:
    """One table as an Arrow IPC file, produced when written (``write_to``), never held whole in
    memory; after a write, ``size`` and ``checksum`` (digest version 2) describe the bytes.
    Writing again (a backup copy) produces the same bytes.

    ``table``: the table, or a callable returning its parts (tables of ``schema``, written as
    record batches one after the other: a writer that builds them one at a time holds one)."""

    def __init__(self, table: pa.Table | Callable[[], Iterable[pa.Table]], compression: str | None,
                 metadata: dict[bytes, bytes], schema: pa.Schema | None = None) -> None:
        if isinstance(table, pa.Table):
            schema, parts = table.schema, table
            self.parts: Callable[[], Iterable[pa.Table]] = lambda: (parts,)
        else:
            if schema is None:
                raise ValueError("a payload built in parts needs their schema")
            self.parts = table
        self.schema = schema.with_metadata(metadata or None)
        self.options = pa.ipc.IpcWriteOptions(compression=compression)
        self.size: int | None = None
        self.checksum: str | None = None

    def write_to(self, sink: pa.NativeFile) -> None:
        out = _Checksummed(sink)
        with pa.ipc.new_file(pa.PythonFile(out, mode="w"), self.schema, options=self.options) as w:
            for part in self.parts():
                w.write_table(part.replace_schema_metadata(self.schema.metadata))
        self.size, self.checksum = out.size, out.hasher.hexdigest()

    def to_buffer(self) -> pa.Buffer:
        sink = pa.BufferOutputStream()
        self.write_to(sink)
        return sink.getvalue()

    def described(self) -> tuple[int, str]:
        """(size, checksum), rendering the file into a counting sink if no write completed (an
        upload that failed part-way: its backup copy still gets a complete digest)."""
        if self.checksum is None:
            self.write_to(pa.MockOutputStream())
        assert self.size is not None and self.checksum is not None  # a completed write sets both
        return self.size, self.checksum


class DigestPayload:
    """``digest.json`` of IPC payloads, rendered when written: after them (publication order),
    from the sizes and checksums their writes recorded."""

    def __init__(self, payloads: dict[str, IpcPayload]) -> None:
        self.payloads = payloads

    def to_buffer(self) -> bytes:
        field = _CHECKSUMS[DIGEST_VERSION][0]
        return _digest_json(DIGEST_VERSION, {name: dict(zip(("size", field), p.described()))
                                             for name, p in self.payloads.items()})

    def write_to(self, sink: pa.NativeFile) -> None:
        sink.write(self.to_buffer())

    @property
    def size(self) -> int:
        return len(self.to_buffer())


# A payload is bytes, any buffer-protocol object, or a streamed payload (``write_to(sink)``).
Payload = bytes | pa.Buffer | IpcPayload | DigestPayload


def _digest_json(version: int, files: dict[str, dict]) -> bytes:
    return json.dumps({"version": version, "files": dict(sorted(files.items()))}, sort_keys=True).encode()


def digest_of(payloads: dict[str, bytes | pa.Buffer], version: int = DIGEST_VERSION) -> bytes:
    """``digest.json`` bytes for the given in-memory payloads (sorted keys: byte-stable)."""
    field, checksum = _CHECKSUMS[version]
    return _digest_json(version, {name: {"size": len(data), field: checksum(data)}
                                  for name, data in payloads.items()})


def check_compression(compression: str | None) -> None:
    if compression not in _COMPRESSIONS:
        raise ValueError(f"compression must be one of {_COMPRESSIONS}, not {compression!r}")


def state_payloads(state: SnapshotState, compression: str | None = None, *,
                   keys_known_unique: bool = False) -> dict[str, IpcPayload | DigestPayload]:
    """Payload name -> streamed payload for a validated state (either layout; written encoded):
    the three Arrow files, then the digest, in publication order.

    ``keys_known_unique``: skip the (tenant, key) uniqueness check (a hash aggregate, the most
    expensive check) when the state comes straight from the engine, whose key index enforces it;
    every other check still runs, and restore re-checks everything.
    """
    check_compression(compression)
    state = state.validate(check_unique_keys=not keys_known_unique).encoded()
    return table_payloads(state.objects, state.replicas, state.segments,
                          state.checksums if state.checksums.num_rows else None, state.replica_next_id, compression)


# a table, or (its schema, a callable returning its parts in order)
TableSource: TypeAlias = "pa.Table | tuple[pa.Schema, Callable[[], Iterable[pa.Table]]]"


def table_payloads(objects: TableSource, replicas: TableSource, segments: TableSource,
                   checksums: TableSource | None, replica_next_id: int,
                   compression: str | None) -> dict[str, IpcPayload | DigestPayload]:
    """The payloads of a validated state's tables, each a table or (schema, its parts in order),
    in publication order: the Arrow files, then the digest."""
    check_compression(compression)

    def payload(source: TableSource, metadata: dict[bytes, bytes]) -> IpcPayload:
        if isinstance(source, pa.Table):
            return IpcPayload(source, compression, metadata)
        return IpcPayload(source[1], compression, metadata, schema=source[0])

    files = {
        OBJECTS_FILE: payload(objects, {}),
        REPLICAS_FILE: payload(replicas, {_NEXT_ID_KEY: str(int(replica_next_id)).encode()}),
        SEGMENTS_FILE: payload(segments, {}),
    }
    if checksums is not None:
        files[CHECKSUMS_FILE] = payload(checksums, {})
    return {**files, DIGEST_FILE: DigestPayload(files)}


def encode_state(state: SnapshotState, compression: str | None = None, *,
                 keys_known_unique: bool = False) -> dict[str, pa.Buffer | bytes]:
    """:func:`state_payloads`, rendered in memory (payload name -> bytes-like)."""
    return {name: p.to_buffer()
            for name, p in state_payloads(state, compression, keys_known_unique=keys_known_unique).items()}


def verify_digest(payloads: dict[str, bytes | pa.Buffer]) -> None:
    """Check every payload against ``digest.json`` (any known digest version); the digest must
    list exactly PAYLOAD_FILES."""
    checks = digest_checks(payloads)
    for name in sorted(checks):
        checks[name]()


def _check_sum(name: str, field: str, expected: object, checksum: Callable[[Buffer], str], data: Buffer) -> None:
    if expected != checksum(data):
        raise SnapshotDigestError(f"{name}: {field} mismatch")


def digest_checks(payloads: dict[str, bytes | pa.Buffer]) -> dict[str, Callable[[], None]]:
    """Check ``digest.json``'s structure, that it lists exactly PAYLOAD_FILES (and maybe the
    optional ones) and every listed payload's presence and size; returns, per listed payload,
    the check of its checksum (the costly part, which runs without the GIL: callers may run
    them in parallel)."""
    raw = payloads.get(DIGEST_FILE)
    if raw is None:
        raise SnapshotDigestError(f"{DIGEST_FILE} is missing")
    try:
        digest = json.loads(bytes(raw))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:  # RecursionError: nesting too deep
        raise SnapshotDigestError(f"{DIGEST_FILE} is not JSON: {type(e).__name__}: {e}") from None
    if (not isinstance(digest, dict) or set(digest) != {"version", "files"}
            or type(digest["version"]) is not int or digest["version"] not in _CHECKSUMS
            or not isinstance(digest["files"], dict)):
        raise SnapshotDigestError(f"{DIGEST_FILE} has an unexpected structure")
    field, checksum = _CHECKSUMS[digest["version"]]
    files = digest["files"]
    if not set(PAYLOAD_FILES) <= set(files) <= {*PAYLOAD_FILES, *OPTIONAL_PAYLOAD_FILES}:
        raise SnapshotDigestError(f"{DIGEST_FILE} lists {sorted(files)}, expected {sorted(PAYLOAD_FILES)}"
                                  f" (and optionally {list(OPTIONAL_PAYLOAD_FILES)})")
    checks: dict[str, Callable[[], None]] = {}
    for name in sorted(files):
        entry, data = files[name], payloads.get(name)
        if data is None:
            raise SnapshotDigestError(f"payload {name} is missing")
        if not isinstance(entry, dict) or set(entry) != {"size", field}:
            raise SnapshotDigestError(f"{DIGEST_FILE}: bad entry for {name}")
        if entry["size"] != len(data):
            raise SnapshotDigestError(f"{name}: {len(data)} bytes, digest says {entry['size']}")

        checks[name] = functools.partial(_check_sum, name, field, entry[field], checksum, data)
    return checks


def optional_payloads(digest: bytes | pa.Buffer) -> tuple[str, ...]:
    """The optional payloads ``digest.json`` lists (to read them besides PAYLOAD_FILES); a
    malformed digest lists none here and fails :func:`verify_digest` later."""
    try:
        files = json.loads(bytes(digest)).get("files", {})
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError):
        return ()
    return tuple(name for name in OPTIONAL_PAYLOAD_FILES if isinstance(files, dict) and name in files)


def read_ipc(data: bytes | pa.Buffer, schema: pa.Schema | tuple[pa.Schema, ...], name: str) -> pa.Table:
    """The table of one IPC file, zero-copy over ``data``, fully validated (offsets, dictionary
    indices, UTF-8: what later kernels index by) and of exactly ``schema``."""
    where = name
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
        for field, column in zip(table.schema, table.columns):  # column by column: errors name it
            where = f"{name}.{field.name}"
            column.validate(full=True)
            release_mapped()  # the pages it read: the file never stays resident as a whole
        where = name
        table.validate()
    # any Arrow error (invalid, key, not implemented, a malloc sized by a forged length...); a
    # field name that is not UTF-8
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise SnapshotPayloadError(f"{where}: not a complete, valid Arrow IPC file: {e}") from None
    check_table(table, schema, name)
    return table


def decode_state(payloads: dict[str, bytes | pa.Buffer], *, check_unique_keys: bool = True) -> SnapshotState:
    """Verify the digest, decode the three tables (encoded layout, zero-copy over the payloads)
    and validate the result (the (tenant, key) uniqueness check may be left to a caller that
    loads the keys into an index anyway)."""
    checks = digest_checks(payloads)
    failed: dict[str, SnapshotDigestError] = {}

    def checked(names: Iterable[str]) -> bool:
        for name in names:
            try:
                checks[name]()
            except SnapshotDigestError as e:
                failed[name] = e
                return False
        return True

    # Checksums and Arrow's validation run without the GIL: the objects file (the largest) is
    # checked and decoded in a second thread, the others here. Every file's checksum is checked
    # before it is decoded, and a checksum mismatch is reported before any decode error (the
    # first in name order, as verify_digest would).
    decode_error: SnapshotPayloadError | None = None
    with ThreadPoolExecutor(max_workers=1) as pool:
        objects_job = pool.submit(lambda: read_ipc(payloads[OBJECTS_FILE], OBJECTS_PAYLOAD_SCHEMA, OBJECTS_FILE)
                                  if checked((OBJECTS_FILE,)) else None)
        if checked(sorted(set(checks) - {OBJECTS_FILE})):
            try:
                replicas = read_ipc(payloads[REPLICAS_FILE], REPLICAS_PAYLOAD_SCHEMA, REPLICAS_FILE)
                # a segments file from before segment ids were kept: SnapshotState adds them as ""
                segments = read_ipc(payloads[SEGMENTS_FILE], (SEGMENTS_ARROW_SCHEMA, SEGMENTS_LEGACY_SCHEMA),
                                    SEGMENTS_FILE)
            except SnapshotPayloadError as e:
                decode_error = e
        wait((objects_job,))
    if failed:
        raise failed[min(failed)]
    if decode_error is not None:
        raise decode_error
    objects = objects_job.result()
    assert objects is not None  # its checksum matched
    meta = replicas.schema.metadata or {}
    raw_next = meta.get(_NEXT_ID_KEY)
    if raw_next is None or not raw_next.isdigit() or (len(raw_next) > 1 and raw_next[:1] == b"0"):
        raise SnapshotSchemaError(f"{REPLICAS_FILE}: missing or malformed replica_next_id")
    checksums = (read_ipc(payloads[CHECKSUMS_FILE], CHECKSUMS_ARROW_SCHEMA, CHECKSUMS_FILE)
                 .replace_schema_metadata(None)
                 if CHECKSUMS_FILE in optional_payloads(payloads[DIGEST_FILE])
                 else CHECKSUMS_ARROW_SCHEMA.empty_table())
    state = SnapshotState(
        objects=objects.replace_schema_metadata(None),
        replicas=replicas.replace_schema_metadata(None),
        segments=segments.replace_schema_metadata(None),
        replica_next_id=int(raw_next),
        checksums=checksums,
    )
    state.validate(check_unique_keys=check_unique_keys)
    release_mapped()
    return state
