"""Hostile input on the master's RPC port, one case at a time: every byte a peer sends is hostile.

A bad frame gets a coro_rpc error or closes that one connection; every other client is served on;
the engine is left as it was and its self-check passes; nothing crashes, hangs, lets an untyped
exception escape or allocates a size the peer chose. Each test ends with ``env.check_unchanged()``:
a new connection is served, no exception escaped a connection's handler and the server logged no
error (a handler that raised, a connection whose frame processing failed), ``verify()`` passes and
the objects put before the case are all there with the same replica descriptors.
"""
from __future__ import annotations

import random
import socket
import struct
import threading
import time
import tracemalloc
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import pytest

from mooncake_columnar import ManualClocks, MasterService
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.errors import ErrorCode
from mooncake_columnar.server.handlers import STORE_VERSION, MasterHandlers
from mooncake_columnar.server.rpc_server import REQUEST_HEADER, Errc, RpcServer
from mooncake_columnar.server.rpc_types import RPCS
from mooncake_columnar.server.struct_pack import STR, Err, Message, MetaColumn, WireDecodeError
from mooncake_columnar.testing.wire_client import ServerThread, WireClient, request_frame
from mooncake_columnar.testing.wire_fuzz import (ERROR_MESSAGE, RecordingObserver, ResponseReader, ServerErrorLog,
                                                 body_of, body_replacing, check_exchange, enc, exchange,
                                                 expected_responses, key_column, parse_responses, read_until_closed,
                                                 record_loop_errors)

CLIENT = (11, 22)
SEGMENT_ID = (33, 44)
SEGMENT = (SEGMENT_ID, "hostile-seg", 1 << 40, 64 << 20, "127.0.0.1:12345", "tcp", "")
CONFIG = (1, 0, 0, 0, None, False, [], "", [], False, 0, "", None)  # upstream ReplicateConfig defaults
KEYS = ["obj-0", "obj-1", "obj-2", "obj-3"]
CLOSED = ("eof", "reset")  # how a connection the server closed ends on this side
READY = RPCS["ServiceReady"].function_id
U32_MAX, U64_MAX = (1 << 32) - 1, (1 << 64) - 1
ALLOCATION_LIMIT = 1 << 20  # traced peak a refused request may cost (the counts below would need GiBs)


def _message(name: str) -> Message:
    message = RPCS[name].request
    assert message is not None
    return message


class Env:
    """A master with a mounted segment and four objects, served on a free port."""

    def __init__(self, **server_options: Any) -> None:
        self.master = MasterService(MasterConfig(default_kv_lease_ttl_ms=5_000, client_live_ttl_s=10),
                                    clocks=ManualClocks())
        self.observer = RecordingObserver()
        self.server = RpcServer(MasterHandlers(self.master), observer=self.observer, **server_options)
        self.thread = ServerThread(self.server)
        self.loop_errors = record_loop_errors(self.thread.loop)
        self.error_log = ServerErrorLog()
        with self.client() as c:
            assert c.call("MountSegment", (SEGMENT, CLIENT)) is None
            for i, key in enumerate(KEYS):
                assert not isinstance(c.call("PutStart", (CLIENT, key, 1000 + i, CONFIG, "default")), Err)
                assert c.call("PutEnd", (CLIENT, (key, None), 4, "default")) is None
            self.replicas = {key: c.call("GetReplicaList", (key, "default")) for key in KEYS}
        self.objects = self.master.object_count()
        self.segments = self.master.segment_usage()

    def client(self, timeout_s: float = 5.0) -> WireClient:
        return self.thread.client(timeout_s)

    def raw(self, timeout_s: float = 5.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.thread.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def check_unchanged(self) -> None:
        assert not self.loop_errors, f"exceptions escaped a connection handler: {self.loop_errors}"
        assert not self.error_log.records, f"the server logged errors: {self.error_log.describe()}"
        with self.client() as c:
            assert c.call("ServiceReady") == STORE_VERSION
            assert {key: c.call("GetReplicaList", (key, "default")) for key in KEYS} == self.replicas
        self.master.verify()
        assert self.master.object_count() == self.objects
        assert self.master.segment_usage() == self.segments

    def stop(self) -> None:
        self.error_log.detach()
        self.thread.stop()


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    yield e
    e.stop()


@contextmanager
def _env(**server_options: Any) -> Iterator[Env]:
    e = Env(**server_options)
    try:
        yield e
    finally:
        e.stop()


@contextmanager
def _traced_peak() -> Iterator[list[int]]:
    """The peak traced allocation (every thread, the server's included) inside the block."""
    out: list[int] = []
    tracemalloc.start()
    try:
        yield out
    finally:
        out.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def _one_response_then_closed(sock: socket.socket) -> tuple[int, int, str]:
    data, how = read_until_closed(sock)
    assert how in CLOSED, f"connection not closed ({how})"
    responses, error = parse_responses(data)
    assert error is None and len(responses) == 1, (responses, error)
    [r] = responses
    return r.seq, r.errc, ERROR_MESSAGE.decode(memoryview(r.body))


def _read_one_response(sock: socket.socket) -> tuple[int, int, bytes]:
    """(seq, errc, body) of the next response on a raw connection with nothing else in flight."""
    r = ResponseReader(sock).next()
    return r.seq, r.errc, r.body


def _call_raw(env: Env, name: str, body: bytes) -> tuple[int, bytes]:
    with env.client() as c:
        errc, out = c.call_raw(RPCS[name].function_id, body)
        assert c.call("ServiceReady") == STORE_VERSION  # the connection goes on
    return errc, out


def _decoded(name: str, errc: int, out: bytes) -> Any:
    assert errc == Errc.OK, ERROR_MESSAGE.decode(memoryview(out))
    return RPCS[name].response.decode(memoryview(out))


# ---- framing ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("first_bytes", [
    request_frame(1, READY, b"", magic=0x16), request_frame(1, READY, b"", magic=0),
    b"GET / HTTP/1.1\r\nHost: master\r\n\r\n", b"\xff" * 64], ids=["magic-22", "magic-0", "http", "ff"])
