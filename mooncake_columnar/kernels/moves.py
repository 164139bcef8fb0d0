"""Element moves within and between 1-d arrays, written as loops.

Numba's slice assignment (``a[i:j] = b[k:l]``) checks the shapes and, for the mismatch it
cannot rule out, compiles an error formatter (``str`` of ints, string concatenation): about a
second on an empty Numba cache, paid by the first kernel of a process that assigns a slice. The
first put of a fresh process runs these moves; a loop compiles to the same copy without it.
"""
from __future__ import annotations

from .jit import njit


@njit(inline="always", cache=True)
def move(dst, at, src, start, count):
    """``dst[at:at + count] = src[start:start + count]``; ``dst`` may be ``src`` (overlapping
    ranges move like ``memmove``)."""
    if at <= start:
        for k in range(count):
            dst[at + k] = src[start + k]
    else:
        for k in range(count - 1, -1, -1):
            dst[at + k] = src[start + k]
