"""Error codes (upstream ``mooncake-store/include/types.h`` names and numbers) and exceptions.

Single-key calls raise the exception of the code; batch calls return an int32 code array.
"""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    OK = 0
    INTERNAL_ERROR = -1
    BUFFER_OVERFLOW = -10
    SHARD_INDEX_OUT_OF_RANGE = -100
    SEGMENT_NOT_FOUND = -101
    SEGMENT_ALREADY_EXISTS = -102
    CLIENT_NOT_FOUND = -103
    NO_AVAILABLE_HANDLE = -200
    INVALID_VERSION = -300
    INVALID_KEY = -400
    WRITE_FAIL = -500
    INVALID_PARAMS = -600
    ILLEGAL_CLIENT = -601
    INVALID_WRITE = -700
    INVALID_READ = -701
    INVALID_REPLICA = -702
    REPLICA_IS_NOT_READY = -703
    OBJECT_NOT_FOUND = -704
    OBJECT_ALREADY_EXISTS = -705
    OBJECT_HAS_LEASE = -706
    LEASE_EXPIRED = -707
    OBJECT_HAS_REPLICATION_TASK = -708
    OBJECT_NO_REPLICATION_TASK = -709
    REPLICA_NOT_FOUND = -710
    REPLICA_ALREADY_EXISTS = -711
    REPLICA_IS_GONE = -712
    REPLICA_NOT_IN_LOCAL_MEMORY = -713
    OBJECT_REPLICA_BUSY = -714
    TRANSFER_FAIL = -800
    CHECKSUM_MISMATCH = -801
    RPC_FAIL = -900
    RPC_TIMEOUT = -901
    ETCD_OPERATION_ERROR = -1000
    ETCD_KEY_NOT_EXIST = -1001
    ETCD_TRANSACTION_FAIL = -1002
    ETCD_CTX_CANCELLED = -1003
    OPLOG_ENTRY_NOT_FOUND = -1004
    INCOMPLETE_OPLOG_CATCH_UP = -1007
    UNAVAILABLE_IN_CURRENT_STATUS = -1010
    UNAVAILABLE_IN_CURRENT_MODE = -1011
    NOT_SUPPORTED = -1012
    FILE_NOT_FOUND = -1100
    SERIALIZE_UNSUPPORTED = -1500
    SERIALIZE_FAIL = -1501
    DESERIALIZE_FAIL = -1502
    PERSISTENT_FAIL = -1503
    TENANT_QUOTA_EXCEEDED = -1700
    TENANT_NOT_REGISTERED = -1701
    TENANT_NOT_EMPTY = -1702


class MooncakeError(Exception):
    """Base of every error this library raises on purpose; ``code`` is the upstream ErrorCode."""

    code: ErrorCode = ErrorCode.INTERNAL_ERROR

    def __init__(self, message: str = "", *, code: ErrorCode | None = None):
        if code is not None:
            self.code = code
        super().__init__(f"{self.code.name}: {message}" if message else self.code.name)


class InternalError(MooncakeError):
    code = ErrorCode.INTERNAL_ERROR


class EngineInvariantError(InternalError):
    """The engine's state breaks a structural invariant (``MasterService.verify()``, or an erase
    refused because a row is not the live object the caller expected); ``check`` names it."""

    def __init__(self, check: str, message: str):
        self.check = check
        super().__init__(f"{check}: {message}")


class InvalidParams(MooncakeError, ValueError):
    code = ErrorCode.INVALID_PARAMS


class IllegalClient(MooncakeError):
    code = ErrorCode.ILLEGAL_CLIENT


ILLEGAL_CLIENT = IllegalClient  # the spelling of the name


class InvalidWrite(MooncakeError):
    code = ErrorCode.INVALID_WRITE


class ReplicaNotReady(MooncakeError):
    code = ErrorCode.REPLICA_IS_NOT_READY


class ObjectNotFound(MooncakeError, KeyError):
    code = ErrorCode.OBJECT_NOT_FOUND

    def __str__(self) -> str:  # KeyError would repr() the message
        return Exception.__str__(self)


class ObjectAlreadyExists(MooncakeError):
    code = ErrorCode.OBJECT_ALREADY_EXISTS


