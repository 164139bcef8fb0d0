"""v2 payloads: one Arrow IPC *file* per table plus ``digest.json`` (size + sha256 per payload).

``replica_next_id`` travels in the replicas file's schema metadata. Decoding is strict: a missing
or extra payload, a size/sha256 mismatch, a truncated or non-IPC file, or a schema that differs from
:mod:`schema` fails the candidate. Nothing here loops over objects.
"""
from __future__ import annotations

import hashlib
import json

import pyarrow as pa

from ..errors import SnapshotDigestError, SnapshotPayloadError, SnapshotSchemaError
from ..schema import OBJECTS_ARROW_SCHEMA, REPLICAS_ARROW_SCHEMA, SEGMENTS_ARROW_SCHEMA
from .state import SnapshotState, check_table

OBJECTS_FILE = "objects.arrow"
REPLICAS_FILE = "replicas.arrow"
SEGMENTS_FILE = "segments.arrow"
DIGEST_FILE = "digest.json"
PAYLOAD_FILES = (OBJECTS_FILE, REPLICAS_FILE, SEGMENTS_FILE)
DIGEST_VERSION = 1
_NEXT_ID_KEY = b"mooncake.replica_next_id"
_COMPRESSIONS = (None, "zstd", "lz4")


# A payload is bytes or any buffer-protocol object (encode returns pyarrow Buffers: copying
# hundreds of MB into a bytes object would cost more than writing the IPC file itself).
Payload = bytes | pa.Buffer


def _ipc_bytes(table: pa.Table, compression: str | None, metadata: dict[bytes, bytes]) -> pa.Buffer:
    options = pa.ipc.IpcWriteOptions(compression=compression)
    table = table.replace_schema_metadata(metadata or None)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue()


def digest_of(payloads: dict[str, Payload]) -> bytes:
    """``digest.json`` bytes for the given payloads (sorted keys: byte-stable)."""
    files = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
             for name, data in sorted(payloads.items())}
    return json.dumps({"version": DIGEST_VERSION, "files": files}, sort_keys=True).encode()


def encode_state(state: SnapshotState, compression: str | None = None, *,
                 keys_known_unique: bool = False) -> dict[str, Payload]:
    """Payload name -> bytes-like for a validated state: the three Arrow files and the digest.

    ``keys_known_unique``: skip the (tenant, key) uniqueness check (a hash aggregate, the most
    expensive check) when the state comes straight from the engine, whose key index enforces it;
    every other check still runs, and restore re-checks everything.
    """
    if compression not in _COMPRESSIONS:
        raise ValueError(f"compression must be one of {_COMPRESSIONS}, not {compression!r}")
    state.validate(check_unique_keys=not keys_known_unique)
    payloads = {
        OBJECTS_FILE: _ipc_bytes(state.objects, compression, {}),
        REPLICAS_FILE: _ipc_bytes(state.replicas, compression,
                                  {_NEXT_ID_KEY: str(int(state.replica_next_id)).encode()}),
        SEGMENTS_FILE: _ipc_bytes(state.segments, compression, {}),
    }
    payloads[DIGEST_FILE] = digest_of(payloads)
    return payloads


def verify_digest(payloads: dict[str, Payload]) -> None:
    """Check every payload against ``digest.json``; the digest must list exactly PAYLOAD_FILES."""
    raw = payloads.get(DIGEST_FILE)
    if raw is None:
        raise SnapshotDigestError(f"{DIGEST_FILE} is missing")
    try:
        digest = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise SnapshotDigestError(f"{DIGEST_FILE} is not JSON: {e}") from None
    if (not isinstance(digest, dict) or set(digest) != {"version", "files"}
            or digest["version"] != DIGEST_VERSION or not isinstance(digest["files"], dict)):
        raise SnapshotDigestError(f"{DIGEST_FILE} has an unexpected structure")
    files = digest["files"]
    if set(files) != set(PAYLOAD_FILES):
        raise SnapshotDigestError(f"{DIGEST_FILE} lists {sorted(files)}, expected {sorted(PAYLOAD_FILES)}")
    for name in PAYLOAD_FILES:
        entry, data = files[name], payloads.get(name)
        if data is None:
            raise SnapshotDigestError(f"payload {name} is missing")
        if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
            raise SnapshotDigestError(f"{DIGEST_FILE}: bad entry for {name}")
        if entry["size"] != len(data):
            raise SnapshotDigestError(f"{name}: {len(data)} bytes, digest says {entry['size']}")
        if entry["sha256"] != hashlib.sha256(data).hexdigest():
            raise SnapshotDigestError(f"{name}: sha256 mismatch")


def _read_ipc(data: Payload, schema: pa.Schema, name: str) -> pa.Table:
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as e:
        raise SnapshotPayloadError(f"{name}: not a complete Arrow IPC file: {e}") from None
    check_table(table, schema, name)
    return table


def decode_state(payloads: dict[str, Payload], *, check_unique_keys: bool = True) -> SnapshotState:
    """Verify the digest, decode the three tables and validate the result (the (tenant, key)
    uniqueness check may be left to a caller that loads the keys into an index anyway)."""
    verify_digest(payloads)
    replicas = _read_ipc(payloads[REPLICAS_FILE], REPLICAS_ARROW_SCHEMA, REPLICAS_FILE)
    meta = replicas.schema.metadata or {}
    raw_next = meta.get(_NEXT_ID_KEY)
    if raw_next is None or not raw_next.isdigit() or (len(raw_next) > 1 and raw_next[:1] == b"0"):
        raise SnapshotSchemaError(f"{REPLICAS_FILE}: missing or malformed replica_next_id")
    state = SnapshotState(
        objects=_read_ipc(payloads[OBJECTS_FILE], OBJECTS_ARROW_SCHEMA, OBJECTS_FILE)
        .replace_schema_metadata(None),
        replicas=replicas.replace_schema_metadata(None),
        segments=_read_ipc(payloads[SEGMENTS_FILE], SEGMENTS_ARROW_SCHEMA, SEGMENTS_FILE)
        .replace_schema_metadata(None),
        replica_next_id=int(raw_next),
    )
    return state.validate(check_unique_keys=check_unique_keys)
