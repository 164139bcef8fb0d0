"""The wire kernels (kernels/wire.py) on their own: a vector of keys decoded into one buffer, a
truncated one refused, per-key results and replica lists encoded as struct_pack lays them out."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from mooncake_columnar.kernels import wire as wk

pytestmark = pytest.mark.kernels


def _strings(keys: list[bytes], width: int) -> np.ndarray:
    return np.frombuffer(b"".join(len(k).to_bytes(width, "little") + k for k in keys), np.uint8)


@pytest.mark.parametrize("width", [1, 2])
def test_decode_strings_gathers_every_key_into_one_buffer(width: int) -> None:
    keys = [b"a", b"", b"x" * 300 if width == 2 else b"xyz", b"last"]
    offsets, data, end = wk.decode_strings(_strings(keys, width), 0, len(keys), width)
    assert end == sum(width + len(k) for k in keys)
    assert [bytes(data[a:b]) for a, b in zip(offsets[:-1], offsets[1:])] == keys


def test_decode_strings_refuses_a_body_that_ends_inside_a_key() -> None:
    buf = _strings([b"abc", b"defg"], 1)[:-1]
    assert wk.decode_strings(buf, 0, 2, 1)[2] == -1
    assert wk.decode_strings(buf[:4], 0, 2, 1)[2] == -1  # ends at the second key's size


def test_decode_object_metas_reads_the_optional_checksums() -> None:
    buf = np.frombuffer(b"\x01k\x00" + b"\x02kk\x01" + struct.pack("<Q", 7), np.uint8)
    offsets, data, has, checksum, end = wk.decode_object_metas(buf, 0, 2, 1)
    assert end == buf.size and bytes(data) == b"kkk" and list(offsets) == [0, 1, 3]
    assert list(has) == [False, True] and int(checksum[1]) == 7
    assert wk.decode_object_metas(np.frombuffer(b"\x01k\x02", np.uint8), 0, 1, 1)[4] == -1  # flag byte 2


def test_encode_expected_results_writes_values_and_error_codes() -> None:
    codes = np.array([0, -704, 0], np.int32)
    voids = wk.encode_expected_results(codes, np.zeros(0, np.bool_), False, 1)
    assert bytes(voids) == b"\x03\x01\x00" + struct.pack("<i", -704) + b"\x01"
    bools = wk.encode_expected_results(codes, np.array([True, False, False]), True, 2)
    assert bytes(bools) == b"\x03\x00\x01\x01\x00" + struct.pack("<i", -704) + b"\x01\x00"


def test_encode_replica_lists_lays_out_descriptors_and_refuses_out_of_order_rows() -> None:
    strings = np.frombuffer(b"\x03tcp\x03e:1", np.uint8)
    string_offsets = np.array([0, strings.size], np.int64)
    args = (np.array([7], np.uint64), np.array([0], np.int64), np.array([1 << 40], np.int64),
            np.array([64], np.int64), strings, string_offsets, 3, 5000, True, 1)
    out = wk.encode_replica_lists(np.array([0, -704], np.int32), np.array([0], np.int64), *args)
    expected = (b"\x02\x01\x01" + struct.pack("<QBQQ", 7, 0, 64, 1 << 40) + b"\x03tcp\x03e:1"
                + struct.pack("<i", 3) + struct.pack("<QB", 5000, 0) + b"\x00" + struct.pack("<i", -704))
    assert bytes(out) == expected
    two = (np.array([7, 8], np.uint64), np.array([0, 0], np.int64), np.array([1, 2], np.int64),
           np.array([64, 64], np.int64), strings, string_offsets, 3, 5000, True, 1)
    assert wk.encode_replica_lists(np.array([0, 0], np.int32), np.array([1, 0], np.int64), *two).size == 0
