"""Progress of long command-line runs (a bench at 100M objects, verifying snapshots), drawn with
``rich`` on stderr only: stdout stays the command's output (one JSON object under ``--json``).
Shown when stderr is a terminal or ``--progress`` asks for it; transient (gone when done)."""
from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator


def wanted(asked: bool) -> bool:
    """Show progress: ``--progress`` was given, or stderr is a terminal."""
    return asked or sys.stderr.isatty()


def _progress():
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True)


@contextlib.contextmanager
def bar(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """``advance(n)``: n more of ``total`` done."""
    if not enabled:
        yield lambda n: None
        return
    with _progress() as p:
        task = p.add_task(label, total=total)
        yield lambda n: p.advance(task, n)


@contextlib.contextmanager
def steps(labels: list[str], enabled: bool) -> Iterator[Callable[[str], None]]:
    """``step(label)``: the run moved on to the next of ``labels`` (one of them, in any order)."""
    if not enabled:
        yield lambda label: None
        return
    with _progress() as p:
        task = p.add_task("", total=len(labels))
        started: list[str] = []

        def step(label: str) -> None:
            if started:
                p.advance(task, 1)
            started.append(label)
            p.update(task, description=label)
        yield step
