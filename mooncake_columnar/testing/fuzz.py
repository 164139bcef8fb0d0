"""Seeded fuzzing of every stored format, run in worker subprocesses so a crash is counted.

A case is ``(format, seed)``: the seed picks a pristine corpus and one mutation (raw bytes,
inside a zstd frame, or a forged value with the digest/checksum recomputed; see
:mod:`.fuzz_formats`). A worker decodes the case, loads it into a fresh MasterService and runs
``verify()`` plus a put/remove probe, and answers one JSON line. The parent feeds cases one at a
time; a worker that dies is a crash of the case it was on, one that does not answer within the
timeout is a hang, and a new worker continues with the next case.

Outcomes: ``rejected`` (a MooncakeError) and ``accepted`` (loaded, verified) are fine;
``crash``, ``untyped`` (any other exception), ``hang``, ``broken`` (loaded but failing verify()
or the probe) and ``partial`` (a v1 candidate accepted with fewer objects than the unmutated
one: a silently dropped shard) are failures.

``python -m mooncake_columnar.testing.fuzz --cases 1000`` prints the summary table;
``--repro FORMAT SEED`` reruns one case in this process with its traceback.
"""
from __future__ import annotations

import argparse
import faulthandler
import json
import os
import random
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from contextlib import ExitStack
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

from ..errors import InvalidParams, MooncakeError
from ..master import MasterService
from .fuzz_formats import CONFIG, ETCD_ENV, FORMATS, V1_FIXTURES_ENV, WRITER, Corpus, Format, cleanup_dropped, clocks
from .fuzz_mutate import mutate_bytes, mutate_zstd, zstd_bomb

OK_OUTCOMES = ("rejected", "accepted")
FAILURE_OUTCOMES = ("crash", "untyped", "hang", "broken", "partial", "memory")
MEMORY_LIMIT_MB = 300  # the most a case may add to the worker's peak memory (issue 13: zstd bombs)
_COLUMNS = (("cases", None), ("rejected-typed", "rejected"), ("accepted-ok", "accepted"), ("crashes", "crash"),
            ("untyped", "untyped"), ("hangs", "hang"), ("broken engines", "broken"), ("partial", "partial"),
            (f"mem>{MEMORY_LIMIT_MB}MB", "memory"))


# ---- the harness's own self-test: a case that crashes, hangs, raises or loads, by its seed -----------

_SELFTEST_CASES = ("segfault", "hang", "untyped", "rejected", "accepted")


def _selftest_load(root: Path) -> MasterService:
    behaviour = (root / "case").read_text()
    if behaviour == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif behaviour == "hang":
        threading.Event().wait()  # never set: the parent's timeout ends it
    elif behaviour == "untyped":
        raise ValueError("an untyped error")
    elif behaviour == "rejected":
        raise InvalidParams("a typed refusal")
    return MasterService(CONFIG, clocks=clocks())


SELFTEST = Format("harness_selftest", len(_SELFTEST_CASES), lambda v: {"case": _SELFTEST_CASES[v].encode()},
                  lambda files, v, rng: (files, _SELFTEST_CASES[v]), _selftest_load, weights=(0, 0, 1, 0))


def _format(name: str) -> Format:
    return SELFTEST if name == SELFTEST.name else FORMATS[name]


# ---- one case -----------------------------------------------------------------------------------

@lru_cache(maxsize=None)
def _corpus(name: str, variant: int) -> Corpus:
    return _format(name).corpus(variant)


def mutate(fmt: Format, seed: int) -> tuple[Corpus, str, int]:
    """(mutated corpus, description, variant) of case ``seed``; deterministic."""
    rng = random.Random(f"{fmt.name}/{seed}")
    variant = seed % fmt.variants
    files = dict(_corpus(fmt.name, variant))
    kind = rng.choices(("raw", "zstd", "forged", "delete"), weights=fmt.weights)[0]
    frames = sorted(p for p in files if fmt.zstd_files and p.endswith(fmt.zstd_files))
    mutator = zstd_bomb if rng.random() < 0.05 else mutate_zstd
    if kind == "zstd" and fmt.zstd_inner is not None and (not frames or rng.random() < 0.6):
        files, what = fmt.zstd_inner(files, rng, mutator)
        return files, what, variant
    if kind == "zstd" and frames:
        path = rng.choice(frames)
        files[path], what = mutator(files[path], rng)
        return files, f"{path}: {what}", variant
    if kind == "raw":
        path = rng.choice(sorted(files))
        files[path], what = mutate_bytes(files[path], rng)
        if rng.random() < 0.75:
            files, what = fmt.reseal(files, path), what + " (digests recomputed)"
        return files, f"{path}: {what}", variant
    if kind == "delete" and len(files) > 1:
        path = rng.choice(sorted(files))
        del files[path]
        return files, f"{path} deleted", variant
    files, what = fmt.forge(files, variant, rng)
    return files, what, variant


