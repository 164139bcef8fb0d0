"""Recycled snapshot payload files (local repositories only).

A deleted file's page cache is freed memory, which a VM with free page reporting hands back to its
host: the next snapshot's files would fault every page in again (about 2 ms per MB here). Payloads
that retention deletes can instead wait in :data:`RECYCLE_DIR` under the cluster directory (one
snapshot's worth of disk) and the next writer overwrites them in place, over pages still resident.

Everything here is an optimisation and fails towards "write a fresh file": a link, a file with other
links or anything resolving outside the repository root is dropped, never written through.
"""
from __future__ import annotations

import contextlib
import logging
import os
import stat
from typing import Callable

from .arrow_codec import OPTIONAL_PAYLOAD_FILES, PAYLOAD_FILES

log = logging.getLogger(__name__)

# Under the cluster directory; not a snapshot id, so listings and retention never see it.
RECYCLE_DIR = ".recycle"
RECYCLED_FILES = (*PAYLOAD_FILES, *OPTIONAL_PAYLOAD_FILES)


class RecycleBin:
    """The recycle directory of one local cluster directory ``base``; ``inside_root(path)`` says
    whether a path, following symlinks, stays inside the repository root (checked on every use:
    the tree may change under us)."""

    def __init__(self, base: str, inside_root: Callable[[str], bool]):
        self.base = base
        self.directory = f"{base}/{RECYCLE_DIR}"
        self._inside_root = inside_root

    def _usable(self) -> bool:
        return self._inside_root(self.base) and not os.path.islink(self.directory)

    def keep(self, snapshot_dir: str) -> None:
        """Move ``snapshot_dir``'s payload files (regular files only) into the recycle directory."""
        if not self._usable() or os.path.islink(snapshot_dir) or not self._inside_root(snapshot_dir):
            return  # a planted link: its files are not ours to keep
        try:
            os.makedirs(self.directory, exist_ok=True)
            if not self._usable() or not self._inside_root(self.directory):
                return
            for name in RECYCLED_FILES:
                src = f"{snapshot_dir}/{name}"
                if os.path.lexists(src) and stat.S_ISREG(os.lstat(src).st_mode):
                    os.replace(src, f"{self.directory}/{name}")
        except OSError as e:  # only an optimisation: the snapshot is deleted anyway
            log.info("snapshot retention: not recycling %s: %s", snapshot_dir, e)

    def take(self, name: str, tmp: str) -> int | None:
        """A recycled ``name`` renamed to ``tmp`` and opened for writing in place, or None."""
        if name not in RECYCLED_FILES or not self._usable():
            return None
        try:
            os.rename(f"{self.directory}/{name}", tmp)
        except OSError:  # none waiting (or another writer took it)
            return None
        try:
            fd = os.open(tmp, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            os.unlink(tmp)
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            os.unlink(tmp)
            return None
        return fd

    def stored_bytes(self) -> int:
        """Bytes of recycled payload files waiting for the next snapshot."""
        if not self._usable():
            return 0
        total = 0
        for name in RECYCLED_FILES:
            with contextlib.suppress(OSError):
                info = os.lstat(f"{self.directory}/{name}")
                total += info.st_size if stat.S_ISREG(info.st_mode) else 0
        return total
