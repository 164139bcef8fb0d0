"""Snapshot storage on ``pyarrow.fs``: layout, manifest-last publication, candidates, retention.

Layout (upstream's): ``<root>/<cluster_id>/<snapshot_id>/<payload>``, ``.../manifest.txt`` and
``<root>/<cluster_id>/latest.txt``. Local paths write a temp file and rename it (a reader never sees
half a file); on S3 each PUT is atomic and the manifest PUT is the commit point.

The storage is shared and may be changed by buggy writers or by anyone with write access, so this
module fails closed:

* every path is built from parts checked by ONE function, :func:`check_path_part` (cluster id,
  snapshot id, file name from a fixed set), for reading, writing and deleting, local and S3 alike;
  on a local root a path that resolves (through a symlink) outside the root is refused;
* ``latest.txt`` is a hint: a missing, malformed or dangling one falls back to the listing
  (:meth:`SnapshotRepository.candidate_plan` says why);
* retention counts only *published* snapshots (:meth:`SnapshotRepository.unpublished_reason`) and
  deletes an unpublished directory only once it has been idle for ``unpublished_grace_s``;
* storage errors other than "not found" raise :class:`SnapshotStorageUnavailable`, and S3 requests
  time out after ``timeout_s``.
"""
from __future__ import annotations

import builtins
import json
import logging
import math
import os
import stat
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeAlias

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import (
    InvalidParams,
    ManifestError,
    SnapshotError,
    SnapshotPayloadError,
    SnapshotPublishError,
    SnapshotStorageUnavailable,
)
from .arrow_codec import DIGEST_FILE
from ..mapped import map_file
from .manifest import (
    MANIFEST_FILE,
    V1_TAG,
    V1_VERSION,
    V2_TAG,
    V2_VERSION,
    is_valid_snapshot_id,
    parse_manifest,
    snapshot_id_ms,
)
from .recycle import RecycleBin

from .layout import (  # noqa: F401 (re-exported: the repository's layout names)
    CLUSTER_FILES,
    DEFAULT_CLUSTER_ID,
    LATEST_FILE,
    MAX_DIGEST_BYTES,
    MAX_LATEST_BYTES,
    MAX_MANIFEST_BYTES,
    SAVE_BACKUP_DIR,
    SNAPSHOT_FILES,
    V1_DESCRIPTOR_FILE,
    V1_PAYLOAD_FILES,
    check_path_part,
)

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_ATTEMPTS = 2
DEFAULT_UNPUBLISHED_GRACE_S = 3600.0


# What a file is written from: bytes-like, or an object that streams itself (``write_to(sink)``,
# e.g. arrow_codec.IpcPayload: the Arrow file is produced straight into the destination).
Data: TypeAlias = bytes | pa.Buffer | Any


def stored_size(data: Data) -> int:
    """Bytes ``data`` occupies once written (a streamed payload knows after its write)."""
    # hasattr(write_to) rules bytes out, but mypy does not narrow a union by hasattr
    return data.size if hasattr(data, "write_to") else len(data)  # type: ignore[union-attr]


def _write(out: pa.NativeFile, data: Data) -> None:
    if hasattr(data, "write_to"):
        data.write_to(out)
    else:
        out.write(data)


@dataclass(frozen=True)
class SnapshotFiles:
    """One stored snapshot: the manifest bytes exactly as stored, and every other file in it."""

    snapshot_id: str
    manifest: bytes
    payloads: dict[str, bytes]


@dataclass(frozen=True)
class CandidatePlan:
    """The restore order and why ``latest.txt`` was not followed (``notes``; empty when it was).

    ``latest`` is the id latest.txt names when it names a listed snapshot, else None.
    """

    ids: list[str]
    latest: str | None
    notes: list[str] = field(default_factory=list)