def test_wrong_magic_closes_that_connection_and_another_is_served(env: Env, first_bytes: bytes) -> None:
    with env.client() as good, env.raw() as bad:
        assert good.call("ServiceReady") == STORE_VERSION
        bad.sendall(first_bytes + request_frame(2, READY, b""))
        data, how = read_until_closed(bad)
        assert data == b"" and how in CLOSED
        assert good.call("ServiceReady") == STORE_VERSION  # the connection opened before is served on
    assert env.observer.wire_errors["bad_magic"] == 1
    env.check_unchanged()


@pytest.mark.parametrize("version", [1, 2, 255])
def test_version_above_0_gets_unknown_protocol_version_then_close(env: Env, version: int) -> None:
    with env.raw() as sock:
        sock.sendall(request_frame(7, READY, b"", version=version) + request_frame(8, READY, b""))
        seq, errc, message = _one_response_then_closed(sock)  # the frame after it is not served
    assert (seq, errc) == (7, Errc.UNKNOWN_PROTOCOL_VERSION) and str(version) in message
    env.check_unchanged()


@pytest.mark.parametrize("serialize_type", [1, 2, 255])
def test_serialize_type_other_than_struct_pack_gets_protocol_error_then_close(env: Env, serialize_type: int) -> None:
    with env.raw() as sock:
        sock.sendall(request_frame(9, READY, b"", serialize_type=serialize_type) + request_frame(10, READY, b""))
        seq, errc, _ = _one_response_then_closed(sock)
    assert (seq, errc) == (9, Errc.PROTOCOL_ERROR)
    env.check_unchanged()


@pytest.mark.parametrize("body", [b"", bytes(range(200))], ids=["empty", "200-bytes"])
def test_unknown_function_id_gets_function_not_registered_and_the_connection_goes_on(env: Env, body: bytes) -> None:
    with env.client() as c:
        for function_id in (0, 0xDEADBEEF, U32_MAX, READY ^ 1):
            errc, out = c.call_raw(function_id, body)
            assert errc == Errc.FUNCTION_NOT_REGISTERED, ERROR_MESSAGE.decode(memoryview(out))
        assert c.call("ServiceReady") == STORE_VERSION
    env.check_unchanged()


@pytest.mark.parametrize("cut", [1, 10, REQUEST_HEADER.size - 1])
def test_truncated_header_then_eof_closes_without_an_answer(env: Env, cut: int) -> None:
    with env.raw() as sock:
        sock.sendall(request_frame(1, READY, b"")[:cut])
        sock.shutdown(socket.SHUT_WR)
        data, how = read_until_closed(sock)
    assert data == b"" and how in CLOSED
    assert env.observer.wire_errors["truncated_frame"] == 1
    env.check_unchanged()


