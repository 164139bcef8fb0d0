"""Hostile coro_rpc traffic for the master's RPC port: seeded generators of frames and bodies, a
reference model of what the server must answer to a byte stream, and the client side that reads
those answers with timeouts (tests/server/test_wire_fuzz.py and test_wire_hostile.py use them).

The model (:func:`expected_responses`) is upstream's framing rule (../shared/spec/upstream-rpc.md
section 1) written out on its own: it splits a stream into frames the way a coro_rpc server must
and says, per frame, which transport error code comes back or that the call is dispatched and
must answer with errc 0 and a body of the RPC's response type; the connection ends where a frame
breaks the framing. A run compares what the server sent with that, so a fuzz case that gets the
wrong code, a response for the wrong seq, a missing response or an extra one fails, not only one
that crashes.
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..server.rpc_server import MAGIC, REQUEST_HEADER, RESPONSE_HEADER, Errc
from ..server.rpc_types import RPCS, Rpc
from ..server.struct_pack import (I32, STR, U64, Bool, Err, Expected, KeyColumn, KeyVec, Message, MetaColumn, MetaVec,
                                  Opt, Prim, Str, Struct, Type, U64Vec, Variant, Vec, Void, WireDecodeError)
from .fuzz_mutate import INVALID_UTF8, mutate_bytes

ERROR_MESSAGE = Message(STR)
RPC_BY_ID: dict[int, Rpc] = {rpc.function_id: rpc for rpc in RPCS.values()}
MAX_U32 = (1 << 32) - 1
_WIDTHS = (1, 2, 4, 8)  # struct_pack's size widths, by the metainfo's bits 3-4


# ---- captured traffic ----------------------------------------------------------------------------

@dataclass(frozen=True)
class CapturedFrame:
    name: str
    header: bytes
    body: bytes

    @property
    def frame(self) -> bytes:
        return self.header + self.body


def load_requests(*paths: Path) -> list[CapturedFrame]:
    """The request frames of captured traffic files (one JSON frame a line), in order."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            d = json.loads(line)
            if d["dir"] == "req":
                out.append(CapturedFrame(d["name"], bytes.fromhex(d["hdr"]), bytes.fromhex(d["body"])))
    return out


# ---- encoding pieces by hand (targeted cases corrupt one field of an otherwise valid body) -------

def enc(t: Type, value: Any, width: int = 1) -> bytes:
    """``value`` encoded as type ``t`` with ``width``-byte sizes, no prologue."""
    out = bytearray()
    t.encode(value, width, out)
    return bytes(out)


def body_of(message: Message, *parts: bytes, width: int = 1) -> bytes:
    """A body of ``message``'s type: its prologue and then ``parts`` as given."""
    return message.prologue(width) + b"".join(parts)


def encode_replacing(t: Type, value: Any, path: Sequence[int], raw: bytes, width: int = 1) -> bytes:
    """``value`` encoded as ``t`` with the field at ``path`` (indices into nested structs) written
    as the bytes ``raw`` instead: a bad flag byte or count in an otherwise valid body."""
    if not path:
        return raw
    if not isinstance(t, Struct):
        raise TypeError(f"path {list(path)} goes into a {type(t).__name__}, not a struct")
    return b"".join(encode_replacing(f, v, path[1:], raw, width) if i == path[0] else enc(f, v, width)
                    for i, (f, v) in enumerate(zip(t.fields, value, strict=True)))


def body_replacing(message: Message, value: Any, path: Sequence[int], raw: bytes, width: int = 1) -> bytes:
    """A body of ``message``'s type whose field at ``path`` is ``raw`` (see :func:`encode_replacing`)."""
    return message.prologue(width) + encode_replacing(message.type, value, path, raw, width)


def encode_with_width(message: Message, value: Any, width: int) -> bytes:
    """A valid body with a size width at least the one struct_pack would pick (wider is legal)."""
    return message.prologue(width) + enc(message.type, value, width)


# ---- hostile values from the types ---------------------------------------------------------------

