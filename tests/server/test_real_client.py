"""The real upstream client (``mooncake.store.MooncakeDistributedStore``) against each master kind.

The expected codes are what the client returns against upstream's own ``mooncake_master``. Some are
the client's doing rather than the master's (it maps OBJECT_ALREADY_EXISTS on put to 0 and rejects an
empty value locally with INVALID_PARAMS); a drop-in master has to produce the same end result.
Every test uses its own keys and does not depend on another test's objects (the remove_all test
clears the store first and counts only its own).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from mooncake_columnar.errors import ErrorCode
from mooncake_columnar.testing.client_driver import RealClient, SeededValue
from mooncake_columnar.testing.upstream_wheel import MasterKind, MasterProcess, skip_reason

from .conftest import LEASE_TTL_MS, MASTER_FLAGS, start_client, start_master

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

OK = ErrorCode.OK
NOT_FOUND = ErrorCode.OBJECT_NOT_FOUND  # -704
HAS_LEASE = ErrorCode.OBJECT_HAS_LEASE  # -706
INVALID_PARAMS = ErrorCode.INVALID_PARAMS  # -600
NO_HANDLE = ErrorCode.NO_AVAILABLE_HANDLE  # -200

KiB, MiB = 1 << 10, 1 << 20
SIZES = [1, 100, 4 * KiB, 1 * MiB, 16 * MiB]
SIZE_IDS = ["1B", "100B", "4KiB", "1MiB", "16MiB"]
WIDE = 300  # above 255: the wire switches every size field to 2 bytes


def test_setup_returns_zero(store_client: RealClient) -> None:
    assert store_client.setup_rc == OK


@pytest.mark.parametrize("size", SIZES, ids=SIZE_IDS)
def test_put_then_get_returns_the_same_bytes(store_client: RealClient, size: int) -> None:
    key, value = f"roundtrip/{size}", SeededValue(size, size)
    assert store_client.put(key, value) == OK
    assert store_client.get(key).matches(value)
    assert store_client.get_size(key) == size
    assert store_client.is_exist(key) == 1
    assert store_client.remove(key, force=True) == OK
    assert store_client.is_exist(key) == 0


def test_small_get_returns_the_exact_bytes(store_client: RealClient) -> None:
    assert store_client.put("exact/1", b"\x00") == OK
    assert store_client.put("exact/2", b"hello mooncake") == OK
    assert store_client.get("exact/1").data == b"\x00"
    assert store_client.get("exact/2").data == b"hello mooncake"


def test_missing_key_reads_return_empty_or_not_found(store_client: RealClient) -> None:
    key = "missing/never-put"
    empty = store_client.get(key)
    assert (empty.size, empty.data) == (0, b"")  # get has no code: a missing key reads as b""
    assert store_client.get_size(key) == NOT_FOUND
    assert store_client.is_exist(key) == 0
    assert store_client.remove(key) == NOT_FOUND
    assert store_client.remove(key, force=True) == NOT_FOUND
    assert store_client.get_into(key, 4096) == (NOT_FOUND, None)


def test_double_put_returns_zero_and_keeps_the_first_value(store_client: RealClient) -> None:
    first, second = SeededValue(1, 100), SeededValue(2, 300)
    assert store_client.put("double/a", first) == OK
    assert store_client.put("double/a", second) == OK  # the master says OBJECT_ALREADY_EXISTS; the client returns 0
    assert store_client.get("double/a").matches(first)
    assert store_client.get_size("double/a") == 100


def test_empty_value_put_is_invalid_params(store_client: RealClient) -> None:
    assert store_client.put("empty/a", b"") == INVALID_PARAMS
    assert store_client.is_exist("empty/a") == 0


def test_remove_without_a_read_needs_no_force(store_client: RealClient) -> None:
    assert store_client.put("nolease/a", b"abc") == OK
    assert store_client.remove("nolease/a") == OK
    assert store_client.is_exist("nolease/a") == 0


@pytest.mark.parametrize("read", ["get", "get_size", "is_exist", "batch_is_exist", "get_batch", "batch_get_into"])
def test_each_read_grants_a_lease_that_refuses_remove_until_forced(store_client: RealClient, read: str) -> None:
    key = f"lease/{read}"
    assert store_client.put(key, b"leased") == OK
    if read in ("get", "get_size", "is_exist"):
        getattr(store_client, read)(key)
    elif read == "batch_get_into":
        store_client.batch_get_into([key], [64])
    else:
        getattr(store_client, read)([key])
    assert store_client.remove(key) == HAS_LEASE
    assert store_client.batch_remove([key]) == [HAS_LEASE]
    assert store_client.is_exist(key) == 1
    assert store_client.remove(key, force=True) == OK
    assert store_client.is_exist(key) == 0


def test_lease_expires_after_default_kv_lease_ttl(store_client: RealClient) -> None:
    assert store_client.put("lease/expiry", b"x") == OK
    read_at = time.monotonic()
    assert store_client.get("lease/expiry").data == b"x"
    assert store_client.remove("lease/expiry") == HAS_LEASE
    removed = store_client.wait_until(lambda c: c.remove("lease/expiry") == OK, timeout_s=LEASE_TTL_MS / 1000 + 10)
    waited = time.monotonic() - read_at
    assert removed, "the read lease never expired"
    assert waited >= LEASE_TTL_MS / 1000 * 0.5, f"lease gone after {waited:.2f} s, ttl {LEASE_TTL_MS} ms"


def test_put_batch_and_get_batch_round_trip(store_client: RealClient) -> None:
    keys = ["pb/a", "pb/b", "pb/c"]
    values = [SeededValue(10, 1), SeededValue(11, 4 * KiB), SeededValue(12, 1 * MiB)]
    assert store_client.put_batch(keys, values) == OK
    reads = store_client.get_batch([*keys, "pb/missing"])
    assert [r.matches(v) for r, v in zip(reads, values)] == [True, True, True]
    assert (reads[3].size, reads[3].data) == (0, b"")
    assert store_client.batch_is_exist([keys[0], "pb/missing", keys[2]]) == [1, 0, 1]


def test_put_batch_with_an_existing_key_keeps_it_and_stores_the_new_one(store_client: RealClient) -> None:
    assert store_client.put("pbx/old", b"old") == OK
    assert store_client.put_batch(["pbx/old", "pbx/new"], [b"replacement", b"new"]) == OK
    assert [r.data for r in store_client.get_batch(["pbx/old", "pbx/new"])] == [b"old", b"new"]


def test_put_batch_with_an_empty_value_stores_nothing(store_client: RealClient) -> None:
    assert store_client.put_batch(["pbe/a", "pbe/b"], [b"", b"x"]) == INVALID_PARAMS
    assert store_client.batch_is_exist(["pbe/a", "pbe/b"]) == [0, 0]


def test_empty_batches(store_client: RealClient) -> None:
    assert store_client.put_batch([], []) == OK
    assert store_client.batch_is_exist([]) == []
    assert store_client.batch_remove([]) == []
    assert store_client.batch_put_from([], []) == []
    assert store_client.batch_get_into([], []) == ([], [])
    # The client answers an empty get_batch with one empty value, not with an empty list.
    assert [r.data for r in store_client.get_batch([])] == [b""]


def test_batch_remove_reports_lease_missing_and_removed_per_key(store_client: RealClient) -> None:
    assert store_client.put_batch(["br/leased", "br/free"], [b"1", b"2"]) == OK
    store_client.get("br/leased")
    assert store_client.batch_remove(["br/leased", "br/missing", "br/free"]) == [HAS_LEASE, NOT_FOUND, OK]
    assert store_client.batch_remove(["br/leased", "br/missing", "br/free"], force=True) == [OK, NOT_FOUND, NOT_FOUND]


def test_batch_of_300_keys(store_client: RealClient) -> None:
    keys = [f"wide/{i:04d}" for i in range(WIDE)]
    values = [SeededValue(1000 + i, 100 + i) for i in range(WIDE)]
    assert store_client.put_batch(keys, values) == OK
    assert store_client.batch_is_exist([*keys, "wide/missing"]) == [1] * WIDE + [0]
    assert all(r.matches(v) for r, v in zip(store_client.get_batch(keys), values))
    rcs, reads = store_client.batch_get_into(keys, [512] * WIDE)
    assert rcs == [v.size for v in values]
    assert all(r is not None and r.matches(v) for r, v in zip(reads, values))
    assert store_client.batch_remove(keys) == [HAS_LEASE] * WIDE
    assert store_client.batch_remove(keys, force=True) == [OK] * WIDE
    assert store_client.batch_put_from(keys, values) == [OK] * WIDE
    assert store_client.batch_remove(keys, force=True) == [OK] * WIDE


def test_key_of_300_bytes(store_client: RealClient) -> None:
    key = "k" * WIDE
    assert store_client.put(key, b"long key") == OK
    assert store_client.get(key).data == b"long key"
    assert store_client.get_size(key) == 8
    assert store_client.is_exist(key) == 1
    assert store_client.batch_is_exist([key, "k" * (WIDE + 1)]) == [1, 0]
    assert store_client.remove(key) == HAS_LEASE
    assert store_client.remove(key, force=True) == OK


def test_batch_put_from_and_batch_get_into_registered_buffers(store_client: RealClient) -> None:
    keys = [f"reg/{s}" for s in SIZE_IDS]
    values = [SeededValue(2000 + i, size) for i, size in enumerate(SIZES)]
    assert store_client.batch_put_from(keys, values) == [OK] * len(keys)
    rcs, reads = store_client.batch_get_into([*keys, "reg/missing"], [*SIZES, 64])
    assert rcs == [*SIZES, NOT_FOUND]
    assert [r is not None and r.matches(v) for r, v in zip(reads, values)] == [True] * len(keys)
    assert reads[-1] is None
    # A slot smaller than the object: INVALID_PARAMS for that key only.
    assert store_client.batch_get_into([keys[1], keys[2]], [99, 4 * KiB])[0] == [INVALID_PARAMS, 4 * KiB]
    # An existing key in batch_put_from reports 0 and keeps its bytes.
    assert store_client.batch_put_from([keys[1]], [SeededValue(9, 100)]) == [OK]
    assert store_client.get(keys[1]).matches(values[1])


def test_put_from_and_get_into_registered_buffers(store_client: RealClient) -> None:
    value = SeededValue(3000, 5000)
    assert store_client.put_from("regone/a", value) == OK
    rc, read = store_client.get_into("regone/a", 8192)
    assert rc == 5000 and read is not None and read.matches(value)
    assert store_client.get_into("regone/a", 4999) == (INVALID_PARAMS, None)


def test_remove_all_counts_objects_without_a_lease(store_client: RealClient) -> None:
    store_client.remove_all(force=True)  # other tests' objects: any count
    assert store_client.remove_all() == 0
    keys = [f"all/{i}" for i in range(5)]
    assert store_client.put_batch(keys, [b"v"] * 5) == OK
    store_client.get(keys[0])
    store_client.is_exist(keys[1])
    assert store_client.remove_all() == 3  # the two leased objects stay
    assert store_client.batch_is_exist(keys) == [1, 1, 0, 0, 0]
    assert store_client.remove_all(force=True) == 2
    assert store_client.remove_all(force=True) == 0


def test_second_process_reads_and_writes_the_first_ones_segment_over_tcp(store_client: RealClient,
                                                                          reader_client: RealClient) -> None:
    values = {f"tcp/{s}": SeededValue(4000 + i, size) for i, (s, size) in enumerate(zip(SIZE_IDS, SIZES))}
    assert store_client.put_batch(list(values), list(values.values())) == OK
    for key, value in values.items():
        assert reader_client.get(key).matches(value), key
        assert reader_client.get_size(key) == value.size
    reads = reader_client.get_batch(list(values))
    assert [r.matches(v) for r, v in zip(reads, values.values())] == [True] * len(values)
    rcs, slots = reader_client.batch_get_into(list(values), [v.size for v in values.values()])
    assert rcs == [v.size for v in values.values()]
    assert all(r is not None and r.matches(v) for r, v in zip(slots, values.values()))
    # The reader has no segment, so its writes land in the first process's segment.
    back = SeededValue(4100, 1 * MiB)
    assert reader_client.put("tcp/from-reader", back) == OK
    assert reader_client.batch_put_from(["tcp/from-reader-2"], [SeededValue(4101, 300)]) == [OK]
    assert store_client.get("tcp/from-reader").matches(back)
    assert store_client.get("tcp/from-reader-2").matches(SeededValue(4101, 300))
    assert reader_client.remove("tcp/from-reader", force=True) == OK
    assert store_client.is_exist("tcp/from-reader") == 0


@pytest.fixture(scope="module")
def ttl_master(master_kind: MasterKind, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    """A master that drops a client 2 s after its last heartbeat."""
    master = start_master(master_kind, tmp_path_factory.mktemp(f"ttl-master-{master_kind}"),
                          [*MASTER_FLAGS, "--client_ttl=2"])
    yield master
    master.stop()


@pytest.fixture(scope="module")
def observer(ttl_master: MasterProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealClient]:
    """A client with no segment: the objects it sees all live in the segment owner's process."""
    client = start_client(ttl_master, tmp_path_factory.mktemp("observer"), "observer", segment_bytes=0,
                          memcpy=False)
    yield client
    client.close(unmount=False)


