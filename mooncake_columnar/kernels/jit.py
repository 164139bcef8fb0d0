"""The package's Numba decorators: ``njit`` (every kernel's) and ``kernel_only`` (a helper that
only other kernels call).

Compile cost counts (docs/architecture.md): besides the function itself, Numba builds two
wrappers per compiled function, each unpacking every argument (an array: seven fields) and each
optimised and turned into machine code again in every kernel that links the function in. A
kernel with 37 array arguments took 0.4 s to compile with them, 0.1 s without.

* The C-callable wrapper (``cfunc``) serves first-class function values, which no kernel here
  uses: ``njit`` turns it off for every kernel.
* The Python wrapper unboxes a call from Python. A helper that only kernels call (``kernel_only``)
  is compiled without it. Calling one from Python anyway would jump to a null pointer, so such
  a dispatcher refuses the call with a TypeError instead.
"""
from __future__ import annotations

from typing import Any, Callable

import numba
from numba.core.registry import CPUDispatcher

_NO_CFUNC: dict[str, Any] = {"no_cfunc_wrapper": True}  # Numba's own option, not in its stubs


def njit(*args: Any, **options: Any) -> Any:
    """``numba.njit`` with the same arguments, without the unused C-callable wrapper."""
    return numba.njit(*args, **{**_NO_CFUNC, **options})


class KernelOnly(CPUDispatcher):
    """A dispatcher compiled without a Python wrapper: kernels call it, Python may not."""

    def __call__(self, *args: Any, **kws: Any) -> Any:
        raise TypeError(f"{self.py_func.__qualname__} is compiled for calls from kernels only (no Python wrapper)")


def kernel_only(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: ``njit(cache=True, **options)`` without the Python wrapper (see the module doc)."""
    def wrap(fn: Callable[..., Any]) -> Any:
        if getattr(numba.config, "DISABLE_JIT", False):  # the kernels run as Python
            return fn
        targetoptions = {"nopython": True, "no_cpython_wrapper": True, **_NO_CFUNC, **options}
        disp = KernelOnly(py_func=fn, locals={}, targetoptions=targetoptions)
        disp.enable_caching()
        return disp
    return wrap
