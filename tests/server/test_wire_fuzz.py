"""Seeded fuzz of the master's RPC port: every byte a peer sends is hostile.

Four families, each a fixed seed and a fixed number of cases (``MOONCAKE_WIRE_FUZZ_CASES``,
default 300 a family; ``MOONCAKE_WIRE_FUZZ_SEED`` picks other cases to explore with):

(a) captured request frames (tests/fixtures/upstream_rpc/) mutated: bit flips, bytes set, inserted
    and deleted, truncation, length and attach fields changed, two frames spliced;
(b) random frames: coro_rpc's magic, random header fields, a known or unknown function id and a
    random body;
(c) structure-aware: for every RPC, valid encodings of its request type carrying hostile values
    (empty, huge and non-UTF-8 strings, integers at their type's bounds, long and repeating
    vectors), from captured requests with a leaf forged or generated from the type;
(d) a small world: plausible calls of every RPC over a few segment names, ids, clients and keys,
    so that they meet each other's state, with time moving and now and then a hostile leaf.
(c) and (d) are mostly dispatched in process, one case in five over a socket.

Each framing case is one connection: the case's bytes, a well-formed ServiceReady after them, and
end of file. What must come back is worked out from the bytes alone (wire_fuzz.expected_responses:
which frame gets which coro_rpc code, which is served, where the connection ends) and the
server's answer is compared with it. On top: no exception escapes a connection's handler, no call
fails with rpc_throw_exception (a handler bug), a case whose frames change nothing leaves the
engine's object count and segment usage as they were, the server logs no error, ``verify()``
passes every VERIFY_EVERY cases (in (d) after every case), and at the end the server thread is
alive, serves a new connection and has closed every connection it was given. ``pytest -s``
prints the outcome table.
"""
from __future__ import annotations

import os
import random
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from mooncake_columnar import ManualClocks, MasterService
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.server.handlers import STORE_VERSION, MasterHandlers
from mooncake_columnar.server.rpc_server import Errc, RpcServer
from mooncake_columnar.server.rpc_types import RPCS, Rpc
from mooncake_columnar.server.struct_pack import Err
from mooncake_columnar.testing.wire_client import ServerThread, request_frame
from mooncake_columnar.testing.wire_fuzz import (ExpectedResponse, RecordingObserver, ServerErrorLog, ValuePool,
                                                 check_exchange, check_response, encode_some_width, exchange,
                                                 expected_dispatch, expected_responses, forge, hostile_request,
                                                 key_column, load_requests, mutate_frame, outcome_label,
                                                 outcome_table, parse_responses, plain, random_frame,
                                                 record_loop_errors, response_label)

CASES = int(os.environ.get("MOONCAKE_WIRE_FUZZ_CASES", "300"))
SEED = int(os.environ.get("MOONCAKE_WIRE_FUZZ_SEED", "0x5EEDC0DE"), 0)
VERIFY_EVERY = 25
SOCKET_EVERY = 5  # families (c) and (d): one case in five over a real socket, the rest dispatched in process
MAX_BODY = 1 << 20  # small enough that length tweaks reach the cap, large enough for every captured frame
FIXTURES = Path(__file__).parent.parent / "fixtures" / "upstream_rpc"

CLIENT = (11, 22)
SEGMENT_ID = (33, 44)
SEGMENT = (SEGMENT_ID, "fuzz-seg", 1 << 40, 256 << 20, "127.0.0.1:12345", "tcp", "")
CONFIG = (1, 0, 0, 0, None, False, [], "", [], False, 0, "", None)
SEED_KEYS = [f"obj-{i}" for i in range(8)]
PROBE_SEQ = 0xFFFF_FFF0
PROBE = request_frame(PROBE_SEQ, RPCS["ServiceReady"].function_id, b"")
# calls after which the engine's object count and segment usage are what they were
READ_ONLY = {"ServiceReady", "GetFsdir", "GetStorageConfig", "FetchTasks", "Ping", "GetReplicaList",
             "BatchGetReplicaList", "ExistKey", "BatchExistKey"}
# hand-written templates for the RPCs the capture has no request of
EXTRA_TEMPLATES: dict[str, list[Any]] = {
    "PutRevoke": [(CLIENT, b"obj-0", 4, b"default")],
    "BatchPutRevoke": [(CLIENT, [b"obj-1", b"new"], 4, b"default")],
    "RemoveByRegex": [(b"^obj-[0-3]$", False, b"default")],
    "PutStart": [(CLIENT, b"new-key", 4096, CONFIG, b"default")],
}

