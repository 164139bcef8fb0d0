"""Upstream v1 complete snapshots (``messagepack|1.0.0|<id>``): read, and write for rollback.

Payloads (upstream-master.md section 6.2): ``metadata`` is a plain msgpack map whose shards are
zstd-compressed msgpack BINs; ``segments`` and ``task_manager`` are zstd-compressed msgpack.
Lease deadlines are system-clock ms and pass through the Phase 2 adapter; v1 has no soft pin.

Unlike upstream's decoder, which logs and skips an object it cannot parse, any bad object here
fails the whole candidate (RFC: never skip one corrupted object while claiming a complete restore).
msgpack yields one Python object per item, so building the columns walks the decoded items once;
everything after that (segment resolution, offsets, deadlines, validation) is vectorized.

Not represented in :class:`SnapshotState` and therefore dropped on read: replication/offload tasks
(``task_manager``), ``discarded_replicas`` (staging buffers whose memory a restart frees anyway),
the optional per-object checksum, segment UUIDs and the upstream allocator state (the extents
say which memory is held). Only MEMORY replicas are supported; any other replica type fails the
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

from ..errors import SerializeFail, SnapshotPayloadError
from ..schema import (
    KIND_MEMORY,
    OBJECTS_ARROW_SCHEMA,
    REPLICAS_ARROW_SCHEMA,
    SEGMENTS_ARROW_SCHEMA,
    ST_COMPLETE,
    ST_REMOVED,
)
from .convert import convert_legacy_ms_deadlines, legacy_system_deadline_ms
from .manifest import snapshot_id_for, v1_manifest
from .mooncake_v1_allocator import (
    SegmentAllocators,
    derive_allocators,
    is_uint,
    pack_allocator,
    pack_handle,
    unzstd,
)
from .repository import SnapshotRepository
from .state import SnapshotState, with_usage

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
SEGMENT_STATUS_OK = 1
SEGMENT_STATUS_UNMOUNTING = 2
_UUID_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"  # UuidToString: "<u64>-<u64>"
_U64 = (1 << 64) - 1


# ---- helpers --------------------------------------------------------------------------------------
def _unpack(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise SnapshotPayloadError(f"{what}: bad msgpack: {e}") from None


def _is_int64(v: Any) -> bool:
    return type(v) is int and -(1 << 63) <= v < (1 << 63)


def _array(values: list, type_: pa.DataType, what: str) -> pa.Array:
    try:
        return pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as e:
        raise SnapshotPayloadError(f"{what}: wrong value type: {e}") from None


def _check_uuids(values: pa.Array | pa.ChunkedArray, what: str) -> None:
    ok = pc.match_substring_regex(values, _UUID_PATTERN)
    if not pc.all(ok).as_py() and len(values):
        bad = values.filter(pc.invert(ok))[0].as_py()
        raise SnapshotPayloadError(f"{what}: {bad!r} is not an upstream UUID string")


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


# ---- read ---------------------------------------------------------------------------------------
def _decode_segments(raw: bytes) -> tuple[pa.Table, dict[str, int]]:
    """Segments table (``used`` filled later) and segment UUID -> row."""
    top = _unpack(unzstd(raw, SEGMENTS_FILE), SEGMENTS_FILE)
    if not isinstance(top, dict) or not {"ma", "an", "ms", "cs", "ld"} <= set(top):
        raise SnapshotPayloadError("segments: expected a map with ma, an, ms, cs, ld")
    if top["ma"] != UPSTREAM_ALLOCATOR_OFFSET:
        raise SnapshotPayloadError(f"segments: allocator type {top['ma']!r} is not OFFSET")
    mounted, clients = top["ms"], top["cs"]
    if not isinstance(mounted, dict) or not isinstance(clients, dict):
        raise SnapshotPayloadError("segments: ms/cs must be maps")
    owner: dict[str, str] = {}
    for client, seg_ids in clients.items():  # one entry per client, not per object
        if not isinstance(client, str) or not isinstance(seg_ids, list):
            raise SnapshotPayloadError("segments: bad client -> segments entry")
        for seg_id in seg_ids:
            if not isinstance(seg_id, str) or seg_id in owner:
                raise SnapshotPayloadError(f"segments: bad or doubly owned segment {seg_id!r}")
            owner[seg_id] = client
    rows: dict[str, list] = {f.name: [] for f in SEGMENTS_ARROW_SCHEMA}
    index: dict[str, int] = {}
    for seg_id, seg in sorted(mounted.items()):
        if not (isinstance(seg, list) and len(seg) == 9 and seg[0] == seg_id
                and isinstance(seg[1], str) and is_uint(seg[2]) and _is_int64(seg[3])
                and seg[3] >= 0 and isinstance(seg[4], str) and type(seg[5]) is int
                and type(seg[6]) is bool and (isinstance(seg[7], list) or not seg[6])):
            raise SnapshotPayloadError(f"segments: malformed MountedSegment {seg_id!r}")
        index[seg_id] = len(index)
        rows["name"].append(seg[1])
        rows["endpoint"].append(seg[4])
        rows["client"].append(owner.get(seg_id, ""))
        rows["base"].append(seg[2])
        rows["size"].append(seg[3])
        rows["used"].append(0)  # filled from the replicas by with_usage
        rows["readable"].append(seg[5] == SEGMENT_STATUS_OK)
    if set(owner) - set(index):
        raise SnapshotPayloadError("segments: a client owns a segment that is not mounted")
    table = pa.table({f.name: _array(rows[f.name], f.type, f"segments.{f.name}")
                      for f in SEGMENTS_ARROW_SCHEMA}, schema=SEGMENTS_ARROW_SCHEMA)
    _check_uuids(pa.array(list(index), pa.string()), "segment id")
    _check_uuids(pa.array(list(owner.values()), pa.string()), "segment owner")
    return table, index


def _parse_meta(tenant: str, key: str, meta: Any, objs: dict[str, list], reps: dict[str, list]
                ) -> None:
    """Append one object (upstream DeserializeMetadata layout) to the column lists."""
    where = f"object {tenant!r}/{key!r}"
    if not isinstance(meta, list) or len(meta) < 7:
        raise SnapshotPayloadError(f"{where}: metadata is not an array of >= 7")
    client, put_start, size, lease, has_soft_pin, soft_pin, count = meta[:7]
    if not (isinstance(client, str) and _is_int64(put_start) and is_uint(size)
            and _is_int64(lease) and type(has_soft_pin) is bool and is_uint(soft_pin)
            and is_uint(count)):
        raise SnapshotPayloadError(f"{where}: bad fixed fields")
    pos, data_type = 7, 0
    if pos < len(meta) and type(meta[pos]) is int:  # optional data_type before the replicas
        data_type, pos = meta[pos], pos + 1
    rest = meta[pos + count:]
    if len(meta) < pos + count or len(rest) > 3:
        raise SnapshotPayloadError(f"{where}: {len(meta)} fields for {count} replicas")
    hard_pinned, group = False, ""
    i = 0
    if i < len(rest) and type(rest[i]) is bool:
        hard_pinned, i = rest[i], i + 1
    if i < len(rest) and isinstance(rest[i], str):
        group, i = rest[i], i + 1
    if i < len(rest) and is_uint(rest[i]):
        i += 1  # object checksum: no column for it in SnapshotState
    if i != len(rest) or not (0 <= data_type <= 255):
        raise SnapshotPayloadError(f"{where}: unexpected optional fields {rest!r}")
    obj_index = len(objs["key"])
    statuses = []
    for rep in meta[pos:pos + count]:
        if not (isinstance(rep, list) and len(rep) == 4 and is_uint(rep[0])
                and type(rep[1]) is int and type(rep[2]) is int):
            raise SnapshotPayloadError(f"{where}: malformed replica")
        if rep[2] != UPSTREAM_REPLICA_MEMORY:
            raise SnapshotPayloadError(f"{where}: replica type {rep[2]} is not supported")
        buf = rep[3]
        if not (isinstance(buf, list) and len(buf) == 5 and is_uint(buf[0]) and is_uint(buf[1])
                and isinstance(buf[2], str) and type(buf[3]) is bool
                and (buf[4] is None or isinstance(buf[4], list))):
            raise SnapshotPayloadError(f"{where}: malformed memory buffer")
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


def decode_v1(payloads: dict[str, bytes], *, restore_system_ns: int, restore_steady_ns: int
              ) -> SnapshotState:
    """A validated SnapshotState with lease deadlines in the restoring steady domain (S1, C1)."""
    for name in V1_FILES:
        if name not in payloads:
            raise SnapshotPayloadError(f"v1 payload {name} is missing")
    segments, seg_index = _decode_segments(payloads[SEGMENTS_FILE])
    top = _unpack(payloads[METADATA_FILE], METADATA_FILE)
    if not isinstance(top, dict) or set(top) != {"shards", "discarded_replicas", "replica_next_id"}:
        raise SnapshotPayloadError("metadata: expected shards, discarded_replicas, replica_next_id")
    if not isinstance(top["shards"], dict) or not isinstance(top["discarded_replicas"], list) \
            or not is_uint(top["replica_next_id"]):
        raise SnapshotPayloadError("metadata: malformed top-level fields")
    tasks = _unpack(unzstd(payloads[TASK_MANAGER_FILE], TASK_MANAGER_FILE), TASK_MANAGER_FILE)
    if not isinstance(tasks, list) or any(not (isinstance(t, list) and len(t) == 8) for t in tasks):
        raise SnapshotPayloadError("task_manager: expected an array of 8-field tasks")
    objs: dict[str, list] = {k: [] for k in (
        "tenant", "key", "client", "size_bytes", "data_type", "group", "hard_pinned", "lease_ms",
        "put_start_time_ms", "processing", "replica_count")}
    reps: dict[str, list] = {k: [] for k in (
        "object_index", "replica_id", "status", "segment_id", "buffer_ptr", "size")}
    for shard_idx, blob in top["shards"].items():
        if not (is_uint(shard_idx) and shard_idx < NUM_SHARDS):
            raise SnapshotPayloadError(f"metadata: bad shard index {shard_idx!r}")
        shard = _unpack(unzstd(blob, f"metadata shard {shard_idx}"), f"metadata shard {shard_idx}")
        if not isinstance(shard, dict) or set(shard) != {"metadata"} \
                or not isinstance(shard["metadata"], list):
            raise SnapshotPayloadError(f"metadata shard {shard_idx}: expected {{metadata: [...]}}")
        for item in shard["metadata"]:
            if isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) \
                    and isinstance(item[1], str):
                _parse_meta(item[0], item[1], item[2], objs, reps)
            elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                _parse_meta(DEFAULT_TENANT, item[0], item[1], objs, reps)  # legacy item
            else:
                raise SnapshotPayloadError(f"metadata shard {shard_idx}: malformed item")

    client = _array(objs["client"], pa.string(), "objects.client")
    _check_uuids(client, "object client_id")
    lease_ms = np.asarray(_array(objs["lease_ms"], pa.int64(), "lease").to_numpy())
    lease = convert_legacy_ms_deadlines(lease_ms, restore_system_ns=restore_system_ns,
                                        restore_steady_ns=restore_steady_ns)
    n = len(objs["key"])
    objects = pa.table({
        "tenant": _array(objs["tenant"], pa.string(), "tenant"),
        "key": _array(objs["key"], pa.string(), "key"),
        "client": client,
        "size_bytes": _array(objs["size_bytes"], pa.int64(), "size"),
        "data_type": _array(objs["data_type"], pa.uint8(), "data_type"),
        "group": _array(objs["group"], pa.string(), "group_id"),
        "hard_pinned": _array(objs["hard_pinned"], pa.bool_(), "hard_pinned"),
        "soft_pin_enabled": pa.array(np.zeros(n, dtype=bool)),  # v1 does not persist soft pin
        "lease_deadline_ns": pa.array(lease, pa.int64()),
        "soft_pin_deadline_ns": pa.array(np.full(n, np.iinfo(np.int64).min, dtype=np.int64)),
        "put_start_time_ms": _array(objs["put_start_time_ms"], pa.int64(), "put_start_time"),
        "processing": _array(objs["processing"], pa.bool_(), "processing"),
        "replica_count": _array(objs["replica_count"], pa.int32(), "replica_count"),
    }, schema=OBJECTS_ARROW_SCHEMA)

    seg_ids = _array(reps["segment_id"], pa.string(), "replica segment_id")
    seg_row = pc.index_in(seg_ids, value_set=pa.array(list(seg_index), pa.string()))
    if seg_row.null_count:
        bad = seg_ids.filter(pc.is_null(seg_row))[0].as_py()
        raise SnapshotPayloadError(f"memory replica on unknown segment id {bad!r}")
    seg_row = seg_row.to_numpy(zero_copy_only=False).astype(np.int64)
    base = segments.column("base").to_numpy()[seg_row]
    ptr = _array(reps["buffer_ptr"], pa.uint64(), "buffer_ptr").to_numpy()
    if (ptr < base).any():
        raise SnapshotPayloadError("memory replica buffer below its segment base")
    status = _array(reps["status"], pa.uint8(), "replica status")
    replicas = pa.table({
        "object_index": pa.array(np.asarray(reps["object_index"], dtype=np.int64)),
        "replica_id": _array(reps["replica_id"], pa.uint64(), "replica id"),
        "kind": pa.array(np.full(len(seg_row), KIND_MEMORY, dtype=np.uint8)),
        "status": status,
        "segment": segments.column("name").take(pa.array(seg_row)),
        "offset": pa.array((ptr - base).astype(np.int64)),
        "size": _array(reps["size"], pa.int64(), "replica size"),
        "readable": pa.array(np.logical_and(
            status.to_numpy(zero_copy_only=False) == ST_COMPLETE,
            segments.column("readable").to_numpy(zero_copy_only=False)[seg_row])),
    }, schema=REPLICAS_ARROW_SCHEMA)
    # Upstream keeps usage in its allocator state; recompute it from the extents actually held.
    return with_usage(SnapshotState(objects, replicas, segments, top["replica_next_id"])).validate()


# ---- write (rollback) ---------------------------------------------------------------------------
def _segment_uuid(name: str) -> str:
    """A stable upstream-style UUID string for a segment name (SnapshotState keeps names only)."""
    digest = hashlib.sha256(name.encode()).digest()
    return f"{int.from_bytes(digest[:8], 'big')}-{int.from_bytes(digest[8:16], 'big')}"


def encode_v1(state: SnapshotState, *, system_now_ns: int, steady_now_ns: int
              ) -> dict[str, bytes]:
    """Upstream v1 payloads (metadata, segments, task_manager, descriptor.txt) for ``state``.

    Steady deadlines become system ms through one (system, steady) pair; soft pin is lost (v1 has
    no slot for it). Client ids must already be upstream UUID strings. Each segment gets the
    OffsetBufferAllocator state, and each buffer the allocation handle, that upstream needs to
    load the replica (derived from the extents, see :mod:`.mooncake_v1_allocator`).
    """
    state.validate()
    objects, replicas, segments = state.objects, state.replicas, state.segments
    if (replicas.column("kind").to_numpy() != KIND_MEMORY).any():
        raise SerializeFail("v1 writer supports MEMORY replicas only")
    owners_col = segments.column("client")
    try:
        _check_uuids(objects.column("client"), "object client")
        _check_uuids(owners_col.filter(pc.not_equal(owners_col, "")), "segment owner")
    except SnapshotPayloadError as e:
        raise SerializeFail(str(e)) from None
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    seg_uuid = [_segment_uuid(name) for name in segments.column("name").to_pylist()]

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
    mounted, owners = {}, {}
    for row, (uid, name, endpoint, client, base, size, readable) in enumerate(zip(
            seg_uuid, seg_names, *(segments.column(c).to_pylist() for c in (
                "endpoint", "client", "base", "size", "readable")))):
        status = SEGMENT_STATUS_OK if readable else SEGMENT_STATUS_UNMOUNTING
        allocator = pack_allocator(allocators.state(row), compressor)
        mounted[uid] = [uid, name, base, size, endpoint, status, True, allocator, ""]
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
    for i, (tenant, key, client, put_start, size, count, dtype, hard, group) in enumerate(zip(*cols)):
        meta = [client, put_start, size, int(lease_ms[i]), False, 0, count, dtype,
                *rep_items[starts[i]:starts[i + 1]], hard, group]
        shards.setdefault(shard_index(group or key), []).append([tenant, key, meta])
    return msgpack.packb({
        "shards": {idx: compressor.compress(msgpack.packb({"metadata": sorted(items)}))
                   for idx, items in sorted(shards.items())},
        "discarded_replicas": [],
        "replica_next_id": int(state.replica_next_id),
    })


def write_v1(repo: SnapshotRepository, state: SnapshotState, system_now_ns: int,
             steady_now_ns: int) -> str:
    """Publish ``state`` as an upstream v1 snapshot (rollback path); returns the snapshot id."""
    snapshot_id = snapshot_id_for(system_now_ns)
    payloads = encode_v1(state, system_now_ns=system_now_ns, steady_now_ns=steady_now_ns)
    repo.publish(snapshot_id, payloads, v1_manifest(snapshot_id).encode())
    return snapshot_id
