"""Standby oplog: batch wire codec, FileOpLogStore append/read, OpLogWriter group commit.

The oplog is per-entry Python (dataclasses validated field by field, msgpack): measured here,
~10 us to construct an entry and ~24 us to decode one. So the parameter is the number of logged
PUT_END entries (one per object put), on a smaller grid than the object counts: 1e7 entries
would take minutes and GBs of Python objects per sample. Batches hold 1024 entries (the writer's default group size).
Ratios divide by a same-run plain msgpack pass (codec) or raw fsynced file writes (store, writer).
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgpack

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.ha.oplog import (OpLogBatch, OpLogEntry, OpLogOp, OpType, PutEndPayload,
                                        ReplicaDescriptor, decode_batch, encode_batch)
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.schema import ObjectDataType, ReplicaKind, ReplicaStatus
from mooncake_columnar.synthetic import synthetic_keys

from ._common import ENTRY_COUNTS, SEGMENTS, TIMEOUT_S, best_seconds

BATCH_ENTRIES = 1024
OBJECT_BYTES = 4096
TENANT = "default"


class Log:
    """The PUT_END entries of ``entries`` seeded objects, as ops, entries, batches and wire bytes."""

    def __init__(self, entries: int) -> None:
        keys = synthetic_keys(0, entries).to_pylist()
        self.ops = tuple(
            OpLogOp(OpType.PUT_END, TENANT, key, PutEndPayload(
                client="client-0", size=OBJECT_BYTES, data_type=int(ObjectDataType.UNKNOWN), group_id="",
                replicas=(ReplicaDescriptor(replica_id=i + 1, kind=int(ReplicaKind.MEMORY),
                                            segment=f"segment-{i % SEGMENTS}", offset=i * OBJECT_BYTES,
                                            size=OBJECT_BYTES, status=int(ReplicaStatus.COMPLETE)),)))
            for i, key in enumerate(keys))
        self.entries = tuple(op.at(i + 1) for i, op in enumerate(self.ops))
        self.batches = build_batches(self.entries)
        self.wire = [encode_batch(b) for b in self.batches]


def build_batches(entries: tuple[OpLogEntry, ...]) -> list[OpLogBatch]:
    return [OpLogBatch(entries[i].sequence_id, entries[i:i + BATCH_ENTRIES])
            for i in range(0, len(entries), BATCH_ENTRIES)]


_LOGS: dict[int, Log] = {}


def cached_log(entries: int) -> Log:
    if entries not in _LOGS:
        _LOGS[entries] = Log(entries)
    return _LOGS[entries]


def plain_wire(entry: OpLogEntry) -> dict[str, Any]:
    """The wire map of an entry built by hand: the baseline skips validation and dataclasses."""
    p = entry.payload
    assert isinstance(p, PutEndPayload)
    return {"seq": entry.sequence_id, "op": int(entry.op), "tenant": entry.tenant, "key": entry.key,
            "payload": {"client": p.client, "size": p.size, "data_type": p.data_type, "group_id": p.group_id,
                        "hard_pinned": p.hard_pinned, "soft_pin_enabled": p.soft_pin_enabled,
                        "replicas": [{"replica_id": r.replica_id, "kind": r.kind, "segment": r.segment,
                                      "offset": r.offset, "size": r.size, "status": r.status,
                                      "endpoint": r.endpoint} for r in p.replicas]}}


def write_fsynced(directory: Path, wire: list[bytes]) -> None:
    """Baseline for durable appends: each batch's bytes in its own file, one fsync each."""
    for i, data in enumerate(wire):
        with open(directory / f"raw-{i}", "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())


class _OpLog:
    params = ENTRY_COUNTS
    param_names = ["entries"]
    timeout = TIMEOUT_S


class Codec(_OpLog):
    def setup(self, entries: int) -> None:
        self.log = cached_log(entries)

    def time_build_batches(self, entries: int) -> None:
        build_batches(self.log.entries)  # validation, entry msgpack and checksum happen here

    def time_encode_batches(self, entries: int) -> None:
        for batch in self.log.batches:
            encode_batch(batch)

    def time_decode_batches(self, entries: int) -> None:
        for data in self.log.wire:
            decode_batch(data)

    def track_encode_ratio_to_baseline(self, entries: int) -> float:
        plain = [[plain_wire(e) for e in b.entries] for b in self.log.batches]

        def encode() -> None:
            for batch in build_batches(self.log.entries):
                encode_batch(batch)

        def baseline() -> None:
            for maps in plain:
                msgpack.packb(msgpack.packb(maps, use_bin_type=True), use_bin_type=True)

        return best_seconds(encode) / best_seconds(baseline)

    track_encode_ratio_to_baseline.unit = "ratio"

    def track_decode_ratio_to_baseline(self, entries: int) -> float:
        def decode() -> None:
            for data in self.log.wire:
                decode_batch(data)

        def baseline() -> None:
            for data in self.log.wire:
                msgpack.unpackb(msgpack.unpackb(data, raw=False)["entries"], raw=False)

        return best_seconds(decode) / best_seconds(baseline)

    track_decode_ratio_to_baseline.unit = "ratio"

    def track_wire_bytes_per_entry(self, entries: int) -> float:
        return sum(len(data) for data in self.log.wire) / entries

    track_wire_bytes_per_entry.unit = "bytes"


class _FreshDir(_OpLog):
    def setup(self, entries: int) -> None:
        self.log = cached_log(entries)
        self.dir = Path(tempfile.mkdtemp(prefix="mooncake-asv-oplog-"))

    def teardown(self, entries: int) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


class FileStoreAppend(_FreshDir):
    """append_batch of every batch into an empty store (4 fsyncs a batch: file, dir, prefix, dir)."""

    def _append(self, directory: Path) -> None:
        store = FileOpLogStore(directory)
        for batch in self.log.batches:
            store.append_batch(batch)

    def time_append_batches(self, entries: int) -> None:
        self._append(self.dir / "store")

    def track_append_ratio_to_baseline(self, entries: int) -> float:
        runs = itertools.count()  # every run needs an empty store

        def append() -> None:
            self._append(self.dir / f"store-{next(runs)}")

        raw = self.dir / "raw"
        raw.mkdir()
        return best_seconds(append) / best_seconds(lambda: write_fsynced(raw, self.log.wire))

    track_append_ratio_to_baseline.unit = "ratio"


class FileStoreRead(_OpLog):
    """read_batches(0) of a whole store: what a standby replays after a restart."""

    def setup(self, entries: int) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="mooncake-asv-oplog-"))
        self.store = FileOpLogStore(self.dir)
        for batch in cached_log(entries).batches:
            self.store.append_batch(batch)

    def teardown(self, entries: int) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def time_read_batches(self, entries: int) -> None:
        self.store.read_batches(0)


class WriterGroupCommit(_FreshDir):
    """One reserve + submit per entry (as each put_end does), then one flush: group commit."""

    def _commit(self, directory: Path) -> None:
        writer = OpLogWriter(FileOpLogStore(directory), window=len(self.log.ops),
                             max_batch_entries=BATCH_ENTRIES, clocks=ManualClocks())
        for op in self.log.ops:
            writer.submit(writer.reserve(1), (op,))
        writer.flush()

    def time_group_commit(self, entries: int) -> None:
        self._commit(self.dir / "store")

    def track_group_commit_ratio_to_baseline(self, entries: int) -> float:
        runs = itertools.count()  # every run needs an empty store
        raw = self.dir / "raw"
        raw.mkdir()
        commit_s = best_seconds(lambda: self._commit(self.dir / f"store-{next(runs)}"))
        return commit_s / best_seconds(lambda: write_fsynced(raw, self.log.wire))

    track_group_commit_ratio_to_baseline.unit = "ratio"
