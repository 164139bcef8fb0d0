"""Tenant, client and segment codes are 2-byte columns: their dictionaries refuse a name past
MAX_CODES with a typed error naming the limit, and the refused call changes nothing."""
from __future__ import annotations

import numpy as np
import pytest

from mooncake_columnar.errors import InvalidParams, NameLimitExceeded
from mooncake_columnar.schema import MAX_CODES, OBJECT_COLUMNS, REPLICA_COLUMNS
from mooncake_columnar.store.segments import Segment, SegmentTable
from mooncake_columnar.store.strings import StringDictionary
from mooncake_columnar.testing.builders import make_master


def test_code_columns_hold_every_code_below_the_limit_and_the_empty_code():
    for dt in (OBJECT_COLUMNS["tenant"], OBJECT_COLUMNS["client"], REPLICA_COLUMNS["replica_segment"]):
        info = np.iinfo(dt)
        assert info.max >= MAX_CODES - 1 and info.min <= -1


def _full(what: str) -> StringDictionary:
    d = StringDictionary(what, MAX_CODES)
    d.codes(np.arange(MAX_CODES), [f"{what}{i}" for i in range(MAX_CODES)])
    return d


def test_full_dictionary_refuses_a_new_name_and_keeps_known_ones():
    d = _full("clients")
    assert d.code("clients7") == 7
    with pytest.raises(NameLimitExceeded) as e:
        d.code("new")
    assert isinstance(e.value, InvalidParams) and e.value.limit == MAX_CODES and "clients" in str(e.value)
    assert len(d) == MAX_CODES and d.find("new") == -1


def test_bulk_interning_past_the_limit_interns_nothing():
    d = StringDictionary("tenants", MAX_CODES)
    d.codes(np.arange(MAX_CODES - 1), [f"t{i}" for i in range(MAX_CODES - 1)])
    with pytest.raises(NameLimitExceeded):
        d.codes(np.array([0, 1]), ["x", "y"])
    assert len(d) == MAX_CODES - 1 and d.find("x") == -1


def test_put_start_with_a_client_past_the_limit_is_refused_and_changes_nothing(clocks):
    m = make_master(clocks)
    m.put_start("a", 64, client_id="client0")
    m.store.clients.codes(np.arange(MAX_CODES - 1), [f"other{i}" for i in range(MAX_CODES - 1)])
    before = m.to_arrow()
    with pytest.raises(NameLimitExceeded):
        m.put_start("b", 64, client_id="one-too-many")
    assert m.to_arrow().equals(before)
    m.put_start("c", 64, client_id="client0")  # a known client still puts
    m.verify()


def _seg(i: int) -> Segment:
    return Segment(f"s{i}", "e:1", "c", 1 << 32, 1 << 20)


def test_segment_table_refuses_a_mount_past_the_limit_and_reuses_freed_codes():
    t = SegmentTable()
    for i in range(MAX_CODES):
        t.mount(_seg(i))
    with pytest.raises(NameLimitExceeded):
        t.mount(_seg(MAX_CODES))
    assert len(t) == MAX_CODES and t.code(f"s{MAX_CODES}") == -1
    t.unmount(5)
    assert t.mount(_seg(MAX_CODES)) == 5


def test_mount_segment_past_the_limit_is_refused_and_changes_nothing(clocks):
    m = make_master(clocks)
    table = m.store.segments
    for i in range(MAX_CODES - len(table)):
        table.mount(_seg(i))
    before = m.to_arrow()
    with pytest.raises(NameLimitExceeded):
        m.mount_segment("late", endpoint="e:1", client_id="client0", base=1 << 40, size=1 << 20)
    assert m.to_arrow().equals(before) and table.code("late") == -1