def _positive_number(name: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (value == 0 and not allow_zero):
        raise InvalidParams(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


class SnapshotRepository:
    """Complete snapshots of one cluster under a local path or an ``s3://`` URI.

    ``s3://bucket/prefix?endpoint_override=HOST:PORT&scheme=http`` reaches an S3-compatible server.
    ``backup_dir`` (a local path) receives every file of a snapshot whose upload failed.

    ``timeout_s``: S3 connect and request (stall) timeout; each request is attempted at most
    ``max_attempts`` times (50 ms, 100 ms... apart). An endpoint that refuses connections raises
    :class:`SnapshotStorageUnavailable` at once; one that accepts connections but never answers
    after about ``2 * timeout_s`` per attempt (measured with pyarrow 26: the stall detector
    counts whole seconds, so values under 1 s act as 1 s). Local I/O errors raise it too.
    ``unpublished_grace_s``: retention deletes a directory without a verified manifest only once
    neither its id's time nor any of its files' mtimes is newer than this (a writer may still be
    uploading it). ``require_manifest_checksum``: refuse v2 manifests written before manifest
    checksums existed (by default they are accepted with a logged warning unless an older
    snapshot of this repository already has a checksummed manifest; see :meth:`read_manifest`).
    """

    def __init__(self, uri: str | os.PathLike[str], cluster_id: str = DEFAULT_CLUSTER_ID,
                 backup_dir: str | os.PathLike[str] | None = None, *,
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 unpublished_grace_s: float = DEFAULT_UNPUBLISHED_GRACE_S,
                 require_manifest_checksum: bool = False):
        check_path_part("cluster_id", cluster_id)
        self.timeout_s = _positive_number("timeout_s", timeout_s)
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidParams(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        self.max_attempts = max_attempts
        self.unpublished_grace_s = _positive_number("unpublished_grace_s", unpublished_grace_s,
                                                    allow_zero=True)
        self.require_manifest_checksum = bool(require_manifest_checksum)
        uri = os.fspath(uri)
        if "://" not in uri:
            uri = os.path.abspath(uri)  # from_uri only takes absolute local paths
        self.fs, root = pafs.FileSystem.from_uri(uri)
        if isinstance(self.fs, pafs.S3FileSystem):
            # from_uri takes no timeouts: rebuild the filesystem from its own options with them
            # (pyarrow's defaults retry an unreachable endpoint for about 6 s, then raise OSError).
            # The default strategy's backoff is short and fixed (50 ms, 100 ms, ...); the
            # standard one sleeps a random time up to about a second between attempts.
            options = dict(self.fs.__reduce__()[1][0])
            options.update(connect_timeout=self.timeout_s, request_timeout=self.timeout_s)
            self.fs = pafs.S3FileSystem(
                **options, retry_strategy=pafs.AwsDefaultS3RetryStrategy(max_attempts=max_attempts))
        self.root = root.rstrip("/")
        self.base = f"{self.root}/{cluster_id}"
        self.cluster_id = cluster_id
        self.backup_dir = Path(backup_dir) if backup_dir is not None else None
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._real_root = os.path.realpath(self.root or "/") if self._local else None
        self._recycle_bin = RecycleBin(self.base, self._inside_root) if self._local else None

    @property
    def is_local(self) -> bool:
        """Files on this machine (their writes fill the page cache), not in an object store."""
        return self._local

    # ---- paths: every one is built here, from checked parts -------------------------------------
    def _dir(self, snapshot_id: str) -> str:
        return f"{self.base}/{check_path_part('snapshot_id', snapshot_id)}"

    def _file(self, snapshot_id: str, name: str) -> str:
        return f"{self._dir(snapshot_id)}/{check_path_part('file', name)}"

    def _cluster_file(self, name: str) -> str:
        return f"{self.base}/{check_path_part('cluster_file', name)}"

    def _path(self, *parts: str) -> str:
        """``(snapshot_id, file)``, ``(snapshot_id,)`` or ``(cluster_file,)``, each part checked."""
        if len(parts) == 2:
            return self._file(*parts)
        if len(parts) == 1:
            return self._cluster_file(parts[0]) if parts[0] in CLUSTER_FILES else self._dir(parts[0])
        raise InvalidParams(f"bad repository path parts {parts!r}")

    def _inside_root(self, path: str) -> bool:
        """Local: ``path`` (following symlinks) stays inside the root. Always true on S3."""
        if self._real_root is None:  # not local
            return True
        real = os.path.realpath(path)
        return real == self._real_root or real.startswith(self._real_root.rstrip(os.sep) + os.sep)

    # ---- low-level I/O --------------------------------------------------------------------------
    def _unavailable(self, what: str, error: OSError) -> SnapshotStorageUnavailable:
        return SnapshotStorageUnavailable(f"{what}: {type(error).__name__}: {error}")

    def _info(self, path: str) -> pafs.FileInfo:
        try:
            return self.fs.get_file_info(path)
        except OSError as e:
            raise self._unavailable(f"cannot stat {path}", e) from e

    def _ls(self, path: str) -> list[pafs.FileInfo]:
        if not self._inside_root(path):
            raise SnapshotPayloadError(f"{path} resolves outside the repository root: not listed")
        try:
            return self.fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
        except FileNotFoundError:
            return []
        except OSError as e:
            raise self._unavailable(f"cannot list {path}", e) from e

    def _put(self, path: str, data: Data) -> None:
        if self._local:
            parent = path.rsplit("/", 1)[0]
            # The directory must resolve inside the root. The file itself is replaced by a
            # rename, which replaces a planted symlink instead of writing through it.
            if not self._inside_root(parent):
                raise PermissionError(f"{parent} resolves outside the repository root: not written")
            self.fs.create_dir(parent, recursive=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            try:
                fd = self._recycle_bin.take(path.rsplit("/", 1)[1], tmp) if self._recycle_bin else None
                if fd is None:
                    with self.fs.open_output_stream(tmp) as out:
                        _write(out, data)
                else:  # over the recycled file's pages, in place, then cut to size
                    with os.fdopen(fd, "r+b") as f:
                        _write(f, data)
                        f.truncate()
                self.fs.move(tmp, path)
            finally:
                if self.fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    self.fs.delete_file(tmp)
        else:
            with self.fs.open_output_stream(path) as out:
                _write(out, data)

    def _read_file(self, path: str, limit: int | None = None) -> bytes | pa.Buffer | None:
        """A file's bytes, or None when it does not exist. A local file is memory-mapped
        (zero-copy: decoding reads the page cache in place); published files are never
        rewritten, only deleted, which a mapping survives. Raises SnapshotPayloadError for
        something that is not a regular file, is larger than ``limit``, or resolves outside the
        root; SnapshotStorageUnavailable for any other I/O error."""
        try:
            if self._local:
                if not self._inside_root(path):
                    raise SnapshotPayloadError(f"{path} resolves outside the repository root: not read")
                try:
                    st = os.stat(path)
                except FileNotFoundError:
                    return None
                if not stat.S_ISREG(st.st_mode):
                    raise SnapshotPayloadError(f"{path} is not a regular file")
                if limit is not None and st.st_size > limit:
                    raise SnapshotPayloadError(f"{path} is {st.st_size} bytes, more than {limit}")
                return map_file(path)  # pages let go by mapped.release_mapped
            # no stat first: opening an object already HEADs it (missing: FileNotFoundError)
            with self.fs.open_input_stream(path) as f:
                data = f.read(limit + 1) if limit is not None else f.readall()
            if limit is not None and len(data) > limit:
                raise SnapshotPayloadError(f"{path} is more than {limit} bytes")
            return data
        except FileNotFoundError:
            return None  # deleted between the stat and the read
        except OSError as e:
            raise self._unavailable(f"cannot read {path}", e) from e

    def _get(self, path: str, limit: int | None = None) -> bytes | pa.Buffer:
        data = self._read_file(path, limit)
        if data is None:
            raise SnapshotPayloadError(f"{path} does not exist")
        return data

    def _exists(self, path: str) -> bool:
        return self._info(path).type != pafs.FileType.NotFound

    def stored_bytes(self, snapshot_id: str) -> int:
        """Total size of the files of one snapshot (0 if it has none)."""
        return sum(info.size or 0 for info in self._ls(self._dir(snapshot_id))
                   if info.type == pafs.FileType.File)

    # ---- publication ----------------------------------------------------------------------------
    def publish(self, snapshot_id: str, payloads: Mapping[str, Data], manifest: str) -> None:
        """Upload payloads (in order), then ``manifest.txt`` LAST, then ``latest.txt``.

        Without a backup dir the first failure raises. With one, every payload upload is attempted
        (upstream behaviour); on any failure the manifest is not published, and every payload, the
        byte-identical manifest and latest.txt are saved under
        ``<backup_dir>/mooncake_snapshot_save_backup/<snapshot_id>/`` before raising.
        """
        check_path_part("snapshot_id", snapshot_id)
        if not payloads or MANIFEST_FILE in payloads:
            raise InvalidParams("payloads must be non-empty and exclude manifest.txt/latest.txt")
        for name in payloads:
            check_path_part("file", name)
        try:
            manifest_bytes = manifest.encode("ascii")
        except (AttributeError, UnicodeEncodeError):
            raise InvalidParams("the manifest must be ASCII text") from None
        fields = manifest.split("|")
        if len(fields) < 3 or fields[2] != snapshot_id:
            raise InvalidParams(f"the manifest does not name snapshot {snapshot_id}: {manifest[:120]!r}")
        if self._exists(self._file(snapshot_id, MANIFEST_FILE)):
            # A published snapshot is immutable: never rewrite files under a visible manifest.
            raise SnapshotPublishError(f"snapshot {snapshot_id} is already published")
        failed: list[str] = []
        for name, data in payloads.items():
            try:
                self._put(self._file(snapshot_id, name), data)
            except OSError as e:
                if self.backup_dir is None:
                    raise SnapshotPublishError(f"upload of {name} failed: {e}", (name,)) from e
                failed.append(name)
        if not failed:
            for name, path, data in ((MANIFEST_FILE, self._file(snapshot_id, MANIFEST_FILE),
                                      manifest_bytes),
                                     (LATEST_FILE, self._cluster_file(LATEST_FILE), snapshot_id.encode())):
                try:
                    self._put(path, data)
                except OSError as e:
                    if self.backup_dir is None:
                        raise SnapshotPublishError(f"upload of {name} failed: {e}", (name,)) from e
                    failed.append(name)
                    break
        if failed:
            self._save_backup(snapshot_id, payloads, manifest_bytes)
            raise SnapshotPublishError(f"snapshot {snapshot_id}: upload failed for {failed}; "
                                       f"saved to {self.backup_dir}", tuple(failed))

    def _save_backup(self, snapshot_id: str, payloads: Mapping[str, Data], manifest: bytes) -> None:
        assert self.backup_dir is not None
        target = self.backup_dir / SAVE_BACKUP_DIR / check_path_part("snapshot_id", snapshot_id)
        target.mkdir(parents=True, exist_ok=True)
        files = {**payloads, MANIFEST_FILE: manifest, LATEST_FILE: snapshot_id.encode()}
        for name, data in files.items():
            tmp = target / f".{name}.tmp-{uuid.uuid4().hex}"
            with pa.OSFile(str(tmp), "wb") as out:
                _write(out, data)
            tmp.replace(target / name)

    # ---- discovery ------------------------------------------------------------------------------
    def list(self) -> list[str]:
        """Valid snapshot ids present (any state), newest first."""
        ids = {info.base_name for info in self._ls(self.base)
               if info.type == pafs.FileType.Directory and is_valid_snapshot_id(info.base_name)}
        return sorted(ids, reverse=True)

    def read_latest(self) -> tuple[str | None, str | None]:
        """(the id in ``latest.txt``, trimmed as upstream, or None; why it is None)."""
        path = self._cluster_file(LATEST_FILE)
        try:
            raw = self._read_file(path, MAX_LATEST_BYTES)
        except SnapshotStorageUnavailable:
            raise
        except SnapshotError as e:
            return None, f"{LATEST_FILE} is unusable: {e}"
        if raw is None:
            return None, f"{LATEST_FILE} is absent"
        try:
            text = bytes(raw).decode("ascii").strip()
        except UnicodeDecodeError:
            return None, f"{LATEST_FILE} is not ASCII"
        if not is_valid_snapshot_id(text):
            return None, f"{LATEST_FILE} does not hold a valid snapshot id: {text[:40]!r}"
        return text, None

    def latest(self) -> str | None:
        """The id in ``latest.txt`` (trimmed, as upstream), or None if absent or invalid."""
        return self.read_latest()[0]

    def candidate_plan(self) -> CandidatePlan:
        """Restore order: the snapshot latest.txt names first, then every other listed id, newest
        first.

        Upstream leaves ids newer than latest.txt out as unfinished publications; here they come
        after latest.txt's snapshot, newest first, because the manifest is written only after
        every payload: a newer snapshot with a valid manifest is complete (its latest.txt upload
        failed, or latest.txt was rewritten), and one without fails its candidate check like any
        unpublished directory. A latest.txt that is absent, malformed or names no listed
        snapshot is ignored, and the reason is a note.
        """
        ids = self.list()
        latest, problem = self.read_latest()
        if latest is not None and latest not in ids:
            latest, problem = None, f"{LATEST_FILE} names {latest}, which does not exist"
        if latest is None:
            notes = [f"{problem}; restoring from the listed snapshots, newest first"] if ids else []
            return CandidatePlan(ids, None, notes)
        return CandidatePlan([latest] + [i for i in ids if i != latest], latest)

    def candidates(self) -> builtins.list[str]:
        """:meth:`candidate_plan`'s order."""
        return self.candidate_plan().ids

    # ---- reading --------------------------------------------------------------------------------
    def read_manifest(self, snapshot_id: str, notes: builtins.list[str] | None = None) -> bytes:
        """``manifest.txt`` of one snapshot, checked: at most 4 KiB of ASCII naming this
        snapshot; a v1/v2 manifest must parse strictly (a v2 checksum must match).

        A v2 manifest without a checksum (written before checksums existed) is refused when
        ``require_manifest_checksum`` is set, or when an older snapshot here already has a
        checksummed manifest (the writer was upgraded before this one was written: the checksum
        was stripped or truncated away). Otherwise it is accepted with a warning, logged and
        appended to ``notes``: upgrading restores from snapshots the previous version wrote.
        """
        raw = bytes(self._get(self._file(snapshot_id, MANIFEST_FILE), MAX_MANIFEST_BYTES))
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise ManifestError(f"manifest of {snapshot_id} is not ASCII") from None
        fields = text.split("|")
        if len(fields) < 3 or fields[2] != snapshot_id:
            raise ManifestError(f"manifest in directory {snapshot_id} does not name it: {text[:120]!r}")
        if fields[0] not in (V1_TAG, V2_TAG):
            return raw  # another format (standby snapshots): its reader parses it
        manifest = parse_manifest(text)
        if manifest.unchecked_clock_pair:
            if self.require_manifest_checksum:
                raise ManifestError(f"manifest of {snapshot_id} has no checksum and "
                                    "require_manifest_checksum is set")
            newer_than = self._checksummed_older_than(snapshot_id)
            if newer_than is not None:
                raise ManifestError(f"manifest of {snapshot_id} has no checksum although the older "
                                    f"snapshot {newer_than} has one: checksum stripped or truncated")
            note = (f"snapshot {snapshot_id}: v2 manifest without a checksum (written before "
                    "manifest checksums): its clock pair is unchecked")
            log.warning(note)
            if notes is not None:
                notes.append(note)
        return raw

    def _checksummed_older_than(self, snapshot_id: str) -> str | None:
        """The newest snapshot older than ``snapshot_id`` whose manifest is a checksummed v2."""
        for other in self.list():
            if other >= snapshot_id:
                continue
            try:
                raw = self._read_file(self._file(other, MANIFEST_FILE), MAX_MANIFEST_BYTES)
                if raw is None or not bytes(raw).startswith(f"{V2_TAG}|{V2_VERSION}|".encode()):
                    continue
                manifest = parse_manifest(bytes(raw))
            except SnapshotStorageUnavailable:
                raise
            except SnapshotError:
                continue
            if manifest.checksummed and manifest.snapshot_id == other:
                return other
        return None

    def read_payloads(self, snapshot_id: str, names: tuple[str, ...]) -> dict[str, bytes | pa.Buffer]:
        return {name: self._get(self._file(snapshot_id, name)) for name in names}

    def read(self, snapshot_id: str) -> SnapshotFiles:
        """The manifest and every other file of one snapshot (files named outside
        :data:`SNAPSHOT_FILES`, e.g. leftovers of interrupted local writes, are not read)."""
        manifest = self.read_manifest(snapshot_id)
        names = tuple(info.base_name for info in self._ls(self._dir(snapshot_id))
                      if info.type == pafs.FileType.File and info.base_name != MANIFEST_FILE
                      and info.base_name in SNAPSHOT_FILES)
        return SnapshotFiles(snapshot_id, manifest,
                             {k: bytes(v) for k, v in self.read_payloads(snapshot_id, names).items()})

    # ---- publication state ------------------------------------------------------------------------
    def unpublished_reason(self, snapshot_id: str) -> str | None:
        """None when ``snapshot_id`` is published, else why not.

        Published: :meth:`read_manifest` accepts the manifest (present, names this snapshot, a
        v2 checksum matches), and every payload it stands for is present: for v1 the upstream
        files, for v2 and standby snapshots every file ``digest.json`` lists, at the size it
        records. (Payload checksums are left to the restore: checking them means reading every
        byte.) Raises SnapshotStorageUnavailable when the storage cannot tell.
        """
        try:
            raw = self.read_manifest(snapshot_id)
        except SnapshotStorageUnavailable:
            raise
        except SnapshotError as e:
            return f"manifest: {e}"
        tag, version = raw.decode("ascii").split("|")[:2]
        sizes = {info.base_name: info.size for info in self._ls(self._dir(snapshot_id))
                 if info.type == pafs.FileType.File}
        if (tag, version) == (V1_TAG, V1_VERSION):
            missing = [n for n in V1_PAYLOAD_FILES if n not in sizes]
            return f"missing v1 payloads {missing}" if missing else None
        try:
            digest_raw = self._read_file(self._file(snapshot_id, DIGEST_FILE), MAX_DIGEST_BYTES)
        except SnapshotStorageUnavailable:
            raise
        except SnapshotError as e:
            return f"{DIGEST_FILE}: {e}"
        if digest_raw is None:
            return f"no {DIGEST_FILE}"
        try:
            files = json.loads(bytes(digest_raw))["files"]
            listed = {name: entry["size"] for name, entry in files.items()}
        except (ValueError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            return f"{DIGEST_FILE} is malformed: {type(e).__name__}"
        if not listed:
            return f"{DIGEST_FILE} lists no payload"
        for name, size in listed.items():
            if name not in SNAPSHOT_FILES or name in (MANIFEST_FILE, DIGEST_FILE):
                return f"{DIGEST_FILE} lists an unexpected file {name[:40]!r}"
            if type(size) is not int or sizes.get(name) != size:
                return f"payload {name}: {sizes.get(name)} bytes present, {DIGEST_FILE} says {size!r}"
        return None

    def published(self) -> builtins.list[str]:
        """Ids of the published snapshots (:meth:`unpublished_reason`), newest first."""
        return [sid for sid in self.list() if self.unpublished_reason(sid) is None]

    def _last_activity_ms(self, snapshot_id: str) -> float | None:
        """The newest of the id's own time and the mtimes of the directory and its files (Unix
        ms), or None when nothing tells (then the directory is never judged stale)."""
        times: builtins.list[float | None] = [snapshot_id_ms(snapshot_id)]
        path = self._dir(snapshot_id)
        if self._local and os.path.islink(path):  # the link's own time: never look through it
            times.append(os.lstat(path).st_mtime_ns / 1e6)
        else:
            infos = [self._info(path), *self._ls(path)]
            times += [info.mtime_ns / 1e6 for info in infos if info.mtime_ns is not None]
        known = [t for t in times if t is not None]
        return max(known) if known else None

    # ---- retention ------------------------------------------------------------------------------
    def retain(self, count: int, *, unpublished_grace_s: float | None = None,
               now_ms: float | None = None, recycle: bool = False) -> builtins.list[str]:
        """Keep the newest ``count`` *published* snapshots and the one latest.txt names; delete
        the other published ones, and unpublished directories idle for longer than
        ``unpublished_grace_s`` (default: the repository's). Returns the deleted ids, newest first.

        Half-written directories of a crashed writer (no manifest, or one that does not verify)
        are never counted, so they cannot push the last good snapshot out. A storage error while
        judging any directory raises SnapshotStorageUnavailable before anything is deleted.
        ``recycle`` (local only): a deleted published snapshot's payload files are kept for the
        next snapshot's writer to overwrite in place (see :mod:`.recycle`).
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise InvalidParams(f"retain count must be an int >= 1, got {count!r}")
        grace_s = self.unpublished_grace_s if unpublished_grace_s is None else \
            _positive_number("unpublished_grace_s", unpublished_grace_s, allow_zero=True)
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        latest = self.latest()
        ids = self.list()
        published: list[str] = []
        stale: set[str] = set()
        for sid in ids:
            reason = self.unpublished_reason(sid)
            if reason is None:
                published.append(sid)
                continue
            last = self._last_activity_ms(sid)
            if last is not None and now_ms - last > grace_s * 1000:
                log.info("snapshot retention: %s is unpublished (%s) and idle since %.0f ms",
                         sid, reason, last)
                stale.add(sid)
        keep = set(published[:count]) | {latest}
        doomed = [sid for sid in ids if sid not in keep and (sid in stale or sid in published)]
        for sid in doomed:
            if recycle and sid in published and self._recycle_bin is not None:
                self._recycle_bin.keep(self._dir(sid))
            self._delete_snapshot(sid)
        return doomed

    def recycled_bytes(self) -> int:
        """Bytes of recycled payload files waiting for the next snapshot (0 on S3)."""
        return self._recycle_bin.stored_bytes() if self._recycle_bin is not None else 0

    def _delete_snapshot(self, snapshot_id: str) -> None:
        path = self._dir(snapshot_id)
        # The cluster directory must resolve inside the root; a symlinked snapshot directory is
        # removed as a link (pyarrow does not follow links when deleting).
        if not self._inside_root(self.base):
            raise SnapshotPayloadError(f"{self.base} resolves outside the repository root: not deleted")
        try:
            self.fs.delete_dir(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise self._unavailable(f"cannot delete {path}", e) from e
