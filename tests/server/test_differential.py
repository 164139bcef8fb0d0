"""The same scripted client sequences against upstream's ``mooncake_master`` and ``mooncake-columnar
serve``: every answer (codes, sizes, sha256 of what was read) must be identical.

Each sequence runs once per master, on one client per master, and the answers are cached; the
comparison is one test per sequence. ``expect`` on a step pins what upstream answers, so a change in
the wheel (or a sequence that no longer tests what it says) shows up even while serve is missing.
Steps with ``compare=False`` depend on what earlier sequences left behind and are not compared.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

from mooncake_columnar.errors import ErrorCode
from mooncake_columnar.testing.client_driver import (
    RealClient,
    SeededValue,
    Value,
    describe_bytes,
    value_fields,
)
from mooncake_columnar.testing.upstream_wheel import MASTER_KINDS, MasterKind, MasterProcess, skip_reason

from .conftest import require_kind, start_client, start_master

pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))

OK = int(ErrorCode.OK)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
HAS_LEASE = int(ErrorCode.OBJECT_HAS_LEASE)
INVALID_PARAMS = int(ErrorCode.INVALID_PARAMS)
KiB, MiB = 1 << 10, 1 << 20
EMPTY_READ = describe_bytes(b"")


def read_of(value: Value) -> dict[str, Any]:
    """The driver's description of a read that returned ``value``."""
    return describe_bytes(value.data() if isinstance(value, SeededValue) else bytes(value))


@dataclass
class Step:
    op: str
    fields: dict[str, Any]
    expect: dict[str, Any] | None = None
    compare: bool = True

    def describe(self) -> str:
        shown = {k: (v if len(repr(v)) < 80 else f"<{len(v)} items>") for k, v in self.fields.items()}
        return f"{self.op}({shown})"


@dataclass
class Script:
    name: str
    steps: list[Step] = field(default_factory=list)

    def key(self, suffix: str) -> str:
        return f"{self.name}/{suffix}"

    def add(self, op: str, expect: dict[str, Any] | None = None, compare: bool = True, **fields: Any) -> Script:
        self.steps.append(Step(op, fields, expect, compare))
        return self

    # Shorthands for the client calls, keyed by suffix within the sequence.
    def put(self, key: str, value: Value, rc: int | None = OK) -> Script:
        return self.add("put", None if rc is None else {"rc": rc}, key=self.key(key), **value_fields(value))

    def get(self, key: str, value: Value | None) -> Script:
        return self.add("get", {"value": read_of(value) if value is not None else EMPTY_READ}, key=self.key(key))

    def code(self, op: str, key: str, rc: int, **fields: Any) -> Script:
        return self.add(op, {"rc": rc}, key=self.key(key), **fields)

    def batch(self, op: str, keys: list[str], rcs: list[int] | int, **fields: Any) -> Script:
        expect = {"rc": rcs} if isinstance(rcs, int) else {"rcs": rcs}
        return self.add(op, expect, keys=[self.key(k) for k in keys], **fields)


def _put_get_sizes() -> Script:
    s = Script("sizes")
    for i, size in enumerate([1, 100, 4 * KiB, 1 * MiB, 16 * MiB]):
        v = SeededValue(100 + i, size)
        s.put(f"v{size}", v).get(f"v{size}", v).code("get_size", f"v{size}", size).code("is_exist", f"v{size}", 1)
        s.code("remove", f"v{size}", HAS_LEASE).code("remove", f"v{size}", OK, force=True)
        s.code("is_exist", f"v{size}", 0)
    return s


def _missing_keys() -> Script:
    s = Script("missing")
    s.get("nope", None).code("get_size", "nope", NOT_FOUND).code("is_exist", "nope", 0)
    s.code("remove", "nope", NOT_FOUND).code("remove", "nope", NOT_FOUND, force=True)
    s.batch("batch_is_exist", ["nope", "nada"], [0, 0])
    s.add("get_batch", {"values": [EMPTY_READ, EMPTY_READ]}, keys=[s.key("nope"), s.key("nada")])
    s.batch("batch_remove", ["nope", "nada"], [NOT_FOUND, NOT_FOUND])
    s.batch("batch_remove", ["nope"], [NOT_FOUND], force=True)
    s.add("batch_get_into", {"rcs": [NOT_FOUND], "values": [None]}, keys=[s.key("nope")], sizes=[64])
    s.add("get_into", {"rc": NOT_FOUND, "value": None}, key=s.key("nope"), size=64)
    return s


def _double_put() -> Script:
    s = Script("double")
    first, second = SeededValue(1, 100), SeededValue(2, 5000)
    s.put("a", first).put("a", second).get("a", first).code("get_size", "a", 100)
    s.batch("put_batch", ["a", "b"], OK, values=[value_fields(second), value_fields(b"bee")])
    s.add("get_batch", {"values": [read_of(first), read_of(b"bee")]}, keys=[s.key("a"), s.key("b")])
    s.batch("batch_put_from", ["b", "c"], [OK, OK], values=[value_fields(second), value_fields(b"sea")])
    s.add("get_batch", {"values": [read_of(b"bee"), read_of(b"sea")]}, keys=[s.key("b"), s.key("c")])
    s.batch("batch_remove", ["a", "b", "c"], [OK, OK, OK], force=True)
    s.put("a", second).get("a", second)
    return s


