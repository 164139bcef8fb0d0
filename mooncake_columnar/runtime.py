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

Every kernel is ``@njit(cache=True)``: Numba keeps its machine code in ``__pycache__`` beside the
source, which a read-only install (system site-packages, a container image) does not allow.
Numba then falls back to ``~/.cache/numba``, and where that is not writable either (a container
running as an arbitrary user with ``HOME=/``) importing the package raises ("no locator
available"). So when the package directory is not writable, the cache goes to
``$XDG_CACHE_HOME/mooncake-columnar/numba`` (``~/.cache/...``), which ``mooncake-columnar warmup``
fills and the README names; where that cannot be created, to a private temporary directory
(compiled in every process, but the import works). Numba has one cache directory per process
and reads it at decoration time, so it is set before any kernel module is imported; an explicit
``NUMBA_CACHE_DIR`` wins.

A cache left by an older version of the package can name a type that no longer exists (the
single read's StructRef of columns, since replaced by a column table). Numba unpickles a
kernel's whole cache index before it checks that the index is stale, so such an entry raised
AttributeError at the kernel's first call after an upgrade (numba/numba#6018, #10434). An index
that cannot be unpickled is treated here as the stale index it is: the kernel compiles and
Numba writes a fresh index over it.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

OMP_WAIT_POLICY = "PASSIVE"


def configure_threading_layer() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


def _writable(directory: Path) -> bool:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(directory, os.W_OK | os.X_OK)


def user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mooncake-columnar" / "numba"


def configure_numba_cache() -> None:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    package = Path(__file__).resolve().parent
    in_tree = package / "__pycache__"  # pip's install precompiles, so it usually exists (root-owned)
    if os.access(in_tree if in_tree.is_dir() else package, os.W_OK | os.X_OK):
        return
    cache_dir = user_cache_dir()
    if not _writable(cache_dir):
        cache_dir = Path(tempfile.mkdtemp(prefix="mooncake-columnar-numba-"))  # private: Numba unpickles from it
        atexit.register(shutil.rmtree, cache_dir, ignore_errors=True)
    os.environ["NUMBA_CACHE_DIR"] = str(cache_dir)
    if "numba.core.config" in sys.modules:  # numba imported first: it read the environment already
        sys.modules["numba.core.config"].reload_config()


def tolerate_stale_cache_indexes() -> None:
    from numba.core import caching

    load_index = caching.IndexDataCacheFile._load_index
    if getattr(load_index, "tolerates_stale_entries", False):
        return

    def _load_index(self: caching.IndexDataCacheFile) -> dict:
        try:
            return load_index(self)
        except (AttributeError, ImportError, EOFError, pickle.UnpicklingError) as exc:
            logging.getLogger(__name__).info("stale Numba cache index %s (%r): recompiling", self._index_path, exc)
            return {}

    _load_index.tolerates_stale_entries = True  # type: ignore[attr-defined]
    caching.IndexDataCacheFile._load_index = _load_index  # type: ignore[method-assign]


configure_threading_layer()
configure_numba_cache()
tolerate_stale_cache_indexes()  # after the two above: it imports Numba
