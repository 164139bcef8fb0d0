"""Upstream v1 complete snapshots (``messagepack|1.0.0|<id>``): read, and write for rollback.

Payloads (upstream-master.md section 6.2): ``metadata`` is a plain msgpack map whose shards are
zstd-compressed msgpack BINs; ``segments`` and ``task_manager`` are zstd-compressed msgpack.
Lease deadlines are system-clock ms and pass through the Phase 2 adapter; v1 has no soft pin.

Unlike upstream's decoder, which logs and skips an object it cannot parse, any bad object here
fails the whole candidate (RFC: never skip one corrupted object while claiming a complete restore).
msgpack yields one Python object per item, so building the columns walks the decoded items once;
everything after that (segment resolution, offsets, deadlines, shard routing, validation) is
vectorized. Stored bytes are hostile: every zstd frame is capped before its output is allocated
(a multiple of its stored size, and ``max_decompressed_bytes`` per payload file); a repeated
msgpack map key (one flipped bit can turn a shard's key into another's, and a dict would drop a
shard) and a key filed in a shard it does not route to fail the candidate; every failure is a
:class:`~mooncake_columnar.errors.SnapshotPayloadFieldError` naming the file (and shard) and the field.

Not represented in :class:`SnapshotState` and therefore dropped on read: replication/offload tasks
(``task_manager``), ``discarded_replicas`` (staging buffers whose memory a restart frees anyway)
and the upstream allocator state (the extents say which memory is held). Kept, and written back:
segment UUIDs and host ids, every object's put start time and the optional object checksum.
Only MEMORY replicas are supported; any other replica type fails the
candidate. The writer derives each segment's allocator and each buffer's allocation handle from
the extents (:mod:`.mooncake_v1_allocator`), since upstream cannot load a replica without them.
"""
from __future__ import annotations

import hashlib
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from ..errors import (
    BadMsgpackMapKey,
    InvalidParams,
    RollbackClientIdsNotUpstream,
    RollbackSegmentsAwaitingRemount,
    SerializeFail,
    SnapshotPayloadFieldError,
)
from ..kernels.upstream_hash import murmur64a
from ..schema import (
    CHECKSUMS_ARROW_SCHEMA,
    KIND_MEMORY,
    OBJECTS_ARROW_SCHEMA,
    REPLICAS_ARROW_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    ST_COMPLETE,
    ST_REMOVED,
)
from .convert import convert_legacy_ms_deadlines, legacy_system_deadline_ms
from .mooncake_v1_allocator import (
    DEFAULT_MAX_DECOMPRESSED_BYTES,
    SegmentAllocators,
    ZstdBudget,
    derive_allocators,
    is_uint,
    pack_allocator,
    pack_handle,
)
from .repository import SnapshotRepository
from ..store.snapshot_state import SnapshotState, with_usage
from ..store.upstream_ids import first_bad_uuid

METADATA_FILE = "metadata"
SEGMENTS_FILE = "segments"
TASK_MANAGER_FILE = "task_manager"
DESCRIPTOR_FILE = "descriptor.txt"
V1_FILES = (METADATA_FILE, SEGMENTS_FILE, TASK_MANAGER_FILE)
DEFAULT_TENANT = "default"
NUM_SHARDS = 1024
ZSTD_LEVEL = 3
UPSTREAM_REPLICA_MEMORY = 0
UPSTREAM_ALLOCATOR_OFFSET = 1
SEGMENT_STATUS_OK = 1  # upstream SegmentStatus: every other status makes its restore drop the objects
_U64 = (1 << 64) - 1


# ---- helpers --------------------------------------------------------------------------------------
def _unique_map(pairs: list[tuple[Any, Any]]) -> dict:
    """A msgpack map as a dict, refusing a repeated key: a dict would keep only the last value
    (a bit flip that turns one shard's key into another's would silently drop that shard)."""
    try:
        out = dict(pairs)
    except TypeError:  # a map or array used as a key
        raise BadMsgpackMapKey("unhashable map key") from None
    if len(out) != len(pairs):  # name the first repeated key
        seen: set = set()
        for key, _ in pairs:
            if key in seen:
                raise BadMsgpackMapKey(f"map key {key!r} appears more than once")
            seen.add(key)
    return out


