"""The code blocks of README.md and docs/*.md run, so the documentation cannot drift from the code.

What runs, by the fence's info string:

- ``python``: executed with ``exec``. The blocks of one page share one namespace and run in page
  order: a later block may use what an earlier block of the same page defined, never what another
  page defined. The test of block k first runs blocks 0..k-1 of its page if they have not run yet
  (so ``-k`` selects any single block), and fails without running if one of them failed.
- ``sh``: not run (they start servers or install packages), unless the line before the fence is
  ``<!-- run -->``. Then each command in it must be a ``mooncake-columnar ...`` command line
  (``\\`` continues a line, ``#`` starts a comment) and must exit 0; it runs in this process
  through ``mooncake_columnar.tools.cli.main``, after the page's python blocks before it.
- ``text`` and any other info string: never run. A fence without an info string is an error:
  every block says what it is.

Each page runs in a fresh empty working directory of its own, so blocks may write relative paths
(``snapshots/``) and a later ``sh`` block of the page may read them. A failure names the page and
the line of the block, with the traceback in the page's own line numbers.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARKER = "<!-- run -->"
CHECKED = ("python", "sh")
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})(.*)$")


@dataclass(frozen=True)
class Block:
    page: Path
    index: int     # among the page's runnable blocks (python, and sh marked to run)
    line: int      # 1-based line of the opening fence
    info: str      # the fence's first word ("" when it has none)
    source: str
    run: bool

    @property
    def name(self) -> str:
        return self.page.relative_to(ROOT).as_posix()

    @property
    def where(self) -> str:
        return f"{self.name}:{self.line}"


def fences(page: Path) -> Iterator[Block]:
    """Every fenced block of ``page`` (CommonMark fences at column 0-3), runnable or not."""
    lines = page.read_text(encoding="utf-8").splitlines()
    i, runnable = 0, 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None or (m.group(2)[0] == "`" and "`" in m.group(3)):
            i += 1
            continue
        indent, fence, rest = len(m.group(1)), m.group(2), m.group(3).strip()
        info = rest.split()[0] if rest else ""
        previous = next((s.strip() for s in reversed(lines[:i]) if s.strip()), "")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            close = _FENCE.match(lines[j])
            if close and close.group(2)[0] == fence[0] and len(close.group(2)) >= len(fence) \
                    and not close.group(3).strip():
                break
            text = lines[j]
            body.append(text[min(indent, len(text) - len(text.lstrip(" "))):])  # a fence's indent, no more
            j += 1
        run = info == "python" or (info == "sh" and previous == RUN_MARKER)
        yield Block(page, runnable if run else -1, i + 1, info, "\n".join(body) + "\n", run)
        runnable += run
        i = j + 1


def runnable_blocks() -> list[Block]:
    return [b for page in PAGES if page.exists() for b in fences(page) if b.run]


BLOCKS = runnable_blocks()


@dataclass
class PageRun:
    """One page's shared namespace and working directory, and how far its blocks have run."""

    directory: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__docs__"})
    done: int = 0                  # blocks 0..done-1 ran
    failed: Block | None = None


class DocRunner:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.pages: dict[Path, PageRun] = {}

    def run(self, block: Block) -> None:
        page = self.pages.get(block.page)
        if page is None:
            directory = self.base / re.sub(r"[^A-Za-z0-9_.-]", "_", block.name)
            directory.mkdir()
            page = self.pages[block.page] = PageRun(directory)
        earlier = [b for b in BLOCKS if b.page == block.page and b.index < block.index]
        for b in earlier[page.done:]:
            self._one(page, b)
        if page.failed is not None:
            pytest.fail(f"{block.where}: not run, an earlier block of the page failed ({page.failed.where})",
                        pytrace=False)
        self._one(page, block)

    def _one(self, page: PageRun, block: Block) -> None:
        if page.failed is not None or block.index < page.done:
            return
        cwd = os.getcwd()
        os.chdir(page.directory)
        try:
            error = self._python(page, block) if block.info == "python" else self._sh(block)
        finally:
            os.chdir(cwd)
        page.done = block.index + 1
        if error is not None:
            page.failed = block
            pytest.fail(f"{block.where}: {block.info} block {block.index} of {block.name} failed\n{error}",
                        pytrace=False)

    @staticmethod
    def _python(page: PageRun, block: Block) -> str | None:
        path = str(block.page)
        # pad so that the compiled line numbers are the page's: tracebacks then show the page's lines
        code = compile("\n" * block.line + block.source, path, "exec")
        try:
            exec(code, page.namespace)
        except Exception as e:  # any failure of the block is the test's failure
            tb = e.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename != path:
                tb = tb.tb_next
            return "".join(traceback.format_exception(type(e), e, tb))
        return None

    @staticmethod
    def _sh(block: Block) -> str | None:
        from mooncake_columnar.tools.cli import main

        for number, command in commands(block):
            argv = shlex.split(command, comments=True)
            if not argv:
                continue
            if argv[0] != "mooncake-columnar":
                return f"line {number}: only `mooncake-columnar ...` commands can run in a checked block: {command}"
            out = io.StringIO()
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    rc = main(argv[1:])
            except SystemExit as e:  # argparse: --help, bad arguments
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except Exception:
                return f"line {number}: {command}\n{traceback.format_exc()}"
            sys.stdout.write(out.getvalue())
            if rc != 0:
                return f"line {number}: {command} exited {rc}; its output ends:\n{out.getvalue()[-3000:]}"
        return None


