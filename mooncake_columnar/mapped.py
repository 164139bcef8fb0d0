"""Local snapshot files read through memory maps, and their pages let go once read.

A local payload is memory-mapped (zero-copy: decoding reads the page cache in place). Every page
read stays in the process's resident set while its mapping lives, so a restore that reads the
whole file and then fills an engine of about the same size would hold both at its peak (at 100M
objects: ~12 GB each). :func:`release_mapped` drops the pages of every live mapping made here
from the resident set: ``madvise(MADV_DONTNEED)`` on a read-only shared file mapping, after
which the page cache still holds the bytes and a later read faults them back in without I/O
(the contents never change). The restore calls it between its passes over the columns.
"""
from __future__ import annotations

import mmap
import os
import weakref

import pyarrow as pa

# the mappings still in use: a mapping lives while any buffer or Arrow array over it does
_MAPPINGS: weakref.WeakSet[mmap.mmap] = weakref.WeakSet()
_CAN_RELEASE = hasattr(mmap, "MADV_DONTNEED") and hasattr(mmap.mmap, "madvise")


def map_file(path: str) -> pa.Buffer:
    """The bytes of the regular file ``path``, memory-mapped read-only (an empty file: an empty
    buffer). The mapping lives as long as the buffer, a slice of it or an Arrow array over it."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return pa.py_buffer(b"")
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    _MAPPINGS.add(mapping)
    return pa.py_buffer(mapping)


def release_mapped() -> None:
    """Drop every mapped page of the files :func:`map_file` mapped (still mapped) from this
    process's resident set; reading them again costs a minor fault per page. No-op where the
    platform has no madvise."""
    if not _CAN_RELEASE:
        return
    for mapping in list(_MAPPINGS):
        mapping.madvise(mmap.MADV_DONTNEED)
