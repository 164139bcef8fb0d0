"""The embedded HTTP metadata server, started for real on loopback and driven with aiohttp's client."""
from __future__ import annotations

import asyncio
from typing import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from mooncake_columnar.server.http_metadata import (
    MAX_VALUE_BYTES,
    HttpMetadataStore,
    MetadataServerHandle,
    PutOutcome,
    key_prefix,
    start_metadata_server,
)

Check = Callable[[aiohttp.ClientSession, str, MetadataServerHandle], Awaitable[None]]


def run(check: Check, store: HttpMetadataStore | None = None, **limits: int) -> None:
    async def main() -> None:
        server = await start_metadata_server("127.0.0.1", 0, store, **limits)
        try:
            async with aiohttp.ClientSession() as client:
                await check(client, f"{server.url}/metadata", server)
        finally:
            await server.close()
    asyncio.run(main())


def test_put_get_delete_round_trip() -> None:
    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        key = {"key": "mooncake/ram/10.0.0.1:12345"}
        async with client.put(url, params=key, data=b'{"name": "seg"}') as r:
            assert (r.status, await r.text()) == (200, "metadata updated")
        async with client.get(url, params=key) as r:
            assert r.status == 200
            assert r.content_type == "application/json"
            assert await r.read() == b'{"name": "seg"}'
        async with client.delete(url, params=key) as r:
            assert (r.status, await r.text()) == (200, "metadata deleted")
        async with client.get(url, params=key) as r:
            assert (r.status, await r.text()) == (404, "metadata not found")
        async with client.delete(url, params=key) as r:
            assert (r.status, await r.text()) == (404, "metadata not found")
        assert len(server.store) == 0 and server.store.total_bytes == 0
    run(check)


def test_values_are_opaque_bytes_and_overwrite() -> None:
    blob = bytes(range(256)) * 17 + b"\x00\xff\r\n"

    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        key = {"key": "mooncake/ram/host a/b?c&d=é"}  # the key is percent-encoded on the wire
        for value in (blob, b"", b"second"):
            async with client.put(url, params=key, data=value) as r:
                assert r.status == 200
            async with client.get(url, params=key) as r:
                assert (r.status, await r.read()) == (200, value)
        assert server.store.keys() == ["mooncake/ram/host a/b?c&d=é"]
        assert server.store.total_bytes == len(key["key"]) + len(b"second")
    run(check)


def test_missing_or_empty_key_parameter_is_400() -> None:
    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        for params in ({}, {"key": ""}, {"other": "x"}):
            for method in ("GET", "PUT", "DELETE"):
                async with client.request(method, url, params=params, data=b"v" if method == "PUT" else None) as r:
                    assert (r.status, await r.text()) == (400, "Missing key parameter"), (method, params)
        assert len(server.store) == 0
    run(check)


def test_rpc_meta_key_is_not_overwritten_by_a_different_value() -> None:
    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        key = {"key": "mooncake/rpc_meta/10.0.0.1:12345"}
        async with client.put(url, params=key, data=b"first") as r:
            assert (r.status, await r.text()) == (200, "metadata updated")
        async with client.put(url, params=key, data=b"first") as r:
            assert (r.status, await r.text()) == (200, "metadata unchanged")
        async with client.put(url, params=key, data=b"second") as r:
            assert (r.status, await r.text()) == (400, "Duplicate rpc_meta key not allowed")
        async with client.get(url, params=key) as r:
            assert await r.read() == b"first"
    run(check)


def test_oversize_put_is_refused_and_the_server_keeps_serving() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(8):
            yield b"y" * 512

    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        async with client.put(url, params={"key": "k"}, data=b"x" * 1025) as r:  # declared length
            assert r.status == 413
        async with client.put(url, params={"key": "k"}, data=chunks()) as r:  # chunked, no length
            assert r.status == 413
        async with client.put(url, params={"key": "k"}, data=b"x" * 1024) as r:
            assert r.status == 200
        async with client.get(url, params={"key": "k"}) as r:
            assert (r.status, await r.read()) == (200, b"x" * 1024)
    run(check, max_value_bytes=1024)


