"""Complete-snapshot manifest (``manifest.txt``): strict parse and encode.

v1 (upstream): ``messagepack|1.0.0|<snapshot_id>``; deadlines in the payload are system-clock ms.
v2 (ours):     ``arrow-ipc|2.0.0|<snapshot_id>|<system_now_ns>|<steady_now_ns>|sha256:<hex>``;
deadlines are steady-clock ns of the writing process, mapped through the (system, steady) pair
captured once. The last field is the sha256 of the five fields before it (their exact text, with
the ``|`` separators): tag, version, id and the clock pair are covered, so an edited clock field
(which would stretch or shorten every restored lease) fails the candidate. A v2 manifest written
before the checksum existed has only the five fields; it still parses, with ``checksummed`` False,
and the repository decides whether to accept it (:class:`~.repository.SnapshotRepository`).
The checksum is not a signature: it catches buggy writers and hand edits, not someone who
recomputes it; for those the restore cross-checks the pair (:func:`check_clock_pair`: the system
time against the snapshot id; ``SnapshotState.check_deadline_horizon``: the steady time against
the deadlines), which a five-field manifest must pass too, as its only verification.

The manifest is the publication marker, so anything unexpected in it fails the candidate: exact
field counts, no whitespace, canonical int64 decimals only (RFC Phase 3: "missing fields,
malformed integers, and overflow are candidate failures").
"""
from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..clock import INT64_MAX, INT64_MIN, NS_PER_MS
from ..errors import ManifestClockError, ManifestError, SnapshotPublishError

V1_TAG = "messagepack"
V1_VERSION = "1.0.0"
V2_TAG = "arrow-ipc"
V2_VERSION = "2.0.0"
MANIFEST_FILE = "manifest.txt"
SNAPSHOT_ID_LENGTH = 19

CHECKSUM_PREFIX = "sha256:"

# Canonical decimal: optional '-', no '+', no leading zeros, no "-0".
_CANONICAL_INT = re.compile(r"(?:0|-?[1-9][0-9]*)\Z")
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}\Z")


def is_valid_snapshot_id(snapshot_id: str) -> bool:
    """Upstream IsValidSnapshotId: 19 chars, '_' at 8 and 15, ASCII digits elsewhere."""
    if not isinstance(snapshot_id, str) or len(snapshot_id) != SNAPSHOT_ID_LENGTH:
        return False
    for i, ch in enumerate(snapshot_id):
        if i in (8, 15):
            if ch != "_":
                return False
        elif not ("0" <= ch <= "9"):  # str.isdigit() would accept non-ASCII digits
            return False
    return True