def commands(block: Block) -> Iterator[tuple[int, str]]:
    """(page line, command) of each command of an sh block; a trailing ``\\`` continues a line."""
    pending, start = "", 0
    for offset, raw in enumerate(block.source.splitlines()):
        if not pending:
            start = block.line + 1 + offset
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        yield start, pending + raw
        pending = ""
    if pending:
        yield start, pending


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> DocRunner:
    return DocRunner(tmp_path_factory.mktemp("docs"))


@pytest.mark.timeout(600)  # an empty Numba cache compiles what the blocks call; warm, a block takes < 2 s
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: f"{b.name}:block{b.index}")
def test_block_runs(runner: DocRunner, block: Block) -> None:
    t0 = time.perf_counter()
    runner.run(block)
    print(f"{block.where}: {time.perf_counter() - t0:.2f} s")


def test_every_fence_says_what_it_is() -> None:
    """A bare fence would be skipped silently: python that rots, or a command nobody checks."""
    bare = [b.where for page in PAGES if page.exists() for b in fences(page) if not b.info]
    assert not bare, f"fenced blocks without an info string (python, sh or text): {bare}"


def test_run_markers_precede_sh_blocks() -> None:
    """``<!-- run -->`` checks the sh block that follows it; anywhere else it would check nothing."""
    misplaced = []
    for page in PAGES:
        if not page.exists():
            continue
        marked = {b.line for b in fences(page) if b.info == "sh" and b.run}
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, text in enumerate(lines, 1):
            if text.strip() == RUN_MARKER:
                following = next((k for k in range(n, len(lines)) if lines[k].strip()), None)
                if following is None or following + 1 not in marked:
                    misplaced.append(f"{page.relative_to(ROOT).as_posix()}:{n}")
    assert not misplaced, f"{RUN_MARKER} not followed by an sh block: {misplaced}"


def test_docs_pages_have_a_title_and_their_links_resolve() -> None:
    """Each docs page starts with a `# ` title; relative links point at files that exist."""
    problems = []
    for page in PAGES:
        if not page.exists():
            continue
        text = page.read_text(encoding="utf-8")
        name = page.relative_to(ROOT).as_posix()
        if page.parent.name == "docs" and not text.startswith("# "):
            problems.append(f"{name}: no title on its first line")
        outside = {line for b in fences(page) for line in range(b.line, b.line + b.source.count("\n") + 2)}
        for n, line in enumerate(text.splitlines(), 1):
            if n in outside:
                continue
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                path = target.split("#", 1)[0]
                if not path or re.match(r"^[a-z][a-z0-9+.-]*:", path):
                    continue
                if not (page.parent / path).exists():
                    problems.append(f"{name}:{n}: link to {target} does not resolve")
    assert not problems, "\n".join(problems)


def test_files_the_docs_name_exist() -> None:
    """A `path/to/module.py` named in the docs exists, in the repository or in the package; a bare
    `module.py` exists somewhere in either."""
    tops = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]
    names = {f.name for d in tops for pattern in ("*.py", "*.ipynb") for f in d.rglob(pattern)}
    missing = []
    for page in PAGES:
        if not page.exists():
            continue
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for path in re.findall(r"`([A-Za-z0-9_./-]+\.(?:py|ipynb))(?![A-Za-z0-9_])", line):
                if "/" not in path and path in names:
                    continue
                if not any((base / path).exists() for base in (ROOT, ROOT / "mooncake_columnar")):
                    missing.append(f"{page.relative_to(ROOT).as_posix()}:{n}: {path}")
    assert not missing, "files named in the docs do not exist:\n" + "\n".join(missing)
