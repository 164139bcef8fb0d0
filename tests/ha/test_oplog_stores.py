"""The OpLogStore contract on FileOpLogStore (tmp dir) and EtcdOpLogStore (real etcd), and what each
store does beyond it."""
from __future__ import annotations

import base64
import itertools
import os
from pathlib import Path
from typing import Any

import pytest

from mooncake_columnar.errors import InvalidParams, OpLogCorrupt, OpLogStoreUnavailable
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogEntry, OpType, SegmentPayload, encode_batch
from mooncake_columnar.ha.stores import EtcdOpLogStore, FileOpLogStore
from mooncake_columnar.testing.etcd_server import EtcdServer
from mooncake_columnar.testing.oplog_store_contract import OpLogStoreContract, OpLogStoreKit, batch, spans


_clusters = itertools.count()


class TestOpLogStoreContract(OpLogStoreContract):
    @pytest.fixture(params=["file", "etcd"])
    def kit(self, request: pytest.FixtureRequest, tmp_path: Path) -> OpLogStoreKit:
        if request.param == "file":
            def corrupt_file(first: int, data: bytes) -> None:
                (tmp_path / "batches" / f"{first:020d}.msgpack").write_bytes(data)

            return OpLogStoreKit(lambda: FileOpLogStore(tmp_path), corrupt_file,
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

        return OpLogStoreKit(lambda: EtcdOpLogStore(server.endpoint, cluster), corrupt_etcd, drop_etcd_prefix)


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
