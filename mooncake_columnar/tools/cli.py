"""`mooncake-columnar` command line: demo, bench."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench import AREAS
    fn = AREAS[args.area]
    from .progress import wanted
    extra = {"trials": args.trials} if args.trials is not None else {}
    result = fn(args.objects, segments=args.segments, replicas=args.replicas, show_progress=wanted(args.progress),
                **extra)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v:,.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    return run_demo(objects=args.objects)


def _cmd_warmup(args: argparse.Namespace) -> int:
    from ..warmup import warm_up_kernels
    print(f"serving-path kernels compiled and cached in {warm_up_kernels():.1f} s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mooncake-columnar", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="failover demo on embedded defaults")
    d.add_argument("--objects", type=int, default=200_000)
    d.set_defaults(func=_cmd_demo)
    w = sub.add_parser("warmup", help="compile every serving-path kernel into the Numba cache (image builds)")
    w.set_defaults(func=_cmd_warmup)
    from .bench import AREAS
    b = sub.add_parser("bench", help="measure one area against a same-run baseline")
    b.add_argument("area", choices=sorted(AREAS))
    b.add_argument("--objects", type=int, default=1_000_000)
    b.add_argument("--segments", type=int, default=4)
    b.add_argument("--replicas", type=int, default=1)
    b.add_argument("--trials", type=int, default=None, help="failover: failovers per kind (default 2)")
    b.add_argument("--json", action="store_true", help="print one JSON object")
    b.add_argument("--progress", action="store_true", help="show progress on stderr (default: when it is a terminal)")
    b.set_defaults(func=_cmd_bench)
    # ---- snapshot ls|inspect|verify (implemented in snapshot_cli.py) ----
    from . import snapshot_cli
    snapshot_cli.add_parser(sub)
    # ---- simulate (implemented in simulate_cli.py) ----
    from . import simulate_cli
    simulate_cli.add_parser(sub)
    from . import verify_cli  # ---- verify: restore a snapshot and self-check the engine ----
    verify_cli.add_parser(sub)
    sub.add_parser("serve", add_help=False,
                   help="serve the upstream master protocol (takes mooncake_master's flags; serve --help lists them)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # upstream mooncake_master's gflags command line, parsed by the server itself
        from ..server.serve import main as serve_main
        return serve_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command in ("demo", "warmup"):  # the commands a first run starts with: say what compiles
        from ..compile_progress import compile_progress
        with compile_progress():
            return int(args.func(args))
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
