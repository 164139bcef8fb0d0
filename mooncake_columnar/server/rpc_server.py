"""coro_rpc over asyncio: frames in, handler calls, frames out (ylt's coro_rpc_protocol.hpp).

Each connection serves its requests in order (the client matches responses by sequence number
within a connection). What a hostile peer can do is bounded per connection: a declared length
above ``max_body_bytes`` is refused before anything is read into memory; a frame begun and not
finished within ``frame_timeout_s`` closes that connection; a header that is not coro_rpc's
closes it; a body that does not decode as the call's arguments gets ``invalid_rpc_arguments``
and the connection goes on. Idle connections stay open, as the client's pool expects.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from enum import IntEnum
from typing import Any, Callable, Protocol

from ..ha.writer import OpLogWriter
from .handlers import MasterHandlers, RawBody
from .struct_pack import STR, Err, Message, WireDecodeError

log = logging.getLogger(__name__)

# magic, version, serialize type, msg type, seq, function id, length, attach
REQUEST_HEADER = struct.Struct("<BBBBIIII")
RESPONSE_HEADER = struct.Struct("<BBBBIII")   # magic, version, err code, msg type, seq, length, attach
MAGIC = 21
_ERROR_MESSAGE = Message(STR)


class Errc(IntEnum):
    """coro_rpc transport errors (ylt/coro_rpc/impl/errno.h) this server answers with."""

    OK = 0
    INVALID_RPC_ARGUMENTS = 4
    RPC_THROW_EXCEPTION = 10
    FUNCTION_NOT_REGISTERED = 11
    PROTOCOL_ERROR = 12
    UNKNOWN_PROTOCOL_VERSION = 13
    MESSAGE_TOO_LARGE = 14


class RpcObserver(Protocol):
    """Where the server reports what it did (server/metrics_http.ServerMetrics is one)."""

    def observe(self, rpc_name: str, seconds: float, ok: bool) -> None: ...

    def wire_error(self, kind: str) -> None: ...

    def connections(self, delta: int) -> None: ...


class _NoObserver:
    def observe(self, rpc_name: str, seconds: float, ok: bool) -> None:
        pass

    def wire_error(self, kind: str) -> None:
        pass

    def connections(self, delta: int) -> None:
        pass


class _CloseConnection(Exception):
    """The peer broke the framing: answer (when possible) and close this connection."""


def response_frame(seq: int, body: bytes, errc: int = 0) -> bytes:
    return RESPONSE_HEADER.pack(MAGIC, 0, errc, 0, seq, len(body), 0) + body


def error_frame(seq: int, errc: Errc, message: str) -> bytes:
    return response_frame(seq, _ERROR_MESSAGE.encode(message), int(errc))


class RpcServer:
    """The master's RPC port: accepts connections and serves :class:`MasterHandlers` on them."""

    def __init__(self, handlers: MasterHandlers, *, observer: RpcObserver | None = None,
                 max_body_bytes: int = 256 << 20, frame_timeout_s: float = 30.0, max_connections: int = 4096,
                 idle_timeout_s: float | None = None, tcp_no_delay: bool = True,
                 durable_timeout_s: float = 10.0) -> None:
        self.handlers = handlers
        self.observer: RpcObserver = observer or _NoObserver()
        self.max_body_bytes = max_body_bytes
        self.frame_timeout_s = frame_timeout_s
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s  # upstream's --rpc_conn_timeout_seconds; None: idle forever
        self.tcp_no_delay = tcp_no_delay
        # HA: while this returns False (a leader past its lease) no call is served: the connection closes
        self.gate: Callable[[], bool] | None = None
        self.durable_timeout_s = durable_timeout_s
        self._connections: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any free one); returns the port."""
        self._server = await asyncio.start_server(self._serve_connection, host, port, limit=1 << 20)
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._connections):
                w.close()
            await self._server.wait_closed()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._connections) >= self.max_connections:
            self.observer.wire_error("too_many_connections")
            writer.close()
            return
        self._connections.add(writer)
        self.observer.connections(+1)
        sock = writer.get_extra_info("socket")
        if sock is not None and self.tcp_no_delay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                try:  # an idle connection waits here, without a limit unless one is set
                    first = await asyncio.wait_for(reader.readexactly(1), self.idle_timeout_s)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                except asyncio.TimeoutError:
                    self.observer.wire_error("idle_timeout")
                    return
                try:
                    frame = await asyncio.wait_for(self._read_frame(first, reader), self.frame_timeout_s)
                except asyncio.TimeoutError:
                    self.observer.wire_error("stalled_frame")
                    return
                except asyncio.IncompleteReadError:
                    self.observer.wire_error("truncated_frame")
                    return
                except _CloseConnection as e:
                    frame_out = e.args[1] if len(e.args) > 1 else None
                    if frame_out:
                        writer.write(frame_out)
                        await writer.drain()
                    return
                if self.gate is not None and not self.gate():
                    self.observer.wire_error("not_leader")
                    return
                journal = self.handlers.journal_writer
                before = journal.reserved_through if journal is not None else 0
                out = self.dispatch(*frame)
                if journal is not None and journal.reserved_through > before:
                    # a change is acknowledged only once durable: an answer lost with the leader
                    # is a call the client retries, an answer given for a lost change is not
                    if not await self._durable(journal, journal.reserved_through):
                        return
                writer.write(out)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._connections.discard(writer)
            self.observer.connections(-1)
            writer.close()

    async def _durable(self, journal: OpLogWriter, seq: int) -> bool:
        """Wait until the journal made ``seq`` durable; False (nothing acknowledged) on timeout."""
        if journal.durable_prefix >= seq:
            return True
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def resolve() -> None:
            if not done.done():
                done.set_result(None)

        def landed(_: int) -> None:  # on the writer's thread
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the loop is gone: the server is shutting down
                pass

        journal.on_durable(seq, landed)
        try:
            await asyncio.wait_for(done, self.durable_timeout_s)
            return True
        except asyncio.TimeoutError:
            self.observer.wire_error("not_durable")
            return False

    async def _read_frame(self, first: bytes, reader: asyncio.StreamReader) -> tuple[int, int, memoryview]:
        head = first + await reader.readexactly(REQUEST_HEADER.size - 1)
        magic, version, serialize_type, _msg_type, seq, function_id, length, attach = REQUEST_HEADER.unpack(head)
        if magic != MAGIC:
            self.observer.wire_error("bad_magic")
            raise _CloseConnection("bad magic")
        if version != 0:
            self.observer.wire_error("bad_version")
            raise _CloseConnection("version", error_frame(seq, Errc.UNKNOWN_PROTOCOL_VERSION,
                                                          f"protocol version {version} is not supported"))
        if serialize_type != 0:
            self.observer.wire_error("bad_serialize_type")
            raise _CloseConnection("serialize type", error_frame(seq, Errc.PROTOCOL_ERROR,
                                                                 f"serialize type {serialize_type} is not struct_pack"))
        if length + attach > self.max_body_bytes:
            self.observer.wire_error("oversize")
            raise _CloseConnection("oversize", error_frame(seq, Errc.MESSAGE_TOO_LARGE,
                                                           f"body of {length + attach} bytes is over the limit"))
        body = await reader.readexactly(length) if length else b""
        if attach:  # the master protocol sends no attachments: read past it, then refuse the call
            await reader.readexactly(attach)
            function_id = -1
        return seq, function_id, memoryview(body)

    def dispatch(self, seq: int, function_id: int, body: memoryview) -> bytes:
        found = self.handlers.handler(function_id)
        if found is None:
            self.observer.wire_error("function_not_registered")
            return error_frame(seq, Errc.FUNCTION_NOT_REGISTERED, f"function id {function_id:#010x} is not registered")
        rpc, fn = found
        t0 = time.perf_counter()
        try:
            args: Any = None
            if rpc.request is not None:
                args = rpc.request.decode(body)
            elif len(body):
                raise WireDecodeError(f"{rpc.name} takes no arguments, got {len(body)} bytes")
        except WireDecodeError as e:
            self.observer.wire_error("bad_arguments")
            return error_frame(seq, Errc.INVALID_RPC_ARGUMENTS, f"{rpc.name}: {e}")
        try:
            result = self.handlers.call(rpc, fn, args)
            ok = not isinstance(result, Err)
            out = (rpc.response.prologue(result.width) + result.payload.tobytes() if isinstance(result, RawBody)
                   else rpc.response.encode(result))
        except Exception as e:  # a bug, not the peer's doing: logged and answered, the server goes on
            log.exception("%s failed", rpc.name)
            self.observer.observe(rpc.name, time.perf_counter() - t0, False)
            return error_frame(seq, Errc.RPC_THROW_EXCEPTION, f"{rpc.name}: internal error {type(e).__name__}")
        self.observer.observe(rpc.name, time.perf_counter() - t0, ok)
        return response_frame(seq, out)