def _owner_puts(owner: RealClient, observer: RealClient, prefix: str) -> list[str]:
    keys = [f"{prefix}/{i}" for i in range(3)]
    values = [SeededValue(6000 + i, 1000 * (i + 1)) for i in range(3)]
    assert owner.put_batch(keys, values) == OK
    assert [r.matches(v) for r, v in zip(observer.get_batch(keys), values)] == [True] * 3
    return keys


def test_closed_client_objects_disappear_at_once(ttl_master: MasterProcess, observer: RealClient,
                                                 tmp_path: Path) -> None:
    owner = start_client(ttl_master, tmp_path, "closing-owner", segment_bytes=64 * MiB)
    try:
        keys = _owner_puts(owner, observer, "closed")
        assert owner.close_store() == OK
        assert observer.batch_is_exist(keys) == [0, 0, 0]
        assert observer.get_size(keys[0]) == NOT_FOUND
        assert observer.put("closed/after", b"x") == NO_HANDLE  # no segment is left to allocate in
    finally:
        owner.close()


def test_killed_client_objects_disappear_after_client_ttl(ttl_master: MasterProcess, observer: RealClient,
                                                          tmp_path: Path) -> None:
    owner = start_client(ttl_master, tmp_path, "killed-owner", segment_bytes=64 * MiB)
    try:
        keys = _owner_puts(owner, observer, "killed")
        owner.kill()
        gone = observer.wait_until(lambda c: c.batch_is_exist(keys) == [0, 0, 0], timeout_s=20)
        assert gone, f"objects still exist 20 s after their owner was killed: {observer.batch_is_exist(keys)}"
        assert observer.get_size(keys[0]) == NOT_FOUND
        assert observer.put("killed/after", b"x") == NO_HANDLE
    finally:
        owner.kill()