def test_default_value_cap_is_64_mib() -> None:
    assert MAX_VALUE_BYTES == 64 << 20


def test_hostile_keys_get_4xx() -> None:
    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        async with client.put(url, params={"key": "k" * 65}, data=b"v") as r:
            assert (r.status, await r.text()) == (400, "metadata key too long")
        async with client.get(url, params={"key": "k" * 20000}) as r:  # past aiohttp's request-line limit
            assert 400 <= r.status < 500
        async with client.get(url.replace("/metadata", "/metadata?key=%ff%zz"), params=None) as r:
            assert r.status == 404
        async with client.post(url, params={"key": "k"}, data=b"v") as r:
            assert r.status == 405
        async with client.get(url.replace("/metadata", "/health")) as r:
            assert (r.status, await r.text()) == (200, "OK")
        assert len(server.store) == 0
    run(check, max_key_chars=64)


def test_total_size_cap_answers_507_and_counts_overwrites() -> None:
    store = HttpMetadataStore(max_total_bytes=100)

    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        async with client.put(url, params={"key": "a"}, data=b"x" * 90) as r:
            assert r.status == 200
        async with client.put(url, params={"key": "b"}, data=b"x" * 20) as r:
            assert (r.status, await r.text()) == (507, "metadata store full")
        async with client.put(url, params={"key": "a"}, data=b"x" * 99) as r:  # replaces its own 90 bytes
            assert r.status == 200
        assert store.total_bytes == 100
    run(check, store)


def test_remove_keys_for_endpoint_deletes_only_that_clients_descriptors() -> None:
    store = HttpMetadataStore(prefix=key_prefix("cluster-a"))
    assert store.endpoint_keys("10.0.0.1:1") == ("mooncake/cluster-a/ram/10.0.0.1:1",
                                                 "mooncake/cluster-a/rpc_meta/10.0.0.1:1")

    async def check(client: aiohttp.ClientSession, url: str, server: MetadataServerHandle) -> None:
        keys = ["mooncake/cluster-a/ram/10.0.0.1:1", "mooncake/cluster-a/rpc_meta/10.0.0.1:1",
                "mooncake/cluster-a/ram/110.0.0.1:1", "mooncake/cluster-a/ram/10.0.0.1:12", "mooncake/ram/10.0.0.1:1"]
        for k in keys:
            async with client.put(url, params={"key": k}, data=k.encode()) as r:
                assert r.status == 200
        assert server.store.remove_keys_for_endpoint("10.0.0.1:1") == 2
        assert server.store.remove_keys_for_endpoint("10.0.0.1:1") == 0
        assert sorted(server.store.keys()) == sorted(keys[2:])
        # the client came back under the same name: its rpc_meta entry may be published afresh
        async with client.put(url, params={"key": keys[1]}, data=b"new") as r:
            assert r.status == 200
    run(check, store)


def test_key_prefix_follows_upstream() -> None:
    assert key_prefix() == key_prefix("") == "mooncake/"
    assert key_prefix("c1") == key_prefix("c1/") == "mooncake/c1/"


def test_store_put_outcomes() -> None:
    s = HttpMetadataStore(max_total_bytes=None)
    assert s.put("mooncake/rpc_meta/x", b"1") is PutOutcome.UPDATED
    assert s.put("mooncake/rpc_meta/x", b"1") is PutOutcome.UNCHANGED
    assert s.put("mooncake/rpc_meta/x", b"2") is PutOutcome.DUPLICATE_RPC_META
    assert s.remove_keys(["mooncake/rpc_meta/x", "absent"]) == 1
    assert "mooncake/rpc_meta/x" not in s and s.total_bytes == 0


def test_a_taken_port_raises() -> None:
    async def main() -> None:
        first = await start_metadata_server("127.0.0.1", 0)
        try:
            with pytest.raises(OSError):
                await start_metadata_server("127.0.0.1", first.port)
        finally:
            await first.close()
            await first.close()  # idempotent
    asyncio.run(main())