class ObjectHasLease(MooncakeError):
    code = ErrorCode.OBJECT_HAS_LEASE


class ObjectReplicaBusy(MooncakeError):
    code = ErrorCode.OBJECT_REPLICA_BUSY


class NoAvailableHandle(MooncakeError):
    code = ErrorCode.NO_AVAILABLE_HANDLE


class SegmentNotFound(MooncakeError):
    code = ErrorCode.SEGMENT_NOT_FOUND


class SegmentAlreadyExists(MooncakeError):
    code = ErrorCode.SEGMENT_ALREADY_EXISTS


class ClientNotFound(MooncakeError):
    code = ErrorCode.CLIENT_NOT_FOUND


class UnavailableInCurrentStatus(MooncakeError):
    code = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS


class TenantQuotaExceeded(MooncakeError):
    code = ErrorCode.TENANT_QUOTA_EXCEEDED


class TenantNotRegistered(MooncakeError):
    code = ErrorCode.TENANT_NOT_REGISTERED


class DeserializeFail(MooncakeError):
    code = ErrorCode.DESERIALIZE_FAIL


class SerializeFail(MooncakeError):
    code = ErrorCode.SERIALIZE_FAIL


class RollbackRefused(SerializeFail):
    """A v1 rollback snapshot was refused: upstream could not load (or could not safely use)
    what it would hold, so nothing was published to the repository. ``fallback_snapshot_id``:
    the v2 snapshot a SnapshotManager published instead into its fallback repository (None when
    it has none)."""

    fallback_snapshot_id: str | None = None


class RollbackSegmentsAwaitingRemount(RollbackRefused):
    """Segments are unreadable (restored from a standby, awaiting their clients' remount).
    Upstream has no status for them: its restore drops every object on a segment that is not OK
    and then fails. ``segments`` names them; write the rollback once their clients remounted."""

    def __init__(self, segments: tuple[str, ...]):
        self.segments = tuple(segments)
        shown = ", ".join(repr(s) for s in self.segments[:8]) + (" ..." if len(self.segments) > 8 else "")
        super().__init__(f"v1 rollback refused: {len(self.segments)} segment(s) await their client's "
                         f"remount (unreadable): {shown}")


class RollbackClientIdsNotUpstream(RollbackRefused):
    """Client ids that are not upstream's UUID strings ``"<u64>-<u64>"`` (upstream names every
    client by one). ``field`` says where (objects.client or segments.client), ``client`` the first."""

    def __init__(self, field: str, client: str):
        self.field, self.client = field, client
        super().__init__(f"v1 rollback refused: {field} {client!r} is not an upstream UUID string "
                         "\"<u64>-<u64>\" (MasterConfig.require_upstream_client_ids refuses such ids "
                         "at mount and put_start)")


class NameLimitExceeded(InvalidParams):
    """A name dictionary (``table``: tenants, clients, segments) already holds ``limit`` names,
    as many as its code column can tell apart; the new name is refused and nothing changed."""

    def __init__(self, table: str, name: str, limit: int):
        self.table, self.limit = table, limit
        super().__init__(f"{table}: {name!r} would be name {limit + 1}; the {table} code column holds "
                         f"at most {limit} names")


