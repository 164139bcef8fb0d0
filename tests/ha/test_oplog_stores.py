"""One contract for every OpLogStore: FileOpLogStore (tmp dir) and EtcdOpLogStore (real etcd)."""
from __future__ import annotations

import base64
import itertools
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from mooncake_columnar.errors import (
    FencedWrite,
    InvalidParams,
    OpLogConflict,
    OpLogCorrupt,
    OpLogGap,
    OpLogStoreUnavailable,
)
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogEntry, OpType, SegmentPayload, encode_batch
from mooncake_columnar.ha.stores import EtcdOpLogStore, FileOpLogStore, OpLogStore
from mooncake_columnar.testing.etcd_server import EtcdServer


class Kit:
    """A backing store plus ways to open more handles on it and to damage it behind its back."""

    def __init__(self, open_handle: Callable[[], OpLogStore], corrupt: Callable[[int, bytes], None],
                 drop_prefix: Callable[[], None]):
        self.open = open_handle
        self.corrupt = corrupt
        self.drop_prefix = drop_prefix


_clusters = itertools.count()


@pytest.fixture(params=["file", "etcd"])
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    if request.param == "file":
        def corrupt_file(first: int, data: bytes) -> None:
            (tmp_path / "batches" / f"{first:020d}.msgpack").write_bytes(data)

        return Kit(lambda: FileOpLogStore(tmp_path), corrupt_file,
                   lambda: (tmp_path / "durable_prefix").unlink())
    server: EtcdServer = request.getfixturevalue("etcd")
    cluster = f"c{os.getpid()}-{next(_clusters)}"  # a fresh namespace per test on the shared server

    def corrupt_etcd(first: int, data: bytes) -> None:
        store = EtcdOpLogStore(server.endpoint, cluster)
        store._post("/v3/kv/put", {"key": base64.b64encode(store._batch_key(first).encode()).decode(),
                                   "value": base64.b64encode(data).decode()})

    def drop_etcd_prefix() -> None:
        store = EtcdOpLogStore(server.endpoint, cluster)
        store._post("/v3/kv/deleterange", {"key": base64.b64encode(store.prefix_key.encode()).decode()})

    return Kit(lambda: EtcdOpLogStore(server.endpoint, cluster), corrupt_etcd, drop_etcd_prefix)


def batch(first: int, n: int, tag: str = "k") -> OpLogBatch:
    return OpLogBatch(first, tuple(OpLogEntry(first + i, OpType.REMOVE, "default", f"{tag}{first + i}")
                                   for i in range(n)))


def spans(batches: list[OpLogBatch]) -> list[tuple[int, int]]:
    return [(b.first_sequence_id, b.last_sequence_id) for b in batches]


def test_implements_protocol(kit: Kit) -> None:
    assert isinstance(kit.open(), OpLogStore)


def test_empty_store(kit: Kit) -> None:
    s = kit.open()
    assert s.durable_prefix() == 0
    assert s.read_batches(0) == []
    assert s.producer_view() == 0


def test_append_read_prefix(kit: Kit) -> None:
    s = kit.open()
    written = [batch(1, 3), batch(4, 1), batch(5, 5)]
    for b in written:
        s.append_batch(b)
    assert s.durable_prefix() == 9
    assert s.read_batches(0) == written
    assert spans(s.read_batches(3)) == [(4, 4), (5, 9)]
    assert spans(s.read_batches(4)) == [(5, 9)]
    assert spans(s.read_batches(8)) == [(5, 9)]
    assert spans(s.read_batches(6)) == [(5, 9)]  # mid-batch: the holder comes back, callers skip
    assert spans(s.read_batches(1)) == [(1, 3), (4, 4), (5, 9)]
    assert spans(s.read_batches(0, limit=2)) == [(1, 3), (4, 4)]
    assert s.read_batches(9) == []
    with pytest.raises(OpLogGap, match="past the durable prefix"):
        s.read_batches(10)
    assert kit.open().read_batches(0) == written  # another handle sees the same log


def test_gap_rejected_and_nothing_written(kit: Kit) -> None:
    s = kit.open()
    s.append_batch(batch(1, 2))
    with pytest.raises(OpLogGap, match="starts at 4"):
        s.append_batch(batch(4, 2))
    assert s.durable_prefix() == 2
    assert spans(s.read_batches(0)) == [(1, 2)]


def test_duplicate_and_overlap_rejected(kit: Kit) -> None:
    s = kit.open()
    s.append_batch(batch(1, 3))
    with pytest.raises(OpLogConflict, match="already 3"):
        s.append_batch(batch(1, 3))
    with pytest.raises(OpLogConflict):
        s.append_batch(batch(2, 5))
    assert s.durable_prefix() == 3
    assert spans(s.read_batches(0)) == [(1, 3)]