def _lease_refusals() -> Script:
    s = Script("lease")
    s.put("unread", b"u").code("remove", "unread", OK)  # a put alone grants no lease
    s.put("got", b"g").get("got", b"g").code("remove", "got", HAS_LEASE)
    s.batch("batch_remove", ["got"], [HAS_LEASE]).code("is_exist", "got", 1)
    s.code("remove", "got", OK, force=True).code("remove", "got", NOT_FOUND, force=True)
    s.put("exists", b"e").code("is_exist", "exists", 1).code("remove", "exists", HAS_LEASE)
    s.put("sized", b"s").code("get_size", "sized", 1).code("remove", "sized", HAS_LEASE)
    s.put("bexists", b"b").batch("batch_is_exist", ["bexists"], [1]).code("remove", "bexists", HAS_LEASE)
    s.put("into", b"i").add("get_into", {"rc": 1, "value": read_of(b"i")}, key=s.key("into"), size=8)
    s.code("remove", "into", HAS_LEASE)
    s.batch("batch_remove", ["exists", "sized", "bexists", "into", "never"], [OK, OK, OK, OK, NOT_FOUND], force=True)
    return s


def _batch_mix() -> Script:
    s = Script("batchmix")
    vals = [SeededValue(300, 10), SeededValue(301, 4 * KiB), SeededValue(302, 64 * KiB)]
    s.batch("put_batch", ["a", "b", "c"], OK, values=[value_fields(v) for v in vals])
    s.batch("batch_is_exist", ["a", "x", "c", "y"], [1, 0, 1, 0])
    s.add("get_batch", {"values": [read_of(vals[0]), EMPTY_READ, read_of(vals[2])]},
          keys=[s.key("a"), s.key("x"), s.key("c")])
    s.add("batch_get_into", {"rcs": [10, NOT_FOUND, INVALID_PARAMS], "values": [read_of(vals[0]), None, None]},
          keys=[s.key("a"), s.key("x"), s.key("b")], sizes=[64, 64, 64])
    s.batch("batch_remove", ["a", "x", "b"], [HAS_LEASE, NOT_FOUND, HAS_LEASE])
    s.batch("put_batch", ["d", "e"], OK, values=[value_fields(b"d"), value_fields(b"e")])
    s.batch("batch_remove", ["d", "a", "e"], [OK, HAS_LEASE, OK])
    s.batch("batch_remove", ["a", "b", "c", "d"], [OK, OK, OK, NOT_FOUND], force=True)
    s.batch("batch_is_exist", ["a", "b", "c", "d", "e"], [0, 0, 0, 0, 0])
    return s


def _wide() -> Script:
    """More than 255 keys, and a 300-byte key: every size field on the wire becomes 2 bytes wide."""
    s = Script("wide")
    keys = [f"{i:03d}" for i in range(300)]
    vals = [SeededValue(400 + i, 1 + i) for i in range(300)]
    s.batch("put_batch", keys, OK, values=[value_fields(v) for v in vals])
    s.batch("batch_is_exist", [*keys, "missing"], [1] * 300 + [0])
    s.add("get_batch", {"values": [read_of(v) for v in vals]}, keys=[s.key(k) for k in keys])
    s.add("batch_get_into", {"rcs": [v.size for v in vals], "values": [read_of(v) for v in vals]},
          keys=[s.key(k) for k in keys], sizes=[512] * 300)
    s.batch("batch_remove", keys, [HAS_LEASE] * 300)
    s.batch("batch_remove", keys, [OK] * 300, force=True)
    s.batch("batch_put_from", keys, [OK] * 300, values=[value_fields(v) for v in vals])
    s.batch("batch_remove", keys, [OK] * 300)
    long_key = "k" * 300
    s.put(long_key, b"long").get(long_key, b"long").code("get_size", long_key, 4)
    s.code("remove", long_key, HAS_LEASE).code("remove", long_key, OK, force=True)
    return s