OUTCOMES: dict[str, Counter[str]] = {}
SOCKET_CASES: Counter[str] = Counter()  # families (c) and (d): how many of their cases went over a socket


@dataclass
class Rig:
    master: MasterService
    clocks: ManualClocks
    server: RpcServer
    thread: ServerThread
    observer: RecordingObserver
    loop_errors: list[dict[str, Any]]
    error_log: ServerErrorLog
    templates: dict[str, list[Any]]
    pool: ValuePool
    frames: list[bytes]
    failures: list[str] = field(default_factory=list)
    recent: deque[str] = field(default_factory=lambda: deque(maxlen=VERIFY_EVERY))  # cases since the last verify
    seq: int = 0

    def dispatch(self, name: str, args: Any) -> Any:
        rpc = RPCS[name]
        body = rpc.request.encode(args) if rpc.request is not None else b""
        [r], error = parse_responses(self.server.dispatch(0, rpc.function_id, memoryview(body)))
        assert error is None and r.errc == 0, (name, r)
        return rpc.response.decode(memoryview(r.body))

    def seed(self) -> None:
        """(Re)mount the fuzz segment and put the seeded objects a case may have removed."""
        self.dispatch("MountSegment", (SEGMENT, CLIENT))
        for key in SEED_KEYS:
            if not isinstance(self.dispatch("PutStart", (CLIENT, key, 4096, CONFIG, "default")), Err):
                self.dispatch("PutEnd", (CLIENT, (key, None), 4, "default"))

    def fingerprint(self) -> tuple:
        return self.master.object_count(), sorted(self.master.segment_usage().items())

    def checkpoint(self, i: int) -> None:
        if i % VERIFY_EVERY == VERIFY_EVERY - 1:
            problem = _verified(self)
            if problem is not None:  # a broken engine breaks every case after it: stop, naming its suspects
                pytest.fail(f"{problem}\nafter the cases:\n" + "\n".join(self.recent), pytrace=False)
            self.seed()

    def case(self, what: str, run: Any) -> None:
        """Run one case; anything it returns is a failure, as is an exception escaping the server."""
        errors_before, logged_before = len(self.loop_errors), len(self.error_log.records)
        self.recent.append(what)
        problem = run()
        if problem is not None:
            self.failures.append(f"{what}: {problem}")
        if len(self.loop_errors) > errors_before:
            ctx = self.loop_errors[-1]
            self.failures.append(f"{what}: escaped the connection handler: {ctx.get('exception')!r}")
        if len(self.error_log.records) > logged_before:
            self.failures.append(f"{what}: the server logged {self.error_log.describe(logged_before)}")


def _templates() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {name: list(v) for name, v in EXTRA_TEMPLATES.items()}
    for frame in load_requests(FIXTURES / "real_traffic.jsonl", FIXTURES / "real_width.jsonl"):
        rpc = RPCS[frame.name]
        if rpc.request is not None:
            out.setdefault(frame.name, []).append(plain(rpc.request.type, rpc.request.decode(memoryview(frame.body))))
    return out


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    clocks = ManualClocks()
    master = MasterService(MasterConfig(default_kv_lease_ttl_ms=5_000, client_live_ttl_s=10), clocks=clocks)
    observer = RecordingObserver()
    server = RpcServer(MasterHandlers(master), observer=observer, max_body_bytes=MAX_BODY, frame_timeout_s=5.0)
    thread = ServerThread(server)
    captured = load_requests(FIXTURES / "real_traffic.jsonl", FIXTURES / "real_width.jsonl")
    pool = ValuePool(strings=[k.encode() for k in SEED_KEYS] + [b"default", b"tcp", b"fuzz-seg", b"127.0.0.1:12345",
                                                                 b"k_small", b"^obj", b"new-key"],
                     uuids=[CLIENT, SEGMENT_ID, (0, 0), ((1 << 64) - 1, (1 << 64) - 1)])
    r = Rig(master, clocks, server, thread, observer, record_loop_errors(thread.loop), ServerErrorLog(), _templates(),
            pool, [f.frame for f in captured])
    # the captured exchange, unmutated, first: every call of it is served
    stream = b"".join(r.frames)
    problem = check_exchange(exchange(thread.port, stream), expected_responses(stream, MAX_BODY))
    assert problem is None, problem
    r.seed()
    master.verify()
    yield r
    print("\nwire fuzz outcomes (of each case's first frame):\n" + outcome_table(OUTCOMES))
    print("over a real socket: (a) and (b) every case; " + ", ".join(f"{f} {n}" for f, n in SOCKET_CASES.items()))
    r.error_log.detach()
    thread.stop()