def test_truncated_body_then_eof_closes_without_an_answer(env: Env) -> None:
    body = _message("Remove").encode(("obj-0", True, "default"))
    with env.raw() as sock:
        sock.sendall(request_frame(1, RPCS["Remove"].function_id, body)[:-3])
        sock.shutdown(socket.SHUT_WR)
        data, how = read_until_closed(sock)
    assert data == b"" and how in CLOSED
    env.check_unchanged()  # the remove it began was not made


@pytest.mark.parametrize(("length", "attach"), [(U32_MAX, 0), (1 << 31, 0), (0, U32_MAX), (1 << 31, 1 << 31),
                                                ((1 << 16) + 1, 0)],
                         ids=["4GiB-body", "2GiB-body", "4GiB-attach", "sum-over-4GiB", "cap-plus-1"])
def test_declared_length_over_the_cap_gets_message_too_large_without_allocating_it(length: int, attach: int) -> None:
    with _env(max_body_bytes=1 << 16) as env:
        with _traced_peak() as peak, env.raw() as sock:
            sock.sendall(request_frame(3, READY, b"", length=length, attach=attach) + bytes(1000))
            seq, errc, _ = _one_response_then_closed(sock)
        assert (seq, errc) == (3, Errc.MESSAGE_TOO_LARGE)
        assert peak[0] < ALLOCATION_LIMIT
        assert env.observer.wire_errors["oversize"] == 1
        env.check_unchanged()


def test_a_body_at_the_cap_is_read_and_served() -> None:
    with _env(max_body_bytes=1 << 16) as small:
        body = _message("ExistKey").encode(("obj-0", "t" * ((1 << 16) - 40)))
        assert len(body) <= 1 << 16
        errc, out = _call_raw(small, "ExistKey", body)
        assert _decoded("ExistKey", errc, out) is True
        small.check_unchanged()


def test_an_attachment_is_refused_with_function_not_registered_and_the_connection_goes_on(env: Env) -> None:
    with env.client() as c:
        c.send_raw(request_frame(5, RPCS["Remove"].function_id, _message("Remove").encode(("obj-0", True, "default")),
                                 attach=8) + bytes(8))
        seq, errc, _ = c.read_response()
        assert (seq, errc) == (5, Errc.FUNCTION_NOT_REGISTERED)
        assert c.call("ServiceReady") == STORE_VERSION
    env.check_unchanged()  # the remove carried with an attachment was not made


def test_pipelined_frames_are_answered_in_order_up_to_the_one_that_breaks_the_framing(env: Env) -> None:
    rng = random.Random(5)
    frames = []
    for seq in range(60):
        kind = rng.choice(("ready", "exist", "unknown", "bad-args"))
        if kind == "ready":
            frames.append(request_frame(seq, READY, b""))
        elif kind == "exist":
            frames.append(request_frame(seq, RPCS["ExistKey"].function_id,
                                        _message("ExistKey").encode((rng.choice(KEYS + ["nope"]), "default"))))
        elif kind == "unknown":
            frames.append(request_frame(seq, rng.randrange(1 << 32), b"xyz"))
        else:
            frames.append(request_frame(seq, RPCS["Remove"].function_id, b"\x00" * rng.randrange(12)))
    stream = b"".join(frames) + request_frame(60, READY, b"", version=3) + b"".join(frames[:5])
    expected = expected_responses(stream, 256 << 20)
    assert len(expected) == 61
    got = exchange(env.thread.port, stream)
    assert check_exchange(got, expected) is None
    env.check_unchanged()


# ---- bodies ----------------------------------------------------------------------------------------

def _remove_body() -> bytes:
    return _message("Remove").encode(("obj-0", True, "default"))


def test_a_body_of_another_rpcs_type_gets_invalid_rpc_arguments(env: Env) -> None:
    exist_body = _message("ExistKey").encode(("obj-0", "default"))  # the same fields but one, another hash
    errc, out = _call_raw(env, "Remove", exist_body)
    assert errc == Errc.INVALID_RPC_ARGUMENTS and "type hash" in ERROR_MESSAGE.decode(memoryview(out))
    env.check_unchanged()


def test_a_random_type_hash_gets_invalid_rpc_arguments(env: Env) -> None:
    body = _remove_body()
    errc, _ = _call_raw(env, "Remove", struct.pack("<I", 0x12345679) + body[4:])
    assert errc == Errc.INVALID_RPC_ARGUMENTS
    env.check_unchanged()


