"""A minimal coro_rpc client speaking the upstream master protocol with this package's codec:
tests (handlers over the wire, fuzzing with raw frames) and load generators use it."""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from ..server.rpc_server import MAGIC, REQUEST_HEADER, RESPONSE_HEADER, RpcServer
from ..server.rpc_types import RPCS
from ..server.struct_pack import STR, Message


def request_frame(seq: int, function_id: int, body: bytes, *, magic: int = MAGIC, version: int = 0,
                  serialize_type: int = 0, length: int | None = None, attach: int = 0) -> bytes:
    """A request frame; every header field can be set (hostile-input tests)."""
    return REQUEST_HEADER.pack(magic, version, serialize_type, 0, seq, function_id,
                               len(body) if length is None else length, attach) + body


class WireClient:
    """One blocking connection to a master's RPC port."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "WireClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read_exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError(f"connection closed after {len(out)} of {n} bytes")
            out += chunk
        return bytes(out)

    def read_response(self) -> tuple[int, int, bytes]:
        """(seq, coro_rpc error code, body) of the next response."""
        magic, _version, errc, _msg_type, seq, length, attach = RESPONSE_HEADER.unpack(
            self._read_exactly(RESPONSE_HEADER.size))
        if magic != MAGIC:
            raise ConnectionError(f"bad response magic {magic}")
        return seq, errc, self._read_exactly(length + attach)[:length]

    def call_raw(self, function_id: int, body: bytes) -> tuple[int, bytes]:
        """(coro_rpc error code, response body) of one request."""
        seq = self.seq
        self.seq += 1
        self.send_raw(request_frame(seq, function_id, body))
        got_seq, errc, out = self.read_response()
        if got_seq != seq:
            raise ConnectionError(f"response seq {got_seq} for request {seq}")
        return errc, out

    def call(self, name: str, args: Any = None) -> Any:
        """Call RPC ``name``; its decoded response, or raise RpcFailed with the coro_rpc error."""
        rpc = RPCS[name]
        body = rpc.request.encode(args) if rpc.request is not None else b""
        errc, out = self.call_raw(rpc.function_id, body)
        if errc:
            raise RpcFailed(errc, Message(STR).decode(memoryview(out)))
        return rpc.response.decode(memoryview(out))


class RpcFailed(Exception):
    """A coro_rpc transport error (``errc``) instead of a response."""

    def __init__(self, errc: int, message: str) -> None:
        super().__init__(f"coro_rpc error {errc}: {message}")
        self.errc = errc


class ServerThread:
    """An :class:`~mooncake_columnar.server.rpc_server.RpcServer` on its own event loop thread,
    on a free loopback port (in-process wire tests)."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rpc-server-test", daemon=True)
        self._thread.start()
        self.port = asyncio.run_coroutine_threadsafe(server.start("127.0.0.1", 0), self.loop).result(10)

    def client(self, timeout_s: float = 10.0) -> WireClient:
        return WireClient("127.0.0.1", self.port, timeout_s)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
