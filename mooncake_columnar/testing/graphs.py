"""Strongly connected components of a directed graph (Tarjan's algorithm, iterative): import
cycles (tests/core/test_layering.py) and loops in compiled IR (testing/refcounts.py)."""
from __future__ import annotations

from typing import Iterator, Mapping


def strongly_connected_components(succ: Mapping[str, set[str]]) -> Iterator[list[str]]:
    """Every component of the graph ``succ`` (node -> successors; every successor a key),
    singletons included, each as its members."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(succ[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                yield comp