@pytest.mark.parametrize("at", [0, 2, -1], ids=["first", "middle", "terminator"])
def test_the_right_hash_with_a_wrong_literal_gets_invalid_rpc_arguments(env: Env, at: int) -> None:
    message = _message("Remove")
    body = bytearray(_remove_body())
    n = len(message.literal)
    index = 5 + (n if at == -1 else at)  # hash, metainfo, then the literal and its 0 terminator
    body[index] ^= 0x40
    errc, out = _call_raw(env, "Remove", bytes(body))
    assert errc == Errc.INVALID_RPC_ARGUMENTS and "literal" in ERROR_MESSAGE.decode(memoryview(out))
    env.check_unchanged()


@pytest.mark.parametrize("name", ["Remove", "PutStart", "BatchRemove", "BatchPutEnd", "ReMountSegment"])
def test_garbage_after_a_right_prologue_gets_invalid_rpc_arguments(env: Env, name: str) -> None:
    rng = random.Random(name)  # seeded: these bytes happen to be no valid payload of any of the five
    for n in (0, 1, 7, 64, 300):
        errc, _ = _call_raw(env, name, _message(name).prologue(1) + bytes(rng.randrange(256) for _ in range(n)))
        assert errc == Errc.INVALID_RPC_ARGUMENTS
    env.check_unchanged()


@pytest.mark.parametrize("extra", [b"\x00", b"\x01\x02\x03", bytes(1000)], ids=["1", "3", "1000"])
def test_trailing_bytes_after_the_payload_get_invalid_rpc_arguments_and_change_nothing(env: Env, extra: bytes) -> None:
    errc, out = _call_raw(env, "Remove", _remove_body() + extra)
    assert errc == Errc.INVALID_RPC_ARGUMENTS and "left over" in ERROR_MESSAGE.decode(memoryview(out))
    env.check_unchanged()  # the forced remove was not made


def test_a_body_without_metainfo_is_read_with_one_byte_sizes(env: Env) -> None:
    message = _message("ExistKey")
    body = struct.pack("<I", message.hash & ~1) + enc(message.type, ("obj-1", "default"))
    errc, out = _call_raw(env, "ExistKey", body)
    assert _decoded("ExistKey", errc, out) is True
    env.check_unchanged()


@pytest.mark.parametrize("meta", [0b101, 0b110, 0b100100, 0xFF])
def test_metainfo_with_fields_the_protocol_never_sends_gets_invalid_rpc_arguments(env: Env, meta: int) -> None:
    body = bytearray(_remove_body())
    body[4] = meta
    errc, _ = _call_raw(env, "Remove", bytes(body))
    assert errc == Errc.INVALID_RPC_ARGUMENTS
    env.check_unchanged()


@pytest.mark.parametrize("name", ["ServiceReady", "GetFsdir", "GetStorageConfig"])
def test_arguments_to_a_call_that_takes_none_get_invalid_rpc_arguments(env: Env, name: str) -> None:
    errc, _ = _call_raw(env, name, b"\x00")
    assert errc == Errc.INVALID_RPC_ARGUMENTS
    env.check_unchanged()


BAD_KEY = b"obj-0\xff"  # a live key's bytes and one that makes it invalid UTF-8


@pytest.mark.parametrize(("name", "args"), [
    ("GetReplicaList", (BAD_KEY, "default")),
    ("ExistKey", (BAD_KEY, "default")),
    ("Remove", (BAD_KEY, True, "default")),
    ("PutStart", (CLIENT, BAD_KEY, 100, CONFIG, "default")),
    ("PutEnd", (CLIENT, (BAD_KEY, None), 4, "default")),
    ("PutRevoke", (CLIENT, BAD_KEY, 4, "default")),
    ("RemoveByRegex", (b"obj-\xc0\x80", True, "default")),
    ("Remove", ("obj-0", True, b"default\xed\xa0\x80")),  # a UTF-16 surrogate in a tenant
], ids=["GetReplicaList", "ExistKey", "Remove", "PutStart", "PutEnd", "PutRevoke", "RemoveByRegex", "tenant"])
def test_non_utf8_string_in_a_single_key_call_gets_invalid_rpc_arguments(env: Env, name: str, args: tuple) -> None:
    errc, out = _call_raw(env, name, _message(name).encode(args))
    assert errc == Errc.INVALID_RPC_ARGUMENTS and "UTF-8" in ERROR_MESSAGE.decode(memoryview(out))
    env.check_unchanged()


def _metas(keys: list[bytes]) -> MetaColumn:
    return MetaColumn(key_column(keys), np.zeros(len(keys), np.bool_), np.zeros(len(keys), np.uint64))