@dataclass
class ValuePool:
    """The plausible values hostile ones are mixed with, so that a case reaches past validation:
    the strings and UUIDs a live master knows (its keys, segment names, clients, tenants)."""

    strings: list[bytes] = field(default_factory=list)
    uuids: list[tuple[int, int]] = field(default_factory=list)


_SMALL_INTS = (0, 1, 2, 3, 4, 8, 16, 100, 4096)
_HOSTILE_STRINGS = (b"", b" ", b"a\x00b", b"x" * 255, b"x" * 256, b"x" * 300, "\u00e9\u4e2d\U0001f600".encode(),
                    b"^.*$", b"(", b".*", b"../etc/passwd", b"%s%n", b"\r\n", b"default\x00")
_NOT_UTF8 = (INVALID_UTF8, b"\xed\xa0\x80", b"\xc0\x80", b"\xff" * 8, b"ok\x80")  # a surrogate, overlong NUL, ...
_HUGE_STRING = b"h" * 70_000  # over 65535: the message needs 4-byte sizes


def _int_range(p: Prim) -> tuple[int, int]:
    bits = p.size * 8
    if p.fmt[-1] in "bhiq":
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def hostile_int(p: Prim, rng: random.Random) -> int:
    """A small plausible value, a boundary of ``p``'s range, or any value of it."""
    lo, hi = _int_range(p)
    r = rng.random()
    if r < 0.4:
        v = rng.choice(_SMALL_INTS)
    elif r < 0.85:
        half = (lo + hi + 1) // 2 if lo == 0 else 0
        v = rng.choice((lo, lo + 1, hi, hi - 1, -1, half, half - 1, 1 << 31, 1 << 32, 1 << 63))
    else:
        v = rng.randint(lo, hi)
    return min(max(v, lo), hi)


def hostile_string(rng: random.Random, pool: ValuePool) -> bytes:
    """A string the master knows, an edge string, one of 70 000 bytes, random bytes or random
    text; one in ten is not UTF-8."""
    r = rng.random()
    if r < 0.5 and pool.strings:
        return rng.choice(pool.strings)
    if r < 0.75:
        return rng.choice(_HOSTILE_STRINGS)
    if r < 0.77:
        return _HUGE_STRING
    if r < 0.82:
        return rng.choice(_NOT_UTF8)
    n = rng.choice((1, 3, 16, 64))
    if r < 0.87:
        return bytes(rng.randrange(256) for _ in range(n))
    return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(n)).encode()


def _count(rng: random.Random, big: int) -> int:
    r = rng.random()
    return 0 if r < 0.25 else rng.randint(1, 3) if r < 0.9 else big


def hostile_value(t: Type, rng: random.Random, pool: ValuePool, keys: int | None = None) -> Any:
    """A value of type ``t`` (as its encoder takes it) with hostile leaves. ``keys``: the length of
    the key vector already generated in the same message (sizes mostly match it)."""
    if isinstance(t, Bool):
        return rng.random() < 0.5
    if isinstance(t, Prim):
        return hostile_int(t, rng)
    if isinstance(t, Str):
        return hostile_string(rng, pool)
    if isinstance(t, U64Vec):
        n = keys if keys is not None and rng.random() < 0.8 else _count(rng, 300)
        return [hostile_int(U64, rng) if rng.random() < 0.3 else rng.choice((1, 8, 100, 4096)) for _ in range(n)]
    if isinstance(t, KeyVec):
        return [hostile_string(rng, pool) for _ in range(_count(rng, rng.choice((300, 2000))))]
    if isinstance(t, MetaVec):
        return [(hostile_string(rng, pool), None if rng.random() < 0.7 else hostile_int(U64, rng))
                for _ in range(_count(rng, 300))]
    if isinstance(t, Vec):
        return [hostile_value(t.item, rng, pool) for _ in range(_count(rng, 40))]
    if isinstance(t, Opt):
        return None if rng.random() < 0.5 else hostile_value(t.item, rng, pool)
    if isinstance(t, Struct):
        if len(t.fields) == 2 and all(isinstance(f, Prim) and f.size == 8 for f in t.fields) and pool.uuids \
                and rng.random() < 0.6:
            return rng.choice(pool.uuids)
        out = []
        for f in t.fields:
            out.append(hostile_value(f, rng, pool, keys))
            if isinstance(f, (KeyVec, MetaVec)):
                keys = len(out[-1])
        return tuple(out)
    if isinstance(t, Variant):
        index = rng.randrange(len(t.alternatives))
        return index, hostile_value(t.alternatives[index], rng, pool)
    if isinstance(t, Void):
        return None
    if isinstance(t, Expected):
        return Err(hostile_int(I32, rng)) if rng.random() < 0.5 else hostile_value(t.item, rng, pool)
    raise TypeError(f"no generator for {type(t).__name__}")


