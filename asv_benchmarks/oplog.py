"""Standby oplog: columnar batch codec, FileOpLogStore append/read, OpLogWriter group commit,
standby apply.

Batches are columns (NumPy arrays per field, one string table), so every step is vectorized per
batch: the parameter is the number of logged PUT_END entries (one per object put). Batches hold
1024 entries (the writer's default group size). Ratios divide by a same-run plain msgpack pass
over per-entry dicts (codec) or raw fsynced file writes (store, writer).
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.ha.apply import apply_batch
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogColumns, OpType, decode_batch, encode_batch, string_parts
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.master import MasterService
from mooncake_columnar.schema import ObjectDataType, ReplicaKind, ReplicaStatus
from mooncake_columnar.tools.synthetic import synthetic_keys

from ._common import ENTRY_COUNTS, SEGMENTS, TIMEOUT_S, best_seconds

BATCH_ENTRIES = 1024
OBJECT_BYTES = 4096
SEGMENT_NAMES = [f"segment-{i}" for i in range(SEGMENTS)]


def put_end_columns(entries: int) -> OpLogColumns:
    """``entries`` PUT_END rows of one memory replica each, as the primary's journal builds them."""
    key_offsets, key_bytes = string_parts(synthetic_keys(0, entries))
    i = np.arange(entries)
    ones = np.ones(entries)
    # string table: "default", "client-0", "", then the segment names
    return OpLogColumns(
        op=np.full(entries, OpType.PUT_END, np.uint8), tenant=np.zeros(entries, np.int32),
        key_offsets=key_offsets, key_bytes=key_bytes, client=np.ones(entries, np.int32),
        size=(ones * OBJECT_BYTES).astype(np.uint64), data_type=np.full(entries, ObjectDataType.UNKNOWN, np.uint8),
        group=np.full(entries, 2, np.int32), hard_pinned=np.zeros(entries, np.bool_),
        soft_pin_enabled=np.zeros(entries, np.bool_), replica_count=ones.astype(np.uint32),
        put_start_time_ms=np.full(entries, 1_700_000_000_000, np.uint64),
        replica_id=(i + 1).astype(np.uint64), replica_kind=np.full(entries, ReplicaKind.MEMORY, np.uint8),
        replica_segment=(3 + i % SEGMENTS).astype(np.int32), replica_offset=(i * OBJECT_BYTES).astype(np.uint64),
        replica_size=(ones * OBJECT_BYTES).astype(np.uint64),
        replica_status=np.full(entries, ReplicaStatus.COMPLETE, np.uint8),
        replica_endpoint=np.full(entries, 2, np.int32),
        strings=pa.array(["default", "client-0", "", *SEGMENT_NAMES], pa.large_string()), segments=())


class Log:
    """The PUT_END entries of ``entries`` seeded objects, as one body, batches and wire bytes."""

    def __init__(self, entries: int) -> None:
        self.body = put_end_columns(entries)
        self.batches = build_batches(self.body)
        self.wire = [encode_batch(b) for b in self.batches]


def build_batches(body: OpLogColumns) -> list[OpLogBatch]:
    return [OpLogBatch(i + 1, OpLogColumns.concat([body.slice(i, min(i + BATCH_ENTRIES, len(body)))]))
            for i in range(0, len(body), BATCH_ENTRIES)]


_LOGS: dict[int, Log] = {}


def cached_log(entries: int) -> Log:
    if entries not in _LOGS:
        _LOGS[entries] = Log(entries)
    return _LOGS[entries]


