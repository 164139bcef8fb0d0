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
from collections import deque
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
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (port 0: any free one); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        self._sweep()
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
            for c in list(self.connections):
                c.close()
            await self._server.wait_closed()

    def _sweep(self) -> None:
        """Close connections whose frame stalled (or that idled past the idle timeout): one timer
        for the whole server, not one per frame."""
        now = time.monotonic()
        for c in list(self.connections):
            if c.closed or c.paused:  # closing already, or not read on purpose (its peer reads its answers late)
                continue
            if c.frame_started is not None and now - c.frame_started > self.frame_timeout_s:
                self.observer.wire_error("stalled_frame")
                c.close()
            elif self.idle_timeout_s is not None and now - c.last_active > self.idle_timeout_s and not c.pending:
                self.observer.wire_error("idle_timeout")
                c.close()
        period = min(self.frame_timeout_s, self.idle_timeout_s or self.frame_timeout_s) / 4
        self._sweeper = asyncio.get_running_loop().call_later(min(period, 1.0), self._sweep)

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
            out = (rpc.response.prologue(result.width) + bytes(result.payload) if isinstance(result, RawBody)
                   else rpc.response.encode(result))
        except Exception as e:  # a bug, not the peer's doing: logged and answered, the server goes on
            log.exception("%s failed", rpc.name)
            self.observer.observe(rpc.name, time.perf_counter() - t0, False)
            return error_frame(seq, Errc.RPC_THROW_EXCEPTION, f"{rpc.name}: internal error {type(e).__name__}")
        self.observer.observe(rpc.name, time.perf_counter() - t0, ok)
        return response_frame(seq, out)


class _Connection(asyncio.Protocol):
    """One client connection: frames parsed from what arrived, served in order as they complete.

    A response that waits for durability holds back the ones after it (the client matches by
    sequence number, but in order is what upstream's server does too)."""

    def __init__(self, server: RpcServer) -> None:
        self.server = server
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.frame_started: float | None = None  # when the first bytes of an unfinished frame came
        self.last_active = time.monotonic()
        self.pending: deque[list[Any]] = deque()  # [future or None, frame] answers not yet sent, in order
        self.closed = False
        self.paused = False  # reading paused until the peer reads its answers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a stream transport (uvloop's is no subclass)
        server = self.server
        if len(server.connections) >= server.max_connections:
            server.observer.wire_error("too_many_connections")
            self.closed = True
            transport.close()
            return
        server.connections.add(self)
        server.observer.connections(+1)
        sock = transport.get_extra_info("socket")
        if sock is not None and server.tcp_no_delay:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.server.connections:
            self.server.connections.discard(self)
            self.server.observer.connections(-1)
        self.closed = True
        self.pending.clear()

    def eof_received(self) -> bool:
        if self.buf:  # the peer ended inside a frame
            self.server.observer.wire_error("truncated_frame")
        return False  # close our side too

    def close(self, last: bytes | None = None) -> None:
        """Close this connection (after ``last``, an error frame, when given)."""
        if self.closed or self.transport is None:
            return
        self.closed = True
        if last:
            self.transport.write(last)
        self.transport.close()

    # flow control: a peer that does not read its answers stops being read
    def pause_writing(self) -> None:
        if self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.paused = False
            self.frame_started = time.monotonic() if self.buf else None  # a stall counts from now
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buf += data
        self.last_active = time.monotonic()
        try:
            self._serve_frames()
        except Exception:  # never let one connection's frame take the loop down
            log.exception("connection failed")
            self.close()

    def _serve_frames(self) -> None:
        server, buf = self.server, self.buf
        head = REQUEST_HEADER.size
        completed = False
        while not self.closed and len(buf) >= head:
            magic, version, serialize_type, _msg_type, seq, function_id, length, attach = \
                REQUEST_HEADER.unpack_from(buf)
            refusal = self._refusal(magic, version, serialize_type, seq, length + attach)
            if refusal is not None:
                server.observer.wire_error(refusal[0])
                self.close(refusal[1])
                return
            end = head + length + attach
            if len(buf) < end:
                break
            body = memoryview(bytes(buf[head:head + length]))
            del buf[:end]
            if attach:  # the master protocol sends no attachments: refuse the call
                function_id = -1
            if server.gate is not None and not server.gate():
                server.observer.wire_error("not_leader")
                self.close()
                return
            self._answer(seq, function_id, body)
            completed = True
        # a stall is timed from the first bytes of the frame still unfinished
        if not buf:
            self.frame_started = None
        elif completed or self.frame_started is None:
            self.frame_started = time.monotonic()

    def _refusal(self, magic: int, version: int, serialize_type: int, seq: int,
                 length: int) -> tuple[str, bytes | None] | None:
        if magic != MAGIC:
            return "bad_magic", None
        if version != 0:
            return "bad_version", error_frame(seq, Errc.UNKNOWN_PROTOCOL_VERSION,
                                              f"protocol version {version} is not supported")
        if serialize_type != 0:
            return "bad_serialize_type", error_frame(seq, Errc.PROTOCOL_ERROR,
                                                     f"serialize type {serialize_type} is not struct_pack")
        if length > self.server.max_body_bytes:
            return "oversize", error_frame(seq, Errc.MESSAGE_TOO_LARGE, f"body of {length} bytes is over the limit")
        return None

    def _answer(self, seq: int, function_id: int, body: memoryview) -> None:
        server = self.server
        journal = server.handlers.journal_writer
        before = journal.reserved_through if journal is not None else 0
        out = server.dispatch(seq, function_id, body)
        waiting: asyncio.Future[None] | None = None
        if journal is not None and journal.reserved_through > before:
            # a change is acknowledged only once durable: an answer lost with the leader is a
            # call the client retries, an answer given for a lost change is not
            waiting = self._durable(journal, journal.reserved_through)
        if waiting is None and not self.pending:
            assert self.transport is not None
            self.transport.write(out)
            return
        self.pending.append([waiting, out])

    def _durable(self, journal: OpLogWriter, seq: int) -> asyncio.Future[None] | None:
        """A future done once ``seq`` is durable (None: it already is); past the durable
        timeout the connection closes with nothing acknowledged."""
        if journal.durable_prefix >= seq:
            return None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def resolve() -> None:
            if not done.done():
                done.set_result(None)
                self._send_ready()

        def landed(_: int) -> None:  # on the writer's thread
            try:
                loop.call_soon_threadsafe(resolve)
            except RuntimeError:  # the loop is gone: the server is shutting down
                pass

        def expired() -> None:
            if not done.done():
                self.server.observer.wire_error("not_durable")
                self.close()

        journal.on_durable(seq, landed)
        loop.call_later(self.server.durable_timeout_s, expired)
        return done

    def _send_ready(self) -> None:
        while self.pending and not self.closed:
            waiting, out = self.pending[0]
            if waiting is not None and not waiting.done():
                return
            self.pending.popleft()
            assert self.transport is not None
            self.transport.write(out)