def test_lost_cas_writes_nothing(kit: Kit) -> None:
    a, b = kit.open(), kit.open()
    assert a.durable_prefix() == b.durable_prefix() == 0
    a.append_batch(batch(1, 2, tag="a"))
    with pytest.raises(OpLogConflict) as ei:
        b.append_batch(batch(1, 3, tag="b"))  # b still believes the prefix is 0
    assert not isinstance(ei.value, FencedWrite)
    assert b.read_batches(0) == [batch(1, 2, tag="a")]
    assert b.durable_prefix() == 2


def test_stale_producer_view_is_fenced(kit: Kit) -> None:
    old, new, unclaimed = kit.open(), kit.open(), kit.open()
    old.set_producer_view(1)
    old.append_batch(batch(1, 2))
    new.set_producer_view(2)
    with pytest.raises(FencedWrite, match="view is 2, this writer holds view 1"):
        old.append_batch(batch(3, 1, tag="old"))  # the deposed primary's write fails...
    with pytest.raises(FencedWrite):
        unclaimed.append_batch(batch(3, 1))
    new.append_batch(batch(3, 1, tag="new"))  # ...and the new primary's succeeds
    assert new.read_batches(2) == [batch(3, 1, tag="new")]
    with pytest.raises(FencedWrite):
        old.set_producer_view(1)  # a deposed primary cannot reclaim an older view
    new.set_producer_view(2)  # re-claiming the current view is idempotent
    assert old.producer_view() == 2
    with pytest.raises(InvalidParams):
        new.set_producer_view(0)


def test_compaction(kit: Kit) -> None:
    s = kit.open()
    for b in (batch(1, 3), batch(4, 3), batch(7, 3)):
        s.append_batch(b)
    assert s.compact_through(5) == 1  # only 1..3 is fully covered
    assert spans(s.read_batches(3)) == [(4, 6), (7, 9)]
    assert spans(s.read_batches(5)) == [(4, 6), (7, 9)]
    with pytest.raises(OpLogGap, match="1..3"):
        s.read_batches(0)
    assert s.compact_through(5) == 0
    assert s.compact_through(9) == 2
    assert s.read_batches(9) == []
    with pytest.raises(OpLogGap):
        s.read_batches(8)
    with pytest.raises(InvalidParams, match="durable prefix is 9"):
        s.compact_through(10)
    s.append_batch(batch(10, 2))  # the prefix survives compaction; appends continue
    assert spans(s.read_batches(9)) == [(10, 11)]