def _finish(r: Rig, family: str) -> None:
    if r.failures:
        pytest.fail(f"{len(r.failures)} failing {family} cases:\n" + "\n".join(r.failures[:20]), pytrace=False)
    r.master.verify()
    assert r.thread._thread.is_alive()  # the server's loop thread survived the family
    got = exchange(r.thread.port, PROBE)
    assert check_exchange(got, expected_responses(PROBE, MAX_BODY)) is None
    assert r.observer.calls["ServiceReady"] > 0


def _framing_case(r: Rig, stream: bytes, family: str) -> str | None:
    expected = expected_responses(stream, MAX_BODY)
    quiet = all(e.errc != 0 or (e.rpc is not None and e.rpc.name in READ_ONLY) for e in expected)
    before = r.fingerprint() if quiet else None
    got = exchange(r.thread.port, stream)
    OUTCOMES[family][outcome_label(got, expected[0] if expected else None)] += 1
    problem = check_exchange(got, expected)
    if problem is None and before is not None and r.fingerprint() != before:
        problem = f"engine state changed by frames that change nothing: {before} -> {r.fingerprint()}"
    return problem


def test_fuzz_mutated_captured_frames(rig: Rig) -> None:
    rng = random.Random(SEED)
    OUTCOMES["a mutated"] = Counter()
    for i in range(CASES):
        frame, what = mutate_frame(rig.frames, rng, MAX_BODY)
        rig.case(f"case {i} ({what})", lambda: _framing_case(rig, frame + PROBE, "a mutated"))
        rig.checkpoint(i)
    _finish(rig, "a mutated")


def test_fuzz_random_frames(rig: Rig) -> None:
    rng = random.Random(SEED + 1)
    OUTCOMES["b random"] = Counter()
    for i in range(CASES):
        frames = [random_frame(rng, MAX_BODY) for _ in range(rng.choice((1, 1, 1, 2, 3)))]
        stream = b"".join(f for f, _ in frames) + PROBE
        rig.case(f"case {i} ({'; '.join(w for _, w in frames)})", lambda: _framing_case(rig, stream, "b random"))
        rig.checkpoint(i)
    _finish(rig, "b random")


def _typed_case(r: Rig, rpc: Rpc, body: bytes, over_socket: bool, family: str = "c typed") -> str | None:
    """One valid-typed request, dispatched in process or (with a ServiceReady after it) over a
    socket; its response checked against what the model expects."""
    seq = r.seq = (r.seq + 1) % PROBE_SEQ
    expected = expected_dispatch(seq, rpc.function_id, body)
    before = r.fingerprint() if expected.errc != 0 or rpc.name in READ_ONLY else None
    if over_socket:
        stream = request_frame(seq, rpc.function_id, body) + PROBE
        got = exchange(r.thread.port, stream)
        problem = check_exchange(got, expected_responses(stream, MAX_BODY))
        OUTCOMES[family][outcome_label(got, expected)] += 1
        SOCKET_CASES[family] += 1
    else:
        try:
            out = r.server.dispatch(seq, rpc.function_id, memoryview(body))
        except Exception as e:  # noqa: BLE001 - the case's failure, reported with the rest
            return f"dispatch raised {e!r}"
        responses, error = parse_responses(out)
        if error is not None or len(responses) != 1:
            return f"dispatch answered {len(responses)} frames ({error})"
        [resp] = responses
        problem = check_response(resp.seq, resp.errc, resp.body, expected)
        OUTCOMES[family][response_label(resp.errc, resp.body, expected.rpc)] += 1
    if problem is None and before is not None and r.fingerprint() != before:
        problem = f"engine state changed: {before} -> {r.fingerprint()}"
    return problem