class InvalidConfig(InvalidParams):
    """A MasterConfig field is out of range; ``field`` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"config field {field!r}: {message}")


_BY_CODE: dict[int, type[MooncakeError]] = {}
for _cls in list(globals().values()):
    if (isinstance(_cls, type) and issubclass(_cls, MooncakeError)
            and _cls not in (MooncakeError, InvalidConfig, NameLimitExceeded, EngineInvariantError)):
        _BY_CODE.setdefault(int(_cls.code), _cls)


def error_for_code(code: int, message: str = "") -> MooncakeError:
    """The exception instance for a batch result code (used to raise from single-key wrappers)."""
    cls = _BY_CODE.get(int(code))
    if cls is None:
        return MooncakeError(message, code=ErrorCode(int(code)))
    return cls(message)


# --- HA oplog (ha/oplog.py, ha/stores.py, ha/writer.py) ---------------------------------------


class OpLogError(MooncakeError):
    """Base of the oplog codec, store and writer errors."""

    code = ErrorCode.INTERNAL_ERROR


class OpLogCorrupt(OpLogError):
    """An encoded batch or stored record does not decode; ``field`` names the offending part."""

    code = ErrorCode.DESERIALIZE_FAIL

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


class OpLogChecksumError(OpLogCorrupt):
    code = ErrorCode.CHECKSUM_MISMATCH


class OpLogGap(OpLogError):
    """Sequence ids are not contiguous (an append that skips ids, or a read with missing history)."""

    code = ErrorCode.INCOMPLETE_OPLOG_CATCH_UP


class OpLogConflict(OpLogError):
    """The durable-prefix compare-and-swap was lost: another write already advanced the prefix."""

    code = ErrorCode.ETCD_TRANSACTION_FAIL


class FencedWrite(OpLogConflict):
    """The store's producer view is newer than the writer's: this writer has been deposed."""


class OpLogStoreUnavailable(OpLogError):
    """The store could not be reached or answered an error; the write may be retried."""

    code = ErrorCode.ETCD_OPERATION_ERROR


class WindowFull(OpLogError):
    """Backpressure: reserved-but-not-durable oplog entries would exceed the writer's window.

    Upstream answers TASK_PENDING_LIMIT_EXCEEDED, which this ErrorCode table does not carry.
    """

    code = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS


# --- the standby (ha/standby.py) ----------------------------------------------------------------


class IncompleteOpLogCatchUp(OpLogError):
    """Promotion could not apply the oplog up to its durable prefix."""

    code = ErrorCode.INCOMPLETE_OPLOG_CATCH_UP


class OpLogRegression(OpLogError):
    """The durable prefix or a batch moved backwards behind what this standby already saw."""

    code = ErrorCode.INCOMPLETE_OPLOG_CATCH_UP


class StandbyFailed(OpLogError):
    """Applying entries failed part-way: the standby's state is unusable until rebuilt."""

    code = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS


# --- complete MasterService snapshots (snapshots/) ----------------------------------------------


class SnapshotError(DeserializeFail):
    """A complete-snapshot candidate cannot be used; the whole candidate fails (RFC Phase 3)."""


class ManifestError(SnapshotError):
    """manifest.txt is malformed, has an unknown tag/version, or a bad clock field."""


class ClockConversionError(SnapshotError):
    """Checked int64 arithmetic overflowed while mapping deadlines between clock domains."""


class SnapshotSchemaError(SnapshotError):
    """An Arrow payload's schema differs from the expected one, or a column holds nulls."""


class SnapshotIntegrityError(SnapshotError):
    """Snapshot tables are inconsistent (dangling indexes, unknown segments, overlapping extents...)."""


class SnapshotDigestError(SnapshotError):
    """A payload is missing, truncated, or its size/sha256 differs from digest.json."""


class SnapshotPayloadError(SnapshotError):
    """A payload does not decode (bad Arrow IPC, msgpack, zstd or an unsupported v1 field)."""


class NoUsableSnapshot(SnapshotError):
    """No candidate restored; ``stats`` records what was tried."""

    def __init__(self, message: str, stats: object = None):
        self.stats = stats
        super().__init__(message)


class SnapshotPublishError(MooncakeError):
    """Uploading a snapshot failed; ``failed`` names every file that did not upload."""

    code = ErrorCode.PERSISTENT_FAIL

    def __init__(self, message: str, failed: tuple[str, ...] = ()):
        self.failed = failed
        super().__init__(message)


class SnapshotStorageUnavailable(SnapshotError):
    """The snapshot storage (a local directory or S3) could not be reached or answered an I/O
    error other than "not found" within the repository's timeout; nothing about any snapshot's
    content is known. A restore raises it instead of falling back to an older candidate (which
    would restore stale state only because the storage was flaky)."""

    code = ErrorCode.PERSISTENT_FAIL


# --- standby snapshots (snapshots/standby.py, ha/standby.py) -------------------------------------


class StandbySnapshotError(SnapshotError):
    """A standby snapshot cannot be used (bad manifest, payload or consistency, or the engine
    built from it fails its self-check); the candidate is rejected as a whole."""


