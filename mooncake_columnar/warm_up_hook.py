"""The serving-path warm-up, as the modules that must run it see it.

warmup.py compiles every serving-path kernel by running a miniature of the whole system: the
service, a standby that promotes, snapshots written and restored. ``MasterService.start()``, a
standby's bootstrap and promote, and a forked snapshot writer run it, and all of them sit below
it. So warmup.py registers its ``warm_up_kernels`` here when it is imported (the package's
``__init__`` imports it, so that is before any of them runs), and they call :func:`warm_up`.
"""
from __future__ import annotations

from typing import Callable

_warm_up: Callable[[], float] | None = None


def register(warm_up_kernels: Callable[[], float]) -> None:
    """Make ``warm_up_kernels`` what :func:`warm_up` runs."""
    global _warm_up
    _warm_up = warm_up_kernels


def warm_up() -> float:
    """Run the registered warm-up (once per process: see warmup.py); its seconds, 0.0 when it was
    done already or none is registered."""
    return _warm_up() if _warm_up is not None else 0.0
