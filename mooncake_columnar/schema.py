"""Column dtypes, flag bits, sentinels, enums and Arrow schemas: defined once, used everywhere."""
from __future__ import annotations

from enum import IntEnum

import numpy as np
import pyarrow as pa

from .clock import INT64_MIN

# ---- sentinels -----------------------------------------------------------------------------------
NEVER_LEASED = np.int64(INT64_MIN)  # lease deadline that is always expired
NO_DEADLINE = np.int64(INT64_MIN)   # soft-pin deadline of an object with no active interval
EMPTY_CODE = -1                    # dictionary code meaning "none" (no group, empty slot)
# Tenant, client and segment codes are int16 columns (2 bytes an object or slot instead of 4):
# codes 0..32767, EMPTY_CODE below them. Their dictionaries refuse a name past the limit
# (NameLimitExceeded); group codes, one per (tenant, group) ever named, stay int32.
CODE_DTYPE = np.dtype(np.int16)
MAX_CODES = int(np.iinfo(CODE_DTYPE).max) + 1

# ---- object flag bits (uint8) --------------------------------------------------------------------
FLAG_LIVE = np.uint8(1)               # row holds an object
FLAG_HARD_PINNED = np.uint8(2)        # immutable; never evicted
FLAG_SOFT_PIN_ENABLED = np.uint8(4)   # participates in soft-pin policy (stays set after expiry)
FLAG_GROUPED = np.uint8(8)            # member of a group (group column valid)
FLAG_PROCESSING = np.uint8(16)        # in upstream's processing_keys: some replica still PROCESSING
FLAG_PENDING_SOFT_PIN = np.uint8(32)  # ENABLE action awaiting the first readable put_end
FLAG_GROUP_REFRESH = np.uint8(64)     # group awaits a lease refresh (new member registered)
FLAG_ERASE_MARK = np.uint8(128)       # scratch bit of the erase guard (kernels/erase_guard.py); clear at rest

# ---- replicas ------------------------------------------------------------------------------------


class ReplicaStatus(IntEnum):
    UNDEFINED = 0   # also: empty replica slot
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


class ReplicaKind(IntEnum):
    MEMORY = 0
    DISK = 1
    LOCAL_DISK = 2
    NOF_SSD = 3


class ObjectDataType(IntEnum):
    UNKNOWN = 0
    KVCACHE = 1
    TENSOR = 2
    WEIGHT = 3
    SAMPLE = 4
    ACTIVATION = 5
    GRADIENT = 6
    OPTIMIZER_STATE = 7
    METADATA = 8
    GENERAL = 9


class SoftPinAction(IntEnum):
    PRESERVE = 0
    ENABLE = 1
    DISABLE = 2


class PingStatus(IntEnum):
    OK = 0
    NEED_REMOUNT = 1


ST_PROCESSING = np.uint8(ReplicaStatus.PROCESSING)
ST_COMPLETE = np.uint8(ReplicaStatus.COMPLETE)
ST_REMOVED = np.uint8(ReplicaStatus.REMOVED)
ST_EMPTY = np.uint8(ReplicaStatus.UNDEFINED)
KIND_MEMORY = np.uint8(ReplicaKind.MEMORY)
KIND_LOCAL_DISK = np.uint8(ReplicaKind.LOCAL_DISK)

# ---- column dtypes -------------------------------------------------------------------------------
OBJECT_COLUMNS: dict[str, np.dtype] = {
    "lease_deadline_ns": np.dtype(np.int64),
    "size_bytes": np.dtype(np.int64),
    "key_ref": np.dtype(np.int64),             # (arena offset << 16) | key length
    "tenant": CODE_DTYPE,
    "client": CODE_DTYPE,
    "put_start_rel": np.dtype(np.uint32),      # put start, system ms after ObjectTable.put_start_base_ms
    "flags": np.dtype(np.uint8),
    "data_type": np.dtype(np.uint8),
}
PUT_START_NONE = np.uint32(0xFFFF_FFFF)  # put_start_rel of an object whose put start is not known (0)

# Replica slot columns, shape (capacity, R): slot j of row i (an object's row or one of its
# continuation rows, see kernels/chains.py).
REPLICA_COLUMNS: dict[str, np.dtype] = {
    # offset inside the segment: a memory replica's in its segment's allocation units (see
    # kernels/allocation.offset_shift; a segment has at most 2**32 units), another kind's in bytes
    "replica_offset": np.dtype(np.uint32),
    "replica_id": np.dtype(np.uint64),
    "replica_segment": CODE_DTYPE,          # segment code (MEMORY) or client code (LOCAL_DISK)
    "replica_refcnt": np.dtype(np.uint16),
    "replica_kind": np.dtype(np.uint8),
    "replica_status": np.dtype(np.uint8),   # 0 = empty slot
}