@pytest.mark.parametrize(("name", "args"), [
    ("BatchRemove", (key_column([b"obj-0", b"obj-1\xff"]), True, "default")),
    ("BatchPutStart", (CLIENT, key_column([b"fresh", b"\xc0\x80"]), np.array([10, 10], np.uint64), CONFIG,
                       "default")),
    ("BatchPutEnd", (CLIENT, _metas([b"obj-0", b"\xff"]), 4, "default")),
    ("BatchPutRevoke", (CLIENT, key_column([b"obj-0", b"\xff"]), 4, "default")),
    ("BatchExistKey", (key_column([b"obj-0", b"\xed\xa0\x80"]), "default")),
    ("BatchGetReplicaList", (key_column([b"\xff", b"obj-0"]), "default")),
])
def test_non_utf8_key_in_a_batch_refuses_every_key_of_it(env: Env, name: str, args: tuple) -> None:
    errc, out = _call_raw(env, name, _message(name).encode(args))
    assert _decoded(name, errc, out) == [Err(ErrorCode.INVALID_PARAMS)] * 2
    env.check_unchanged()  # obj-0 was neither removed nor revoked


# ---- values out of range ---------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1 << 63, U64_MAX])
def test_put_size_0_or_over_2_63_is_refused_with_invalid_params(env: Env, size: int) -> None:
    errc, out = _call_raw(env, "PutStart", _message("PutStart").encode((CLIENT, "new", size, CONFIG, "default")))
    assert _decoded("PutStart", errc, out) == Err(ErrorCode.INVALID_PARAMS)
    batch = (CLIENT, key_column(["new-a", "new-b"]), np.array([size, size], np.uint64), CONFIG, "default")
    errc, out = _call_raw(env, "BatchPutStart", _message("BatchPutStart").encode(batch))
    assert _decoded("BatchPutStart", errc, out) == [Err(ErrorCode.INVALID_PARAMS)] * 2
    env.check_unchanged()


def test_batch_put_with_fewer_sizes_than_keys_is_refused_per_key(env: Env) -> None:
    batch = (CLIENT, key_column(["new-a", "new-b", "new-c"]), np.array([10], np.uint64), CONFIG, "default")
    errc, out = _call_raw(env, "BatchPutStart", _message("BatchPutStart").encode(batch))
    assert _decoded("BatchPutStart", errc, out) == [Err(ErrorCode.INVALID_PARAMS)] * 3
    env.check_unchanged()


@pytest.mark.parametrize("replica_num", [0, 1 << 20, 1 << 32, (1 << 63) - 1, 1 << 63, U64_MAX])
def test_replica_num_0_or_huge_is_refused_without_allocating_per_replica(env: Env, replica_num: int) -> None:
    config = (replica_num,) + CONFIG[1:]
    with _traced_peak() as peak:
        errc, out = _call_raw(env, "PutStart", _message("PutStart").encode((CLIENT, "new", 10, config, "default")))
    assert isinstance(_decoded("PutStart", errc, out), Err)
    assert peak[0] < ALLOCATION_LIMIT
    env.check_unchanged()


@pytest.mark.parametrize(("action", "ttl"), [(9, None), (1, U64_MAX), (1, 1 << 63), (0, U64_MAX)])
def test_soft_pin_action_or_ttl_out_of_range_is_refused(env: Env, action: int, ttl: int | None) -> None:
    config = CONFIG[:3] + (action, ttl) + CONFIG[5:]
    errc, out = _call_raw(env, "PutStart", _message("PutStart").encode((CLIENT, "new", 10, config, "default")))
    assert _decoded("PutStart", errc, out) == Err(ErrorCode.INVALID_PARAMS)
    env.check_unchanged()


# (rpc, value, path of the count, width): each count is 2^32 - 1 or 2^64 - 1 in a body of a few dozen bytes
_HUGE_COUNTS = [
    ("BatchExistKey", (key_column(["k"]), "default"), (0,)),
    ("BatchRemove", (key_column(["obj-0"]), True, "default"), (0,)),
    ("BatchPutStart", (CLIENT, key_column(["k"]), [10], CONFIG, "default"), (1,)),
    ("BatchPutStart", (CLIENT, key_column(["k"]), [10], CONFIG, "default"), (2,)),
    ("BatchPutEnd", (CLIENT, _metas([b"k"]), 4, "default"), (1,)),
    ("ReMountSegment", ([SEGMENT], CLIENT), (0,)),
    ("PutStart", (CLIENT, "k", 10, CONFIG, "default"), (3, 6)),  # preferred segments
    ("GetReplicaList", ("obj-0", "default"), (0,)),  # a string's length
    ("MountSegment", (SEGMENT, CLIENT), (0, 1)),
]


