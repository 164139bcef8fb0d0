"""`mooncake-columnar snapshot ls|inspect|verify <uri>`: look at complete snapshots without restoring.

``<uri>`` is what :class:`SnapshotRepository` takes: a local directory (the root above
``<cluster_id>/``) or ``s3://bucket/prefix?endpoint_override=...``.

Exit codes: 0 success; 1 a snapshot failed verification or cannot be inspected; 2 usage or
repository errors (unreachable URI or storage, an invalid cluster or snapshot id, no snapshot to
look at). Snapshot ids given on the command line pass the repository's one path check
(repo_args.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from typing import Any

import numpy as np

from ..clock import NS_PER_S, MonotonicClocks
from ..errors import CliUsageError
from ..schema import NEVER_LEASED
from .progress import steps, wanted
from .repo_args import (EXIT_BAD_SNAPSHOT, EXIT_OK, add_repository_args, check_id, open_repo, pick_snapshot,
                        reporting_usage_errors, storage_error)

QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
# Histogram edges in seconds of remaining lease: expired, then growing buckets.
HIST_EDGES_S = (0.0, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 3600.0)


class _FixedClocks:
    """The clock pair a decode sees. steady = 0 makes every converted deadline equal to its
    remaining time at ``system_ns``: new = C1 + remaining with C1 = 0."""

    def __init__(self, system_ns: int, steady_ns: int = 0) -> None:
        self._system, self._steady = system_ns, steady_ns

    def system_ns(self) -> int:
        return self._system

    def steady_ns(self) -> int:
        return self._steady


def _iso(system_ns: int) -> str:
    try:
        dt = datetime.fromtimestamp(system_ns / NS_PER_S, tz=timezone.utc)
    except (OverflowError, OSError, ValueError):
        return "out of range"
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _manifest_summary(repo, snapshot_id: str) -> dict[str, Any]:
    from ..errors import ManifestError, SnapshotError, SnapshotStorageUnavailable
    from ..snapshots.manifest import parse_manifest
    row: dict[str, Any] = {"snapshot_id": snapshot_id, "format": None}
    notes: list[str] = []
    try:
        raw = repo.read_manifest(snapshot_id, notes=notes)
    except SnapshotStorageUnavailable:
        raise
    except ManifestError as e:
        return {**row, "status": f"invalid manifest: {e}"}
    except SnapshotError as e:
        missing = "does not exist" in str(e)
        return {**row, "status": "no manifest (unpublished)" if missing else f"unreadable manifest: {e}"}
    fields = raw.decode("ascii").split("|")
    row["format"] = f"{fields[0]}|{fields[1]}"
    reason = repo.unpublished_reason(snapshot_id)
    if reason is not None:
        return {**row, "status": f"unpublished: {reason}"}
    if fields[0] in ("arrow-ipc", "messagepack") and parse_manifest(raw).unchecked_clock_pair:
        return {**row, "status": "published, manifest without checksum (clock pair unchecked)"}
    return {**row, "status": "published"}


# ---- ls -------------------------------------------------------------------------------------------
def _cmd_ls(args: argparse.Namespace) -> int:
    from ..errors import SnapshotStorageUnavailable
    repo = open_repo(args)
    try:
        ids, latest = repo.list(), repo.latest()
    except Exception as e:
        raise CliUsageError(f"cannot list {args.uri!r}: {type(e).__name__}: {e}") from None
    rows = []
    for sid in ids:
        try:
            row = _manifest_summary(repo, sid)
        except SnapshotStorageUnavailable as e:
            raise storage_error(args.uri, e) from None
        row["latest"] = sid == latest
        rows.append(row)
    if args.json:
        print(json.dumps({"cluster_id": repo.cluster_id, "latest": latest, "snapshots": rows}))
        return EXIT_OK
    if not rows:
        print(f"no snapshots under {repo.base}")
        return EXIT_OK
    for row in rows:
        fmt = row["format"] or "-"
        note = "  (latest)" if row["latest"] else ""
        status = "" if row["status"] == "published" else f"  [{row['status']}]"
        print(f"{row['snapshot_id']}  {fmt:<20}{note}{status}")
    return EXIT_OK


# ---- inspect ----------------------------------------------------------------------------------------
def remaining_distribution(remaining_ns: np.ndarray) -> dict[str, Any]:
    """Counts, quantiles (s) and a histogram (s) of remaining times; NEVER_LEASED excluded."""
    remaining_ns = np.asarray(remaining_ns, np.int64)
    never = remaining_ns == NEVER_LEASED
    live = remaining_ns[~never]
    out: dict[str, Any] = {"never_leased": int(never.sum()), "expired": int((live <= 0).sum()),
                           "active": int((live > 0).sum())}
    if live.size:
        secs = live / NS_PER_S
        out["quantiles_s"] = {f"p{round(q * 100)}": float(v)
                              for q, v in zip(QUANTILES, np.quantile(secs, QUANTILES))}
        edges = np.array([-np.inf, *HIST_EDGES_S, np.inf])
        # Right-closed bins, so "<= 0 s" (expired) is its own bucket.
        idx = np.searchsorted(edges, secs, side="left") - 1
        counts = np.bincount(idx, minlength=edges.size - 1)
        labels = ["<= 0"] + [f"({a:g}, {b:g}]" for a, b in zip(HIST_EDGES_S, HIST_EDGES_S[1:])] + [
            f"> {HIST_EDGES_S[-1]:g}"]
        out["histogram_s"] = dict(zip(labels, map(int, counts)))
    else:
        out["quantiles_s"], out["histogram_s"] = {}, {}
    return out


def _inspect(repo, snapshot_id: str, at_system_ns: int) -> dict[str, Any]:
    from ..snapshots.complete import cleanup_state, decode_candidate
    state, manifest, _ = decode_candidate(repo, snapshot_id, _FixedClocks(at_system_ns))
    text = repo.read_manifest(snapshot_id).decode("ascii")
    checksum = None
    if manifest.is_v2 and manifest.checksummed:  # verified by the parse: shown apart from the fields
        text, checksum = text.rsplit("|", 1)
    objects = state.objects
    lease = objects.column("lease_deadline_ns").to_numpy()        # = remaining (C1 = 0)
    soft = objects.column("soft_pin_deadline_ns").to_numpy()
    soft_enabled = objects.column("soft_pin_enabled").to_numpy(zero_copy_only=False)
    hard = objects.column("hard_pinned").to_numpy(zero_copy_only=False)
    _, dropped = cleanup_state(state, 0, drop_expired=True)
    info: dict[str, Any] = {
        "snapshot_id": snapshot_id,
        "latest": snapshot_id == repo.latest(),
        "manifest": text,  # the manifest's fields, without its checksum field
        "manifest_checksum": checksum,  # "sha256:...", verified; None: v1, or v2 without one
        "format": f"{manifest.tag}|{manifest.version}",
        "system_now_ns": manifest.system_now_ns,
        "steady_now_ns": manifest.steady_now_ns,
        "objects": objects.num_rows,
        "replicas": state.replicas.num_rows,
        "segments": state.segments.num_rows,
        "replica_next_id": int(state.replica_next_id),
        "hard_pinned": int(hard.sum()),
        "soft_pin_enabled": int(soft_enabled.sum()),
        "soft_pin_active": int((soft_enabled & (soft != NEVER_LEASED) & (soft > 0)).sum()),
        "at_system_ns": at_system_ns,
        "dropped_by_default_cleanup": dropped,
        "remaining_lease": remaining_distribution(lease),
    }
    if manifest.system_now_ns is not None:
        info["snapshot_age_s"] = (at_system_ns - manifest.system_now_ns) / NS_PER_S
    return info


def _print_inspect(info: dict[str, Any]) -> None:
    latest = " (latest)" if info["latest"] else ""
    print(f"snapshot      {info['snapshot_id']}{latest}")
    print(f"manifest      {info['manifest']}")
    if info["manifest_checksum"] is not None:
        print(f"checksum      {info['manifest_checksum']} (verified)")
    elif info["system_now_ns"] is not None:
        print("checksum      none: written before manifest checksums, the clock pair is unchecked")
    print(f"format        {info['format']}")
    if info["system_now_ns"] is not None:
        print(f"clock pair    system_now_ns={info['system_now_ns']} ({_iso(info['system_now_ns'])})  "
              f"steady_now_ns={info['steady_now_ns']}")
    else:
        print("clock pair    none (v1: deadlines are system-clock ms)")
    print(f"objects       {info['objects']:,}   replicas {info['replicas']:,}   "
          f"segments {info['segments']:,}   replica_next_id {info['replica_next_id']}")
    print(f"pins          hard {info['hard_pinned']:,}   soft enabled {info['soft_pin_enabled']:,}"
          f"   soft active {info['soft_pin_active']:,}")
    age = f", snapshot age {info['snapshot_age_s']:.3f} s" if "snapshot_age_s" in info else ""
    print(f"at            system_ns={info['at_system_ns']} ({_iso(info['at_system_ns'])}){age}")
    d = info["remaining_lease"]
    print(f"remaining lease: active {d['active']:,}   expired {d['expired']:,}   "
          f"never leased {d['never_leased']:,}   "
          f"dropped by default cleanup {info['dropped_by_default_cleanup']:,}")
    if d["quantiles_s"]:
        print("  quantiles (s): " + "  ".join(f"{k}={v:.3f}" for k, v in d["quantiles_s"].items()))
        print("  histogram (s):")
        for label, count in d["histogram_s"].items():
            print(f"    {label:<14}{count:,}")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from ..errors import SnapshotStorageUnavailable
    repo = open_repo(args)
    snapshot_id = pick_snapshot(repo, args.snapshot_id)
    at = MonotonicClocks().system_ns() if args.at_system_ns is None else args.at_system_ns
    try:
        info = _inspect(repo, snapshot_id, at)
    except SnapshotStorageUnavailable as e:
        raise storage_error(args.uri, e) from None
    except Exception as e:
        print(f"cannot inspect snapshot {snapshot_id}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_SNAPSHOT
    if args.json:
        print(json.dumps(info))
    else:
        _print_inspect(info)
    return EXIT_OK


# ---- verify ------------------------------------------------------------------------------------------
def verify_snapshot(repo, snapshot_id: str, at_system_ns: int) -> None:
    """Everything a restore checks, without building an engine: strict manifest, every payload
    present, digests (v2), Arrow/msgpack decode, schema and descriptor validation, the clock
    conversion at ``at_system_ns`` and cleanup. Raises on the first problem."""
    from ..clock import MonotonicClocks
    from ..snapshots.complete import cleanup_state, decode_candidate
    clocks = _FixedClocks(at_system_ns, MonotonicClocks().steady_ns())
    state, _, now_ns = decode_candidate(repo, snapshot_id, clocks)
    cleanup_state(state, now_ns, drop_expired=True)


def _verify_one(repo, sid: str, at: int, uri: str, results: list[dict]) -> None:
    from ..errors import SnapshotStorageUnavailable
    try:
        verify_snapshot(repo, sid, at)
    except SnapshotStorageUnavailable as e:
        raise storage_error(uri, e) from None
    except Exception as e:
        results.append({"snapshot_id": sid, "ok": False, "error": f"{type(e).__name__}: {e}"})
    else:
        results.append({"snapshot_id": sid, "ok": True, "error": None})


def _cmd_verify(args: argparse.Namespace) -> int:
    repo = open_repo(args)
    if args.snapshot_id:
        ids = [check_id(sid) for sid in args.snapshot_id]
    else:
        try:
            plan = repo.candidate_plan()
        except Exception as e:
            raise CliUsageError(f"cannot list {args.uri!r}: {type(e).__name__}: {e}") from None
        ids = plan.ids
        for note in plan.notes:
            print(f"note: {note}", file=sys.stderr)
    if not ids:
        raise CliUsageError(f"no snapshots to verify under {repo.base}")
    at = MonotonicClocks().system_ns() if args.at_system_ns is None else args.at_system_ns
    results: list[dict] = []
    labels = [f"verifying {sid}" for sid in ids]
    with steps(labels, wanted(args.progress)) as step:
        for sid, label in zip(ids, labels):
            step(label)
            _verify_one(repo, sid, at, args.uri, results)
    failed = [r for r in results if not r["ok"]]

    if args.json:
        print(json.dumps({"ok": not failed, "results": results}))
    else:
        for r in results:
            print(f"OK    {r['snapshot_id']}" if r["ok"] else f"FAIL  {r['snapshot_id']}: {r['error']}")
        print(f"{len(results) - len(failed)} of {len(results)} snapshots verified"
              + (f"; {len(failed)} FAILED" if failed else ""))
    return EXIT_BAD_SNAPSHOT if failed else EXIT_OK


# ---- wiring ----------------------------------------------------------------------------------------
def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``snapshot ls|inspect|verify`` on the top-level subparsers."""
    s = sub.add_parser("snapshot", help="list, inspect and verify complete snapshots")
    ssub = s.add_subparsers(dest="snapshot_command", required=True)
    ls = ssub.add_parser("ls", help="snapshot ids (newest first, latest marked) and formats")
    add_repository_args(ls)
    ls.set_defaults(func=reporting_usage_errors(_cmd_ls))
    ins = ssub.add_parser("inspect", help="manifest, clock pair, counts, remaining-lease distribution")
    add_repository_args(ins)
    ins.add_argument("--snapshot-id", help="default: the one in latest.txt")
    ins.add_argument("--at-system-ns", type=int,
                     help="restore time (Unix ns) for remaining leases; default now")
    ins.set_defaults(func=reporting_usage_errors(_cmd_inspect))
    ver = ssub.add_parser("verify", help="check digests and decodability without restoring")
    add_repository_args(ver)
    ver.add_argument("--snapshot-id", action="append",
                     help="snapshot to verify (repeatable); default: every restore candidate")
    ver.add_argument("--at-system-ns", type=int,
                     help="restore time (Unix ns) for the clock-conversion check; default now")
    ver.add_argument("--progress", action="store_true", help="show progress on stderr (default: when it is a terminal)")
    ver.set_defaults(func=reporting_usage_errors(_cmd_verify))
    return s
