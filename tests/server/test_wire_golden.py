"""Golden vectors: every frame the real client and the real upstream master exchanged
(tests/fixtures/upstream_rpc/) decodes with this codec and re-encodes byte for byte."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mooncake_columnar.server.rpc_server import REQUEST_HEADER, RESPONSE_HEADER
from mooncake_columnar.server.rpc_types import RPCS
from mooncake_columnar.server.struct_pack import KeyColumn, MetaColumn, Message

FIXTURES = Path(__file__).parent.parent / "fixtures" / "upstream_rpc"
FRAMES = [json.loads(line) for name in ("real_traffic.jsonl", "real_width.jsonl")
          for line in (FIXTURES / name).read_text().splitlines()]


def _frame_id(frame: dict) -> str:
    return f"{frame['name']}-{frame['dir']}-conn{frame['conn']}-seq{frame['seq']}"


def _message(frame: dict) -> Message | None:
    rpc = RPCS[frame["name"]]
    return rpc.request if frame["dir"] == "req" else rpc.response


def test_every_captured_rpc_is_served() -> None:
    assert {f["name"] for f in FRAMES} <= set(RPCS)


@pytest.mark.parametrize("frame", FRAMES, ids=_frame_id)
def test_captured_frame_decodes_and_reencodes_byte_for_byte(frame: dict) -> None:
    rpc = RPCS[frame["name"]]
    header = bytes.fromhex(frame["hdr"])
    body = bytes.fromhex(frame["body"])
    if frame["dir"] == "req":
        fields = REQUEST_HEADER.unpack(header)
        assert fields[5] == rpc.function_id == frame["fid"]
        assert fields[6] == len(body)
    else:
        assert RESPONSE_HEADER.unpack(header)[5] == len(body)
    message = _message(frame)
    if message is None:
        assert body == b""
        return
    value = message.decode(memoryview(body))
    assert message.encode(value) == body


@pytest.mark.parametrize("name", sorted({f["name"] for f in FRAMES}))
def test_type_literals_derived_from_the_types_match_the_capture(name: str) -> None:
    for frame in (f for f in FRAMES if f["name"] == name and f["body"]):
        body = bytes.fromhex(frame["body"])
        message = _message(frame)
        assert message is not None
        n = len(message.literal)
        assert body[5:5 + n] == message.literal and body[5 + n] == 0


def test_a_300_key_batch_decodes_into_one_key_column_with_two_byte_sizes() -> None:
    frame = next(f for f in FRAMES if f["name"] == "BatchPutStart" and f["dir"] == "req" and len(f["body"]) > 4000)
    body = bytes.fromhex(frame["body"])
    assert (body[4] >> 3) & 3 == 1  # metainfo: 2-byte sizes
    message = RPCS["BatchPutStart"].request
    assert message is not None
    _, keys, sizes, _, tenant = message.decode(memoryview(body))
    assert isinstance(keys, KeyColumn) and len(keys) == len(sizes) >= 256
    assert tenant == "default"


def test_batch_put_end_decodes_object_metas_into_columns() -> None:
    frame = next(f for f in FRAMES if f["name"] == "BatchPutEnd" and f["dir"] == "req")
    message = RPCS["BatchPutEnd"].request
    assert message is not None
    _, metas, replica_type, _ = message.decode(memoryview(bytes.fromhex(frame["body"])))
    assert isinstance(metas, MetaColumn) and len(metas.keys) > 0
    assert not metas.has_checksum.any() and replica_type == 4