@pytest.mark.parametrize("width", [4, 8])
@pytest.mark.parametrize(("name", "value", "path"), _HUGE_COUNTS,
                         ids=["BatchExistKey-keys", "BatchRemove-keys", "BatchPutStart-keys", "BatchPutStart-sizes",
                              "BatchPutEnd-metas", "ReMountSegment-segments", "PutStart-preferred",
                              "GetReplicaList-key", "MountSegment-name"])
def test_a_count_of_2_32_or_2_64_in_a_tiny_body_fails_fast_without_allocating(
        env: Env, name: str, value: tuple, path: tuple[int, ...], width: int) -> None:
    count = (U32_MAX if width == 4 else U64_MAX).to_bytes(width, "little")
    body = body_replacing(_message(name), value, path, count + b"\x01\x02\x03", width)
    assert len(body) < 400
    t0 = time.monotonic()
    with _traced_peak() as peak:
        errc, out = _call_raw(env, name, body)
    assert errc == Errc.INVALID_RPC_ARGUMENTS, ERROR_MESSAGE.decode(memoryview(out))
    assert peak[0] < ALLOCATION_LIMIT
    assert time.monotonic() - t0 < 2.0  # a few milliseconds; a loop over the count would take hours
    env.check_unchanged()


@pytest.mark.parametrize(("base", "size"), [(U64_MAX - 4095, 1 << 20), (1 << 63, 4096), ((1 << 63) - 1, 1 << 63),
                                            (1 << 40, 0), (0, 1 << 20), (1 << 40, U64_MAX)],
                         ids=["end-over-2^64", "base-2^63", "size-2^63", "size-0", "base-0", "size-max"])
def test_a_segment_that_does_not_fit_the_address_space_is_refused(env: Env, base: int, size: int) -> None:
    segment = ((7, 7), "far", base, size, "far:1", "tcp", "")
    errc, out = _call_raw(env, "MountSegment", _message("MountSegment").encode((segment, CLIENT)))
    assert _decoded("MountSegment", errc, out) == Err(ErrorCode.INVALID_PARAMS)
    errc, out = _call_raw(env, "ReMountSegment", _message("ReMountSegment").encode(([segment], CLIENT)))
    assert _decoded("ReMountSegment", errc, out) == Err(ErrorCode.INVALID_PARAMS)
    env.check_unchanged()


@pytest.mark.parametrize(("name", "value", "path"), [
    ("Remove", ("obj-0", True, "default"), (1,)),
    ("RemoveAll", (True, ""), (0,)),
    ("BatchRemove", (key_column(["obj-0"]), True, "default"), (1,)),
    ("RemoveByRegex", (".*", True, "default"), (1,)),
    ("PutStart", (CLIENT, "new", 10, CONFIG, "default"), (3, 5)),  # with_hard_pin
])
@pytest.mark.parametrize("byte", [2, 0xFF])
def test_a_bool_byte_other_than_0_or_1_gets_invalid_rpc_arguments(env: Env, name: str, value: tuple,
                                                                    path: tuple[int, ...], byte: int) -> None:
    errc, out = _call_raw(env, name, body_replacing(_message(name), value, path, bytes([byte])))
    assert errc == Errc.INVALID_RPC_ARGUMENTS and "bool" in ERROR_MESSAGE.decode(memoryview(out))
    env.check_unchanged()  # nothing was removed


@pytest.mark.parametrize(("name", "value", "path", "raw"), [
    ("PutEnd", (CLIENT, ("obj-0", None), 4, "default"), (1, 1), b"\x02"),  # ObjectMeta's checksum
    ("PutStart", (CLIENT, "new", 10, CONFIG, "default"), (3, 4), b"\x02"),  # soft_pin_ttl_ms
    ("PutStart", (CLIENT, "new", 10, CONFIG, "default"), (3, 12), b"\x03"),  # group_ids
    ("BatchPutEnd", (CLIENT, _metas([b"obj-0"]), 4, "default"), (1,), b"\x01\x05obj-0\x02"),  # in the kernel
], ids=["PutEnd-checksum", "PutStart-soft-pin-ttl", "PutStart-group-ids", "BatchPutEnd-checksum"])
def test_an_optional_flag_byte_out_of_range_gets_invalid_rpc_arguments(env: Env, name: str, value: tuple,
                                                                        path: tuple[int, ...], raw: bytes) -> None:
    errc, _ = _call_raw(env, name, body_replacing(_message(name), value, path, raw))
    assert errc == Errc.INVALID_RPC_ARGUMENTS
    env.check_unchanged()