def plain(t: Type, value: Any) -> Any:
    """A decoded value as its encoder takes it back, with columns as lists (so leaves can change)."""
    if isinstance(value, KeyColumn):
        return _rows(value)
    if isinstance(value, MetaColumn):
        return [(k, int(c) if h else None) for k, h, c in zip(_rows(value.keys), value.has_checksum, value.checksum)]
    if isinstance(t, U64Vec):
        return [int(v) for v in value]
    if isinstance(t, Vec):
        return [plain(t.item, v) for v in value]
    if isinstance(t, Opt):
        return None if value is None else plain(t.item, value)
    if isinstance(t, Struct):
        return tuple(plain(f, v) for f, v in zip(t.fields, value, strict=True))
    return value


def _rows(keys: KeyColumn) -> list[bytes]:
    return [keys.data[a:b].tobytes() for a, b in zip(keys.offsets[:-1], keys.offsets[1:])]


def _leaf_count(t: Type, value: Any) -> int:
    if isinstance(t, (KeyVec, MetaVec, U64Vec)):
        return 1 + len(value)
    if isinstance(t, Vec):
        return 1 + sum(_leaf_count(t.item, v) for v in value)
    if isinstance(t, Opt):
        return 1 + (0 if value is None else _leaf_count(t.item, value))
    if isinstance(t, Struct):
        return sum(_leaf_count(f, v) for f, v in zip(t.fields, value, strict=True))
    return 1


def forge(t: Type, value: Any, rng: random.Random, pool: ValuePool, p: float) -> Any:
    """``value`` with each leaf (and each container, as a whole) replaced by a hostile value of its
    type with probability ``p``, and a vector's element sometimes repeated."""
    if rng.random() < p:
        return hostile_value(t, rng, pool)
    if isinstance(t, (KeyVec, MetaVec, U64Vec)):
        return list(value) if not value or rng.random() >= p else [*value, rng.choice(value)]
    if isinstance(t, Vec):
        out = [forge(t.item, v, rng, pool, p) for v in value]
        if value and rng.random() < 4 * p:  # an element again, itself forged: a duplicate segment, key, ...
            out.insert(rng.randrange(len(out) + 1), forge(t.item, rng.choice(value), rng, pool, 0.3))
        return out
    if isinstance(t, Opt):
        return None if value is None else forge(t.item, value, rng, pool, p)
    if isinstance(t, Struct):
        return tuple(forge(f, v, rng, pool, p) for f, v in zip(t.fields, value, strict=True))
    return value


def hostile_request(rpc: Rpc, rng: random.Random, pool: ValuePool,
                    templates: Sequence[Any] = ()) -> tuple[bytes, str]:
    """A body that is a valid encoding of ``rpc``'s request type with hostile values in it: a
    template (a captured request, decoded) with one or two leaves forged, or a value generated from
    the type. The size width is the smallest that fits, or sometimes a wider one."""
    if rpc.request is None:
        return b"", "no arguments"
    if templates and rng.random() < 0.5:
        template = rng.choice(templates)
        value = forge(rpc.request.type, template, rng, pool, rng.choice((1, 2)) / _leaf_count(rpc.request.type,
                                                                                              template))
        what = "forged template"
    else:
        value, what = hostile_value(rpc.request.type, rng, pool), "generated"
    body, width = encode_some_width(rpc.request, value, rng)
    return body, f"{what}, width {width}"


