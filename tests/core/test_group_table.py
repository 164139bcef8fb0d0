"""Group member lists live in the group side table (store/rare_fields.py GroupTable.next): only
grouped objects hold a slot; the lists stay whole through removals, restores and the read-lease
group rule."""
from __future__ import annotations

from mooncake_columnar import MasterService, ReplicateConfig
from mooncake_columnar.testing.builders import make_master

GROUP = ReplicateConfig(group_id="grp")


def _put(m: MasterService, key: str, config: ReplicateConfig = ReplicateConfig()) -> None:
    m.put_start(key, 64, client_id="client0", config=config)
    m.put_end(key, client_id="client0")


def _deadlines(m: MasterService, keys: list[str]) -> set[int]:
    return {m.object_info(k).lease_deadline_ns for k in keys}


def test_only_grouped_objects_hold_links_and_a_removal_keeps_the_rest_linked(clocks):
    m = make_master(clocks)
    _put(m, "alone")
    members = [f"g{i}" for i in range(4)]
    for k in members:
        _put(m, k, GROUP)
    assert int(m.store.group_of.in_use.sum()) == 4 and "group_next" not in m.column_bytes()
    m.get_replica_list("g2")  # the group rule: every member gets the reader's deadline
    assert _deadlines(m, members) == {clocks.steady_ns() + m.lease_ttl_ns}
    m.remove("g1", force=True)
    assert int(m.store.group_of.in_use.sum()) == 3
    m.verify()
    clocks.advance(ms=m.lease_ttl_ns // 1_000_000 + 1)
    m.get_replica_list("g3")  # the list closed over the gap: g0 and g2 are reached again
    rest = ["g0", "g2", "g3"]
    assert _deadlines(m, rest) == {clocks.steady_ns() + m.lease_ttl_ns}
    assert m.object_info("alone").lease_deadline_ns < clocks.steady_ns()


def test_group_links_survive_export_and_restore(clocks):
    m = make_master(clocks)
    for k in ("a", "b", "c"):
        _put(m, k, GROUP)
    back = MasterService.from_state(m.export_state(), config=m.config, clocks=clocks)
    back.verify()
    back.get_replica_list("b")
    assert _deadlines(back, ["a", "b", "c"]) == {clocks.steady_ns() + back.lease_ttl_ns}