def test_fuzz_structure_aware_requests_for_every_rpc(rig: Rig) -> None:
    rng = random.Random(SEED + 2)
    OUTCOMES["c typed"] = Counter()
    rpcs = list(RPCS.values())
    per_rpc: Counter[str] = Counter()
    for i in range(CASES):
        rpc = rpcs[i % len(rpcs)]
        body, what = hostile_request(rpc, rng, rig.pool, rig.templates.get(rpc.name, []))
        per_rpc[rpc.name] += 1
        rig.case(f"case {i} {rpc.name} ({what}, {len(body)} bytes)",
                 lambda: _typed_case(rig, rpc, body, over_socket=i % SOCKET_EVERY == 0))
        rig.checkpoint(i)
    assert set(per_rpc) == set(RPCS) or CASES < len(RPCS)
    _finish(rig, "c typed")


# ---- (d) a small world ------------------------------------------------------------------------------
# Few segment names, segment ids, clients and keys, so that calls meet each other's state (a key put
# by one client and ended by another, a remount of a name mounted under another id, a batch naming
# a key twice); time moves now and then (leases and clients expire). Values are plausible, and in
# one case in three a leaf of the request is replaced by a hostile value of its type.
W_NAMES = ["w0", "w1", "w2"]
W_IDS = [(1, 1), (1, 2), (2, 1), (2, 2)]
W_CLIENTS = [CLIENT, (5, 5)]
W_KEYS = ["a", "b", "c", "d"]
W_BASES = [1 << 40, (1 << 40) + (1 << 20), 1 << 41]
W_POOL = ValuePool(strings=[k.encode() for k in W_KEYS + W_NAMES] + [b"default"], uuids=W_IDS + W_CLIENTS)


def _w_segment(rng: random.Random) -> tuple:
    return (rng.choice(W_IDS), rng.choice(W_NAMES), rng.choice(W_BASES), rng.choice((4096, 1 << 20, 2 << 20)),
            rng.choice(("w:1", "w:2")), "tcp", "")


def _w_config(rng: random.Random) -> tuple:
    return (rng.choice((1, 1, 2, 3)), 0, 0, rng.choice((0, 0, 1)), rng.choice((None, None, 0, 1000)),
            rng.random() < 0.2, rng.choice(([], [], [rng.choice(W_NAMES)])), rng.choice(("", rng.choice(W_NAMES))),
            [], False, 0, "", rng.choice((None, None, ["g"])))


def _w_keys(rng: random.Random) -> list[str]:
    return [rng.choice(W_KEYS) for _ in range(rng.randint(0, 4))]


def _w_size(rng: random.Random) -> int:
    return rng.choice((1, 100, 4096, 1 << 20))


WORLD: dict[str, Any] = {
    "ServiceReady": lambda rng: None,
    "GetFsdir": lambda rng: None,
    "GetStorageConfig": lambda rng: None,
    "Ping": lambda rng: rng.choice(W_CLIENTS),
    "FetchTasks": lambda rng: (rng.choice(W_CLIENTS), 16),
    "MountSegment": lambda rng: (_w_segment(rng), rng.choice(W_CLIENTS)),
    "ReMountSegment": lambda rng: ([_w_segment(rng) for _ in range(rng.choice((0, 1, 1, 2, 3)))],
                                   rng.choice(W_CLIENTS)),
    "UnmountSegment": lambda rng: (rng.choice(W_IDS), rng.choice(W_CLIENTS)),
    "PutStart": lambda rng: (rng.choice(W_CLIENTS), rng.choice(W_KEYS), _w_size(rng), _w_config(rng), "default"),
    "PutEnd": lambda rng: (rng.choice(W_CLIENTS), (rng.choice(W_KEYS), None), 4, "default"),
    "PutRevoke": lambda rng: (rng.choice(W_CLIENTS), rng.choice(W_KEYS), 4, "default"),
    "BatchPutStart": lambda rng: (lambda keys: (rng.choice(W_CLIENTS), keys, [_w_size(rng) for _ in keys],
                                                _w_config(rng), "default"))(_w_keys(rng)),
    "BatchPutEnd": lambda rng: (rng.choice(W_CLIENTS), [(k, None) for k in _w_keys(rng)], 4, "default"),
    "BatchPutRevoke": lambda rng: (rng.choice(W_CLIENTS), _w_keys(rng), 4, "default"),
    "GetReplicaList": lambda rng: (rng.choice(W_KEYS), "default"),
    "BatchGetReplicaList": lambda rng: (_w_keys(rng), "default"),
    "ExistKey": lambda rng: (rng.choice(W_KEYS), "default"),
    "BatchExistKey": lambda rng: (_w_keys(rng), "default"),
    "Remove": lambda rng: (rng.choice(W_KEYS), rng.random() < 0.5, "default"),
    "BatchRemove": lambda rng: (_w_keys(rng), rng.random() < 0.5, "default"),
    "RemoveByRegex": lambda rng: (rng.choice(("a|b", "^c", ".*")), rng.random() < 0.5, "default"),
    "RemoveAll": lambda rng: (rng.random() < 0.5, ""),
}