# The replica slot columns widen for puts of up to this many replicas (the counts commonly used);
# a wider object keeps its other replicas in continuation rows (kernels/chains.py), so that one
# put with replica_num=64 does not make every row 64 slots wide.
HOT_REPLICA_SLOTS = 4

MAX_KEY_BYTES = 65_535

# ---- Arrow schemas -------------------------------------------------------------------------------
OBJECTS_ARROW_SCHEMA = pa.schema([
    pa.field("tenant", pa.string(), nullable=False),
    pa.field("key", pa.string(), nullable=False),
    pa.field("client", pa.string(), nullable=False),
    pa.field("size_bytes", pa.int64(), nullable=False),
    pa.field("data_type", pa.uint8(), nullable=False),
    pa.field("group", pa.string(), nullable=False),
    pa.field("hard_pinned", pa.bool_(), nullable=False),
    pa.field("soft_pin_enabled", pa.bool_(), nullable=False),
    pa.field("lease_deadline_ns", pa.int64(), nullable=False),
    pa.field("soft_pin_deadline_ns", pa.int64(), nullable=False),
    pa.field("put_start_time_ms", pa.int64(), nullable=False),
    pa.field("processing", pa.bool_(), nullable=False),
    pa.field("replica_count", pa.int32(), nullable=False),
])

REPLICAS_ARROW_SCHEMA = pa.schema([
    pa.field("object_index", pa.int64(), nullable=False),  # position in the objects table
    pa.field("replica_id", pa.uint64(), nullable=False),
    pa.field("kind", pa.uint8(), nullable=False),
    pa.field("status", pa.uint8(), nullable=False),
    pa.field("segment", pa.string(), nullable=False),       # segment name; LOCAL_DISK: owner client
    pa.field("offset", pa.int64(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    pa.field("readable", pa.bool_(), nullable=False),
])

SEGMENTS_ARROW_SCHEMA = pa.schema([
    pa.field("name", pa.string(), nullable=False),
    pa.field("endpoint", pa.string(), nullable=False),
    pa.field("client", pa.string(), nullable=False),
    pa.field("base", pa.uint64(), nullable=False),
    pa.field("size", pa.int64(), nullable=False),
    # bytes of the memory replicas on it, exact (upstream's QuerySegments figure); the engine's
    # allocator holds whole allocation units (MasterService.segment_info reports both)
    pa.field("used", pa.int64(), nullable=False),
    pa.field("readable", pa.bool_(), nullable=False),
    pa.field("segment_id", pa.string(), nullable=False),  # upstream segment UUID, "" if unknown
    pa.field("host_id", pa.string(), nullable=False),
])
# Segments tables written before segment ids were kept (v2 snapshots, tools): the first seven
# columns; SnapshotState adds the identity columns as "" (the engine generates ids at load).
SEGMENTS_LEGACY_SCHEMA = pa.schema(list(SEGMENTS_ARROW_SCHEMA)[:7])

# Upstream's optional per-object checksum (ObjectMetadata.object_checksum, set by a client's
# PutEnd and kept in v1 snapshots). Few objects have one here (only those restored from an
# upstream snapshot: this engine's put_end takes none), so it is a sparse table, one row per
# object that has one, not a column every object pays for.
CHECKSUMS_ARROW_SCHEMA = pa.schema([
    pa.field("object_index", pa.int64(), nullable=False),  # position in the objects table, increasing
    pa.field("checksum", pa.uint64(), nullable=False),
])

# ---- v2 snapshot payload layout ------------------------------------------------------------------
# The same columns as above, with the low-cardinality name columns dictionary-encoded (the
# engine's int32 codes plus its string dictionary: no per-row string work, a few bytes per row)
# and keys as large_string (the engine's int64 key offsets, no 2 GiB limit). The dictionary index
# may be any of NAME_INDEX_TYPES (the narrowest that fits); schemas compare with int32 indices.
NAME_INDEX_TYPES = (pa.int8(), pa.int16(), pa.int32())
NAME_DICTIONARY = pa.dictionary(pa.int32(), pa.string())


def _encoded(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    return pa.schema([f.with_type(NAME_DICTIONARY) if f.name in names
                      else f.with_type(pa.large_string()) if f.name == "key" else f for f in schema])


OBJECTS_PAYLOAD_SCHEMA = _encoded(OBJECTS_ARROW_SCHEMA, ("tenant", "client", "group"))
REPLICAS_PAYLOAD_SCHEMA = _encoded(REPLICAS_ARROW_SCHEMA, ("segment",))