def test_hostile_responses_fail_to_decode_with_a_typed_error() -> None:
    """The same codec reads responses (the test client, tools): a variant index, an expected flag,
    an optional flag or a count out of range is a WireDecodeError, not an IndexError or a hang."""
    response = RPCS["GetReplicaList"].response
    good = response.encode(([(1, (0, ((100, 1 << 40, "tcp", "ep"),)), 3)], 5000, None))
    assert response.decode(memoryview(good))[1] == 5000
    payload_at = len(response.prologue(1))
    cases = {
        "expected flag 2": (payload_at, 2),
        "vector count 255 of 1": (payload_at + 1, 255),
        "variant index 5 of 5": (payload_at + 2 + 8, 5),
        "variant index 255": (payload_at + 2 + 8, 255),
        "optional flag 2": (len(good) - 1, 2),
    }
    for what, (at, byte) in cases.items():
        bad = bytearray(good)
        bad[at] = byte
        with pytest.raises(WireDecodeError):
            response.decode(memoryview(bytes(bad)))
            pytest.fail(what)
    with pytest.raises(WireDecodeError):  # the error-message body of a failed call
        Message(STR).decode(memoryview(body_of(Message(STR), U32_MAX.to_bytes(4, "little"), width=4)))


# ---- connections -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cut", [5, REQUEST_HEADER.size + 3], ids=["in-header", "in-body"])
def test_a_half_frame_then_a_stall_is_closed_after_the_frame_timeout_while_others_are_served(cut: int) -> None:
    with _env(frame_timeout_s=0.5) as env, env.raw() as idle, env.raw() as stalled:
        frame = request_frame(1, RPCS["Remove"].function_id, _remove_body())
        stalled.sendall(frame[:cut])
        t0 = time.monotonic()
        with env.client() as good:
            for _ in range(5):
                assert good.call("ServiceReady") == STORE_VERSION
            assert env.observer.wire_errors["stalled_frame"] == 0  # served while the stalled frame was open
        data, how = read_until_closed(stalled)
        elapsed = time.monotonic() - t0
        assert data == b"" and how in CLOSED
        assert elapsed >= 0.4, f"closed after {elapsed:.2f} s, before the frame timeout"
        assert env.observer.wire_errors["stalled_frame"] == 1
        # an idle connection (no frame begun) is not subject to the frame timeout: the client's pool keeps them
        idle.sendall(request_frame(2, READY, b""))
        assert _read_one_response(idle)[:2] == (2, Errc.OK)
        env.check_unchanged()  # the stalled remove was not made


