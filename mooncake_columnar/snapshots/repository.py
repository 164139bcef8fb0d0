"""Snapshot storage on ``pyarrow.fs``: layout, manifest-last publication, candidates, retention.

Layout (upstream's): ``<root>/<cluster_id>/<snapshot_id>/<payload>``, ``.../manifest.txt`` and
``<root>/<cluster_id>/latest.txt``. Local paths write a temp file and rename it (a reader never sees
half a file); on S3 each PUT is atomic and the manifest PUT is the commit point.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from ..errors import InvalidParams, SnapshotPayloadError, SnapshotPublishError
from .manifest import MANIFEST_FILE, is_valid_snapshot_id

LATEST_FILE = "latest.txt"
DEFAULT_CLUSTER_ID = "mooncake_cluster"
SAVE_BACKUP_DIR = "mooncake_snapshot_save_backup"


# What a file is written from: bytes-like, or an object that streams itself (``write_to(sink)``,
# e.g. arrow_codec.IpcPayload: the Arrow file is produced straight into the destination).
Data = bytes | pa.Buffer | Any


def stored_size(data: Data) -> int:
    """Bytes ``data`` occupies once written (a streamed payload knows after its write)."""
    return data.size if hasattr(data, "write_to") else len(data)


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


class SnapshotRepository:
    """Complete snapshots of one cluster under a local path or an ``s3://`` URI.

    ``s3://bucket/prefix?endpoint_override=HOST:PORT&scheme=http`` reaches an S3-compatible server.
    ``backup_dir`` (a local path) receives every file of a snapshot whose upload failed.
    """

    def __init__(self, uri: str | os.PathLike[str], cluster_id: str = DEFAULT_CLUSTER_ID,
                 backup_dir: str | os.PathLike[str] | None = None):
        uri = os.fspath(uri)
        if "://" not in uri:
            uri = os.path.abspath(uri)  # from_uri only takes absolute local paths
        self.fs, root = pafs.FileSystem.from_uri(uri)
        root = root.rstrip("/")
        if "/" in cluster_id:
            raise InvalidParams(f"cluster_id must not contain '/': {cluster_id!r}")
        self.base = f"{root}/{cluster_id}" if cluster_id else root
        self.cluster_id = cluster_id
        self.backup_dir = Path(backup_dir) if backup_dir is not None else None
        self._local = isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def is_local(self) -> bool:
        """Files on this machine (their writes fill the page cache), not in an object store."""
        return self._local

    def stored_bytes(self, snapshot_id: str) -> int:
        """Total size of the files of one snapshot (0 if it has none)."""
        selector = pafs.FileSelector(self._path(snapshot_id), recursive=False, allow_not_found=True)
        return sum(info.size or 0 for info in self.fs.get_file_info(selector)
                   if info.type == pafs.FileType.File)

    # ---- low-level I/O --------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join((self.base, *parts))

    def _put(self, path: str, data: Data) -> None:
        if self._local:
            self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            try:
                with self.fs.open_output_stream(tmp) as out:
                    _write(out, data)
                self.fs.move(tmp, path)
            finally:
                if self.fs.get_file_info(tmp).type != pafs.FileType.NotFound:
                    self.fs.delete_file(tmp)
        else:
            with self.fs.open_output_stream(path) as out:
                _write(out, data)

    def _get(self, path: str) -> bytes | pa.Buffer:
        """A file's bytes; a local file is memory-mapped (zero-copy: decoding reads the page
        cache in place). Published files are never rewritten, only deleted, which a mapping
        survives."""
        try:
            if self._local:
                with pa.memory_map(path) as f:
                    return f.read_buffer()
            with self.fs.open_input_stream(path) as f:
                return f.readall()
        except FileNotFoundError:
            raise SnapshotPayloadError(f"{path} does not exist") from None

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type != pafs.FileType.NotFound

    # ---- publication ----------------------------------------------------------------------------
    def publish(self, snapshot_id: str, payloads: dict[str, Data], manifest: str) -> None:
        """Upload payloads (in order), then ``manifest.txt`` LAST, then ``latest.txt``.

        Without a backup dir the first failure raises. With one, every payload upload is attempted
        (upstream behaviour); on any failure the manifest is not published, and every payload, the
        byte-identical manifest and latest.txt are saved under
        ``<backup_dir>/mooncake_snapshot_save_backup/<snapshot_id>/`` before raising.
        """
        if not is_valid_snapshot_id(snapshot_id):
            raise InvalidParams(f"invalid snapshot id {snapshot_id!r}")
        if MANIFEST_FILE in payloads or LATEST_FILE in payloads or not payloads:
            raise InvalidParams("payloads must be non-empty and exclude manifest.txt/latest.txt")
        for name in payloads:
            if not name or "/" in name or name.startswith("."):
                raise InvalidParams(f"bad payload name {name!r}")
        manifest_bytes = manifest.encode("ascii")
        if self._exists(self._path(snapshot_id, MANIFEST_FILE)):
            # A published snapshot is immutable: never rewrite files under a visible manifest.
            raise SnapshotPublishError(f"snapshot {snapshot_id} is already published")
        failed: list[str] = []
        for name, data in payloads.items():
            try:
                self._put(self._path(snapshot_id, name), data)
            except OSError as e:
                if self.backup_dir is None:
                    raise SnapshotPublishError(f"upload of {name} failed: {e}", (name,)) from e
                failed.append(name)
        if not failed:
            for name, path, data in ((MANIFEST_FILE, self._path(snapshot_id, MANIFEST_FILE),
                                      manifest_bytes),
                                     (LATEST_FILE, self._path(LATEST_FILE), snapshot_id.encode())):
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

    def _save_backup(self, snapshot_id: str, payloads: dict[str, Data], manifest: bytes) -> None:
        assert self.backup_dir is not None
        target = self.backup_dir / SAVE_BACKUP_DIR / snapshot_id
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
        selector = pafs.FileSelector(self.base, recursive=False, allow_not_found=True)
        ids = {info.base_name for info in self.fs.get_file_info(selector)
               if info.type == pafs.FileType.Directory and is_valid_snapshot_id(info.base_name)}
        return sorted(ids, reverse=True)

    def latest(self) -> str | None:
        """The id in ``latest.txt`` (trimmed, as upstream), or None if absent or invalid."""
        path = self._path(LATEST_FILE)
        if not self._exists(path):
            return None
        try:
            text = bytes(self._get(path)).decode("ascii").strip()
        except UnicodeDecodeError:
            return None
        return text if is_valid_snapshot_id(text) else None

    def candidates(self) -> list[str]:
        """Restore order: latest first, then older ids newest to oldest.

        As upstream, ids newer than latest.txt are left out: their publication never completed.
        Without a usable latest.txt every id is a candidate.
        """
        latest, ids = self.latest(), self.list()
        if latest is None:
            return ids
        return [latest] + [i for i in ids if i < latest]

    # ---- reading --------------------------------------------------------------------------------
    def read_manifest(self, snapshot_id: str) -> bytes:
        return bytes(self._get(self._path(snapshot_id, MANIFEST_FILE)))

    def read_payloads(self, snapshot_id: str, names: tuple[str, ...]) -> dict[str, bytes | pa.Buffer]:
        return {name: self._get(self._path(snapshot_id, name)) for name in names}

    def read(self, snapshot_id: str) -> SnapshotFiles:
        """The manifest and every other file of one snapshot."""
        if not is_valid_snapshot_id(snapshot_id):
            raise InvalidParams(f"invalid snapshot id {snapshot_id!r}")
        manifest = self.read_manifest(snapshot_id)
        selector = pafs.FileSelector(self._path(snapshot_id), recursive=False)
        names = tuple(info.base_name for info in self.fs.get_file_info(selector)
                      if info.type == pafs.FileType.File and info.base_name != MANIFEST_FILE
                      and ".tmp-" not in info.base_name)  # leftovers of interrupted local writes
        return SnapshotFiles(snapshot_id, manifest,
                             {k: bytes(v) for k, v in self.read_payloads(snapshot_id, names).items()})

    # ---- retention ------------------------------------------------------------------------------
    def retain(self, count: int) -> list[str]:
        """Delete all but the newest ``count`` snapshots (never the one in latest.txt).

        Returns the deleted ids.
        """
        if count < 1:
            raise InvalidParams(f"retain count must be >= 1, got {count}")
        latest = self.latest()
        doomed = [i for i in self.list()[count:] if i != latest]
        for snapshot_id in doomed:
            self.fs.delete_dir(self._path(snapshot_id))
        return doomed
