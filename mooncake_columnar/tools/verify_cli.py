"""`mooncake-columnar verify <uri>`: restore one complete snapshot into an engine and run the
engine's self-check (:func:`mooncake_columnar.integrity.verify_engine`) on it.

Unlike ``snapshot verify`` (decode-level checks, no engine), this builds the MasterService a
restore would build and checks every structural invariant of it. Unlike ``restore_master`` it
never falls back to an older candidate: the snapshot asked for (default: the latest) is the one
judged. Every object is kept (no expired-object cleanup) so the check covers all of them;
``--drop-expired`` applies the restore's default cleanup instead.

Exit codes: 0 the engine passes; 1 the snapshot does not restore or breaks an invariant;
2 usage or repository errors (as ``snapshot``: an invalid ``--snapshot`` id such as ``../x``,
unreachable storage).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any, Callable

from .progress import steps, wanted
from .repo_args import (EXIT_BAD_SNAPSHOT, EXIT_OK, add_repository_args, open_repo, pick_snapshot,
                        reporting_usage_errors, storage_error)


_STEPS = ("restoring the snapshot into an engine", "engine self-check")


def verify_snapshot_engine(repo, snapshot_id: str, *, drop_expired: bool = False,
                           step: Callable[[str], None] = lambda label: None) -> dict[str, Any]:
    """Restore ``snapshot_id`` into a MasterService and self-check it; a result dict with
    ``ok``, ``objects`` and, on failure, ``check`` (the invariant id, or ``restore``) and ``error``.
    ``step`` hears each phase start (progress)."""
    from ..clock import MonotonicClocks
    from ..errors import EngineInvariantError, SnapshotStorageUnavailable
    from ..master import MasterService
    from ..snapshots.complete import cleanup_state, decode_candidate

    out: dict[str, Any] = {"snapshot_id": snapshot_id, "ok": False, "objects": None, "check": None,
                           "error": None}
    clocks = MonotonicClocks()
    t0 = time.perf_counter()
    step(_STEPS[0])
    try:
        state, _, now_ns = decode_candidate(repo, snapshot_id, clocks, check_unique_keys=False)
        state, _ = cleanup_state(state, now_ns, drop_expired)
        m = MasterService.from_state(state, clocks=clocks, segments_readable=True, validated=True)
    except SnapshotStorageUnavailable:
        raise  # the storage, not the snapshot: a repository error
    except Exception as e:  # the candidate a restore would reject before any self-check
        out.update(check="restore", error=f"{type(e).__name__}: {e}")
        return out
    out["objects"] = m.object_count()
    t1 = time.perf_counter()
    step(_STEPS[1])
    try:
        m.verify()
    except EngineInvariantError as e:
        out.update(check=e.check, error=str(e))
    else:
        out["ok"] = True
    out["restore_seconds"], out["verify_seconds"] = t1 - t0, time.perf_counter() - t1
    return out


def _cmd_verify(args: argparse.Namespace) -> int:
    from ..errors import SnapshotStorageUnavailable
    repo = open_repo(args)
    snapshot_id = pick_snapshot(repo, args.snapshot)  # a given id passes the repository's path check
    try:
        with steps(list(_STEPS), wanted(args.progress)) as step:
            result = verify_snapshot_engine(repo, snapshot_id, drop_expired=args.drop_expired, step=step)
    except SnapshotStorageUnavailable as e:
        raise storage_error(args.uri, e) from None
    if args.json:
        print(json.dumps(result))
    elif result["ok"]:
        print(f"snapshot {snapshot_id}: {result['objects']:,} objects: ok "
              f"(restore {result['restore_seconds']:.3f} s, self-check {result['verify_seconds']:.3f} s)")
    else:
        count = "" if result["objects"] is None else f"{result['objects']:,} objects: "
        print(f"snapshot {snapshot_id}: {count}FAILED {result['check']}: {result['error']}")
    return EXIT_OK if result["ok"] else EXIT_BAD_SNAPSHOT


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``verify`` on the top-level subparsers."""
    p = sub.add_parser("verify", help="restore a snapshot into an engine and run the engine self-check")
    add_repository_args(p)
    p.add_argument("--snapshot", help="snapshot id (default: the one in latest.txt)")
    p.add_argument("--drop-expired", action="store_true",
                   help="drop expired, unpinned objects first, as a restore does by default")
    p.add_argument("--progress", action="store_true", help="show progress on stderr (default: when it is a terminal)")
    p.set_defaults(func=reporting_usage_errors(_cmd_verify))
    return p