def plain_wire(batch: OpLogBatch) -> list[dict[str, Any]]:
    """Per-entry wire maps of a batch, built by hand: what a row-oriented log would pack."""
    c = batch.columns
    keys = c.keys.to_pylist()
    return [{"seq": batch.first_sequence_id + i, "op": int(OpType.PUT_END), "tenant": "default", "key": key,
             "payload": {"client": "client-0", "size": OBJECT_BYTES, "data_type": 0, "group_id": "",
                         "hard_pinned": False, "soft_pin_enabled": False,
                         "replicas": [{"replica_id": int(c.replica_id[i]), "kind": 0, "segment": "segment-0",
                                       "offset": int(c.replica_offset[i]), "size": OBJECT_BYTES, "status": 3,
                                       "endpoint": ""}]}}
            for i, key in enumerate(keys)]


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


def _encode_fresh(batches: list[OpLogBatch]) -> None:
    for batch in batches:
        encode_batch(OpLogBatch(batch.first_sequence_id, batch.columns))  # a new batch: nothing cached


class Codec(_OpLog):
    def setup(self, entries: int) -> None:
        self.log = cached_log(entries)

    def time_build_batches(self, entries: int) -> None:
        build_batches(self.log.body)  # slice + string-table compaction per batch

    def time_encode_batches(self, entries: int) -> None:
        _encode_fresh(self.log.batches)

    def time_decode_batches(self, entries: int) -> None:
        for data in self.log.wire:
            decode_batch(data)

    def track_encode_ratio_to_baseline(self, entries: int) -> float:
        plain = [plain_wire(b) for b in self.log.batches]

        def baseline() -> None:
            for maps in plain:
                msgpack.packb(msgpack.packb(maps, use_bin_type=True), use_bin_type=True)

        return best_seconds(lambda: _encode_fresh(build_batches(self.log.body))) / best_seconds(baseline)

    track_encode_ratio_to_baseline.unit = "ratio"

    def track_decode_ratio_to_baseline(self, entries: int) -> float:
        plain = [msgpack.packb(plain_wire(b), use_bin_type=True) for b in self.log.batches]

        def decode() -> None:
            for data in self.log.wire:
                decode_batch(data)

        def baseline() -> None:
            for data in plain:
                msgpack.unpackb(data, raw=False)

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
    """Submits then one flush (group commit): one reservation per entry (single-key put_end), or
    one for the whole body (batch_put_end)."""

    def _commit(self, directory: Path, per_entry: bool) -> None:
        body = self.log.body
        writer = OpLogWriter(FileOpLogStore(directory), window=len(body), max_batch_entries=BATCH_ENTRIES,
                             clocks=ManualClocks())
        if per_entry:
            for i in range(len(body)):
                writer.submit(writer.reserve(1), body.slice(i, i + 1))
        else:
            writer.submit(writer.reserve(len(body)), body)
        writer.flush()

    def time_group_commit(self, entries: int) -> None:
        self._commit(self.dir / "store", per_entry=True)

    def time_group_commit_one_reservation(self, entries: int) -> None:
        self._commit(self.dir / "store-bulk", per_entry=False)

    def track_group_commit_ratio_to_baseline(self, entries: int) -> float:
        runs = itertools.count()  # every run needs an empty store
        raw = self.dir / "raw"
        raw.mkdir()
        commit_s = best_seconds(lambda: self._commit(self.dir / f"store-{next(runs)}", per_entry=True))
        return commit_s / best_seconds(lambda: write_fsynced(raw, self.log.wire))

    track_group_commit_ratio_to_baseline.unit = "ratio"


class StandbyApply(_OpLog):
    """apply_batch of every batch into an empty standby container (segments mounted)."""

    number = 1  # each timed call needs the empty container setup built
    repeat = (1, 5, 60.0)
    warmup_time = 0.0

    def setup(self, entries: int) -> None:
        self.log = cached_log(entries)
        self.m = MasterService(MasterConfig(), clocks=ManualClocks(), initial_capacity=entries)
        for name in SEGMENT_NAMES:
            self.m.mount_segment(name, endpoint=f"{name}:1", client_id="client-0", base=1 << 40,
                                 size=entries * OBJECT_BYTES)

    def time_apply_batches(self, entries: int) -> None:
        for batch in self.log.batches:
            apply_batch(self.m, batch)
