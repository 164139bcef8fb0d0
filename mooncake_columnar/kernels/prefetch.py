"""Software prefetch of an array element: a hint that retires at once, so a kernel can start
the cache misses of many independent keys before it needs any of them (a plain load would hold
its slot in the CPU's reorder window until the data came, keeping few misses in flight).

``prefetch(array, index)`` with an integer index (1-D) or a tuple of them; a no-op when Numba's
JIT is disabled (the kernels then run as Python).
"""
from __future__ import annotations

from llvmlite import ir
from numba import config, types
from numba.core import cgutils
from numba.extending import intrinsic


@intrinsic
def _prefetch(typingctx, array, index):
    if not isinstance(array, types.Array):
        return None
    sig = types.void(array, index)

    def codegen(context, builder, signature, args):
        arrty, idxty = signature.args
        arr = context.make_array(arrty)(context, builder, args[0])
        if isinstance(idxty, types.BaseTuple):
            indices = [builder.extract_value(args[1], k) for k in range(len(idxty))]
            kinds = list(idxty)
        else:
            indices, kinds = [args[1]], [idxty]
        indices = [context.cast(builder, v, t, types.intp) for v, t in zip(indices, kinds)]
        ptr = cgutils.get_item_pointer(context, builder, arrty, arr, indices, wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        # read access, high temporal locality, data cache
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


# Rows: how far ahead a pass over sparse ascending rows (an eviction's 5%) starts their columns'
# loads. Each row's own work is tens of nanoseconds, a miss over a hundred: about ten rows'
# misses must be in flight.
ROWS_AHEAD = 16


def _no_prefetch(array, index) -> None:
    return None


prefetch = _no_prefetch if getattr(config, "DISABLE_JIT", False) else _prefetch