def _rst_close(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("how", ["fin-in-body", "rst-in-body", "rst-in-header", "unread-response",
                                 "rst-before-response"])
def test_a_client_that_disconnects_mid_request_costs_only_its_connection(env: Env, how: str) -> None:
    remove = request_frame(1, RPCS["Remove"].function_id, _remove_body())
    many = _message("BatchGetReplicaList").encode((key_column(KEYS * 2000), "default"))  # a response of ~700 KB
    big = request_frame(2, RPCS["BatchGetReplicaList"].function_id, many)
    with env.client() as other:
        assert other.call("ServiceReady") == STORE_VERSION
        sock = env.raw()
        if how == "fin-in-body":
            sock.sendall(remove[:-4])
            sock.close()
        elif how == "rst-in-body":
            sock.sendall(remove[:-4])
            _rst_close(sock)
        elif how == "rst-in-header":
            sock.sendall(remove[:7])
            _rst_close(sock)
        elif how == "unread-response":
            sock.sendall(big + big)
            sock.close()
        else:
            sock.sendall(big)
            _rst_close(sock)
        assert env.observer.wait_open(1), "the disconnected connection was not cleaned up"
        assert other.call("ServiceReady") == STORE_VERSION
    assert env.observer.wait_open(0)
    env.check_unchanged()


def test_200_connections_at_once_are_all_served_and_bad_ones_among_them_close_only_themselves(env: Env) -> None:
    socks = [env.raw() for _ in range(200)]
    try:
        for i, sock in enumerate(socks):
            sock.sendall(request_frame(i, READY, b"", magic=0x16 if i % 10 == 3 else 21))
        for i, sock in enumerate(socks):
            if i % 10 == 3:
                data, how = read_until_closed(sock)
                assert data == b"" and how in CLOSED
                continue
            seq, errc, body = _read_one_response(sock)
            assert (seq, errc) == (i, Errc.OK)
            assert RPCS["ServiceReady"].response.decode(memoryview(body)) == STORE_VERSION
        assert env.observer.open_connections == 180  # every good one is open and served at once
    finally:
        for sock in socks:
            sock.close()
    assert env.observer.wait_open(0)
    env.check_unchanged()


def test_max_connections_refuses_the_connection_over_the_cap_and_serves_again_after_one_closes() -> None:
    with _env(max_connections=3) as env:
        clients = [env.client() for _ in range(3)]
        try:
            for c in clients:
                assert c.call("ServiceReady") == STORE_VERSION
            assert env.observer.wait_open(3)
            with env.raw() as refused:
                try:
                    refused.sendall(request_frame(1, READY, b""))
                except OSError:
                    pass  # refused before the request went out
                data, how = read_until_closed(refused)
            assert data == b"" and how in CLOSED
            assert env.observer.wire_errors["too_many_connections"] == 1
            for c in clients:  # the connections under the cap are served on
                assert c.call("ServiceReady") == STORE_VERSION
            clients.pop().close()
            assert env.observer.wait_open(2)
            with env.client() as again:
                assert again.call("ServiceReady") == STORE_VERSION
        finally:
            for c in clients:
                c.close()
        assert env.observer.wait_open(0)
        env.check_unchanged()


# ---- engine bugs hostile input reaches -------------------------------------------------------------

def test_remount_naming_one_new_segment_twice_with_two_ids_is_refused_and_leaves_the_registry_whole(
        env: Env) -> None:
    first = ((50, 1), "twice", 1 << 41, 1 << 20, "127.0.0.1:2", "tcp", "")
    second = ((50, 2), "twice", 1 << 42, 1 << 20, "127.0.0.1:2", "tcp", "")
    errc, out = _call_raw(env, "ReMountSegment", _message("ReMountSegment").encode(([first, second], CLIENT)))
    assert isinstance(_decoded("ReMountSegment", errc, out), Err)
    env.master.verify()
    other = ((51, 1), "other", 1 << 43, 1 << 20, "127.0.0.1:3", "tcp", "")
    errc, out = _call_raw(env, "MountSegment", _message("MountSegment").encode((other, CLIENT)))
    assert _decoded("MountSegment", errc, out) is None


def test_a_connection_whose_frames_each_complete_at_once_is_never_closed_as_stalled() -> None:
    with _env(frame_timeout_s=0.3) as env, env.raw() as sock:
        frame = request_frame(0, RPCS["ExistKey"].function_id, _message("ExistKey").encode(("obj-0", "default")))
        half = len(frame) // 2
        sock.sendall(frame[:half])
        t0 = time.monotonic()
        while time.monotonic() - t0 < 1.0:  # three frame timeouts of traffic, each frame done within a round trip
            sock.sendall(frame[half:] + frame[:half])  # the rest of one frame and the start of the next
            assert _read_one_response(sock)[:2] == (0, Errc.OK)
        assert env.observer.wire_errors["stalled_frame"] == 0


def _send_until_full(sock: socket.socket, frame: bytes, most: int) -> int:
    """Send ``frame`` again and again without reading, until the socket's buffers are full; the
    bytes sent (the last frame usually cut)."""
    sock.setblocking(False)
    sent = 0
    try:
        while sent < most * len(frame):
            sent += sock.send(frame[sent % len(frame):])
    except BlockingIOError:
        pass
    sock.settimeout(5.0)
    return sent


def test_a_pipelining_client_that_reads_its_answers_late_is_not_closed_as_stalled() -> None:
    with _env(frame_timeout_s=0.3) as env, env.raw() as sock:
        body = _message("BatchGetReplicaList").encode((key_column(KEYS * 500), "default"))  # answers of 126 KB
        frame = request_frame(0, RPCS["BatchGetReplicaList"].function_id, body)
        sent = _send_until_full(sock, frame, 1000)
        assert sent > 20 * len(frame)  # far more answers than the socket buffers hold: the server stopped reading
        # reading paused by the server is not a stalled peer: no close for three frame timeouts
        assert not env.observer.wait_wire_error("stalled_frame", 1, timeout_s=1.0)
        # the rest of the last frame goes out while the answers are read: the server reads again
        # only once its answers drain
        rest = threading.Thread(target=sock.sendall, args=(frame[sent % len(frame):] if sent % len(frame) else b"",))
        rest.start()
        reader = ResponseReader(sock)
        for _ in range(-(-sent // len(frame))):
            r = reader.next()
            assert (r.seq, r.errc) == (0, Errc.OK)
        rest.join(5.0)
        env.check_unchanged()
