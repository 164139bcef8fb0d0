"""`serve`'s command line: upstream mooncake_master's gflags flags, their defaults, classes and mapping."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import InvalidConfig
from mooncake_columnar.server.flags import (FLAGS, FlagClass, FlagError, HelpRequested, ServeOptions, help_text,
                                            parse_duration_ms, parse_flags)

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "upstream_master_flags.txt"

# (type, default) as `mooncake_master --help` prints them (wheel mooncake-transfer-engine-non-cuda
# 0.3.13.post1); upstream's duration flags are gflags strings.
UPSTREAM_DEFAULTS = {
    "rpc_port": ("int32", "0"),
    "port": ("int32", "50051"),
    "rpc_address": ("string", "0.0.0.0"),
    "rpc_thread_num": ("int32", "0"),
    "max_threads": ("int32", "16"),
    "rpc_conn_timeout_seconds": ("int32", "0"),
    "rpc_enable_tcp_no_delay": ("bool", "true"),
    "enable_http_metadata_server": ("bool", "false"),
    "http_metadata_server_host": ("string", "0.0.0.0"),
    "http_metadata_server_port": ("int32", "8080"),
    "metrics_host": ("string", "0.0.0.0"),
    "metrics_port": ("int32", "9003"),
    "enable_metric_reporting": ("bool", "true"),
    "default_kv_lease_ttl": ("string", "10000"),
    "default_kv_soft_pin_ttl": ("string", "1800000"),
    "max_kv_soft_pin_ttl": ("string", "86400000"),
    "allow_evict_soft_pinned_objects": ("bool", "true"),
    "eviction_ratio": ("double", "0.050000000000000003"),
    "eviction_high_watermark_ratio": ("double", "0.90000000000000002"),
    "client_ttl": ("int64", "10"),
    "put_start_discard_timeout_sec": ("uint64", "30"),
    "put_start_release_timeout_sec": ("uint64", "600"),
    "cluster_id": ("string", "mooncake_cluster"),
    "enable_multi_tenants": ("bool", "false"),
    "enable_offload": ("bool", "false"),
    "offloading_queue_limit": ("uint64", "50000"),
    "enable_ha": ("bool", "false"),
    "etcd_endpoints": ("string", ""),
    "enable_oplog": ("bool", "false"),
    "enable_snapshot": ("bool", "false"),
    "enable_snapshot_restore": ("bool", "false"),
    "snapshot_interval_seconds": ("uint64", "600"),
    "snapshot_retention_count": ("uint32", "2"),
    "snapshot_object_store_type": ("string", ""),
    "enable_cxl": ("bool", "false"),
    "memory_allocator": ("string", "offset"),
    "allocation_strategy": ("string", "random"),
    "enable_disk_eviction": ("bool", "true"),
    "dynamic_replication_mode": ("string", "off"),
}


def upstream_flag_names() -> list[str]:
    lines = FIXTURE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def raises_flag_error(argv: list[str]) -> FlagError:
    with pytest.raises(FlagError) as info:
        parse_flags(argv)
    return info.value


# --- the table against upstream ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(UPSTREAM_DEFAULTS))
def test_flag_type_and_default_equal_upstream_help(name):
    flag = FLAGS[name]
    upstream_type, upstream_default = UPSTREAM_DEFAULTS[name]
    assert ("string" if flag.type == "duration" else flag.type) == upstream_type
    assert flag.default_value == flag.parse(upstream_default)


def test_every_upstream_flag_in_the_fixture_is_known_to_the_parser():
    names = upstream_flag_names()
    assert len(names) > 90  # the fixture holds the whole list, not a sample
    unknown = [n for n in names if n not in FLAGS]
    assert unknown == []
    for name in names:
        assert FLAGS[name].origin in ("master", "utils")


def test_no_table_entry_claims_an_upstream_flag_missing_from_the_fixture():
    names = set(upstream_flag_names())
    assert {f.name for f in FLAGS.values() if f.origin in ("master", "utils")} == names


def test_every_flag_accepts_its_own_default_value_on_the_command_line():
    for name, flag in FLAGS.items():
        if name in ("help", "helpfull", "helpshort", "version"):
            continue
        parse_flags([f"--{name}={flag.default}"])


def test_table_targets_name_existing_fields_and_cover_every_serve_option():
    config_fields = {f.name for f in dataclasses.fields(MasterConfig)}
    serve_fields = {f.name for f in dataclasses.fields(ServeOptions)} - {"config", "explicit", "warnings", "values"}
    targeted = set()
    for flag in FLAGS.values():
        where, _, name = flag.target.partition(".")
        if where == "config":
            assert name in config_fields, flag.name
        elif where == "serve":
            assert name in serve_fields, flag.name
            targeted.add(name)
        else:
            assert flag.target == "", flag.name
        if flag.kind is not FlagClass.HONOURED:
            assert flag.why and not flag.target, flag.name
    assert targeted == serve_fields


# --- defaults -------------------------------------------------------------------------------------


def test_no_flags_give_the_engine_defaults_and_upstream_serve_defaults():
    opts = parse_flags([])
    assert opts.config == MasterConfig()
    assert opts.rpc_port == 50051 and opts.rpc_address == "0.0.0.0"
    assert opts.metrics_port == 9003 and opts.enable_metric_reporting is True
    assert opts.enable_http_metadata_server is False
    assert (opts.http_metadata_server_host, opts.http_metadata_server_port) == ("0.0.0.0", 8080)
    assert opts.cluster_id == "mooncake_cluster"
    assert opts.enable_ha is False and opts.enable_oplog is False and opts.etcd_endpoints == ""
    assert opts.enable_snapshot is False and opts.snapshot_interval_seconds == 600
    assert opts.snapshot_retention_count == 2
    assert opts.log_level == logging.INFO
    assert opts.explicit == frozenset() and opts.warnings == ()


# --- syntax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["--metrics_port=9100"], ["-metrics_port=9100"], ["--metrics_port", "9100"],
                                  ["-metrics_port", "9100"]])
def test_value_flag_syntax_forms(argv):
    opts = parse_flags(argv)
    assert opts.metrics_port == 9100
    assert opts.explicit == frozenset({"metrics_port"})


@pytest.mark.parametrize("arg,expected", [
    ("--enable_http_metadata_server", True), ("-enable_http_metadata_server", True),
    ("--noenable_http_metadata_server", False), ("-noenable_http_metadata_server", False),
    ("--enable_http_metadata_server=true", True), ("--enable_http_metadata_server=false", False),
    ("--enable_http_metadata_server=1", True), ("--enable_http_metadata_server=0", False),
    ("--enable_http_metadata_server=yes", True), ("--enable_http_metadata_server=no", False),
    ("--enable_http_metadata_server=TRUE", True), ("--enable_http_metadata_server=No", False),
    ("--enable_http_metadata_server=t", True), ("--enable_http_metadata_server=F", False),
    ("--enable_http_metadata_server=y", True), ("--enable_http_metadata_server=n", False),
])
def test_bool_flag_syntax_forms(arg, expected):
    assert parse_flags([arg]).enable_http_metadata_server is expected


def test_noname_of_a_default_true_bool_turns_it_off():
    assert parse_flags(["--noenable_metric_reporting"]).enable_metric_reporting is False


def test_last_occurrence_of_a_flag_wins():
    assert parse_flags(["--metrics_port=9100", "--metrics_port", "9200"]).metrics_port == 9200


def test_double_dash_ends_the_flags():
    assert parse_flags(["--metrics_port=9100", "--"]).metrics_port == 9100
    err = raises_flag_error(["--", "--metrics_port=9100"])
    assert err.value == "--metrics_port=9100"  # after "--" it is not read as a flag


def test_bool_flag_does_not_take_the_next_argument_as_its_value():
    err = raises_flag_error(["--enable_http_metadata_server", "false"])
    assert err.flag == "false" and "--name=value" in str(err)


def test_string_value_may_start_with_a_dash_when_given_as_the_next_argument():
    assert parse_flags(["--cluster_id", "-c1"]).cluster_id == "-c1"


def test_integer_flags_accept_hex_and_leading_zeros_as_gflags_does():
    assert parse_flags(["--metrics_port=0x2400"]).metrics_port == 0x2400
    assert parse_flags(["--metrics_port=09100"]).metrics_port == 9100


# --- errors ---------------------------------------------------------------------------------------


def test_flag_error_is_an_invalid_config_naming_the_flag():
    err = raises_flag_error(["--rpc_port=abc"])
    assert isinstance(err, InvalidConfig)
    assert err.flag == err.field == "rpc_port" and err.value == "abc"


@pytest.mark.parametrize("name", ["rpc_prot", "nosuchflag", "logtostderrr", "-rpc_port"])
def test_unknown_flag_is_an_error_naming_it(name):
    err = raises_flag_error([f"--{name}=1"])
    assert err.flag == name
    assert f"unknown command line flag '{name}'" in str(err)


def test_no_prefix_on_a_non_bool_flag_is_an_error():
    err = raises_flag_error(["--noport"])
    assert "boolean value (noport) specified for int32" in str(err)


def test_no_prefix_with_a_value_is_an_error():
    err = raises_flag_error(["--noenable_http_metadata_server=true"])
    assert err.flag == "enable_http_metadata_server"


def test_missing_argument_is_an_error_naming_the_flag():
    err = raises_flag_error(["--rpc_address"])
    assert err.flag == "rpc_address" and "missing its argument" in str(err)


def test_positional_argument_is_an_error():
    assert raises_flag_error(["serve"]).flag == "serve"


@pytest.mark.parametrize("flag,value", [
    ("rpc_port", "abc"), ("rpc_port", "70000"), ("rpc_port", "-1"), ("rpc_port", "1_000"), ("rpc_port", "5.0"),
    ("port", "0"), ("metrics_port", "0"), ("metrics_port", "65536"), ("http_metadata_server_port", "-1"),
    ("client_ttl", "-1"), ("client_ttl", "0"), ("client_ttl", "ten"),
    ("default_kv_lease_ttl", "-5"), ("default_kv_lease_ttl", "1.5s"), ("default_kv_lease_ttl", ""),
    ("default_kv_soft_pin_ttl", "2d"), ("put_start_discard_timeout_sec", "-1"),
    ("eviction_ratio", "abc"), ("eviction_ratio", "1.5"), ("eviction_high_watermark_ratio", "nan"),
    ("enable_http_metadata_server", "maybe"), ("snapshot_retention_count", "4294967296"),
    ("offloading_queue_limit", "0"), ("memory_allocator", "jemalloc"), ("dynamic_replication_mode", "on"),
    ("snapshot_object_store_type", "gcs"), ("minloglevel", "-1"), ("max_replica_num", "65"),
])
def test_bad_value_is_an_error_naming_flag_and_value(flag, value):
    err = raises_flag_error([f"--{flag}={value}"])
    assert err.flag == flag
    assert err.value == value
    assert flag in str(err) and repr(value)[1:-1] in str(err)


# --- refused and no-effect flags ------------------------------------------------------------------


@pytest.mark.parametrize("argv,flag,value", [
    (["--enable_cxl=true"], "enable_cxl", "true"),
    (["--enable_cxl"], "enable_cxl", "true"),
    (["--memory_allocator=cachelib"], "memory_allocator", "cachelib"),
    (["--allocation_strategy=free_ratio_first"], "allocation_strategy", "free_ratio_first"),
    (["--enable_kv_events"], "enable_kv_events", "true"),
    (["--dynamic_replication_mode=enforce"], "dynamic_replication_mode", "enforce"),
    (["--nof_eviction_ratio=0.1"], "nof_eviction_ratio", "0.1"),
    (["--root_fs_dir=/mnt/3fs"], "root_fs_dir", "/mnt/3fs"),
    (["--ha_backend_type=redis"], "ha_backend_type", "redis"),
    (["--snapshot_catalog_store_type=redis"], "snapshot_catalog_store_type", "redis"),
    (["--tenant_quota_connector_type=etcd"], "tenant_quota_connector_type", "etcd"),
    (["--config_path=/etc/master.yaml"], "config_path", "/etc/master.yaml"),
    (["--flagfile=/etc/master.flags"], "flagfile", "/etc/master.flags"),
])
def test_refused_value_is_an_error_naming_flag_value_and_reason(argv, flag, value):
    err = raises_flag_error(argv)
    assert err.flag == flag and err.value == value
    assert f"--{flag}={value} is refused: {FLAGS[flag].why}" in str(err)


@pytest.mark.parametrize("argv", [
    ["--enable_cxl=false"], ["--noenable_cxl"], ["--memory_allocator=offset"], ["--allocation_strategy=random"],
    ["--nof_eviction_ratio=0.050"], ["--dynamic_replication_mode=off"], ["--snapshot_catalog_store_type=embedded"],
    ["--ha_backend_type=etcd"], ["--config_path="],
])
def test_refused_flag_at_its_upstream_default_is_accepted(argv):
    parse_flags(argv)


def test_no_effect_flag_set_off_default_is_accepted_with_a_warning():
    opts = parse_flags(["--max_total_pending_tasks=5", "--cxl_path=/dev/dax1.0", "--rpc_conn_timeout_seconds=5"])
    assert any(w.startswith("--max_total_pending_tasks=5 is accepted without effect") for w in opts.warnings)
    assert any(w.startswith("--cxl_path=/dev/dax1.0 is accepted without effect") for w in opts.warnings)
    assert opts.rpc_conn_timeout_seconds == 5
    assert parse_flags(["--max_total_pending_tasks=10000"]).warnings == ()


# --- durations and the mapping into MasterConfig --------------------------------------------------


@pytest.mark.parametrize("text,ms", [("5000", 5000), ("5s", 5000), ("500ms", 500), ("2m", 120_000),
                                     ("1h", 3_600_000), ("10S", 10_000), ("3MS", 3), (" 7 ms ", 7), ("0", 0)])
def test_duration_strings_convert_to_milliseconds(text, ms):
    assert parse_duration_ms(text) == ms
    assert parse_flags([f"--default_kv_lease_ttl={text}"]).config.default_kv_lease_ttl_ms == ms


@pytest.mark.parametrize("text", ["", "s", "5d", "1m30s", "-5", "+5", "1.5s", "5 s x", "5sec", str(1 << 64)])
def test_malformed_duration_strings_are_refused(text):
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_honoured_engine_flags_map_into_master_config():
    cfg = parse_flags(["--default_kv_lease_ttl=5000", "--client_ttl=3", "--eviction_high_watermark_ratio=0.8",
                       "--eviction_ratio=0.1", "--default_kv_soft_pin_ttl=10m", "--max_kv_soft_pin_ttl=2h",
                       "--noallow_evict_soft_pinned_objects", "--put_start_discard_timeout_sec=40",
                       "--put_start_release_timeout_sec=700", "--enable_offload", "--offloading_queue_limit=7",
                       "--recovery_kv_lease_ttl=2s", "--max_replica_num=2"]).config
    assert cfg == MasterConfig(default_kv_lease_ttl_ms=5000, client_live_ttl_s=3, eviction_high_watermark_ratio=0.8,
                               eviction_ratio=0.1, default_kv_soft_pin_ttl_ms=600_000,
                               max_kv_soft_pin_ttl_ms=7_200_000, allow_evict_soft_pinned_objects=False,
                               put_start_discard_timeout_s=40, put_start_release_timeout_s=700, enable_offload=True,
                               offloading_queue_limit=7, recovery_kv_lease_ttl_ms=2000, max_replica_num=2)


def test_recovery_lease_ttl_defaults_to_the_read_lease_ttl():
    cfg = parse_flags(["--default_kv_lease_ttl=3s"]).config
    assert cfg.recovery_kv_lease_ttl_ms is None and cfg.effective_recovery_kv_lease_ttl_ms == 3000


def test_combination_master_config_rejects_is_a_flag_error_naming_the_upstream_flag():
    err = raises_flag_error(["--put_start_discard_timeout_sec=700"])
    assert err.flag == "put_start_release_timeout_sec"
    assert "--put_start_discard_timeout_sec" in str(err) and "put_start_discard_timeout_s " not in str(err)
    err = raises_flag_error(["--max_kv_soft_pin_ttl=1h", "--default_kv_soft_pin_ttl=2h"])
    assert err.flag == "default_kv_soft_pin_ttl" and err.value == "2h"


# --- serve options --------------------------------------------------------------------------------


def test_rpc_port_falls_back_to_the_deprecated_port_flag():
    assert parse_flags(["--port=6000"]).rpc_port == 6000
    assert parse_flags(["--rpc_port=7000", "--port=6000"]).rpc_port == 7000
    assert parse_flags(["--rpc_port=0", "--port=6000"]).rpc_port == 6000
    assert "--port is deprecated upstream; use --rpc_port" in parse_flags(["--port=6000"]).warnings


def test_rpc_thread_num_falls_back_to_max_threads():
    assert parse_flags(["--rpc_thread_num=3"]).rpc_thread_num == 3
    assert parse_flags(["--max_threads=1"]).rpc_thread_num == 1


def test_ha_flags_resolve_the_connection_string_and_check_upstream_requirements():
    opts = parse_flags(["--enable_ha", "--etcd_endpoints=10.0.0.1:2379;10.0.0.2:2379", "--enable_oplog",
                        "--rpc_address=10.0.0.5"])
    assert opts.enable_ha and opts.enable_oplog
    assert opts.ha_backend_connstring == "10.0.0.1:2379;10.0.0.2:2379"
    assert parse_flags(["--enable_ha", "--ha_backend_connstring=h:1", "--etcd_endpoints=e:2"]).ha_backend_connstring \
        == "h:1"
    assert raises_flag_error(["--enable_ha"]).flag == "etcd_endpoints"
    assert raises_flag_error(["--enable_oplog"]).flag == "enable_oplog"


def test_snapshot_flags_resolve_the_store_type_and_check_upstream_requirements():
    opts = parse_flags(["--enable_snapshot", "--snapshot_object_store_type=S3", "--snapshot_interval_seconds=60",
                        "--snapshot_retention_count=5", "--snapshot_backup_dir=/var/snap", "--enable_snapshot_restore"])
    assert (opts.snapshot_object_store_type, opts.snapshot_interval_seconds, opts.snapshot_retention_count) == \
        ("s3", 60, 5)
    assert opts.snapshot_backup_dir == "/var/snap" and opts.enable_snapshot_restore
    legacy = parse_flags(["--enable_snapshot", "--snapshot_payload_store_type=local"])
    assert legacy.snapshot_object_store_type == "local"
    assert any("--snapshot_payload_store_type is deprecated" in w for w in legacy.warnings)
    assert parse_flags(["--snapshot_payload_backend_type=local",
                        "--snapshot_object_store_type=s3"]).snapshot_object_store_type == "s3"
    assert raises_flag_error(["--enable_snapshot"]).flag == "snapshot_object_store_type"
    err = raises_flag_error(["--enable_snapshot", "--snapshot_object_store_type=local", "--snapshot_retention_count=0"])
    assert err.flag == "snapshot_retention_count"


def test_multi_tenants_with_the_file_connector_needs_its_path():
    assert raises_flag_error(["--enable_multi_tenants"]).flag == "tenant_quota_connector_uri"
    opts = parse_flags(["--enable_multi_tenants", "--tenant_quota_connector_uri=/etc/quotas.yaml"])
    assert opts.config.enable_multi_tenants and opts.tenant_quota_connector_uri == "/etc/quotas.yaml"


def test_storage_config_flags_pass_through_for_get_storage_config():
    opts = parse_flags(["--noenable_disk_eviction", "--quota_bytes=1024"])
    assert opts.enable_disk_eviction is False and opts.quota_bytes == 1024


@pytest.mark.parametrize("argv,level", [([], logging.INFO), (["--v=1"], logging.DEBUG),
                                        (["--minloglevel=1"], logging.WARNING), (["--minloglevel=2"], logging.ERROR),
                                        (["--minloglevel=3"], logging.CRITICAL),
                                        (["--minloglevel=1", "--v=2"], logging.WARNING)])
def test_glog_levels_map_to_the_log_level(argv, level):
    assert parse_flags(argv).log_level == level


def test_common_glog_flags_are_accepted():
    opts = parse_flags(["--logtostderr", "--alsologtostderr=true", "--stderrthreshold=0", "--log_dir=/var/log/mc",
                        "--v=0", "--minloglevel=0"])
    assert opts.log_dir == "/var/log/mc"


# --- help -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arg", ["--help", "-help", "--helpfull", "-helpfull", "--helpshort", "--help=true"])
def test_help_flags_raise_help_requested_with_the_help_text(arg):
    with pytest.raises(HelpRequested) as info:
        parse_flags(["--metrics_port=9100", arg])
    assert info.value.topic == "help" and info.value.text == help_text()


def test_help_wins_over_a_bad_flag_elsewhere_on_the_line():
    with pytest.raises(HelpRequested):
        parse_flags(["--no_such_flag", "--help"])


def test_help_set_false_does_not_ask_for_help():
    assert parse_flags(["--help=false"]).rpc_port == 50051


def test_version_flag_raises_help_requested_with_the_version():
    with pytest.raises(HelpRequested) as info:
        parse_flags(["--version"])
    assert info.value.topic == "version" and "mooncake-columnar" in info.value.text


def test_help_text_lists_every_flag_with_its_type_default_and_class():
    text = help_text()
    for kind in FlagClass:
        assert sum(1 for f in FLAGS.values() if f.kind is kind) > 0
    sections = {kind: text.index(heading) for kind, heading in [
        (FlagClass.HONOURED, "Honoured:"), (FlagClass.NO_EFFECT, "Accepted without effect"),
        (FlagClass.REFUSED, "Refused when set")]}
    bounds = sorted(sections.values()) + [len(text)]
    for flag in FLAGS.values():
        line = f"  --{flag.name} ({flag.type}, default {flag.default!r})"
        at = text.index(line)
        start = sections[flag.kind]
        assert start < at < bounds[bounds.index(start) + 1], flag.name
