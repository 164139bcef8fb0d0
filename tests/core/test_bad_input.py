"""Bad input raises a typed error naming the problem and leaves the table unchanged."""
from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from mooncake_columnar import ManualClocks, MasterConfig, ReplicateConfig, SoftPinAction
from mooncake_columnar.errors import InvalidConfig, InvalidParams, MooncakeError
from mooncake_columnar.testing.builders import make_master


@pytest.fixture
def loaded(clocks):
    m = make_master(clocks, segments=2)
    for k in ("a", "b"):
        m.put_start(k, 128, client_id="client0")
        m.put_end(k, client_id="client0")
    m.put_start("inflight", 64, client_id="client0")
    return m


CALLS = {
    "put_start key type": lambda m: m.put_start(b"k", 10, client_id="client0"),
    "put_start empty key": lambda m: m.put_start("", 10, client_id="client0"),
    "put_start negative size": lambda m: m.put_start("k", -1, client_id="client0"),
    "put_start float size": lambda m: m.put_start("k", 1.5, client_id="client0"),
    "put_start bool size": lambda m: m.put_start("k", True, client_id="client0"),
    "put_start client type": lambda m: m.put_start("k", 10, client_id=7),
    "put_start config type": lambda m: m.put_start("k", 10, client_id="c", config={"replica_num": 1}),
    "put_start bad tenant": lambda m: m.put_start("k", 10, client_id="c", config=ReplicateConfig(tenant_id="_x")),
    "put_start oversize ttl": lambda m: m.put_start("k", 10, client_id="c", config=ReplicateConfig(
        soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=10**15)),
    "put_start negative ttl": lambda m: m.put_start("k", 10, client_id="c", config=ReplicateConfig(
        soft_pin_action=SoftPinAction.ENABLE, soft_pin_ttl_ms=-1)),
    "put_start replica_num": lambda m: m.put_start("k", 10, client_id="c", config=ReplicateConfig(replica_num=0)),
    "put_start huge key": lambda m: m.put_start("k" * 70_000, 10, client_id="c"),
    "put_end wrong client": lambda m: m.put_end("inflight", client_id="someone-else"),
    "put_end unknown key": lambda m: m.put_end("zzz", client_id="client0"),
    "put_revoke complete": lambda m: m.put_revoke("a", client_id="client0"),
    "get empty key": lambda m: m.get_replica_list(""),
    "get key type": lambda m: m.get_replica_list(None),
    "get tenant type": lambda m: m.get_replica_list("a", 3),
    "remove force type": lambda m: m.remove("a", force="yes"),
    "remove_by_regex bad": lambda m: m.remove_by_regex("(", force=True),
    "batch sizes mismatch": lambda m: m.batch_put_start(["x", "y"], [1], client_id="client0"),
    "batch keys type": lambda m: m.batch_put_start([1, 2], [1, 1], client_id="client0"),
    "batch keys null": lambda m: m.batch_get_replica_list(["a", None]),
    "mount zero base": lambda m: m.mount_segment("s", endpoint="e", client_id="c", base=0, size=10),
    "mount negative size": lambda m: m.mount_segment("s", endpoint="e", client_id="c", base=1, size=-1),
    "mount conflicting": lambda m: m.mount_segment("seg0", endpoint="e", client_id="c", base=1, size=1),
    "remount wrong client": lambda m: m.remount_segments("client1", [dict(
        name="seg0", endpoint="10.0.0.0:1234", client="client0", base=1 << 32, size=64 << 20)]),
    "remount bad item": lambda m: m.remount_segments("client0", ["seg0"]),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_bad_input_raises_typed_error_and_changes_nothing(loaded, name):
    before = loaded.to_arrow()
    usage = loaded.segment_usage()
    with pytest.raises(MooncakeError):
        CALLS[name](loaded)
    assert loaded.to_arrow().equals(before)
    assert loaded.segment_usage() == usage


@pytest.mark.parametrize("field,value", [
    ("eviction_ratio", 1.5), ("eviction_high_watermark_ratio", -0.1), ("default_kv_lease_ttl_ms", -1),
    ("default_kv_soft_pin_ttl_ms", 86_400_001), ("put_start_release_timeout_s", 30),
    ("client_live_ttl_s", 0), ("recovery_kv_lease_ttl_ms", "10"), ("allow_evict_soft_pinned_objects", 1),
])
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(InvalidConfig) as err:
        MasterConfig(**{field: value})
    assert err.value.field == field and field in str(err.value)


def test_recovery_ttl_defaults_to_lease_ttl():
    assert MasterConfig(default_kv_lease_ttl_ms=1234).effective_recovery_kv_lease_ttl_ms == 1234
    assert MasterConfig(recovery_kv_lease_ttl_ms=99).effective_recovery_kv_lease_ttl_ms == 99


@settings(max_examples=50, deadline=None)
@given(key=st.one_of(st.none(), st.integers(), st.binary(), st.just(""), st.text(max_size=5)),
       size=st.one_of(st.integers(-5, 5), st.floats(), st.none(), st.text(max_size=2)))
def test_put_start_fuzzed_arguments_never_corrupt_state(key, size):
    m = make_master(ManualClocks())
    try:
        m.put_start(key, size, client_id="client0")
    except MooncakeError:
        assert m.object_count() == 0 and m.segment_usage()["seg0"][0] == 0
    else:
        assert isinstance(key, str) and key and isinstance(size, int) and size > 0
        assert m.object_count() == 1


def test_invalid_params_is_a_value_error():
    assert issubclass(InvalidParams, ValueError)
