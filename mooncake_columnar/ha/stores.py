"""Durable oplog stores: batches plus a durable prefix advanced by compare-and-swap.

Both stores keep upstream's protocol (``upstream-ha.md`` 1.5): a batch becomes durable together
with the prefix that covers it, and only the batch that starts at ``prefix + 1`` can be appended.
Improvements over upstream HEAD, per ARCHITECTURE.md section 5:

* producer-view fencing is wired: every append compares the store's producer view with the view
  this store handle claimed (``set_producer_view``), so a deposed primary's write fails with
  :class:`FencedWrite` instead of racing the new primary on the prefix alone;
* ``compact_through`` deletes batches fully covered by a published standby snapshot.

Batches are addressed by their first sequence id (20 digits, so that key order is id order); the
last id of a batch is the next batch's first id minus one, or the durable prefix for the newest.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import re
import urllib.error
import urllib.request
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol, runtime_checkable

from ..errors import FencedWrite, InvalidParams, OpLogConflict, OpLogCorrupt, OpLogGap, OpLogStoreUnavailable
from .oplog import _SEQ_MAX, OpLogBatch, decode_batch, encode_batch


@runtime_checkable
class OpLogStore(Protocol):
    def append_batch(self, batch: OpLogBatch) -> None:
        """Make ``batch`` durable and advance the prefix to its last id, atomically.

        Raises OpLogGap if it does not start at ``durable_prefix() + 1`` (ids would be skipped),
        OpLogConflict if the prefix is already at or past its first id (a duplicate, or another
        writer won), FencedWrite if the store's producer view is not this handle's view.
        Nothing is written when it raises, except OpLogStoreUnavailable, which may be ambiguous.
        """

    def durable_prefix(self) -> int:
        """Last durable sequence id; 0 for an empty log."""

    def read_batches(self, after_seq: int, limit: int | None = None) -> list[OpLogBatch]:
        """Durable batches holding the ids after ``after_seq``, in order, at most ``limit`` of them.

        The first batch may start at or before ``after_seq`` (callers skip applied entries).
        Missing history (compacted away or lost) raises OpLogGap; a bad record raises OpLogCorrupt.
        """

    def producer_view(self) -> int:
        """The newest producer view claimed in the store; 0 if none was."""

    def set_producer_view(self, view: int) -> None:
        """Claim ``view`` for this handle's writes; FencedWrite if a newer view is already claimed.

        A handle starts with view 0, which can write only while no view was ever claimed.
        """

    def compact_through(self, seq: int) -> int:
        """Delete the batches whose every id is <= ``seq`` (<= the durable prefix); returns how many."""


def batch_name(first_sequence_id: int) -> str:
    return f"{first_sequence_id:020d}"


def _parse_counter(raw: bytes, what: str) -> int:
    # Canonical decimal only: anything else in a control record means the store is damaged.
    if not re.fullmatch(rb"(0|[1-9][0-9]{0,18})\n?", raw):
        raise OpLogCorrupt(what, f"not a canonical decimal: {raw[:40]!r}")
    value = int(raw)
    if value > _SEQ_MAX:  # 19 digits can pass 2**63 - 1: no sequence id or view is that large
        raise OpLogCorrupt(what, f"{value} is outside [0, 2**63)")
    return value


# Batch names: exactly 20 ASCII digits (\d alone would also take other scripts' digits).
_BATCH_DIGITS = re.compile(r"[0-9]{20}")


def _check_seq_arg(name: str, value: int) -> None:
    if type(value) is not int or value < 0:
        raise InvalidParams(f"{name} must be a non-negative int, got {value!r}")


def _check_view(view: int) -> None:
    if type(view) is not int or view < 1:
        raise InvalidParams(f"producer view must be a positive int, got {view!r}")


def _append_refusal(batch: OpLogBatch, prefix: int) -> OpLogGap | OpLogConflict:
    if batch.first_sequence_id > prefix + 1:
        return OpLogGap(f"batch starts at {batch.first_sequence_id} but the durable prefix is {prefix}")
    return OpLogConflict(
        f"batch starts at {batch.first_sequence_id} but the durable prefix is already {prefix} "
        "(duplicate append, or another writer advanced it)"
    )


def _fencing_refusal(stored: int, mine: int) -> FencedWrite:
    return FencedWrite(f"store producer view is {stored}, this writer holds view {mine}")


def _plan_read(firsts: list[int], prefix: int, after_seq: int, limit: int | None) -> list[int]:
    """First ids of the batches to load for ``read_batches`` (``firsts`` sorted, all <= prefix)."""
    _check_seq_arg("after_seq", after_seq)
    if limit is not None and (type(limit) is not int or limit < 1):
        raise InvalidParams(f"limit must be a positive int, got {limit!r}")
    if after_seq > prefix:
        raise OpLogGap(f"reader is at {after_seq}, past the durable prefix {prefix} (the log regressed)")
    if after_seq == prefix:
        return []
    # The batch holding after_seq + 1 is the last one starting at or before it.
    start = None
    for i, f in enumerate(firsts):
        if f > after_seq + 1:
            break
        start = i
    if start is None:
        upto = firsts[0] - 1 if firsts else prefix
        raise OpLogGap(f"sequence ids {after_seq + 1}..{upto} are not in the store (compacted or lost)")
    chosen = firsts[start:]
    return chosen if limit is None else chosen[:limit]


def _check_chain(batches: list[OpLogBatch], names: list[int], prefix: int, complete: bool) -> None:
    """Loaded batches must sit at their names, chain without gaps and end at the prefix."""
    for b, first in zip(batches, names):
        if b.first_sequence_id != first:
            raise OpLogCorrupt(f"batches/{batch_name(first)}", f"holds a batch starting at {b.first_sequence_id}")
    for prev, b in zip(batches, batches[1:]):
        if b.first_sequence_id != prev.last_sequence_id + 1:
            raise OpLogGap(f"batch {prev.first_sequence_id} ends at {prev.last_sequence_id}, "
                           f"next batch starts at {b.first_sequence_id}")
    if batches and batches[-1].last_sequence_id > prefix:
        raise OpLogCorrupt(f"batches/{batch_name(batches[-1].first_sequence_id)}",
                           f"ends at {batches[-1].last_sequence_id}, past the durable prefix {prefix}")
    if complete and batches and batches[-1].last_sequence_id != prefix:
        raise OpLogGap(f"durable prefix is {prefix} but the stored batches end at {batches[-1].last_sequence_id}")


def _covered(firsts: list[int], prefix: int, seq: int) -> list[int]:
    """First ids of the batches whose every id is <= seq."""
    _check_seq_arg("seq", seq)
    if seq > prefix:
        raise InvalidParams(f"cannot compact through {seq}: the durable prefix is {prefix}")
    ends = [f - 1 for f in firsts[1:]] + [prefix]
    return [f for f, last in zip(firsts, ends) if last <= seq]


# --- local directory ------------------------------------------------------------------------------


class FileOpLogStore:
    """The embedded default: the same protocol in a local directory, no server needed.

    Layout: ``batches/<20-digit first id>.msgpack``, ``durable_prefix`` and ``producer_view`` (decimal
    text). Every file is written to a temp name, fsynced and renamed, and the directory fsynced. An
    append writes its batch file first and then replaces the prefix file: a crash in between leaves
    a batch past the prefix, which readers ignore and the next append overwrites. An exclusive
    ``flock`` on ``lock`` makes the check-then-write a compare-and-swap across processes.
    """

    _NAME = re.compile(r"([0-9]{20})\.msgpack")  # used with fullmatch: no trailing newline either

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.root = Path(directory)
        self._batches = self.root / "batches"
        self._batches.mkdir(parents=True, exist_ok=True)
        self._view = 0
        with self._locked():
            self._prefix()  # fail at open, not at first use, on a damaged or missing prefix

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.root / "lock", "a+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _read_counter(self, name: str) -> int:
        try:
            raw = (self.root / name).read_bytes()
        except FileNotFoundError:
            return 0
        return _parse_counter(raw, name)

    def _prefix(self) -> int:
        """The durable prefix; a log with batches but no prefix file is corrupt, not empty
        (reading it as empty would promote an empty master, or restart the ids at 1)."""
        if not (self.root / "durable_prefix").exists():
            stored = sum(1 for p in self._batches.iterdir() if self._NAME.fullmatch(p.name))
            if stored:
                raise OpLogCorrupt("durable_prefix", f"missing while {stored} batches are stored in {self._batches}")
            return 0
        return self._read_counter("durable_prefix")

    @staticmethod
    def _fsync_dir(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex}")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        self._fsync_dir(path.parent)

    def _firsts(self, prefix: int) -> list[int]:
        ids = sorted(int(m.group(1)) for p in self._batches.iterdir() if (m := self._NAME.fullmatch(p.name)))
        return [f for f in ids if f <= prefix]  # a batch past the prefix was never made durable

    def _batch_path(self, first: int) -> Path:
        return self._batches / f"{batch_name(first)}.msgpack"

    def append_batch(self, batch: OpLogBatch) -> None:
        data = encode_batch(batch)
        with self._locked():
            stored_view = self._read_counter("producer_view")
            if stored_view != self._view:
                raise _fencing_refusal(stored_view, self._view)
            prefix = self._prefix()
            if batch.first_sequence_id != prefix + 1:
                raise _append_refusal(batch, prefix)
            try:
                self._write_atomic(self._batch_path(batch.first_sequence_id), data)
                self._write_atomic(self.root / "durable_prefix", f"{batch.last_sequence_id}\n".encode())
            except OSError as exc:
                raise OpLogStoreUnavailable(f"writing batch {batch.first_sequence_id}: {exc}") from exc

    def durable_prefix(self) -> int:
        with self._locked():
            return self._prefix()

    def read_batches(self, after_seq: int, limit: int | None = None) -> list[OpLogBatch]:
        with self._locked():  # a consistent cut: no append or compaction runs meanwhile
            prefix = self._prefix()
            firsts = self._firsts(prefix)
            names = _plan_read(firsts, prefix, after_seq, limit)
            batches = []
            for first in names:
                try:
                    raw = self._batch_path(first).read_bytes()
                except OSError as exc:
                    raise OpLogStoreUnavailable(f"reading batch {first}: {exc}") from exc
                batches.append(decode_batch(raw))
        _check_chain(batches, names, prefix, complete=names[-1:] == firsts[-1:])
        return batches

    def producer_view(self) -> int:
        with self._locked():
            return self._read_counter("producer_view")

    def set_producer_view(self, view: int) -> None:
        _check_view(view)
        with self._locked():
            stored = self._read_counter("producer_view")
            if stored > view:
                raise _fencing_refusal(stored, view)
            if stored < view:
                self._write_atomic(self.root / "producer_view", f"{view}\n".encode())
            self._view = view

    def compact_through(self, seq: int) -> int:
        with self._locked():
            prefix = self._prefix()
            doomed = _covered(self._firsts(prefix), prefix, seq)
            for first in doomed:
                self._batch_path(first).unlink()
            if doomed:
                self._fsync_dir(self._batches)
            return len(doomed)


# --- etcd -----------------------------------------------------------------------------------------

_CLUSTER_ID = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")  # upstream IsValidClusterIdComponent


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode("ascii")


class EtcdOpLogStore:
    """The oplog in etcd, through etcd's v3 JSON gateway (``/v3/kv/*``, base64 keys and values).

    Plain urllib on purpose: the pip etcd3 clients are unmaintained and break with current
    protobuf releases, and the gateway needs nothing beyond HTTP + JSON.

    Keys (upstream layout): ``/oplog/<cluster>/batches/<20-digit first id>``,
    ``/oplog/<cluster>/durable_prefix`` and ``/oplog/<cluster>/producer_view`` (decimal text).
    An append is ONE txn: compare prefix == first - 1 and view == this handle's view, then put
    the batch and the new prefix. Reads pin one etcd revision so that a read is a consistent cut.
    """

    # etcd refuses requests over --max-request-bytes (1.5 MiB by default); base64 inflates by 4/3.
    DEFAULT_MAX_BATCH_BYTES = 1 << 20

    def __init__(self, endpoint: str, cluster_id: str, *, timeout_s: float = 5.0,
                 max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES) -> None:
        cluster = cluster_id.rstrip("/")
        if not _CLUSTER_ID.match(cluster):
            raise InvalidParams(f"cluster id {cluster_id!r} must match {_CLUSTER_ID.pattern}")
        self.endpoint = endpoint.rstrip("/")
        if "://" not in self.endpoint:
            self.endpoint = "http://" + self.endpoint
        self.timeout_s = timeout_s
        self.max_batch_bytes = max_batch_bytes
        base = f"/oplog/{cluster}/"
        self.batches_prefix = base + "batches/"
        self.prefix_key = base + "durable_prefix"
        self.view_key = base + "producer_view"
        self._view = 0

    # transport

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.endpoint + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:300].decode("utf-8", "replace")
            raise OpLogStoreUnavailable(f"etcd {path} answered {exc.code}: {detail}") from exc
        except (OSError, ValueError) as exc:  # URLError, timeouts and resets are OSErrors
            raise OpLogStoreUnavailable(f"etcd {path} at {self.endpoint}: {exc}") from exc

    def _batch_key(self, first: int) -> str:
        return self.batches_prefix + batch_name(first)

    def _get(self, key: str, revision: int = 0) -> tuple[bytes | None, int]:
        """(value or None, header revision) of one key."""
        body: dict[str, Any] = {"key": b64(key)}
        if revision:
            body["revision"] = revision
        resp = self._post("/v3/kv/range", body)
        kvs = resp.get("kvs") or []
        value = base64.b64decode(kvs[0].get("value", "")) if kvs else None
        return value, int(resp["header"]["revision"])

    def _counter(self, key: str, revision: int = 0) -> tuple[int, int]:
        raw, rev = self._get(key, revision)
        return (0 if raw is None else _parse_counter(raw, key)), rev

    def _firsts(self, start: str, end: str, revision: int, **extra: Any) -> list[int]:
        body = {"key": b64(start), "range_end": b64(end), "keys_only": True, "revision": revision, **extra}
        kvs = self._post("/v3/kv/range", body).get("kvs") or []
        out = []
        for kv in kvs:
            key = base64.b64decode(kv["key"]).decode("utf-8", "replace")
            name = key[len(self.batches_prefix):]
            if _BATCH_DIGITS.fullmatch(name):  # foreign keys under the prefix are not batches
                out.append(int(name))
        return out

    def _equals(self, key: str, value: int) -> dict[str, Any]:
        """Txn compare: the key holds ``value``; 0 means the key does not exist."""
        if value == 0:
            return {"key": b64(key), "target": "VERSION", "result": "EQUAL", "version": "0"}
        return {"key": b64(key), "target": "VALUE", "result": "EQUAL", "value": b64(str(value))}

    # protocol

    def append_batch(self, batch: OpLogBatch) -> None:
        data = encode_batch(batch)
        if len(data) > self.max_batch_bytes:
            # Permanent, not retryable: the same bytes would be refused forever (an upstream stall).
            raise InvalidParams(f"batch of {len(data)} bytes exceeds the etcd store limit {self.max_batch_bytes}")
        txn = {
            "compare": [self._equals(self.prefix_key, batch.first_sequence_id - 1),
                        self._equals(self.view_key, self._view)],
            "success": [
                {"request_put": {"key": b64(self._batch_key(batch.first_sequence_id)), "value": b64(data)}},
                {"request_put": {"key": b64(self.prefix_key), "value": b64(str(batch.last_sequence_id))}},
            ],
        }
        try:
            resp = self._post("/v3/kv/txn", txn)
        except OpLogStoreUnavailable:
            # The txn may have committed before the connection broke: it did iff the prefix
            # reached our last id and the stored batch is byte-identical (upstream's resolution).
            if self._already_durable(batch, data):
                return
            raise
        if resp.get("succeeded"):
            return
        stored_view, rev = self._counter(self.view_key)
        if stored_view != self._view:
            raise _fencing_refusal(stored_view, self._view)
        prefix, _ = self._counter(self.prefix_key, rev)
        raise _append_refusal(batch, prefix)

    def _already_durable(self, batch: OpLogBatch, data: bytes) -> bool:
        try:
            prefix, rev = self._counter(self.prefix_key)
            return prefix >= batch.last_sequence_id and self._get(
                self._batch_key(batch.first_sequence_id), rev)[0] == data
        except OpLogStoreUnavailable:
            return False

    def _prefix(self) -> tuple[int, int]:
        """(durable prefix, revision); batches without a prefix key are corrupt, not empty."""
        raw, rev = self._get(self.prefix_key)
        if raw is not None:
            return _parse_counter(raw, self.prefix_key), rev
        end = self.batches_prefix[:-1] + chr(ord(self.batches_prefix[-1]) + 1)
        if self._firsts(self.batches_prefix, end, rev, limit=1):
            raise OpLogCorrupt("durable_prefix", f"{self.prefix_key} is missing while batches are stored")
        return 0, rev

    def durable_prefix(self) -> int:
        return self._prefix()[0]

    def read_batches(self, after_seq: int, limit: int | None = None) -> list[OpLogBatch]:
        _check_seq_arg("after_seq", after_seq)
        prefix, rev = self._prefix()
        if after_seq >= prefix:
            _plan_read([], prefix, after_seq, limit)  # raises the regression or a bad limit, else nothing to read
            return []
        # Only the newest batch starting at or before after_seq + 1 is needed from the older part.
        anchor = self._firsts(self.batches_prefix, self._batch_key(after_seq + 1) + "\0", rev,
                              sort_order="DESCEND", sort_target="KEY", limit=1)
        newer = self._firsts(self._batch_key(after_seq + 2), self._batch_key(prefix) + "\0", rev)
        firsts = anchor + newer
        names = _plan_read(firsts, prefix, after_seq, limit)
        if not names:
            return []
        body: dict[str, Any] = {"key": b64(self._batch_key(names[0])),
                                "range_end": b64(self._batch_key(names[-1]) + "\0"), "revision": rev}
        kvs = self._post("/v3/kv/range", body).get("kvs") or []
        by_name = {base64.b64decode(kv["key"]).decode("utf-8", "replace"): kv.get("value", "") for kv in kvs}
        batches = []
        for first in names:
            value = by_name.get(self._batch_key(first))
            if value is None:
                raise OpLogGap(f"batch {first} vanished from revision {rev}")
            batches.append(decode_batch(base64.b64decode(value)))
        _check_chain(batches, names, prefix, complete=names[-1] == firsts[-1])
        return batches

    def producer_view(self) -> int:
        return self._counter(self.view_key)[0]

    def set_producer_view(self, view: int) -> None:
        _check_view(view)
        while True:  # CAS loop: retry only when another claimant changed the key in between
            stored, _ = self._counter(self.view_key)
            if stored > view:
                raise _fencing_refusal(stored, view)
            if stored == view:
                break
            resp = self._post("/v3/kv/txn", {
                "compare": [self._equals(self.view_key, stored)],
                "success": [{"request_put": {"key": b64(self.view_key), "value": b64(str(view))}}],
            })
            if resp.get("succeeded"):
                break
        self._view = view

    def compact_through(self, seq: int) -> int:
        prefix, rev = self._counter(self.prefix_key)
        firsts = self._firsts(self.batches_prefix, self._batch_key(prefix) + "\0", rev)
        doomed = _covered(firsts, prefix, seq)
        if not doomed:
            return 0
        # Covered batches are immutable, so a plain range delete cannot race an append.
        resp = self._post("/v3/kv/deleterange", {"key": b64(self._batch_key(doomed[0])),
                                                 "range_end": b64(self._batch_key(doomed[-1]) + "\0")})
        return int(resp.get("deleted", 0))