def _probe(master: Any) -> None:
    """A put and a remove on the loaded engine: typed refusals are fine, anything else means
    the loaded state broke it (e.g. an id or size past int64)."""
    key = "__fuzz_probe__"
    try:
        master.put_start(key, 4096, client_id=WRITER)
        master.put_end(key, client_id=WRITER)
        master.remove(key)
    except MooncakeError:
        pass


def _where(exc: BaseException) -> str:
    """The innermost frame of this package in the traceback (groups failures by site)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "mooncake_columnar" in f.filename
              and "/testing/" not in f.filename] or traceback.extract_tb(exc.__traceback__)
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


@lru_cache(maxsize=None)
def _baseline(name: str, variant: int) -> int:
    with tempfile.TemporaryDirectory(prefix="mooncake-fuzz-") as tmp:
        _format(name).stage(dict(_corpus(name, variant)), Path(tmp))
        return _format(name).load(Path(tmp)).object_count()


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(name: str, seed: int) -> dict[str, Any]:
    """:func:`classify` one case, and flag it ``memory`` if it raised this process's peak
    memory by more than MEMORY_LIMIT_MB (the peak is a high-water mark: the worker then exits)."""
    fmt = _format(name)
    files, what, variant = mutate(fmt, seed)
    before = _peak_mb()
    out = classify(fmt, files, variant)
    grown = _peak_mb() - before
    out = {"format": name, "seed": seed, "mutation": what, **out, "peak_growth_mb": round(grown)}
    if grown > MEMORY_LIMIT_MB:
        out.update(outcome="memory", restart=True, was=out["outcome"], where=out.get("where", ""),
                   detail=f"peak memory grew by {grown:.0f} MB (was {out['outcome']}: {out.get('error', '')})")
    return out


def classify(fmt: Format, files: Corpus, variant: int) -> dict[str, Any]:
    """Load, verify and classify one mutated corpus (in this process). An error while staging
    it (e.g. etcd unreachable) is the harness's, not the case's: it propagates."""
    with tempfile.TemporaryDirectory(prefix="mooncake-fuzz-") as tmp:
        fmt.stage(files, Path(tmp))
        try:
            cleanup_dropped[0] = 0
            master = fmt.load(Path(tmp))
        except MooncakeError as exc:
            return {"outcome": "rejected", "error": type(exc).__name__, "detail": str(exc)[:300]}
        except Exception as exc:  # noqa: BLE001 - an untyped error is what the fuzz looks for
            return {"outcome": "untyped", "error": type(exc).__name__, "detail": str(exc)[:300],
                    "where": _where(exc)}
        try:
            master.verify()
            _probe(master)
            master.verify()
        except Exception as exc:  # noqa: BLE001
            return {"outcome": "broken", "error": type(exc).__name__, "detail": str(exc)[:300],
                    "where": _where(exc)}
        objects = master.object_count()
    if fmt.keeps_objects and objects + cleanup_dropped[0] < _baseline(fmt.name, variant):
        return {"outcome": "partial", "error": "", "where": "",
                "detail": f"{objects} objects restored, the unmutated file holds {_baseline(fmt.name, variant)}"}
    return {"outcome": "accepted", "objects": objects}


def worker_main() -> None:
    """Answer one JSON line per request line on stdin; faulthandler reports a crash on stderr."""
    faulthandler.enable()
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints must not corrupt the answers
    for line in sys.stdin:
        req = json.loads(line)
        if "prepare" in req:  # corpora and baselines first, under the long startup timeout
            fmt = _format(req["prepare"])
            for variant in range(fmt.variants):
                _corpus(fmt.name, variant)
                if fmt.keeps_objects:
                    _baseline(fmt.name, variant)
            answer: dict[str, Any] = {"ready": req["prepare"]}
        else:
            try:
                answer = run_case(req["format"], req["seed"])
            except Exception:  # noqa: BLE001 - staging failed: the parent stops the run
                answer = {"harness_error": traceback.format_exc()}
        out.write(json.dumps(answer) + "\n")
        if answer.get("restart"):
            return


# ---- the parent -----------------------------------------------------------------------------------

class _Worker:
    def __init__(self, env: dict[str, str], stderr: Any) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "mooncake_columnar.testing.fuzz", "--worker"],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=stderr, env=env, text=True)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]

    def ask(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any] | str:
        """The answer, or "hang" / "crash:<exit status>" (the worker is then gone)."""
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except BrokenPipeError:
            return f"crash:{self.proc.wait()}"
        if not self.sel.select(timeout_s):
            self.close()
            return "hang"
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            return f"crash:{self.proc.wait()}"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.sel.close()


def run_cases(names: Iterable[str], cases: int, *, first_seed: int = 0, timeout_s: float = 60.0,
              startup_timeout_s: float = 600.0, env: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Run ``cases`` seeds per format in worker subprocesses; results by format, in seed order."""
    env = {**os.environ, **(env or {})}
    results: dict[str, list[dict]] = {}
    with ExitStack() as stack:
        log = stack.enter_context(tempfile.TemporaryFile())
        worker: _Worker | None = None
        for name in names:
            results[name] = []
            ready = False
            for seed in range(first_seed, first_seed + cases):
                if worker is None or not ready:
                    if worker is None:
                        worker = _Worker(env, log)
                    answer = worker.ask({"prepare": name}, startup_timeout_s)
                    if not isinstance(answer, dict):
                        raise RuntimeError(f"fuzz worker failed to prepare {name}: {answer}: {_tail(log)}")
                    ready = True
                log.seek(0)
                log.truncate()
                answer = worker.ask({"format": name, "seed": seed}, timeout_s)
                if isinstance(answer, dict) and "harness_error" in answer:
                    raise RuntimeError(f"fuzz case {name}/{seed} could not be staged: {answer['harness_error']}")
                if not isinstance(answer, dict):  # the worker is gone: count the case, start anew
                    outcome, _, status = answer.partition(":")
                    answer = {"format": name, "seed": seed, "outcome": outcome, "error": f"exit status {status}"
                              if status else f"no answer within {timeout_s:g} s", "detail": _tail(log), "where": ""}
                    worker.close()
                    worker, ready = None, False
                elif answer.pop("restart", False):  # (an answer made up above never asks for one)
                    worker.close()
                    worker, ready = None, False
                results[name].append(answer)
        if worker is not None:
            worker.close()
    return results