def _unpack(data: bytes, file: str) -> Any:
    """One msgpack value filling ``data``; maps are dicts without repeated keys (one hook call
    per map: v1 maps are per file and per shard, never per object)."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, object_pairs_hook=_unique_map)
    except BadMsgpackMapKey as e:
        raise SnapshotPayloadFieldError(file, "msgpack map", e.detail) from None
    # ValueError covers ExtraData, FormatError, StackError and UnicodeDecodeError (bad UTF-8)
    except (ValueError, TypeError, OverflowError) as e:
        raise SnapshotPayloadFieldError(file, "msgpack", f"bad msgpack: {type(e).__name__}: {e}") from None


def _is_int64(v: Any) -> bool:
    return type(v) is int and -(1 << 63) <= v < (1 << 63)


def _array(values: list, type_: pa.DataType, file: str, field: str) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
        raise SnapshotPayloadFieldError(file, field, f"wrong value type: {e}") from None


def _check_uuids(values: pa.Array | pa.ChunkedArray, file: str, field: str) -> None:
    """Every value is UuidToString's "<u64>-<u64>"."""
    bad = first_bad_uuid(values)
    if bad >= 0:
        raise SnapshotPayloadFieldError(file, field, f"{values[bad].as_py()!r} is not an upstream UUID string "
                                        "(\"<u64>-<u64>\", each half at most 2**64 - 1)")


def shard_index(routing_key: str) -> int:
    """Upstream shard of a key: libstdc++ ``std::hash<std::string>`` (murmur2 64) % 1024.

    Grouped objects are routed by their group id. Checked against the real fixtures.
    """
    data = routing_key.encode()
    mul = 0xC6A4A7935BD1E995
    n, aligned = len(data), len(data) & ~7
    h = (0xC70F6907 ^ (n * mul)) & _U64
    for i in range(0, aligned, 8):
        k = (int.from_bytes(data[i:i + 8], "little") * mul) & _U64
        h = ((h ^ (((k ^ (k >> 47)) * mul) & _U64)) * mul) & _U64
    if n & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * mul) & _U64
    h = (((h ^ (h >> 47)) * mul) & _U64)
    return (h ^ (h >> 47)) % NUM_SHARDS


