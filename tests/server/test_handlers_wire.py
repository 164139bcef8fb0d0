"""The RPC handlers over a real socket, in process, on a master with injected clocks: every RPC
the client uses, with the engine's semantics (leases, lease refusals, NEED_REMOUNT, batches over
255 keys), and unknown function ids answered with coro_rpc function_not_registered."""
from __future__ import annotations

from typing import Iterator

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterService
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import ErrorCode
from mooncake_columnar.server.handlers import STORE_VERSION, MasterHandlers
from mooncake_columnar.server.rpc_server import Errc, RpcServer
from mooncake_columnar.server.rpc_types import RPCS
from mooncake_columnar.server.struct_pack import Err, KeyColumn, MetaColumn
from mooncake_columnar.testing.wire_client import ServerThread, WireClient

CLIENT = (11, 22)
SEGMENT_ID = (33, 44)
BASE, SIZE = 1 << 40, 64 << 20
TTL_MS = 5_000
CONFIG: tuple = (1, 0, 0, 0, None, False, [], "", [], False, 0, "", None)  # upstream ReplicateConfig defaults
SEGMENT = (SEGMENT_ID, "127.0.0.1:12345", BASE, SIZE, "127.0.0.1:12345", "tcp", "")


def keys_column(keys: list[str]) -> KeyColumn:
    raw = [k.encode() for k in keys]
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return KeyColumn(offsets, np.frombuffer(b"".join(raw), np.uint8))


def metas(keys: list[str]) -> MetaColumn:
    return MetaColumn(keys_column(keys), np.zeros(len(keys), np.bool_), np.zeros(len(keys), np.uint64))


@pytest.fixture
def clocks() -> ManualClocks:
    return ManualClocks()


@pytest.fixture
def master(clocks: ManualClocks) -> MasterService:
    return MasterService(MasterConfig(default_kv_lease_ttl_ms=TTL_MS, client_live_ttl_s=10), clocks=clocks)


@pytest.fixture
def wire(master: MasterService) -> Iterator[WireClient]:
    server = ServerThread(RpcServer(MasterHandlers(master)))
    with server.client() as c:
        yield c
    server.stop()


@pytest.fixture
def mounted(wire: WireClient) -> WireClient:
    assert wire.call("ServiceReady") == STORE_VERSION
    assert wire.call("MountSegment", (SEGMENT, CLIENT)) is None
    return wire


def put(wire: WireClient, key: str, size: int) -> list:
    replicas = wire.call("PutStart", (CLIENT, key, size, CONFIG, "default"))
    assert wire.call("PutEnd", (CLIENT, (key, None), 4, "default")) is None
    return replicas


def test_service_ready_answers_the_version_the_client_checks(wire: WireClient) -> None:
    assert wire.call("ServiceReady") == "2.0.0"
    assert wire.call("GetStorageConfig") == ("", True, 0)
    assert wire.call("GetFsdir") == ""


def test_ping_needs_remount_until_the_client_remounts(mounted: WireClient) -> None:
    assert mounted.call("Ping", CLIENT) == (0, 2)
    assert mounted.call("ReMountSegment", ([SEGMENT], CLIENT)) is None
    assert mounted.call("Ping", CLIENT) == (0, 1)


def test_put_returns_a_processing_buffer_inside_the_segment_and_get_the_complete_one(mounted: WireClient) -> None:
    started = mounted.call("PutStart", (CLIENT, "k", 100, CONFIG, "default"))
    [(replica_id, (variant, ((size, address, protocol, endpoint),)), status)] = started
    assert (variant, size, protocol, endpoint, status) == (0, 100, "tcp", "127.0.0.1:12345", 2)
    assert BASE <= address and address + size <= BASE + SIZE
    assert mounted.call("GetReplicaList", ("k", "default")) == Err(ErrorCode.REPLICA_IS_NOT_READY)
    assert mounted.call("PutEnd", (CLIENT, ("k", None), 4, "default")) is None
    replicas, lease_ttl_ms, checksum = mounted.call("GetReplicaList", ("k", "default"))
    assert replicas == [(replica_id, (0, ((100, address, "tcp", "127.0.0.1:12345"),)), 3)]
    assert (lease_ttl_ms, checksum) == (TTL_MS, None)


def test_missing_key_and_double_put_codes(mounted: WireClient) -> None:
    assert mounted.call("GetReplicaList", ("nope", "default")) == Err(ErrorCode.OBJECT_NOT_FOUND)
    assert mounted.call("ExistKey", ("nope", "default")) is False
    put(mounted, "k", 10)
    assert mounted.call("PutStart", (CLIENT, "k", 10, CONFIG, "default")) == Err(ErrorCode.OBJECT_ALREADY_EXISTS)


def test_remove_within_the_read_lease_is_refused_until_it_expires_or_force(mounted: WireClient,
                                                                          clocks: ManualClocks) -> None:
    put(mounted, "a", 10)
    put(mounted, "b", 10)
    assert mounted.call("ExistKey", ("a", "default")) is True  # grants the read lease
    mounted.call("GetReplicaList", ("b", "default"))
    assert mounted.call("Remove", ("a", False, "default")) == Err(ErrorCode.OBJECT_HAS_LEASE)
    assert mounted.call("Remove", ("a", True, "default")) is None
    clocks.advance(ms=TTL_MS + 1)
    assert mounted.call("Remove", ("b", False, "default")) is None
    assert mounted.call("ExistKey", ("b", "default")) is False