class StandbySnapshotUnreplayable(StandbySnapshotError):
    """The oplog no longer holds the entries right after a standby snapshot's sequence id
    (compacted or lost), or ends before it: the standby could not catch up from it."""

    code = ErrorCode.INCOMPLETE_OPLOG_CATCH_UP


class NoUsableStandbySnapshot(StandbySnapshotError):
    """Standby snapshots exist but none can be used; ``notes`` says why each was rejected."""

    def __init__(self, message: str, notes: list[str] | None = None):
        self.notes = list(notes or ())
        super().__init__(message)


class SnapshotPayloadFieldError(SnapshotPayloadError):
    """A payload field is malformed, of the wrong type or outside its domain (v1 msgpack);
    ``file`` names the payload (and shard), ``field`` the field."""

    def __init__(self, file: str, field: str, message: str):
        self.file = file
        self.field = field
        super().__init__(f"{file}: {field}: {message}")


class SnapshotDecompressionLimit(SnapshotPayloadFieldError):
    """A zstd frame, or a payload's frames together, would decompress past the cap (a multiple of
    the stored size, or the configured maximum); refused before the output is allocated."""


# --- decoded-state domains (store/snapshot_state.py, ha/apply.py) ----------------------------------


class SnapshotFieldError(SnapshotIntegrityError):
    """A decoded value is outside its field's domain (a size past its segment, an id at or past
    2**63, an offset off its allocation unit...); ``table``, ``field`` and ``row`` name it (``row``
    None: the table or the state as a whole)."""

    def __init__(self, table: str, field: str, row: int | None, message: str):
        self.table, self.field, self.row = table, field, row
        where = f"{table}.{field}" + (f" row {row}" if row is not None else "")
        super().__init__(f"{where}: {message}")


class SnapshotExtentError(SnapshotFieldError):
    """Memory extents overlap each other (or, applying oplog entries, an extent the engine
    already holds), or one is empty."""


class ManifestClockError(ManifestError):
    """The manifest's clock pair contradicts the snapshot: its system time is later than the
    snapshot id's, or a lease or soft-pin deadline lies further past its steady time than any
    TTL the master grants."""


class SnapshotDecodeError(SnapshotPayloadError):
    """An untyped error (Arrow, Unicode, ValueError...) escaped while decoding or rebuilding
    a candidate; mapped at the restore boundary, the original is the ``__cause__``."""


class OpLogInvalidEntry(OpLogCorrupt):
    """An oplog entry decodes but cannot be applied (a value outside its domain, an extent that
    overlaps one the standby holds); ``sequence_id`` names it (None: not attributable)."""

    def __init__(self, field: str, message: str, sequence_id: int | None = None):
        self.sequence_id = sequence_id
        super().__init__(field, f"entry {sequence_id}: {message}" if sequence_id is not None else message)


class BadMsgpackMapKey(SnapshotPayloadError):
    """A msgpack map repeats a key or uses an unhashable one; raised inside the decoder's map hook,
    which does not know the file (the v1 reader re-raises ``detail`` as SnapshotPayloadFieldError)."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(detail)


# --- clocks, remount recovery, the command line -----------------------------------------------


class ClockOverflow(MooncakeError, OverflowError):
    """A deadline computation left the int64 range (clock.py)."""


class RecoveryFault(MooncakeError, RuntimeError):
    """Raised by an injected fault hook (tests) to fail a remount at a named step."""


class SegmentExtentsCorrupt(EngineInvariantError, ValueError):
    """A segment's replica extents overlap, share an allocation unit or lie outside its capacity,
    so no allocator can be rebuilt from them: the remount refuses, granting and publishing
    nothing. ``segment`` names it. (Also a ValueError, which the remount raised before.)"""

    def __init__(self, segment: str, message: str):
        self.segment, self.detail = segment, message
        super().__init__("segment_extents", f"segment {segment!r}: {message}")


class CliUsageError(InvalidParams):
    """A command-line argument cannot be used (a URI that does not open or list, a snapshot id
    outside the repository's path rules, no snapshots); the CLI prints ``detail`` and exits 2."""

    def __init__(self, detail: str):
        self.detail = detail
        super().__init__(detail)