def shard_indices(routing_keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """:func:`shard_index` of every string of an Arrow column (one kernel call)."""
    arr = routing_keys.cast(pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, np.int64)
    _, offsets, data = arr.buffers()
    offsets = np.frombuffer(offsets, np.int64)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return (murmur64a(data, offsets) % np.uint64(NUM_SHARDS)).astype(np.int64)


# ---- read ---------------------------------------------------------------------------------------
def _decode_segments(raw: bytes, max_bytes: int) -> tuple[pa.Table, dict[str, int]]:
    """Segments table (``used`` filled later) and segment UUID -> row."""
    f = SEGMENTS_FILE
    top = _unpack(ZstdBudget(len(raw), max_bytes).unzstd(raw, f), f)
    if not isinstance(top, dict) or not {"ma", "an", "ms", "cs", "ld"} <= set(top):
        raise SnapshotPayloadFieldError(f, "top level", "expected a map with ma, an, ms, cs, ld")
    if top["ma"] != UPSTREAM_ALLOCATOR_OFFSET:
        raise SnapshotPayloadFieldError(f, "ma", f"allocator type {top['ma']!r} is not OFFSET")
    mounted, clients = top["ms"], top["cs"]
    if not isinstance(mounted, dict) or not isinstance(clients, dict):
        raise SnapshotPayloadFieldError(f, "ms/cs", "must be maps")
    owner: dict[str, str] = {}
    for client, seg_ids in clients.items():  # one entry per client, not per object
        if not isinstance(client, str) or not isinstance(seg_ids, list):
            raise SnapshotPayloadFieldError(f, "cs", "bad client -> segments entry")
        for seg_id in seg_ids:
            if not isinstance(seg_id, str) or seg_id in owner:
                raise SnapshotPayloadFieldError(f, "cs", f"bad or doubly owned segment {seg_id!r}")
            owner[seg_id] = client
    if not all(isinstance(seg_id, str) for seg_id in mounted):  # before sorting them
        raise SnapshotPayloadFieldError(f, "ms", "a mounted segment id is not a string")
    rows: dict[str, list] = {name: [] for name in SEGMENTS_ARROW_SCHEMA.names}
    index: dict[str, int] = {}
    for seg_id, seg in sorted(mounted.items()):
        if not (isinstance(seg, list) and len(seg) == 9 and seg[0] == seg_id
                and isinstance(seg[1], str) and _is_int64(seg[2]) and seg[2] >= 0
                and _is_int64(seg[3]) and seg[3] >= 0 and isinstance(seg[4], str)
                and type(seg[5]) is int and type(seg[6]) is bool
                and (isinstance(seg[7], list) or not seg[6]) and isinstance(seg[8], str)):
            raise SnapshotPayloadFieldError(f, f"ms[{seg_id!r}]", "malformed MountedSegment")
        index[seg_id] = len(index)
        rows["name"].append(seg[1])
        rows["endpoint"].append(seg[4])
        rows["client"].append(owner.get(seg_id, ""))
        rows["base"].append(seg[2])
        rows["size"].append(seg[3])
        rows["used"].append(0)  # filled from the replicas by with_usage
        rows["readable"].append(seg[5] == SEGMENT_STATUS_OK)
        rows["segment_id"].append(seg_id)
        rows["host_id"].append(seg[8])
    if set(owner) - set(index):
        raise SnapshotPayloadFieldError(f, "cs", "a client owns a segment that is not mounted")
    table = pa.table({fl.name: _array(rows[fl.name], fl.type, f, f"ms.{fl.name}")
                      for fl in SEGMENTS_ARROW_SCHEMA}, schema=SEGMENTS_ARROW_SCHEMA)
    _check_uuids(pa.array(list(index), pa.string()), f, "ms segment id")
    _check_uuids(pa.array(list(owner.values()), pa.string()), f, "cs client id")
    return table, index


def _object_error(file: str, tenant: str, key: str, message: str) -> SnapshotPayloadFieldError:
    return SnapshotPayloadFieldError(file, f"object {tenant!r}/{key!r}", message)


def _parse_meta(file: str, tenant: str, key: str, meta: Any, objs: dict[str, list],
                reps: dict[str, list]) -> None:
    """Append one object (upstream DeserializeMetadata layout) to the column lists."""
    if not isinstance(meta, list) or len(meta) < 7:
        raise _object_error(file, tenant, key, "metadata is not an array of >= 7")
    client, put_start, size, lease, has_soft_pin, soft_pin, count = meta[:7]
    if not (isinstance(client, str) and _is_int64(put_start) and is_uint(size)
            and _is_int64(lease) and type(has_soft_pin) is bool and is_uint(soft_pin)
            and is_uint(count)):
        raise _object_error(file, tenant, key, "bad fixed fields")
    pos, data_type = 7, 0
    if pos < len(meta) and type(meta[pos]) is int:  # optional data_type before the replicas
        data_type, pos = meta[pos], pos + 1
    rest = meta[pos + count:]
    if len(meta) < pos + count or len(rest) > 3:
        raise _object_error(file, tenant, key, f"{len(meta)} fields for {count} replicas")
    hard_pinned, group = False, ""
    i = 0
    if i < len(rest) and type(rest[i]) is bool:
        hard_pinned, i = rest[i], i + 1
    if i < len(rest) and isinstance(rest[i], str):
        group, i = rest[i], i + 1
    obj_index = len(objs["key"])
    if i < len(rest) and is_uint(rest[i]):  # upstream's optional object checksum
        objs["checksum_object"].append(obj_index)
        objs["checksum"].append(rest[i])
        i += 1
    if i != len(rest) or not (0 <= data_type <= 255):
        raise _object_error(file, tenant, key, f"unexpected optional fields {rest!r}")
    statuses = []
    for rep in meta[pos:pos + count]:
        if not (isinstance(rep, list) and len(rep) == 4 and is_uint(rep[0])
                and type(rep[1]) is int and type(rep[2]) is int):
            raise _object_error(file, tenant, key, "malformed replica")
        if rep[2] != UPSTREAM_REPLICA_MEMORY:
            raise _object_error(file, tenant, key, f"replica type {rep[2]} is not supported")
        buf = rep[3]
        if not (isinstance(buf, list) and len(buf) == 5 and is_uint(buf[0]) and is_uint(buf[1])
                and isinstance(buf[2], str) and type(buf[3]) is bool
                and (buf[4] is None or isinstance(buf[4], list))):
            raise _object_error(file, tenant, key, "malformed memory buffer")
        reps["object_index"].append(obj_index)
        reps["replica_id"].append(rep[0])
        reps["status"].append(rep[1])
        reps["segment_id"].append(buf[2])
        reps["buffer_ptr"].append(buf[1])
        reps["size"].append(buf[0])
        statuses.append(rep[1])
    objs["tenant"].append(tenant)
    objs["key"].append(key)
    objs["client"].append(client)
    objs["size_bytes"].append(size)
    objs["data_type"].append(data_type)
    objs["group"].append(group)
    objs["hard_pinned"].append(hard_pinned)
    objs["lease_ms"].append(lease)
    objs["put_start_time_ms"].append(put_start)
    objs["processing"].append(any(s != ST_COMPLETE for s in statuses))
    objs["replica_count"].append(count)


def _parse_shards(shards: dict, budget: ZstdBudget, objs: dict[str, list], reps: dict[str, list]
                  ) -> np.ndarray:
    """Parse every shard's objects into the column lists; returns each object's shard index."""
    shard_of: list[int] = []
    counts: list[int] = []
    for shard_idx, blob in shards.items():
        if not (is_uint(shard_idx) and shard_idx < NUM_SHARDS):
            raise SnapshotPayloadFieldError(METADATA_FILE, "shards", f"bad shard index {shard_idx!r}")
        file = f"{METADATA_FILE} shard {shard_idx}"
        shard = _unpack(budget.unzstd(blob, file), file)
        if not isinstance(shard, dict) or set(shard) != {"metadata"} \
                or not isinstance(shard["metadata"], list):
            raise SnapshotPayloadFieldError(file, "top level", "expected {metadata: [...]}")
        for item in shard["metadata"]:
            if isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) \
                    and isinstance(item[1], str):
                _parse_meta(file, item[0], item[1], item[2], objs, reps)
            elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                _parse_meta(file, DEFAULT_TENANT, item[0], item[1], objs, reps)  # legacy item
            else:
                raise SnapshotPayloadFieldError(file, "metadata", "malformed item")
        shard_of.append(shard_idx)
        counts.append(len(shard["metadata"]))
    return np.repeat(np.asarray(shard_of, np.int64), np.asarray(counts, np.int64))