def test_batches_over_255_keys_round_trip_with_two_byte_sizes(mounted: WireClient) -> None:
    keys = [f"key-{i:04d}-" + "x" * (300 if i == 7 else 0) for i in range(300)]
    col = keys_column(keys)
    started = mounted.call("BatchPutStart", (CLIENT, col, np.full(300, 64, np.uint64), CONFIG, "default"))
    assert len(started) == 300 and all(len(r) == 1 and r[0][2] == 2 for r in started)
    addresses = [r[0][1][1][0][1] for r in started]
    assert len(set(addresses)) == 300
    assert mounted.call("BatchPutEnd", (CLIENT, metas(keys), 4, "default")) == [None] * 300
    got = mounted.call("BatchGetReplicaList", (keys_column(keys + ["missing"]), "default"))
    assert [r[0][0][1][1][0][1] for r in got[:300]] == addresses
    assert all(r[1] == TTL_MS for r in got[:300]) and got[300] == Err(ErrorCode.OBJECT_NOT_FOUND)
    assert mounted.call("BatchExistKey", (keys_column(["missing", keys[0]]), "default")) == [False, True]
    codes = mounted.call("BatchRemove", (keys_column(keys[:2] + ["missing"]), True, "default"))
    assert codes == [None, None, Err(ErrorCode.OBJECT_NOT_FOUND)]


def test_batch_put_revoke_frees_the_keys_it_names(mounted: WireClient) -> None:
    mounted.call("BatchPutStart", (CLIENT, keys_column(["r1", "r2"]), np.array([8, 8], np.uint64), CONFIG, "default"))
    assert mounted.call("BatchPutRevoke", (CLIENT, keys_column(["r1", "r2", "r3"]), 4, "default")) == [
        None, None, Err(ErrorCode.OBJECT_NOT_FOUND)]
    assert mounted.call("BatchExistKey", (keys_column(["r1", "r2"]), "default")) == [False, False]


def test_remove_all_counts_the_unleased_objects(mounted: WireClient, clocks: ManualClocks) -> None:
    for k in ("a", "b", "c"):
        put(mounted, k, 10)
    mounted.call("ExistKey", ("a", "default"))
    assert mounted.call("RemoveAll", (False, "default")) == 2
    assert mounted.call("RemoveAll", (True, "")) == 1


def test_remove_by_regex_removes_the_matching_keys(mounted: WireClient) -> None:
    for k in ("user/1", "user/2", "other"):
        put(mounted, k, 10)
    assert mounted.call("RemoveByRegex", ("^user/", False, "default")) == 2
    assert mounted.call("RemoveByRegex", ("(", False, "default")) == Err(ErrorCode.INVALID_PARAMS)


def test_unmount_by_segment_id_drops_its_objects(mounted: WireClient, master: MasterService) -> None:
    put(mounted, "k", 10)
    assert mounted.call("UnmountSegment", (SEGMENT_ID, CLIENT)) is None
    assert mounted.call("ExistKey", ("k", "default")) is False
    assert mounted.call("UnmountSegment", (SEGMENT_ID, CLIENT)) is None  # idempotent, as upstream
    master.verify()


def test_fetch_tasks_is_empty(mounted: WireClient) -> None:
    assert mounted.call("FetchTasks", (CLIENT, 16)) == []


def test_an_unregistered_function_id_gets_function_not_registered_and_the_connection_goes_on(
        wire: WireClient) -> None:
    errc, _ = wire.call_raw(0x12345678, b"")
    assert errc == Errc.FUNCTION_NOT_REGISTERED
    assert wire.call("ServiceReady") == STORE_VERSION


def test_bad_arguments_get_invalid_rpc_arguments_and_change_nothing(mounted: WireClient,
                                                                    master: MasterService) -> None:
    put(mounted, "k", 10)
    exist_body = RPCS["ExistKey"].request.encode(("k", "default"))  # type: ignore[union-attr]
    errc, _ = mounted.call_raw(RPCS["Remove"].function_id, exist_body)  # a body of another call's type
    assert errc == Errc.INVALID_RPC_ARGUMENTS
    assert master.object_count() == 1
    master.verify()


def test_out_of_range_values_are_refused_with_invalid_params(mounted: WireClient, master: MasterService) -> None:
    assert mounted.call("PutStart", (CLIENT, "k", 1 << 63, CONFIG, "default")) == Err(ErrorCode.INVALID_PARAMS)
    bad_config = (0,) + CONFIG[1:]
    assert mounted.call("PutStart", (CLIENT, "k", 10, bad_config, "default")) == Err(ErrorCode.INVALID_PARAMS)
    far = (SEGMENT_ID, "far", (1 << 64) - 8, 1 << 20, "far", "tcp", "")
    assert mounted.call("MountSegment", (far, CLIENT)) == Err(ErrorCode.INVALID_PARAMS)
    assert master.object_count() == 0
    master.verify()


def test_the_single_key_fast_encoding_is_byte_for_byte_the_generic_one(master: MasterService) -> None:
    handlers = MasterHandlers(master)
    master.mount_segment("127.0.0.1:1", endpoint="127.0.0.1:1", client_id="1-2", base=BASE, size=SIZE)
    descs = master.put_start("k", 100, client_id="1-2")
    for status, ttl, rpc in ((2, None, "PutStart"), (3, TTL_MS, "GetReplicaList")):
        fast = handlers._replica_list_body(descs, status, ttl)
        assert fast is not None
        value = [handlers._descriptor(d, status) for d in descs]
        generic = RPCS[rpc].response.encode(value if ttl is None else (value, ttl, None))
        assert RPCS[rpc].response.prologue(fast.width) + bytes(fast.payload) == generic
