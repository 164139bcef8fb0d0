"""Command-line plumbing shared by the subcommands that read a snapshot repository (``snapshot``
and ``verify``): exit codes, the repository arguments, opening the repository, picking a
snapshot, and turning usage errors into exit code 2.

Snapshot ids given on the command line are checked by the repository's one path check
(:func:`~mooncake_columnar.snapshots.repository.check_path_part`): nothing outside the cluster
directory is read.
"""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from ..errors import CliUsageError, InvalidParams

EXIT_OK, EXIT_BAD_SNAPSHOT, EXIT_USAGE = 0, 1, 2


def add_repository_args(p: argparse.ArgumentParser) -> None:
    from ..snapshots.repository import DEFAULT_CLUSTER_ID
    p.add_argument("uri", help="snapshot root: a local directory or s3://bucket/prefix?...")
    p.add_argument("--cluster-id", default=DEFAULT_CLUSTER_ID,
                   help=f"cluster directory under the root (default {DEFAULT_CLUSTER_ID})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--timeout-s", type=float, default=5.0,
                   help="S3 connect/request timeout in seconds (default 5)")


def reporting_usage_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``fn`` with a CliUsageError printed on stderr and answered with EXIT_USAGE."""
    def wrapper(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except CliUsageError as e:
            print(f"error: {e.detail}", file=sys.stderr)
            return EXIT_USAGE
    return wrapper


def open_repo(args: argparse.Namespace):
    from ..snapshots.repository import SnapshotRepository
    try:
        return SnapshotRepository(args.uri, cluster_id=args.cluster_id,
                                  timeout_s=getattr(args, "timeout_s", 5.0))
    except Exception as e:  # pyarrow raises several types for bad URIs; report them all the same
        raise CliUsageError(f"cannot open {args.uri!r}: {type(e).__name__}: {e}") from None


def check_id(snapshot_id: str) -> str:
    """A snapshot id from the command line, through the repository's one path check."""
    from ..snapshots.repository import check_path_part
    try:
        return check_path_part("snapshot_id", snapshot_id)
    except InvalidParams as e:
        raise CliUsageError(str(e)) from None


def storage_error(uri: str, e: Exception) -> CliUsageError:
    return CliUsageError(f"cannot read {uri!r}: {type(e).__name__}: {e}")


def pick_snapshot(repo, snapshot_id: str | None) -> str:
    """The id asked for (checked), else the one latest.txt names, else (latest.txt absent,
    malformed or dangling: said on stderr) the newest published one, or the newest listed."""
    if snapshot_id is not None:
        return check_id(snapshot_id)
    try:
        plan = repo.candidate_plan()
        if not plan.ids:
            raise CliUsageError(f"no snapshots under {repo.base}")
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
        if plan.latest is not None:
            return plan.latest
        return next((sid for sid in plan.ids if repo.unpublished_reason(sid) is None), plan.ids[0])
    except CliUsageError:
        raise
    except Exception as e:
        raise CliUsageError(f"cannot list {repo.base!r}: {type(e).__name__}: {e}") from None