def _check_routing(objects: pa.Table, shard_of: np.ndarray) -> None:
    """Every object sits in the shard upstream routes it to (group id, else key): a key moved
    to another shard is a damaged file, and upstream would never find it there."""
    group = objects.column("group")
    routed = shard_indices(pc.if_else(pc.equal(group, ""), objects.column("key"), group))
    bad = np.flatnonzero(routed != shard_of)
    if bad.size:
        row = int(bad[0])
        raise SnapshotPayloadFieldError(
            f"{METADATA_FILE} shard {int(shard_of[row])}", "key",
            f"{objects.column('key')[row].as_py()!r} belongs in shard {int(routed[row])}")


def decode_v1(payloads: dict[str, bytes], *, restore_system_ns: int, restore_steady_ns: int,
              max_decompressed_bytes: int = DEFAULT_MAX_DECOMPRESSED_BYTES) -> SnapshotState:
    """A validated SnapshotState with lease deadlines in the restoring steady domain (S1, C1).

    ``max_decompressed_bytes``: the most one payload file's zstd frames may decompress to
    together (each frame is also held to a multiple of its stored size,
    :data:`~.mooncake_v1_allocator.ZSTD_MAX_RATIO`). Every decode failure raises a
    :class:`~mooncake_columnar.errors.SnapshotError` naming the file and field.
    """
    if type(max_decompressed_bytes) is not int or max_decompressed_bytes <= 0:
        raise InvalidParams(f"max_decompressed_bytes {max_decompressed_bytes!r} is not a "
                            "positive int")
    for name in V1_FILES:
        if not isinstance(payloads.get(name), bytes):
            raise SnapshotPayloadFieldError(name, "payload", "missing, or not bytes")
    segments, seg_index = _decode_segments(payloads[SEGMENTS_FILE], max_decompressed_bytes)
    top = _unpack(payloads[METADATA_FILE], METADATA_FILE)
    if not isinstance(top, dict) or set(top) != {"shards", "discarded_replicas", "replica_next_id"}:
        raise SnapshotPayloadFieldError(METADATA_FILE, "top level",
                                 "expected shards, discarded_replicas, replica_next_id")
    if not isinstance(top["shards"], dict) or not isinstance(top["discarded_replicas"], list) \
            or not is_uint(top["replica_next_id"]):
        raise SnapshotPayloadFieldError(METADATA_FILE, "top level", "malformed top-level fields")
    raw_tasks = payloads[TASK_MANAGER_FILE]
    tasks = _unpack(ZstdBudget(len(raw_tasks), max_decompressed_bytes).unzstd(
        raw_tasks, TASK_MANAGER_FILE), TASK_MANAGER_FILE)
    if not isinstance(tasks, list) or any(not (isinstance(t, list) and len(t) == 8) for t in tasks):
        raise SnapshotPayloadFieldError(TASK_MANAGER_FILE, "tasks", "expected an array of 8-field tasks")
    objs: dict[str, list] = {k: [] for k in (
        "tenant", "key", "client", "size_bytes", "data_type", "group", "hard_pinned", "lease_ms",
        "put_start_time_ms", "processing", "replica_count", "checksum_object", "checksum")}
    reps: dict[str, list] = {k: [] for k in (
        "object_index", "replica_id", "status", "segment_id", "buffer_ptr", "size")}
    budget = ZstdBudget(len(payloads[METADATA_FILE]), max_decompressed_bytes)
    shard_of = _parse_shards(top["shards"], budget, objs, reps)

    f = METADATA_FILE
    client = _array(objs["client"], pa.string(), f, "objects.client")
    _check_uuids(client, f, "objects.client")
    lease_ms = np.asarray(_array(objs["lease_ms"], pa.int64(), f, "objects.lease").to_numpy())
    lease = convert_legacy_ms_deadlines(lease_ms, restore_system_ns=restore_system_ns,
                                        restore_steady_ns=restore_steady_ns)
    n = len(objs["key"])
    objects = pa.table({
        "tenant": _array(objs["tenant"], pa.string(), f, "objects.tenant"),
        "key": _array(objs["key"], pa.string(), f, "objects.key"),
        "client": client,
        "size_bytes": _array(objs["size_bytes"], pa.int64(), f, "objects.size"),
        "data_type": _array(objs["data_type"], pa.uint8(), f, "objects.data_type"),
        "group": _array(objs["group"], pa.string(), f, "objects.group_id"),
        "hard_pinned": _array(objs["hard_pinned"], pa.bool_(), f, "objects.hard_pinned"),
        "soft_pin_enabled": pa.array(np.zeros(n, dtype=bool)),  # v1 does not persist soft pin
        "lease_deadline_ns": pa.array(lease, pa.int64()),
        "soft_pin_deadline_ns": pa.array(np.full(n, np.iinfo(np.int64).min, dtype=np.int64)),
        "put_start_time_ms": _array(objs["put_start_time_ms"], pa.int64(), f,
                                    "objects.put_start_time"),
        "processing": _array(objs["processing"], pa.bool_(), f, "objects.processing"),
        "replica_count": _array(objs["replica_count"], pa.int32(), f, "objects.replica_count"),
    }, schema=OBJECTS_ARROW_SCHEMA)
    _check_routing(objects, shard_of)

    seg_ids = _array(reps["segment_id"], pa.string(), f, "replicas.segment_id")
    seg_row = pc.index_in(seg_ids, value_set=pa.array(list(seg_index), pa.string()))
    if seg_row.null_count:
        bad = seg_ids.filter(pc.is_null(seg_row))[0].as_py()
        raise SnapshotPayloadFieldError(f, "replicas.segment_id", f"memory replica on unknown segment "
                                 f"id {bad!r}")
    seg_row = seg_row.to_numpy(zero_copy_only=False).astype(np.int64)
    base = segments.column("base").to_numpy().astype(np.uint64)[seg_row]  # bases are >= 0
    ptr = _array(reps["buffer_ptr"], pa.uint64(), f, "replicas.buffer_ptr").to_numpy()
    if (ptr < base).any():
        raise SnapshotPayloadFieldError(f, "replicas.buffer_ptr", "memory replica buffer below its "
                                 "segment base")
    offset = ptr - base  # uint64: exact (int64 against uint64 would compare as float64)
    if (offset > np.uint64(np.iinfo(np.int64).max)).any():
        raise SnapshotPayloadFieldError(f, "replicas.buffer_ptr", "buffer offset beyond int64")
    status = _array(reps["status"], pa.uint8(), f, "replicas.status")
    replicas = pa.table({
        "object_index": pa.array(np.asarray(reps["object_index"], dtype=np.int64)),
        "replica_id": _array(reps["replica_id"], pa.uint64(), f, "replicas.replica_id"),
        "kind": pa.array(np.full(len(seg_row), KIND_MEMORY, dtype=np.uint8)),
        "status": status,
        "segment": segments.column("name").take(pa.array(seg_row)),
        "offset": pa.array(offset.astype(np.int64)),
        "size": _array(reps["size"], pa.int64(), f, "replicas.size"),
        "readable": pa.array(np.logical_and(
            status.to_numpy(zero_copy_only=False) == ST_COMPLETE,
            segments.column("readable").to_numpy(zero_copy_only=False)[seg_row])),
    }, schema=REPLICAS_ARROW_SCHEMA)
    checksums = pa.table({"object_index": np.asarray(objs["checksum_object"], np.int64),
                          "checksum": _array(objs["checksum"], pa.uint64(), f, "objects.object_checksum")},
                         schema=CHECKSUMS_ARROW_SCHEMA)
    # Upstream keeps usage in its allocator state; recompute it from the extents actually held.
    return with_usage(SnapshotState(objects, replicas, segments, top["replica_next_id"], checksums)).validate()