@pytest.mark.parametrize("damage", ["flip", "garbage", "misplaced"])
def test_corrupt_stored_batch_detected(kit: Kit, damage: str) -> None:
    s = kit.open()
    for b in (batch(1, 3), batch(4, 3)):
        s.append_batch(b)
    good = encode_batch(batch(4, 3))
    if damage == "flip":
        bad = bytearray(good)
        bad[len(bad) // 2] ^= 0x40
        kit.corrupt(4, bytes(bad))
    elif damage == "garbage":
        kit.corrupt(4, b"\x00garbage\xff")
    else:  # a valid batch under the wrong name
        kit.corrupt(4, encode_batch(batch(1, 3)))
    with pytest.raises(OpLogCorrupt):
        s.read_batches(0)
    assert spans(s.read_batches(0, limit=1)) == [(1, 3)]  # the damage is confined to its batch


def test_batches_without_a_durable_prefix_are_corruption_not_an_empty_log(kit: Kit) -> None:
    from mooncake_columnar import ManualClocks
    from mooncake_columnar.ha.standby import StandbyService
    from mooncake_columnar.ha.writer import OpLogWriter
    kit.open().append_batch(batch(1, 3))
    kit.drop_prefix()
    with pytest.raises(OpLogCorrupt, match="durable_prefix"):
        kit.open().durable_prefix()
    with pytest.raises(OpLogCorrupt, match="durable_prefix"):
        kit.open().read_batches(0)
    with pytest.raises(OpLogCorrupt):  # a new writer must not restart the ids over stored batches
        OpLogWriter(kit.open(), window=8, clocks=ManualClocks())
    with pytest.raises(OpLogCorrupt):  # nor may a standby follow (and promote) an empty log
        StandbyService(kit.open(), clocks=ManualClocks()).poll()


def test_file_store_reopen_recovers_prefix(tmp_path: Path) -> None:
    s = FileOpLogStore(tmp_path)
    s.append_batch(batch(1, 4))
    s.set_producer_view(3)
    s.append_batch(batch(5, 2))
    # A crash between the batch file and the prefix replace leaves an undurable batch behind.
    (tmp_path / "batches" / f"{7:020d}.msgpack").write_bytes(encode_batch(batch(7, 9, tag="lost")))
    reopened = FileOpLogStore(tmp_path)
    assert reopened.durable_prefix() == 6
    assert spans(reopened.read_batches(0)) == [(1, 4), (5, 6)]
    assert reopened.producer_view() == 3
    reopened.set_producer_view(3)
    reopened.append_batch(batch(7, 1, tag="kept"))  # overwrites the stray file
    assert reopened.read_batches(6) == [batch(7, 1, tag="kept")]
    assert not list(tmp_path.glob("batches/.tmp-*"))


def test_file_store_rejects_damaged_prefix(tmp_path: Path) -> None:
    FileOpLogStore(tmp_path).append_batch(batch(1, 1))
    (tmp_path / "durable_prefix").write_bytes(b"01\n")
    with pytest.raises(OpLogCorrupt, match="durable_prefix"):
        FileOpLogStore(tmp_path)


def test_etcd_ambiguous_commit_resolves(etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    s = EtcdOpLogStore(etcd.endpoint, f"amb{os.getpid()}")
    real_post = s._post
    calls: list[str] = []

    def commit_then_drop(path: str, body: dict[str, Any]) -> dict[str, Any]:
        calls.append(path)
        real_post(path, body)
        if path == "/v3/kv/txn":
            raise OpLogStoreUnavailable("connection reset after the request was sent")
        return real_post(path, body)

    monkeypatch.setattr(s, "_post", commit_then_drop)
    s.append_batch(batch(1, 2))  # committed, then the answer was lost: still a success
    monkeypatch.setattr(s, "_post", real_post)
    assert s.durable_prefix() == 2 and "/v3/kv/txn" in calls

    def drop_before(path: str, body: dict[str, Any]) -> dict[str, Any]:
        if path == "/v3/kv/txn":
            raise OpLogStoreUnavailable("connection refused")
        return real_post(path, body)

    monkeypatch.setattr(s, "_post", drop_before)
    with pytest.raises(OpLogStoreUnavailable):
        s.append_batch(batch(3, 1))  # never reached etcd: the error stands
    monkeypatch.setattr(s, "_post", real_post)
    assert s.durable_prefix() == 2


def test_etcd_store_limits(etcd: EtcdServer) -> None:
    with pytest.raises(InvalidParams, match="cluster id"):
        EtcdOpLogStore(etcd.endpoint, "bad/cluster")
    s = EtcdOpLogStore(etcd.endpoint, f"big{os.getpid()}", max_batch_bytes=512)
    big = OpLogBatch(1, tuple(OpLogEntry(1 + i, OpType.SEGMENT_MOUNT, "default", f"e{i}",
                                         SegmentPayload("s" * 40, "e", 1, "c")) for i in range(10)))
    with pytest.raises(InvalidParams, match="exceeds"):
        s.append_batch(big)
    assert s.durable_prefix() == 0


def test_etcd_unreachable_is_unavailable() -> None:
    s = EtcdOpLogStore("127.0.0.1:1", "nowhere", timeout_s=1)
    with pytest.raises(OpLogStoreUnavailable):
        s.durable_prefix()


@pytest.mark.parametrize("name", ["durable_prefix", "producer_view"])
def test_file_store_counter_past_int64_is_corruption(tmp_path: Path, name: str) -> None:
    s = FileOpLogStore(tmp_path)
    s.set_producer_view(1)
    s.append_batch(batch(1, 1))
    (tmp_path / name).write_bytes(b"9223372036854775808\n")  # 19 canonical digits, one past int64
    with pytest.raises(OpLogCorrupt, match=name):
        FileOpLogStore(tmp_path).durable_prefix() if name == "durable_prefix" else s.producer_view()


# Names that match \d{20} but are not 20 ASCII digits, or carry a trailing newline.
LOOKALIKES = ["\u0660" * 19 + "\u0661", f"{1:020d}\n"]


def test_file_store_ignores_names_that_only_look_like_batch_ids(tmp_path: Path) -> None:
    s = FileOpLogStore(tmp_path)
    for b in (batch(1, 3), batch(4, 3)):
        s.append_batch(b)
    for name in LOOKALIKES:
        (tmp_path / "batches" / (name.rstrip("\n") + ".msgpack" + "\n" * name.endswith("\n"))).write_bytes(
            encode_batch(batch(4, 3, tag="foreign")))
    assert s.read_batches(0) == [batch(1, 3), batch(4, 3)]
    assert s.compact_through(3) == 1  # a lookalike counted as batch 1 would be deleted twice
    assert s.read_batches(3) == [batch(4, 3)]


def test_etcd_store_ignores_keys_that_only_look_like_batch_ids(etcd: EtcdServer) -> None:
    s = EtcdOpLogStore(etcd.endpoint, f"c{os.getpid()}-lookalike")
    for b in (batch(1, 3), batch(4, 3)):
        s.append_batch(b)
    for name in LOOKALIKES:
        s._post("/v3/kv/put", {"key": base64.b64encode((s.batches_prefix + name).encode()).decode(),
                               "value": base64.b64encode(encode_batch(batch(4, 3, tag="foreign"))).decode()})
    assert s.read_batches(0) == [batch(1, 3), batch(4, 3)]