def encode_some_width(message: Message, value: Any, rng: random.Random, wider: float = 0.2) -> tuple[bytes, int]:
    """``value``'s body with the narrowest size width that fits or, with probability ``wider``,
    a wider one (struct_pack allows any that fits); the body and its width."""
    body = message.encode(value)
    width = _WIDTHS[(body[4] >> 3) & 0b11]  # the narrowest, as the encoder chose it
    if rng.random() < wider:
        width = rng.choice([w for w in _WIDTHS if w >= width])
        body = encode_with_width(message, value, width)
    return body, width


# ---- frame mutations -----------------------------------------------------------------------------

def _set_header(frame: bytes, **fields: int) -> bytes:
    names = ("magic", "version", "serialize_type", "msg_type", "seq", "function_id", "length", "attach")
    values = dict(zip(names, REQUEST_HEADER.unpack_from(frame)))
    values.update(fields)
    return REQUEST_HEADER.pack(*(values[n] for n in names)) + frame[REQUEST_HEADER.size:]


def mutate_frame(frames: Sequence[bytes], rng: random.Random, max_body_bytes: int) -> tuple[bytes, str]:
    """A captured request frame mutated: its bytes (bit flips, bytes set, inserted or deleted,
    truncation), its length or attach field, or two frames spliced."""
    frame = rng.choice(frames)
    kind = rng.choice(("bytes", "bytes", "bytes", "body", "length", "attach", "splice"))
    if kind == "bytes":
        return mutate_bytes(frame, rng)
    if kind == "body":  # a mutation inside the body, the header's length kept in step
        head, body = frame[:REQUEST_HEADER.size], frame[REQUEST_HEADER.size:]
        body, what = mutate_bytes(body, rng)
        return _set_header(head + body, length=len(body)), f"body: {what}"
    length = REQUEST_HEADER.unpack_from(frame)[6]
    if kind == "length":
        new = rng.choice((0, 1, length - 1, length + 1, length + rng.randint(2, 64), length // 2, max_body_bytes,
                          max_body_bytes + 1, MAX_U32, rng.randrange(1 << 32)))
        new = min(max(new, 0), MAX_U32)
        return _set_header(frame, length=new), f"length {length} -> {new}"
    if kind == "attach":
        attach = rng.choice((1, 8, max_body_bytes, MAX_U32))
        return _set_header(frame, attach=attach) + bytes(min(attach, 16)), f"attach {attach}"
    other = rng.choice(frames)
    at, other_at = rng.randrange(len(frame) + 1), rng.randrange(len(other) + 1)
    return frame[:at] + other[other_at:], f"splice: {at} bytes then another frame from byte {other_at}"


def random_frame(rng: random.Random, max_body_bytes: int) -> tuple[bytes, str]:
    """A frame with coro_rpc's magic and random everything else: version and serialize type
    mostly 0, a known function id or not, a random body (sometimes after a right prologue) and a
    length field that mostly matches it."""
    rpc = rng.choice(list(RPCS.values()))
    function_id = rpc.function_id if rng.random() < 0.6 else rng.randrange(1 << 32)
    version = 0 if rng.random() < 0.85 else rng.randint(1, 255)
    serialize_type = 0 if rng.random() < 0.85 else rng.randint(1, 255)
    body = bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 4, 5, 8, 32, 200))))
    if rpc.request is not None and rng.random() < 0.4:
        body = rpc.request.prologue(rng.choice((1, 2, 4, 8))) + body
    length = len(body)
    if rng.random() < 0.15:
        length = rng.choice((0, max(length - 1, 0), length + 1, max_body_bytes + 1, MAX_U32, rng.randrange(1 << 32)))
    attach = 0 if rng.random() < 0.9 else rng.choice((1, 4, MAX_U32))
    frame = REQUEST_HEADER.pack(MAGIC, version, serialize_type, rng.randrange(256), rng.randrange(1 << 32),
                                function_id, length, attach) + body
    name = rpc.name if function_id == rpc.function_id else f"{function_id:#010x}"
    return frame, f"{name} v{version} st{serialize_type} len {length}/{len(body)} attach {attach}"


