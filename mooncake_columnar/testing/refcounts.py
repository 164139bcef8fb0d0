"""Reference counting left inside a kernel's loops, read off its LLVM IR (see kernels/nrt_free.py).

An NRT incref or decref call in a block that lies on a cycle of the control-flow graph runs once
per iteration: an atomic operation per key where none is needed. :func:`loop_refcounts` counts
those calls in a compiled kernel's own functions; callees compiled on their own (``nrt_free``
cores, loaded from the Numba cache as machine code) are not part of its IR.
"""
from __future__ import annotations

from .graphs import strongly_connected_components

import re

from numba import njit

_DEFINE = re.compile(r"\ndefine ")
_NAME = re.compile(r'[^@]*@"?([^"(]+)')
_LABEL = re.compile(r"^([\w.$-]+):")
_TARGET = re.compile(r"label %\"?([\w.$-]+)\"?")
_REFCOUNT = ("@NRT_incref", "@NRT_decref")


def _blocks(body: str) -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {"entry": []}
    current = "entry"
    for line in body.split("\n"):
        m = _LABEL.match(line)
        if m:
            current = m.group(1)
            blocks[current] = []
        else:
            blocks[current].append(line)
    return blocks


def _cyclic(succ: dict[str, set[str]]) -> set[str]:
    """Blocks on some cycle: members of a strongly connected component of two or more blocks, or
    with an edge to themselves."""
    out: set[str] = set()
    for comp in strongly_connected_components(succ):
        if len(comp) > 1 or comp[0] in succ[comp[0]]:
            out.update(comp)
    return out


def ir_loop_refcounts(ir: str) -> dict[str, int]:
    """Per function defined in ``ir``: NRT incref/decref calls in blocks on a cycle (only >0)."""
    counts: dict[str, int] = {}
    for fn in _DEFINE.split(ir)[1:]:
        name = _NAME.match(fn)
        blocks = _blocks(fn.split("{", 1)[1])
        succ = {b: {t for line in lines for t in _TARGET.findall(line) if t in blocks}
                for b, lines in blocks.items()}
        n = sum(line.count(op) for b in _cyclic(succ) for line in blocks[b] for op in _REFCOUNT)
        if n:
            counts[name.group(1) if name else "?"] = n
    return counts


def loop_refcounts(kernel) -> dict[str, int]:
    """:func:`ir_loop_refcounts` of ``kernel`` (a Numba dispatcher that has run) compiled again,
    uncached, for each signature it has: IR is kept only for code compiled in this process."""
    fresh = njit(**{k: v for k, v in kernel.targetoptions.items() if k not in ("cache", "nopython")})(kernel.py_func)
    counts: dict[str, int] = {}
    for sig in kernel.signatures:
        fresh.compile(sig)
    for ir in fresh.inspect_llvm().values():
        counts.update(ir_loop_refcounts(ir))
    return counts