def _tail(log: Any, n: int = 800) -> str:
    """The worker's last words: from faulthandler's report if there is one."""
    log.seek(0)
    text = log.read().decode("utf-8", "replace")
    at = text.find("Fatal Python error")
    return text[at:at + n] if at >= 0 else text[-n:]


def summary_table(results: dict[str, list[dict]]) -> str:
    """The per-format counts of every outcome, as a fixed-width table."""
    head = f"{'format':<12}" + "".join(f"{title:>16}" for title, _ in _COLUMNS)
    rows = [head, "-" * len(head)]
    for name, res in results.items():
        counts = Counter(r["outcome"] for r in res)
        rows.append(f"{name:<12}" + "".join(f"{len(res) if key is None else counts[key]:>16}" for _, key in _COLUMNS))
    return "\n".join(rows)


def failure_groups(results: dict[str, list[dict]]) -> list[dict]:
    """Failures grouped by (format, outcome, error type, site), each with its first case (the
    reproducer: ``--repro FORMAT SEED``) and how many cases it covers."""
    groups: dict[tuple, dict] = {}
    for name, res in results.items():
        for r in res:
            if r["outcome"] in FAILURE_OUTCOMES:
                key = (name, r["outcome"], r.get("error", ""), r.get("where", ""))
                group = groups.setdefault(key, {"format": name, "outcome": r["outcome"], "error": key[2],
                                                "where": key[3], "count": 0, "example": r})
                group["count"] += 1
    return list(groups.values())


def failure_report(results: dict[str, list[dict]]) -> str:
    lines = []
    for g in failure_groups(results):
        ex = g["example"]
        lines.append(f"{g['format']} {g['outcome']} x{g['count']}: {g['error']} at {g['where']}; "
                     f"seed {ex['seed']}: {ex.get('mutation', '?')} -> {ex.get('detail', '')[:200]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--cases", type=int, default=1000, help="cases per format")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60.0, help="per-case timeout (s)")
    parser.add_argument("--v1-fixtures", default="tests/fixtures/mooncake_v1")
    parser.add_argument("--repro", nargs=2, metavar=("FORMAT", "SEED"), help="rerun one case here, with traceback")
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    os.environ.setdefault(V1_FIXTURES_ENV, str(Path(args.v1_fixtures).resolve()))
    names = args.repro[:1] if args.repro else args.formats.split(",")
    with ExitStack() as stack:
        if "etcd_store" in names and ETCD_ENV not in os.environ:
            from .etcd_server import EtcdServer
            os.environ[ETCD_ENV] = stack.enter_context(EtcdServer()).endpoint
        if args.repro:  # in this process: a crash reproduces as a crash
            name, seed = args.repro[0], int(args.repro[1])
            print(f"{name} seed {seed}: {mutate(_format(name), seed)[1]}", flush=True)
            result = run_case(name, seed)
            print(json.dumps(result, indent=1))
            if result["outcome"] in ("untyped", "broken"):  # again, for the whole traceback
                fmt = _format(name)
                with tempfile.TemporaryDirectory() as tmp:
                    fmt.stage(mutate(fmt, seed)[0], Path(tmp))
                    master = fmt.load(Path(tmp))
                    master.verify()
                    _probe(master)
            return int(result["outcome"] in FAILURE_OUTCOMES)
        t0 = time.perf_counter()
        results = run_cases(names, args.cases, first_seed=args.first_seed, timeout_s=args.timeout)
        print(summary_table(results))
        print(failure_report(results))
        print(f"{sum(map(len, results.values()))} cases in {time.perf_counter() - t0:.0f} s")
        return int(any(r["outcome"] in FAILURE_OUTCOMES for res in results.values() for r in res))


if __name__ == "__main__":
    sys.exit(main())