def _world_request(rng: random.Random) -> tuple[Rpc, Any, bytes]:
    name = rng.choice(sorted(WORLD))
    rpc = RPCS[name]
    args = WORLD[name](rng)
    if rpc.request is not None and rng.random() < 1 / 3:
        args = forge(rpc.request.type, plain(rpc.request.type, args), rng, W_POOL, 0.1)
    return rpc, args, b"" if rpc.request is None else encode_some_width(rpc.request, args, rng, 0.1)[0]


def _world_case(r: Rig, rpc: Rpc, body: bytes, advance_ms: int, i: int) -> str | None:
    if advance_ms:  # time passes first: leases, soft pins and silent clients expire
        r.clocks.advance(ms=advance_ms)
        try:
            r.master.tick()
        except Exception as e:  # noqa: BLE001 - the case's failure, reported with the rest
            return f"tick() after {advance_ms} ms raised {e!r}"
    return _typed_case(r, rpc, body, over_socket=i % SOCKET_EVERY == 0, family="d world") or _verified(r)


def _verified(r: Rig) -> str | None:
    try:
        r.master.verify()
    except Exception as e:  # noqa: BLE001 - the case's failure, reported with the rest
        return f"verify() failed: {e}"
    return None


def test_fuzz_a_small_world_of_names_ids_clients_and_keys(rig: Rig) -> None:
    assert set(WORLD) == set(RPCS)  # a new RPC needs its plausible calls here
    rng = random.Random(SEED + 3)
    OUTCOMES["d world"] = Counter()
    for i in range(CASES):
        rpc, args, body = _world_request(rng)
        advance_ms = rng.choice((1_000, 6_000, 11_000)) if rng.random() < 0.05 else 0
        rig.case(f"case {i}: {'+%d ms, ' % advance_ms if advance_ms else ''}{rpc.name}{args!r:.300}",
                 lambda: _world_case(rig, rpc, body, advance_ms, i))
        if rig.failures:  # the engine is broken: what follows only repeats it
            break
    else:
        rig.seed()
    _finish(rig, "d world")


def test_the_server_served_every_family_and_closed_every_connection(rig: Rig) -> None:
    assert rig.observer.wait_open(0), f"{rig.observer.open_connections} connections still open"
    assert not rig.loop_errors
    assert rig.observer.calls["ServiceReady"] > 0
    with rig.thread.client() as c:
        assert c.call("ServiceReady") == STORE_VERSION
    rig.master.verify()


def test_expected_responses_model_follows_the_framing_rule() -> None:
    """The reference model itself, on hand-made streams (a wrong model would pass a wrong server)."""
    ready = RPCS["ServiceReady"].function_id
    good = request_frame(1, ready, b"")
    assert expected_responses(good + good, MAX_BODY) == [ExpectedResponse(1, Errc.OK, RPCS["ServiceReady"])] * 2
    assert expected_responses(request_frame(2, ready, b"", magic=20) + good, MAX_BODY) == []
    assert [e.errc for e in expected_responses(request_frame(3, ready, b"", version=1) + good, MAX_BODY)] == [
        Errc.UNKNOWN_PROTOCOL_VERSION]
    assert [e.errc for e in expected_responses(request_frame(3, ready, b"x") + good, MAX_BODY)] == [
        Errc.INVALID_RPC_ARGUMENTS, Errc.OK]
    assert [e.errc for e in expected_responses(request_frame(4, 7, b"") + good[:-1], MAX_BODY)] == [
        Errc.FUNCTION_NOT_REGISTERED]
    assert [e.errc for e in expected_responses(request_frame(5, ready, b"", length=MAX_BODY + 1), MAX_BODY)] == [
        Errc.MESSAGE_TOO_LARGE]
    batch = RPCS["BatchExistKey"]
    assert batch.request is not None
    body = batch.request.encode((key_column(["a", "b", "c"]), "default"))
    assert expected_dispatch(6, batch.function_id, body).keys == 3
