"""``nrt_free``: the loops of a serial kernel compiled without reference counting.

Helpers are inlined at Numba's IR level (``inline="always"``), and an inlined helper binds each
array it takes to a new variable: an NRT incref on entry and a decref on each way out, per
call. Numba's reference-count pruning removes the pair only when the helper is one straight
block; a helper that loops or returns early keeps them, atomic operations per key. In the
serial batch key lookup that was 6 increfs and up to 6 decrefs per key, and made it 4x slower
in cache (185 against 48 ms per 1M keys). (A ``prange`` body is lowered apart and kept none.)

So a serial kernel that calls such helpers per key is split in two: the kernel allocates its
outputs and scratch, and hands them with its inputs to an ``nrt_free`` function holding the
loops. That function allocates nothing and keeps no array past the call, so the caller's
references keep every array alive and nothing inside it needs counting.

A kernel that Python calls and that allocates nothing is ``nrt_free`` as a whole: with reference
counting, its wrapper wraps each array (or ``bytes``) argument in a new NRT meminfo at every call
(an allocation, its free and two reference counts: ~5% of the single-key read), and the
counting is more code to compile on an empty Numba cache.
"""
from __future__ import annotations

from typing import Any

from .jit import kernel_only, njit

_OPTIONS: dict[str, Any] = {"_nrt": False}  # Numba's own option, not in its stubs
nrt_free = njit(cache=True, **_OPTIONS)
nrt_free_core = kernel_only(**_OPTIONS)
"""An ``nrt_free`` function that only kernels call (:func:`.jit.kernel_only`): the cores that a
kernel hands its loops to."""