def snapshot_id_ms(snapshot_id: str) -> int | None:
    """Unix ms of a valid ``YYYYMMDD_HHMMSS_mmm`` id (UTC, as :func:`snapshot_id_for` writes it),
    or None when the id is not a valid id or not a real calendar time."""
    if not is_valid_snapshot_id(snapshot_id):
        return None
    try:
        dt = datetime.strptime(snapshot_id[:15], "%Y%m%d_%H%M%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return int(dt.timestamp()) * 1000 + int(snapshot_id[16:])


def manifest_checksum(fields_text: str) -> str:
    """The checksum field of a v2 manifest whose fields before it are ``fields_text``."""
    return CHECKSUM_PREFIX + hashlib.sha256(fields_text.encode("ascii")).hexdigest()


def snapshot_id_for(system_ns: int) -> str:
    """``YYYYMMDD_HHMMSS_mmm`` of a Unix-epoch ns time, in UTC (upstream uses local time)."""
    if not INT64_MIN <= int(system_ns) <= INT64_MAX:  # int64 ns spans years 1677..2262: 19 chars
        raise ManifestError(f"system time {system_ns} ns is outside int64")
    ms = int(system_ns) // NS_PER_MS
    dt = datetime.fromtimestamp(ms // 1000, tz=timezone.utc)
    return f"{dt:%Y%m%d_%H%M%S}_{ms % 1000:03d}"


def parse_canonical_int64(text: str, field: str) -> int:
    """A canonical signed decimal in int64 range, else :class:`ManifestError` naming ``field``."""
    if not _CANONICAL_INT.match(text):
        raise ManifestError(f"{field}: not a canonical integer: {text!r}")
    value = int(text)
    if value < INT64_MIN or value > INT64_MAX:
        raise ManifestError(f"{field}: {text} is outside int64")
    return value


@dataclass(frozen=True)
class SnapshotManifest:
    """A parsed manifest. ``system_now_ns``/``steady_now_ns`` are set exactly for v2.

    ``checksummed`` (v2 only, not part of equality): the manifest carries the checksum field and
    it matched. False for a v2 manifest written before checksums existed (five fields): its clock
    pair is unchecked, and :meth:`encode` writes it back in that legacy form. Manifests built with
    :func:`v2_manifest` are always checksummed.
    """

    tag: str
    version: str
    snapshot_id: str
    system_now_ns: int | None = None
    steady_now_ns: int | None = None
    checksummed: bool = field(default=True, compare=False)

    @property
    def is_v2(self) -> bool:
        return self.version == V2_VERSION

    @property
    def unchecked_clock_pair(self) -> bool:
        """A v2 manifest without a checksum: nothing vouches for its clock pair."""
        return self.is_v2 and not self.checksummed

    def encode(self) -> str:
        """The manifest text (no trailing newline, like upstream)."""
        if self.tag == V1_TAG and self.version == V1_VERSION:
            if self.system_now_ns is not None or self.steady_now_ns is not None:
                raise ManifestError("a v1 manifest carries no clock pair")
            if not is_valid_snapshot_id(self.snapshot_id):
                raise ManifestError(f"invalid snapshot id {self.snapshot_id!r}")
            return f"{V1_TAG}|{V1_VERSION}|{self.snapshot_id}"
        if self.tag == V2_TAG and self.version == V2_VERSION:
            text = (f"{V2_TAG}|{V2_VERSION}|{self.snapshot_id}|"
                    f"{self.system_now_ns}|{self.steady_now_ns}")
            if self.checksummed:
                text = f"{text}|{manifest_checksum(text)}"
            # Round-trip through the strict parser so nothing unparsable is ever published.
            if parse_manifest(text) != self:
                raise ManifestError(f"manifest does not round-trip: {self!r}")
            return text
        raise ManifestError(f"unknown manifest tag/version {self.tag!r}/{self.version!r}")


def v1_manifest(snapshot_id: str) -> SnapshotManifest:
    return SnapshotManifest(V1_TAG, V1_VERSION, snapshot_id)


def v2_manifest(snapshot_id: str, system_now_ns: int, steady_now_ns: int) -> SnapshotManifest:
    return SnapshotManifest(V2_TAG, V2_VERSION, snapshot_id, int(system_now_ns), int(steady_now_ns))


def check_clock_pair(manifest: SnapshotManifest) -> None:
    """Cross-check a v2 manifest's system time with its snapshot id: the writer names a snapshot
    after its system time S0 (:func:`snapshot_id_for`), bumped later, never earlier, when two
    snapshots share a millisecond or the wall clock stepped back (:class:`SnapshotIdAllocator`).
    An id earlier than S0 therefore means S0 was changed, and a later S0 would lengthen every
    restored lease: :class:`ManifestClockError`. (The steady time is cross-checked with the
    deadlines once the payloads are decoded: ``SnapshotState.check_deadline_horizon``.)"""
    if not manifest.is_v2:
        return
    id_ms = snapshot_id_ms(manifest.snapshot_id)
    if id_ms is None:
        raise ManifestClockError(f"snapshot id {manifest.snapshot_id} is not a calendar time")
    assert manifest.system_now_ns is not None  # set exactly for v2
    system_ms = manifest.system_now_ns // NS_PER_MS
    if system_ms > id_ms:
        raise ManifestClockError(f"system_now_ns {manifest.system_now_ns} is {system_ms - id_ms} ms after the "
                                 f"time of snapshot id {manifest.snapshot_id}, which is named after it")


def parse_manifest(data: str | bytes) -> SnapshotManifest:
    """Strictly parse manifest text or bytes (ASCII only)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("ascii")
        except UnicodeDecodeError as e:
            raise ManifestError(f"manifest is not ASCII: {e}") from None
    if not isinstance(data, str):
        raise ManifestError(f"manifest must be str or bytes, not {type(data).__name__}")
    parts = data.split("|")
    if len(parts) < 2:
        raise ManifestError(f"manifest has no tag|version: {data!r}")
    tag, version = parts[0], parts[1]
    if (tag, version) == (V1_TAG, V1_VERSION):
        if len(parts) != 3:
            raise ManifestError(f"v1 manifest needs 3 fields, got {len(parts)}")
    elif (tag, version) == (V2_TAG, V2_VERSION):
        if len(parts) not in (5, 6):
            raise ManifestError(f"v2 manifest needs 6 fields (5 before checksums; missing clock "
                                f"fields?), got {len(parts)}")
        if len(parts) == 6:
            if not _CHECKSUM.match(parts[5]):
                raise ManifestError(f"v2 manifest checksum field is malformed: {parts[5][:80]!r}")
            if manifest_checksum("|".join(parts[:5])) != parts[5]:
                raise ManifestError("v2 manifest checksum mismatch: its tag, version, id or clock "
                                    "pair changed after it was written")
    else:
        raise ManifestError(f"unsupported manifest tag/version {tag!r}/{version!r}")
    snapshot_id = parts[2]
    if not is_valid_snapshot_id(snapshot_id):
        raise ManifestError(f"invalid snapshot id {snapshot_id!r}")
    if len(parts) == 3:
        return SnapshotManifest(tag, version, snapshot_id)
    return SnapshotManifest(tag, version, snapshot_id,
                            parse_canonical_int64(parts[3], "system_now_ns"),
                            parse_canonical_int64(parts[4], "steady_now_ns"),
                            checksummed=len(parts) == 6)


def id_after(snapshot_id: str) -> str:
    """The id 1 ms after ``snapshot_id``. Restore checks a manifest's clock against its id's
    calendar time, so an id that is not one (a planted non-calendar or past-2262 directory)
    leaves nothing to write above it: refused, naming the directory to remove."""
    ms = snapshot_id_ms(snapshot_id)
    try:
        if ms is not None:
            return snapshot_id_for((ms + 1) * NS_PER_MS)
    except ManifestError:  # past what int64 ns can express
        pass
    raise SnapshotPublishError(f"no snapshot id sorts above {snapshot_id}, which is not a calendar time "
                               "int64 ns can express: remove that directory")


class SnapshotIdAllocator:
    """Ids for one writer of a repository: the wall-clock id, or the next id past the newest
    one present if that is not newer. Ids order the candidates, so a new snapshot must sort
    above every directory, also one planted with a far-future or non-calendar id; the
    repository is listed each time (another writer may have added one since)."""

    def __init__(self, list_ids) -> None:
        self._list_ids = list_ids   # newest first, as SnapshotRepository.list
        self._lock = threading.Lock()
        self._last_id = ""  # the newest id handed out ("" sorts below every id)

    def next_id(self, system_ns: int) -> str:
        sid = snapshot_id_for(system_ns)
        with self._lock:
            existing = self._list_ids()
            newest = max(existing[0] if existing else "", self._last_id)
            if sid <= newest:
                sid = id_after(newest)
            self._last_id = sid
        return sid
