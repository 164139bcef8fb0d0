"""Test sizes that depend on whether the kernels are compiled.

`make test` runs the kernel tests a second time with ``NUMBA_DISABLE_JIT=1``: the kernels as plain
Python, one to two hundred times slower. Those runs check the same logic at sizes that still cross
the same boundaries (windows, regions, growths), so that the pass stays a couple of minutes.
"""
from __future__ import annotations

import numba

COMPILED = not numba.config.DISABLE_JIT


def compiled_or_plain(compiled: int, plain: int) -> int:
    """``compiled`` when the kernels are compiled, else ``plain``."""
    return compiled if COMPILED else plain
