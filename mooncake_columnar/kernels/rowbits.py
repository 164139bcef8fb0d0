"""Row sets as bitsets: bit ``r & 63`` of uint64 word ``r >> 6``.

Remount marks up to every object of a master; one bit per row is an eighth of a boolean mask's
fresh memory (first touches are the dominant cost of a large fresh array) and lets passes over a
sparse set skip 64 rows per empty word.
"""
from __future__ import annotations

import numpy as np
from .jit import njit


@njit(inline="always", cache=True)
def words_for(rows):
    return (rows + 63) >> 6


@njit(inline="always", cache=True)
def has_bit(word, b):
    return (word >> np.uint64(b)) & np.uint64(1) != 0


@njit(inline="always", cache=True)
def bit(b):
    return np.uint64(1) << np.uint64(b)


def to_bool(bits: np.ndarray, rows: int) -> np.ndarray:
    """The bitset as a boolean mask of ``rows`` rows (tests, small tools)."""
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:rows].astype(np.bool_)


def from_bool(mask: np.ndarray) -> np.ndarray:
    """A boolean mask as a bitset."""
    packed = np.packbits(np.asarray(mask, np.bool_), bitorder="little")
    words = np.zeros((packed.size + 7) // 8 * 8, np.uint8)
    words[: packed.size] = packed
    return words.view(np.uint64)