# ---- what the server must answer -----------------------------------------------------------------

@dataclass(frozen=True)
class ExpectedResponse:
    seq: int
    errc: int        # the transport error code that must come back (0: the call is served)
    rpc: Rpc | None  # the call that is served (errc 0), to decode its response
    keys: int | None = None  # a batch call: how many per-key results its response has


def _batch_keys(args: Any) -> int | None:
    for a in args if isinstance(args, tuple) else ():
        if isinstance(a, KeyColumn):
            return len(a)
        if isinstance(a, MetaColumn):
            return len(a.keys)
    return None


def expected_dispatch(seq: int, function_id: int, body: bytes) -> ExpectedResponse:
    """What one complete frame's call must answer: function_not_registered for an unknown id,
    invalid_rpc_arguments for a body that is not the call's arguments, else served."""
    rpc = RPC_BY_ID.get(function_id)
    if rpc is None:
        return ExpectedResponse(seq, Errc.FUNCTION_NOT_REGISTERED, None)
    if rpc.request is None:
        return ExpectedResponse(seq, Errc.INVALID_RPC_ARGUMENTS if body else Errc.OK, None if body else rpc)
    try:
        args = rpc.request.decode(memoryview(body))
    except WireDecodeError:
        return ExpectedResponse(seq, Errc.INVALID_RPC_ARGUMENTS, None)
    return ExpectedResponse(seq, Errc.OK, rpc, _batch_keys(args))


def expected_responses(stream: bytes, max_body_bytes: int) -> list[ExpectedResponse]:
    """The responses a server must send to ``stream`` followed by end of file, in order; after the
    last one the server closes the connection (a framing error, or the stream's end)."""
    out: list[ExpectedResponse] = []
    pos = 0
    while len(stream) - pos >= REQUEST_HEADER.size:
        magic, version, serialize_type, _, seq, function_id, length, attach = REQUEST_HEADER.unpack_from(stream, pos)
        if magic != MAGIC:
            break  # not coro_rpc: closed without an answer
        if version != 0:
            out.append(ExpectedResponse(seq, Errc.UNKNOWN_PROTOCOL_VERSION, None))
            break
        if serialize_type != 0:
            out.append(ExpectedResponse(seq, Errc.PROTOCOL_ERROR, None))
            break
        if length + attach > max_body_bytes:
            out.append(ExpectedResponse(seq, Errc.MESSAGE_TOO_LARGE, None))
            break
        start = pos + REQUEST_HEADER.size
        if len(stream) - start < length + attach:
            break  # the stream ends inside the frame
        pos = start + length + attach
        if attach:  # the master protocol has no attachments: the call is refused, the connection goes on
            out.append(ExpectedResponse(seq, Errc.FUNCTION_NOT_REGISTERED, None))
            continue
        out.append(expected_dispatch(seq, function_id, stream[start:start + length]))
    return out


@dataclass(frozen=True)
class Response:
    seq: int
    errc: int
    body: bytes


@dataclass
class Exchange:
    """What came back on one connection: the responses, and how the connection ended."""

    responses: list[Response]
    ended: str  # "eof", "reset" or "timeout"
    error: str | None = None  # a response that is not a well-formed coro_rpc response frame


def parse_responses(data: bytes) -> tuple[list[Response], str | None]:
    out: list[Response] = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < RESPONSE_HEADER.size:
            return out, f"{len(data) - pos} bytes after the last response"
        magic, version, errc, msg_type, seq, length, attach = RESPONSE_HEADER.unpack_from(data, pos)
        if (magic, version, msg_type, attach) != (MAGIC, 0, 0, 0):
            return out, f"bad response header {data[pos:pos + RESPONSE_HEADER.size].hex()}"
        start = pos + RESPONSE_HEADER.size
        if len(data) - start < length:
            return out, f"response of seq {seq} cut at {len(data) - start} of {length} bytes"
        out.append(Response(seq, errc, data[start:start + length]))
        pos = start + length
    return out, None