# ---- write (rollback) ---------------------------------------------------------------------------
def _segment_uuid(name: str) -> str:
    """A stable upstream-style UUID string for a segment whose id is unknown (a state built by
    hand or by a tool; the engine always knows its segments' ids)."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"{int.from_bytes(digest[:8], 'big')}-{int.from_bytes(digest[8:16], 'big')}"


def encode_v1(state: SnapshotState, *, system_now_ns: int, steady_now_ns: int
              ) -> dict[str, bytes]:
    """Upstream v1 payloads (metadata, segments, task_manager, descriptor.txt) for ``state``.

    Steady deadlines become system ms through one (system, steady) pair; soft pin is lost (v1 has
    no slot for it). Each segment gets the OffsetBufferAllocator state, and each buffer the
    allocation handle, that upstream needs to load the replica (derived from the extents, see
    :mod:`.mooncake_v1_allocator`), under its segment id (a state without one, built by hand,
    gets an id derived from the name).

    Refuses (:class:`~mooncake_columnar.errors.RollbackRefused`, nothing written) what upstream
    could not load: segments awaiting their client's remount (upstream has no status for them;
    its restore drops every object on a segment that is not OK and then fails), and client ids
    that are not upstream UUID strings.
    """
    state.validate()
    objects, replicas, segments = state.objects, state.replicas, state.segments
    if (replicas.column("kind").to_numpy() != KIND_MEMORY).any():
        raise SerializeFail("v1 writer supports MEMORY replicas only")
    unreadable = pc.invert(segments.column("readable"))
    if pc.any(unreadable).as_py():  # upstream has no status for them (SegmentStatus 2 is DRAINING)
        raise RollbackSegmentsAwaitingRemount(tuple(segments.column("name").filter(unreadable).to_pylist()))
    owners_col = segments.column("client")
    for field, clients in (("objects.client", objects.column("client")),
                           ("segments.client", owners_col.filter(pc.not_equal(owners_col, "")))):
        bad = first_bad_uuid(clients)
        if bad >= 0:
            raise RollbackClientIdsNotUpstream(field, clients[bad].as_py())
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    seg_uuid = [uid or _segment_uuid(name) for uid, name in zip(
        segments.column("segment_id").to_pylist(), segments.column("name").to_pylist())]

    # Replicas in object order (CSR) so each object's replicas are one slice.
    order = np.argsort(replicas.column("object_index").to_numpy(), kind="stable")
    reps = replicas.take(pa.array(order))
    seg_row = pc.index_in(reps.column("segment"), value_set=segments.column("name")).to_numpy(
        zero_copy_only=False).astype(np.int64)
    size = reps.column("size").to_numpy()
    # REMOVED replicas no longer own their extent and an empty one owns none: no node, no handle.
    held = (reps.column("status").to_numpy() != ST_REMOVED) & (size > 0)
    allocators = derive_allocators(segments, seg_row, reps.column("offset").to_numpy(), size, held)
    rep_items = _replica_items(reps, segments, seg_row, seg_uuid, allocators)
    return {
        METADATA_FILE: _metadata_blob(state, rep_items, system_now_ns, steady_now_ns, compressor),
        SEGMENTS_FILE: _segments_blob(segments, seg_uuid, allocators, compressor),
        TASK_MANAGER_FILE: compressor.compress(msgpack.packb([])),
        DESCRIPTOR_FILE: f"0|0|{int(system_now_ns) // 1_000_000}".encode(),
    }


def _segments_blob(segments: pa.Table, seg_uuid: list[str], allocators: SegmentAllocators,
                   compressor: zstandard.ZstdCompressor) -> bytes:
    seg_names = segments.column("name").to_pylist()
    mounted: dict[str, list] = {}
    owners: dict[str, list[str]] = {}
    for row, (uid, name, endpoint, client, base, size, host_id) in enumerate(zip(
            seg_uuid, seg_names, *(segments.column(c).to_pylist() for c in (
                "endpoint", "client", "base", "size", "host_id")))):
        allocator = pack_allocator(allocators.state(row), compressor)
        mounted[uid] = [uid, name, base, size, endpoint, SEGMENT_STATUS_OK, True, allocator, host_id]
        if client:
            owners.setdefault(client, []).append(uid)
    return compressor.compress(msgpack.packb({
        "ma": UPSTREAM_ALLOCATOR_OFFSET, "an": seg_names, "ms": dict(sorted(mounted.items())),
        "cs": {c: sorted(ids) for c, ids in sorted(owners.items())}, "ld": {}}))


def _replica_items(reps: pa.Table, segments: pa.Table, seg_row: np.ndarray, seg_uuid: list[str],
                   allocators: SegmentAllocators) -> list[list]:
    """Each replica's msgpack value, in the order of ``reps``."""
    ptr = (segments.column("base").to_numpy()[seg_row].astype(np.uint64)
           + reps.column("offset").to_numpy().astype(np.uint64))
    has_handle = allocators.node >= 0
    return [[rid, st, UPSTREAM_REPLICA_MEMORY,
             [sz, p, seg_uuid[s], h, pack_handle(p, sz, off, node) if h else None]]
            for rid, st, sz, p, s, h, off, node in zip(
                reps.column("replica_id").to_pylist(), reps.column("status").to_pylist(),
                reps.column("size").to_pylist(), ptr.tolist(), seg_row.tolist(),
                has_handle.tolist(), allocators.offset.tolist(), allocators.node.tolist())]