def _registered_buffers() -> Script:
    s = Script("registered")
    vals = [SeededValue(500, 1), SeededValue(501, 100), SeededValue(502, 4 * KiB), SeededValue(503, 1 * MiB)]
    keys = ["a", "b", "c", "d"]
    s.batch("batch_put_from", keys, [OK] * 4, values=[value_fields(v) for v in vals])
    s.add("batch_get_into", {"rcs": [1, 100, 4 * KiB, 1 * MiB, NOT_FOUND],
                             "values": [*(read_of(v) for v in vals), None]},
          keys=[s.key(k) for k in [*keys, "missing"]], sizes=[1, 100, 4 * KiB, 1 * MiB, 8])
    s.add("batch_get_into", {"rcs": [INVALID_PARAMS, 100]},
          keys=[s.key("c"), s.key("b")], sizes=[4 * KiB - 1, 128])
    s.add("put_from", {"rc": OK}, key=s.key("e"), **value_fields(SeededValue(504, 3000)))
    s.add("get_into", {"rc": 3000, "value": read_of(SeededValue(504, 3000))}, key=s.key("e"), size=4096)
    s.add("get_into", {"rc": INVALID_PARAMS, "value": None}, key=s.key("e"), size=2999)
    s.batch("batch_remove", [*keys, "e"], [OK] * 5, force=True)
    return s


def _remove_all_counts() -> Script:
    s = Script("removeall")
    s.add("remove_all", compare=False, force=True)  # whatever earlier sequences left
    s.add("remove_all", {"rc": 0})
    s.batch("put_batch", ["a", "b", "c", "d", "e"], OK, values=[value_fields(b"v")] * 5)
    s.get("a", b"v").code("is_exist", "b", 1)
    s.add("remove_all", {"rc": 3})
    s.batch("batch_is_exist", ["a", "b", "c", "d", "e"], [1, 1, 0, 0, 0])
    s.add("remove_all", {"rc": 2}, force=True)
    s.add("remove_all", {"rc": 0}, force=True)
    return s


def _invalid_values() -> Script:
    """What the client rejects or shapes itself; a master must not change the outcome."""
    s = Script("invalid")
    s.put("empty", b"", rc=INVALID_PARAMS).code("is_exist", "empty", 0)
    s.batch("put_batch", ["e1", "e2"], INVALID_PARAMS, values=[value_fields(b""), value_fields(b"x")])
    s.batch("batch_is_exist", ["e1", "e2"], [0, 0])
    s.add("put_batch", {"rc": OK}, keys=[], values=[])
    s.add("get_batch", {"values": [EMPTY_READ]}, keys=[])  # one empty value for no keys
    s.add("batch_is_exist", {"rcs": []}, keys=[])
    s.add("batch_remove", {"rcs": []}, keys=[])
    s.add("put", {"rc": INVALID_PARAMS}, key="", value_hex="00")
    return s


SEQUENCES = {s.name: s for s in [_put_get_sizes(), _missing_keys(), _double_put(), _lease_refusals(), _batch_mix(),
                                  _wide(), _registered_buffers(), _remove_all_counts(), _invalid_values()]}


def run_sequence(client: RealClient, sequence: Script) -> list[dict[str, Any]]:
    answers = []
    for step in sequence.steps:
        answer = client.request(step.op, check=False, **step.fields)
        answer.pop("id", None)
        answers.append(answer)
    return answers


class Recorder:
    """One client per master kind; each sequence runs at most once per kind."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._masters: dict[MasterKind, MasterProcess] = {}
        self._clients: dict[MasterKind, RealClient] = {}
        self._answers: dict[tuple[MasterKind, str], list[dict[str, Any]]] = {}

    def client(self, kind: MasterKind) -> RealClient:
        if kind not in self._clients:
            master = start_master(kind, self._tmp / f"master-{kind}")
            self._masters[kind] = master
            self._clients[kind] = start_client(master, self._tmp / f"client-{kind}", f"differential-{kind}")
        return self._clients[kind]

    def answers(self, kind: MasterKind, name: str) -> list[dict[str, Any]]:
        if (kind, name) not in self._answers:
            self._answers[(kind, name)] = run_sequence(self.client(kind), SEQUENCES[name])
        return self._answers[(kind, name)]

    def close(self) -> None:
        for client in self._clients.values():
            client.close(unmount=False)
        for master in self._masters.values():
            master.stop()


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorder]:
    rec = Recorder(tmp_path_factory.mktemp("differential"))
    yield rec
    rec.close()


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_upstream_answers_as_recorded(recorder: Recorder, name: str) -> None:
    answers = recorder.answers(require_kind("upstream"), name)
    wrong = []
    for i, (step, answer) in enumerate(zip(SEQUENCES[name].steps, answers)):
        if step.expect is not None:
            got = {k: answer.get(k) for k in step.expect}
            if got != step.expect or "error" in answer:
                wrong.append(f"step {i} {step.describe()}: expected {step.expect}, upstream answered {answer}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_serve_answers_like_upstream(recorder: Recorder, name: str) -> None:
    assert "serve" in MASTER_KINDS
    expected = recorder.answers(require_kind("upstream"), name)
    actual = recorder.answers(require_kind("serve"), name)
    differ = [f"step {i} {step.describe()}:\n  upstream {want}\n  serve    {got}"
              for i, (step, want, got) in enumerate(zip(SEQUENCES[name].steps, expected, actual))
              if step.compare and want != got]
    assert not differ, "\n".join(differ)
