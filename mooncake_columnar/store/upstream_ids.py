"""Upstream's UUID strings: segment and client ids as ``UuidToString`` renders them.

Upstream identifies a client and each mounted segment by a 128-bit UUID, written in snapshots as
``"<u64>-<u64>"`` (two decimal halves). The engine keeps segment ids in that form (one per
segment, generated like upstream's random ``UUID`` when a mount carries none) so a v1 rollback
snapshot gives each segment back the id its client mounts it with.
"""
from __future__ import annotations

import re
import secrets

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UUID_PATTERN = r"^[0-9]{1,20}-[0-9]{1,20}$"
_UUID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})\Z")
_U64 = (1 << 64) - 1


def is_upstream_uuid(value: object) -> bool:
    """Whether ``value`` is a ``"<u64>-<u64>"`` string (each half at most 2**64 - 1)."""
    if type(value) is not str:
        return False
    m = _UUID.match(value)
    return m is not None and int(m.group(1)) <= _U64 and int(m.group(2)) <= _U64


def new_upstream_uuid() -> str:
    """A fresh random id in upstream's form (upstream draws its UUIDs at random too)."""
    return f"{secrets.randbits(64)}-{secrets.randbits(64)}"


def first_bad_uuid(values: pa.Array | pa.ChunkedArray) -> int:
    """Index of the first string of ``values`` that is not upstream's UUID form (a half above
    2**64 - 1 included), or -1: two vectorized passes, no per-row Python."""
    if len(values) == 0:
        return -1
    bad = np.flatnonzero(~pc.fill_null(pc.match_substring_regex(values, UUID_PATTERN), False)
                         .to_numpy(zero_copy_only=False))
    if bad.size:
        return int(bad[0])
    # every value is "<digits>-<digits>": 20-digit halves compare as strings, and only those
    # above 2**64 - 1 are out of range
    halves = pc.split_pattern(values, "-")
    wide = np.zeros(len(values), np.bool_)
    for i in (0, 1):
        part = pc.list_element(halves, i)
        wide |= pc.and_(pc.equal(pc.utf8_length(part), 20),
                        pc.greater(part, str(_U64))).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(wide)
    return int(bad[0]) if bad.size else -1
