"""The behaviour every :class:`~mooncake_columnar.ha.stores.OpLogStore` must have, as a reusable
pytest suite: the file store, the etcd store, or your own.

Subclass :class:`OpLogStoreContract` in a test module (the subclass's name must start with
``Test``) and give it a ``kit`` fixture that returns an :class:`OpLogStoreKit` on a fresh, empty
store::

    class TestMyStore(OpLogStoreContract):
        @pytest.fixture
        def kit(self, tmp_path):
            return OpLogStoreKit(open=lambda: MyStore(tmp_path), corrupt=..., drop_prefix=...)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.errors import FencedWrite, InvalidParams, OpLogConflict, OpLogCorrupt, OpLogGap
from mooncake_columnar.ha.oplog import OpLogBatch, OpLogEntry, OpType, encode_batch
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import OpLogStore
from mooncake_columnar.ha.writer import OpLogWriter


@dataclass(frozen=True)
class OpLogStoreKit:
    """One backing store, plus ways to open more handles on it and to damage it behind its back.

    ``open()``: a new handle on the same store. ``corrupt(first, data)``: replace the stored record
    of the batch that starts at sequence id ``first`` with the raw bytes ``data``.
    ``drop_prefix()``: delete the stored durable prefix, leaving the batches.
    """

    open: Callable[[], OpLogStore]
    corrupt: Callable[[int, bytes], None]
    drop_prefix: Callable[[], None]


def batch(first: int, n: int, tag: str = "k") -> OpLogBatch:
    """``n`` REMOVE entries from sequence id ``first``, keys ``<tag><id>``."""
    return OpLogBatch(first, tuple(OpLogEntry(first + i, OpType.REMOVE, "default", f"{tag}{first + i}")
                                   for i in range(n)))


def spans(batches: list[OpLogBatch]) -> list[tuple[int, int]]:
    """Each batch's (first, last) sequence id."""
    return [(b.first_sequence_id, b.last_sequence_id) for b in batches]


class OpLogStoreContract:
    """Append, read, fence, compact and detect damage: what the writer and the standby rely on."""

    def test_implements_protocol(self, kit: OpLogStoreKit) -> None:
        assert isinstance(kit.open(), OpLogStore)

    def test_empty_store(self, kit: OpLogStoreKit) -> None:
        s = kit.open()
        assert s.durable_prefix() == 0
        assert s.read_batches(0) == []
        assert s.producer_view() == 0

    def test_append_read_prefix(self, kit: OpLogStoreKit) -> None:
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

    def test_gap_rejected_and_nothing_written(self, kit: OpLogStoreKit) -> None:
        s = kit.open()
        s.append_batch(batch(1, 2))
        with pytest.raises(OpLogGap, match="starts at 4"):
            s.append_batch(batch(4, 2))
        assert s.durable_prefix() == 2
        assert spans(s.read_batches(0)) == [(1, 2)]

    def test_duplicate_and_overlap_rejected(self, kit: OpLogStoreKit) -> None:
        s = kit.open()
        s.append_batch(batch(1, 3))
        with pytest.raises(OpLogConflict, match="already 3"):
            s.append_batch(batch(1, 3))
        with pytest.raises(OpLogConflict):
            s.append_batch(batch(2, 5))
        assert s.durable_prefix() == 3
        assert spans(s.read_batches(0)) == [(1, 3)]

    def test_lost_cas_writes_nothing(self, kit: OpLogStoreKit) -> None:
        a, b = kit.open(), kit.open()
        assert a.durable_prefix() == b.durable_prefix() == 0
        a.append_batch(batch(1, 2, tag="a"))
        with pytest.raises(OpLogConflict) as ei:
            b.append_batch(batch(1, 3, tag="b"))  # b still believes the prefix is 0
        assert not isinstance(ei.value, FencedWrite)
        assert b.read_batches(0) == [batch(1, 2, tag="a")]
        assert b.durable_prefix() == 2

    def test_stale_producer_view_is_fenced(self, kit: OpLogStoreKit) -> None:
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

    def test_compaction(self, kit: OpLogStoreKit) -> None:
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
    def test_corrupt_stored_batch_detected(self, kit: OpLogStoreKit, damage: str) -> None:
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

    def test_batches_without_a_durable_prefix_are_corruption_not_an_empty_log(self, kit: OpLogStoreKit) -> None:
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
