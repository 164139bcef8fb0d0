"""Shared by the checks: the error, readable names of rows and segments, constants."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..errors import EngineInvariantError
from ..kernels import hashing as hk
from ..schema import FLAG_LIVE, KIND_MEMORY, ST_EMPTY, ReplicaStatus

if TYPE_CHECKING:
    from .engine import Engine

MEM = int(KIND_MEMORY)
PROCESSING = int(ReplicaStatus.PROCESSING)
COMPLETE = int(ReplicaStatus.COMPLETE)
EMPTY = int(ST_EMPTY)
ROW_MASK = np.int64(0xFFFFFFFF)
CHUNKS = 64  # parallel kernels split rows into this many chunks (first violation: lowest chunk)


def fail(check: str, message: str) -> None:
    raise EngineInvariantError(check, message)


def row_name(m: "Engine", row: int) -> str:
    """``row N (tenant T, key K)``; the key only when its reference is sane (never trusted)."""
    o = m.store.objects
    try:
        ref, t = int(o.key_ref[row]), int(o.tenant[row])
        off, ln = ref >> hk.KEY_LENGTH_BITS, ref & ((1 << hk.KEY_LENGTH_BITS) - 1)
        if 0 <= off and off + ln <= m.store.keys.arena_used and 0 <= t < len(m.store.tenants):
            key = bytes(m.store.keys.arena[off:off + ln]).decode("utf-8", "replace")
            state = "" if o.flags[row] & FLAG_LIVE else "free "  # a free row's key is its last one
            return f"{state}row {row} (tenant {m.store.tenants.name(t)!r}, key {key!r})"
    except (IndexError, ValueError):
        pass
    return f"row {row}"


def seg_name(m: "Engine", code: int) -> str:
    info = m.store.segments.info
    seg = info[code] if 0 <= code < len(info) else None
    return f"segment {seg.name!r} (code {code})" if seg else f"segment code {code}"

