"""Argument validation and the lock decorator shared by the MasterService API."""
from __future__ import annotations

import functools
import re
from typing import Callable, TypeVar

import numpy as np

from .errors import InvalidParams, error_for_code
from .schema import MAX_KEY_BYTES

T = TypeVar("T")
_PRINTABLE = re.compile(r"^[\x20-\x7e]+$")


def locked(fn: Callable[..., T]) -> Callable[..., T]:
    """Run the method holding ``self._lock`` (a :class:`~.locking.MasterLock`), taken and left
    in turns (no lock convoys between client threads)."""
    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):  # every MasterService part holds self._lock
        lock = self._lock
        lock.take()
        try:
            return fn(self, *args, **kwargs)
        finally:
            lock.leave()
    return wrapper


def require_str(name: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise InvalidParams(f"{name} must be a str, got {type(value).__name__}")
    if not allow_empty and value == "":
        raise InvalidParams(f"{name} must not be empty")
    if not value.isascii():
        _utf8(name, value)
    return value


def _utf8(name: str, value: str) -> bytes:
    """UTF-8 bytes of ``value``; a lone surrogate (which no oplog entry, snapshot or Arrow
    column can carry) is InvalidParams here, before anything is reserved or mutated."""
    try:
        return value.encode()
    except UnicodeEncodeError:
        raise InvalidParams(f"{name} is not valid Unicode text (lone surrogate): {value!r}") from None


def require_int(name: str, value: object, lo: int, hi: int = 2**63 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidParams(f"{name} must be an int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise InvalidParams(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def require_bool(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidParams(f"{name} must be a bool, got {type(value).__name__}")
    return bool(value)


def validate_tenant(tenant: object) -> str:
    """Upstream TenantId validity: non-empty, no leading '_', printable ASCII."""
    t = require_str("tenant_id", tenant)
    if t.startswith("_") or not _PRINTABLE.match(t):
        raise InvalidParams(f"invalid tenant_id {t!r}")
    return t


def single_key(key: object) -> tuple[np.ndarray, np.ndarray]:
    """One key as (offsets, data) arrays, the shape every batch kernel takes."""
    k = require_str("key", key)
    data = np.frombuffer(k.encode(), np.uint8)  # require_str checked it encodes
    if data.size > MAX_KEY_BYTES:
        raise InvalidParams(f"key longer than {MAX_KEY_BYTES} bytes")
    return np.array([0, data.size], np.int64), data


def raise_code(code: int, what: str) -> None:
    if code != 0:
        raise error_for_code(code, what)