def read_until_closed(sock: socket.socket, timeout_s: float = 5.0) -> tuple[bytes, str]:
    """Everything the peer sends until it closes the connection, and how it ended: "eof",
    "reset", or "timeout" when nothing ended it within ``timeout_s`` (a hang)."""
    data = bytearray()
    deadline = time.monotonic() + timeout_s
    while True:
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            return bytes(data), "reset"
        except socket.timeout:
            return bytes(data), "timeout"
        if not chunk:
            return bytes(data), "eof"
        data += chunk


class ResponseReader:
    """Responses off a raw connection one at a time (several may arrive in one read)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def next(self) -> Response:
        """The next response; ConnectionError when the connection ends before one is complete,
        socket.timeout (the socket's own) when none comes."""
        while True:
            if len(self.buf) >= RESPONSE_HEADER.size:
                length = RESPONSE_HEADER.unpack_from(self.buf)[5]
                end = RESPONSE_HEADER.size + length
                if len(self.buf) >= end:
                    [r], error = parse_responses(bytes(self.buf[:end]))
                    if error is not None:
                        raise ConnectionError(error)
                    del self.buf[:end]
                    return r
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError(f"connection closed with {len(self.buf)} bytes of a response")
            self.buf += chunk


def exchange(port: int, stream: bytes, timeout_s: float = 5.0) -> Exchange:
    """Send ``stream`` on a new connection, end it (shutdown of the sending side, so a frame the
    stream leaves open is ended by end of file, not by the server's frame timeout), and read
    until the server closes. A read that waits ``timeout_s`` is a hang."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(stream)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # EPIPE, ECONNRESET, ENOTCONN
            pass  # the server closed first (a framing error early in the stream): read what it sent
        data, ended = read_until_closed(sock, timeout_s)
        responses, error = parse_responses(data)
        return Exchange(responses, ended, error)
    finally:
        sock.close()


def check_exchange(got: Exchange, expected: Sequence[ExpectedResponse]) -> str | None:
    """Why ``got`` is not what ``expected`` says (None: it is): each response for the right seq
    with the right code and a body of the right type, nothing else, and the connection closed."""
    if got.ended == "timeout":
        return f"hang: no end of the connection after {len(got.responses)} responses"
    if got.error is not None:
        return got.error
    if len(got.responses) != len(expected):
        return (f"{len(got.responses)} responses {[(r.seq, r.errc) for r in got.responses]}, expected "
                f"{[(e.seq, int(e.errc)) for e in expected]} (connection {got.ended})")
    for r, e in zip(got.responses, expected):
        problem = check_response(r.seq, r.errc, r.body, e)
        if problem is not None:
            return problem
    return None


def check_response(seq: int, errc: int, body: bytes, e: ExpectedResponse) -> str | None:
    if seq != e.seq:
        return f"response for seq {seq}, expected {e.seq}"
    if errc != e.errc:
        return f"seq {seq}: errc {errc}, expected {int(e.errc)}: {_error_text(body)}"
    if errc:
        try:
            ERROR_MESSAGE.decode(memoryview(body))
        except WireDecodeError as err:
            return f"seq {seq}: error body is not a string: {err}"
        return None
    assert e.rpc is not None
    try:
        value = e.rpc.response.decode(memoryview(body))
    except WireDecodeError as err:
        return f"seq {seq}: {e.rpc.name} response does not decode: {err}"
    if e.keys is not None and len(value) != e.keys:
        return f"seq {seq}: {e.rpc.name} answered {len(value)} results for {e.keys} keys"
    return None


def _error_text(body: bytes) -> str:
    try:
        return str(ERROR_MESSAGE.decode(memoryview(body)))
    except WireDecodeError:
        return body[:60].hex()


def response_label(errc: int, body: bytes, rpc: Rpc | None) -> str:
    """The table's name for one response: its transport error, or for a served call whether the
    engine accepted it ("served: ok") or answered an error code ("served: refused"; a batch: for
    every key)."""
    if errc:
        return Errc(errc).name.lower() if errc in Errc._value2member_map_ else f"errc {errc}"
    if rpc is None:
        return "served"
    try:
        value = rpc.response.decode(memoryview(body))
    except WireDecodeError:
        return "undecodable"
    refused = isinstance(value, Err) or (isinstance(rpc.response.type, Vec) and bool(value)
                                         and all(isinstance(v, Err) for v in value))
    return "served: refused" if refused else "served: ok"


def outcome_label(got: Exchange, first: ExpectedResponse | None) -> str:
    """The table's name for what a case's first frame got: its response's label, or 'closed'."""
    if not got.responses or first is None or got.responses[0].seq != first.seq:
        return "closed"
    r = got.responses[0]
    return response_label(r.errc, r.body, first.rpc)


# ---- the server's side: what it reported, and escaped exceptions ---------------------------------

class RecordingObserver:
    """An RpcObserver that counts what the server reports and lets a test wait (with a timeout)
    until its count of open connections, or of a wire error, reaches a value."""

    def __init__(self) -> None:
        self.wire_errors: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self._open = 0
        self._cond = threading.Condition()

    def observe(self, rpc_name: str, seconds: float, ok: bool) -> None:
        self.calls[rpc_name] += 1
        if not ok:
            self.failed[rpc_name] += 1

    def wire_error(self, kind: str) -> None:
        with self._cond:
            self.wire_errors[kind] += 1
            self._cond.notify_all()

    def connections(self, delta: int) -> None:
        with self._cond:
            self._open += delta
            self._cond.notify_all()

    @property
    def open_connections(self) -> int:
        return self._open

    def wait_open(self, n: int, timeout_s: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._open == n, timeout_s)

    def wait_wire_error(self, kind: str, n: int = 1, timeout_s: float = 5.0) -> bool:
        """Whether ``kind`` was reported ``n`` times within ``timeout_s``."""
        with self._cond:
            return self._cond.wait_for(lambda: self.wire_errors[kind] >= n, timeout_s)


def record_loop_errors(loop: asyncio.AbstractEventLoop) -> list[dict[str, Any]]:
    """Install an exception handler on the server's event loop (running in another thread):
    every exception that escapes a connection's handler (asyncio reports it there) lands in the
    returned list."""
    errors: list[dict[str, Any]] = []

    def handler(_loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        errors.append(context)

    async def install() -> None:
        loop.set_exception_handler(handler)

    asyncio.run_coroutine_threadsafe(install(), loop).result(10)
    return errors


class ServerErrorLog(logging.Handler):
    """The ERROR records the server logs (a handler that raised, a connection whose frame
    processing failed): each is a bug, whatever the peer sent. Attached to the
    ``mooncake_columnar.server`` logger until :meth:`detach`."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []
        logging.getLogger("mooncake_columnar.server").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def detach(self) -> None:
        logging.getLogger("mooncake_columnar.server").removeHandler(self)

    def describe(self, start: int = 0) -> list[str]:
        return [f"{r.getMessage()}: {r.exc_info[1]!r}" if r.exc_info else r.getMessage() for r in self.records[start:]]


def outcome_table(counts: dict[str, Counter[str]]) -> str:
    """Outcome counts as a small text table: a row per outcome, a column per family."""
    families = list(counts)
    labels = sorted({label for c in counts.values() for label in c})
    rows = [["outcome", *families]]
    rows += [[label, *(str(counts[f][label]) for f in families)] for label in labels]
    rows.append(["total", *(str(sum(counts[f].values())) for f in families)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
                     for r in rows)


def key_column(keys: Sequence[bytes | str]) -> KeyColumn:
    raw = [k.encode() if isinstance(k, str) else k for k in keys]
    offsets = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    return KeyColumn(offsets, np.frombuffer(b"".join(raw), np.uint8).copy())
