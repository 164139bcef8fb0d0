"""Process settings the engine's parallel kernels need, applied when the package is imported.

Numba's parallel kernels run on its threading layer; here that is OpenMP (libgomp; TBB is not
installed). OpenMP's default wait policy keeps the worker threads spinning for a while after
every parallel region. On a small shared host (2 cores) those spinning workers take the core
that the caller, other client threads or the next region's workers need: the same sequence of
small parallel calls took 0.11-0.29 s or 1.6-1.9 s from one run to the next with the default
policy, 0.12-0.21 s every time with ``OMP_WAIT_POLICY=PASSIVE`` (workers sleep at once; waking
them costs tens of microseconds, nothing beside the milliseconds a region large enough to be
parallel runs).

The runtime reads the variable once, when it is loaded (at the first parallel call), so it is
set here, before any kernel runs. An explicit setting in the environment wins; so does an
OpenMP runtime the process loaded before importing this package.
"""
from __future__ import annotations

import os

OMP_WAIT_POLICY = "PASSIVE"


def configure_threading_layer() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


configure_threading_layer()
