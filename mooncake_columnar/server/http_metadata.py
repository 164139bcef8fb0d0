"""Embedded HTTP metadata server: the key/value store the clients' transfer engines publish their
segment descriptors to (``GET/PUT/DELETE /metadata?key=...``), as upstream's master runs it with
``--enable_http_metadata_server``.

Status codes and bodies follow upstream's C++ server: a missing key answers 404, an empty or absent
``key`` parameter 400, and an ``rpc_meta`` key cannot be overwritten with a different value (400)
until it is deleted, which the master does for a client that timed out
(:meth:`HttpMetadataStore.remove_keys_for_endpoint`). Values are opaque bytes.
"""
from __future__ import annotations

import enum
import logging
import threading
from typing import Iterable

from aiohttp import web

log = logging.getLogger(__name__)

DEFAULT_KEY_PREFIX = "mooncake/"
# A segment descriptor is kilobytes; the caps only stop a hostile or broken client from exhausting memory.
MAX_VALUE_BYTES = 64 << 20
MAX_KEY_CHARS = 4096
MAX_TOTAL_BYTES = 1 << 30


def key_prefix(cluster_id: str | None = None) -> str:
    """Upstream's key prefix: ``mooncake/``, or ``mooncake/<cluster_id>/`` when the cluster sets
    ``MC_METADATA_CLUSTER_ID`` (clients and master must agree on it)."""
    if not cluster_id:
        return DEFAULT_KEY_PREFIX
    return DEFAULT_KEY_PREFIX + (cluster_id if cluster_id.endswith("/") else cluster_id + "/")


class PutOutcome(enum.Enum):
    UPDATED = "metadata updated"
    UNCHANGED = "metadata unchanged"
    DUPLICATE_RPC_META = "Duplicate rpc_meta key not allowed"
    FULL = "metadata store full"


class HttpMetadataStore:
    """key -> bytes, safe to call from any thread (the RPC server's client-expiry path may run off
    the event loop). ``max_total_bytes`` bounds keys plus values together."""

    def __init__(self, *, prefix: str = DEFAULT_KEY_PREFIX, max_total_bytes: int | None = MAX_TOTAL_BYTES) -> None:
        self.prefix = prefix
        self.max_total_bytes = max_total_bytes
        self._lock = threading.Lock()
        self._data: dict[str, bytes] = {}
        self._total = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    @property
    def total_bytes(self) -> int:
        return self._total

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._data)

    def get(self, key: str) -> bytes | None:
        with self._lock:
            return self._data.get(key)

    def put(self, key: str, value: bytes) -> PutOutcome:
        with self._lock:
            old = self._data.get(key)
            # A live client's rpc_meta entry is its identity; a second writer under the same name is refused.
            if old is not None and "rpc_meta" in key:
                return PutOutcome.UNCHANGED if old == value else PutOutcome.DUPLICATE_RPC_META
            grow = len(value) - len(old) if old is not None else len(key) + len(value)
            if self.max_total_bytes is not None and grow > 0 and self._total + grow > self.max_total_bytes:
                return PutOutcome.FULL
            self._data[key] = bytes(value)
            self._total += grow
            return PutOutcome.UPDATED

    def remove_key(self, key: str) -> bool:
        with self._lock:
            return self._pop(key)

    def remove_keys(self, keys: Iterable[str]) -> int:
        with self._lock:
            return sum(self._pop(k) for k in keys)

    def endpoint_keys(self, endpoint: str) -> tuple[str, str]:
        """The keys upstream's master deletes for a timed-out client's segment ``endpoint``."""
        return f"{self.prefix}ram/{endpoint}", f"{self.prefix}rpc_meta/{endpoint}"

    def remove_keys_for_endpoint(self, endpoint: str) -> int:
        """Delete a dead client's descriptors (``enable_metadata_cleanup_on_timeout``); returns how many existed."""
        removed = self.remove_keys(self.endpoint_keys(endpoint))
        log.info("removed %d HTTP metadata keys of segment %s", removed, endpoint)
        return removed

    def _pop(self, key: str) -> bool:
        old = self._data.pop(key, None)
        if old is None:
            return False
        self._total -= len(key) + len(old)
        return True


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text)


def make_metadata_app(store: HttpMetadataStore, *, max_value_bytes: int = MAX_VALUE_BYTES,
                      max_key_chars: int = MAX_KEY_CHARS) -> web.Application:
    """``/metadata`` (GET, PUT, DELETE) and ``/health`` over ``store``."""

    def checked_key(request: web.Request) -> str:
        key = request.query.get("key", "")
        if not key:
            raise web.HTTPBadRequest(text="Missing key parameter")
        if len(key) > max_key_chars:
            raise web.HTTPBadRequest(text="metadata key too long")
        return key

    async def get(request: web.Request) -> web.Response:
        value = store.get(checked_key(request))
        if value is None:
            return _text(404, "metadata not found")
        return web.Response(body=value, content_type="application/json")

    async def put(request: web.Request) -> web.Response:
        key = checked_key(request)
        # Refuse a declared oversize body before buffering any of it; chunked bodies hit client_max_size.
        if request.content_length is not None and request.content_length > max_value_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=max_value_bytes, actual_size=request.content_length)
        outcome = store.put(key, await request.read())
        status = {PutOutcome.DUPLICATE_RPC_META: 400, PutOutcome.FULL: 507}.get(outcome, 200)
        if outcome is PutOutcome.FULL:
            log.warning("HTTP metadata store full (%d bytes): refused key %r", store.total_bytes, key[:200])
        return _text(status, outcome.value)

    async def delete(request: web.Request) -> web.Response:
        if not store.remove_key(checked_key(request)):
            return _text(404, "metadata not found")
        return _text(200, "metadata deleted")

    async def health(request: web.Request) -> web.Response:
        return _text(200, "OK")

    app = web.Application(client_max_size=max_value_bytes)
    app.router.add_get("/metadata", get)
    app.router.add_put("/metadata", put)
    app.router.add_delete("/metadata", delete)
    app.router.add_get("/health", health)
    return app


class HttpServerHandle:
    """A started aiohttp app; ``port`` is the bound one (useful when started on port 0)."""

    def __init__(self, runner: web.AppRunner) -> None:
        self.runner = runner
        self.host, self.port = runner.addresses[0][:2]
        self._closed = False

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self.runner.cleanup()


class MetadataServerHandle(HttpServerHandle):
    def __init__(self, runner: web.AppRunner, store: HttpMetadataStore) -> None:
        super().__init__(runner)
        self.store = store


async def serve_app(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Start ``app`` on the running loop; a failed bind raises (OSError) after releasing the runner."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def start_metadata_server(host: str, port: int, store: HttpMetadataStore | None = None, *,
                                max_value_bytes: int = MAX_VALUE_BYTES,
                                max_key_chars: int = MAX_KEY_CHARS) -> MetadataServerHandle:
    store = HttpMetadataStore() if store is None else store
    app = make_metadata_app(store, max_value_bytes=max_value_bytes, max_key_chars=max_key_chars)
    handle = MetadataServerHandle(await serve_app(app, host, port), store)
    log.info("HTTP metadata server listening on %s", handle.url)
    return handle
