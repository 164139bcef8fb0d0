"""Kernel variants chosen by input size: serial and GIL-holding for a few keys, nogil (and
parallel where the kernel is) for batches.

* A ``parallel=True`` kernel starts the threading layer's workers on every call, even for one
  element: tens of microseconds with a passive OpenMP runtime, and up to milliseconds on a busy
  2-core host with a spinning one. Single-key calls (a remove clears one replica slot) must
  never reach one.
* A ``nogil=True`` kernel drops the GIL on entry. For a batch that is what lets other client
  threads run (and queue for the master lock) meanwhile; for one key it only invites a thread
  switch in the middle of a call that holds the master lock: the woken thread finds the lock
  taken and sleeps again, and the caller waits to get the GIL back.

``variant`` compiles the same Python function again with other options. The copy gets its own
qualified name because numba keys its on-disk cache by name, not by options: without it a
serial variant could load the parallel machine code cached for the original.
"""
from __future__ import annotations

import types
from typing import Any, Callable

from numba import typeof
from numba.core.dispatcher import Dispatcher

from .jit import njit

BATCH_MIN = 4096  # keys (or rows): below, the serial variant that keeps the GIL; from here,
                  # the batch variant (nogil, and parallel where the kernel is). One cut-over
                  # (the bulk index delete's, as before), so that a warm-up call below it and
                  # one above compile every variant (warmup.py: 1 and 6000 keys).


def variant(kernel, suffix: str, **options):
    """``kernel``'s Python function compiled again with its own options updated by ``options``
    (``cache=True`` default; an ``nrt_free`` kernel's variants stay without reference counting)."""
    py = getattr(kernel, "py_func", kernel)  # NUMBA_DISABLE_JIT: njit returns the function itself
    options = {**{k: v for k, v in getattr(kernel, "targetoptions", {}).items() if k != "nopython"}, **options}
    fn = types.FunctionType(py.__code__, py.__globals__, py.__name__ + suffix, py.__defaults__, py.__closure__)
    fn.__qualname__ = py.__qualname__ + suffix
    fn.__module__ = py.__module__
    fn.__doc__ = py.__doc__
    options.setdefault("cache", True)
    return njit(**options)(fn)


def compiled(kernel, *args: Any) -> Callable[..., Any]:
    """``kernel``'s machine code for the types of ``args``, compiled or loaded from the cache as
    a call would. Calling it skips the dispatcher's per-call typing of each argument, which for
    an object such as a StructRef is a Python ``typeof`` (~2 us). It must only be called with
    arguments of those same types (a NumPy argument of another dtype would be misread): get it
    again whenever they may change."""
    if not isinstance(kernel, Dispatcher):  # NUMBA_DISABLE_JIT: the plain function
        return kernel
    return kernel.compile(tuple(typeof(a) for a in args))