def _metadata_blob(state: SnapshotState, rep_items: list[list], system_now_ns: int,
                   steady_now_ns: int, compressor: zstandard.ZstdCompressor) -> bytes:
    objects = state.objects
    lease_ms = legacy_system_deadline_ms(objects.column("lease_deadline_ns").to_numpy(),
                                         system_now_ns=system_now_ns, steady_now_ns=steady_now_ns)
    starts = np.concatenate([[0], np.cumsum(objects.column("replica_count").to_numpy())]).tolist()
    shards: dict[int, list] = {}
    cols = [objects.column(c).to_pylist() for c in (
        "tenant", "key", "client", "put_start_time_ms", "size_bytes", "replica_count",
        "data_type", "hard_pinned", "group")]
    checksum = dict(zip(state.checksums.column("object_index").to_pylist(),  # sparse: few objects
                        state.checksums.column("checksum").to_pylist()))
    for i, (tenant, key, client, put_start, size, count, dtype, hard, group) in enumerate(zip(*cols)):
        meta = [client, put_start, size, int(lease_ms[i]), False, 0, count, dtype,
                *rep_items[starts[i]:starts[i + 1]], hard, group]
        if i in checksum:
            meta.append(checksum[i])
        shards.setdefault(shard_index(group or key), []).append([tenant, key, meta])
    return msgpack.packb({
        "shards": {idx: compressor.compress(msgpack.packb({"metadata": sorted(items)}))
                   for idx, items in sorted(shards.items())},
        "discarded_replicas": [],
        "replica_next_id": int(state.replica_next_id),
    })


def write_v1(repo: SnapshotRepository, state: SnapshotState, system_now_ns: int,
             steady_now_ns: int) -> str:
    """Publish ``state`` as an upstream v1 snapshot (rollback path, :func:`~.writer.publish_state`);
    returns the snapshot id."""
    from .writer import publish_state  # the writer imports this codec
    return publish_state(repo, state, system_now_ns, steady_now_ns, v1=True).snapshot_id
