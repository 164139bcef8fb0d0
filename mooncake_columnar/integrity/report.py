"""Shared by the checks: the error, readable names of rows and segments, constants."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import EngineInvariantError
from ..kernels import hashing as hk
from ..schema import FLAG_LIVE, KIND_MEMORY, ST_EMPTY, ReplicaStatus

if TYPE_CHECKING:
    from ..master import MasterService

MEM = int(KIND_MEMORY)
PROCESSING = int(ReplicaStatus.PROCESSING)
COMPLETE = int(ReplicaStatus.COMPLETE)
EMPTY = int(ST_EMPTY)
ROW_MASK = np.int64(0xFFFFFFFF)
CHUNKS = 64  # parallel kernels split rows into this many chunks (first violation: lowest chunk)


def fail(check: str, message: str) -> None:
    raise EngineInvariantError(check, message)


def row_name(m: "MasterService", row: int) -> str:
    """``row N (tenant T, key K)``; the key only when its reference is sane (never trusted)."""
    o = m.objects
    try:
        ref, t = int(o.key_ref[row]), int(o.tenant[row])
        off, ln = ref >> hk.KEY_LENGTH_BITS, ref & ((1 << hk.KEY_LENGTH_BITS) - 1)
        if 0 <= off and off + ln <= m.keys.arena_used and 0 <= t < len(m.tenants):
            key = bytes(m.keys.arena[off:off + ln]).decode("utf-8", "replace")
            state = "" if o.flags[row] & FLAG_LIVE else "free "  # a free row's key is its last one
            return f"{state}row {row} (tenant {m.tenants.name(t)!r}, key {key!r})"
    except (IndexError, ValueError):
        pass
    return f"row {row}"


def seg_name(m: "MasterService", code: int) -> str:
    info = m.segments.info
    return f"segment {info[code].name!r} (code {code})" if 0 <= code < len(info) and info[code] else \
        f"segment code {code}"

