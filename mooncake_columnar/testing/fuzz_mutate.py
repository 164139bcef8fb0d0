"""Seeded mutators shared by every fuzzed format: raw bytes, zstd frames, decoded msgpack
values and Arrow tables.

Each takes a ``random.Random`` and returns the mutated value plus a short description of what
it did (the description is part of a case's report, so a failure is readable without rerunning).
"""
from __future__ import annotations

import random
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import zstandard

# 0, -1, int32/int64/uint64 boundaries, a 10^15 skew and "huge": wrapped into each column's dtype
EDGE_INTS = (0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, 10**15, -10**15)
INVALID_UTF8 = b"k\xff\xfe\xc0"


# ---- raw bytes ---------------------------------------------------------------------------------

def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A bit flip, a random byte, a truncation, an insertion, a deletion or a duplicated range."""
    n = len(data)
    kind = rng.choice(("flip", "flip", "flip", "byte", "truncate", "insert", "delete", "duplicate"))
    if n == 0:
        kind = "insert"
    at = rng.randrange(max(n, 1))
    if kind == "flip":
        bit = rng.randrange(8)
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:], f"bit {bit} of byte {at} flipped"
    if kind == "byte":
        value = rng.choice((0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)))
        return data[:at] + bytes([value]) + data[at + 1:], f"byte {at} = {value:#04x}"
    if kind == "truncate":
        return data[:at], f"truncated to {at} of {n} bytes"
    if kind == "insert":
        extra = bytes(rng.randrange(256) for _ in range(rng.choice((1, 4, 8, 64))))
        return data[:at] + extra + data[at:], f"{len(extra)} bytes inserted at {at}"
    span = rng.randrange(1, min(64, n - at) + 1)
    if kind == "delete":
        return data[:at] + data[at + span:], f"{span} bytes deleted at {at}"
    return data[:at + span] + data[at:], f"{span} bytes at {at} duplicated"


def zstd_frame(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def unzstd(data: bytes) -> bytes:
    return zstandard.ZstdDecompressor().decompressobj().decompress(data)


def mutate_zstd(frame: bytes, rng: random.Random) -> tuple[bytes, str]:
    """Decompress, mutate the content's bytes, recompress: the frame itself stays valid."""
    data, what = mutate_bytes(unzstd(frame), rng)
    return zstd_frame(data), f"inside zstd: {what}"


BOMB_BYTES = 512 << 20  # what a zstd bomb inflates to: far past the 300 MB a case may add


def zstd_bomb(frame: bytes, rng: random.Random) -> tuple[bytes, str]:
    """A small valid frame of BOMB_BYTES zeros in place of ``frame`` (compressed in chunks, so
    building it costs no memory)."""
    comp = zstandard.ZstdCompressor(level=1).compressobj()
    chunk = bytes(1 << 20)
    data = b"".join(comp.compress(chunk) for _ in range(BOMB_BYTES >> 20)) + comp.flush()
    return data, f"zstd bomb: {len(data)} bytes inflating to {BOMB_BYTES}"


# ---- decoded msgpack values --------------------------------------------------------------------

def edge_string(rng: random.Random, others: list[str]) -> bytes:
    """An edge string as raw bytes (it may be invalid UTF-8); ``others`` supplies duplicates."""
    choices = [b"", INVALID_UTF8, b"x" * 5000, b"a\x00b", b"../escape", "\ud800".encode("utf-8", "surrogatepass")]
    if others:
        choices.append(rng.choice(others).encode("utf-8", "surrogatepass"))
    return rng.choice(choices)


def wrap(value: int, dtype: np.dtype) -> int:
    """``value`` as the two's-complement integer ``dtype`` stores for it."""
    bits = dtype.itemsize * 8
    v = value % (1 << bits)
    return v - (1 << bits) if dtype.kind == "i" and v >= 1 << (bits - 1) else v


def _leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    """Paths to the int / str / bytes leaves of a decoded msgpack value."""
    if isinstance(obj, dict):
        return [leaf for k, v in obj.items() for leaf in _leaves(v, path + (k,))]
    if isinstance(obj, list):
        return [leaf for i, v in enumerate(obj) for leaf in _leaves(v, path + (i,))]
    return [path] if isinstance(obj, (int, str, bytes)) else []


def _get(obj: Any, path: tuple) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def forge_leaf(obj: Any, rng: random.Random) -> str:
    """Change one int / str / bytes leaf of ``obj`` (in place) to an edge value; describe it."""
    leaves = _leaves(obj)
    if not leaves:
        return "no leaf to forge"
    path = rng.choice(leaves)
    old = _get(obj, path)
    new: Any
    if isinstance(old, int) and not isinstance(old, bool):
        new = rng.choice(EDGE_INTS + (old + 1, old - 1, 2**64 - 1, -2**63))
        new = max(min(new, 2**64 - 1), -2**63)  # msgpack carries int64 .. uint64
    else:
        strings = [v for p in leaves if isinstance(v := _get(obj, p), str)]
        raw = edge_string(rng, strings)
        try:  # a str stays a str where it can; invalid UTF-8 travels as bin (a type change too)
            new = raw if rng.random() < 0.3 else raw.decode("utf-8")
        except UnicodeDecodeError:
            new = raw
    _get(obj, path[:-1])[path[-1]] = new
    return f"{'/'.join(map(str, path))}: {old!r:.40} -> {new!r:.40}"


def pack_pairs(pairs: list[tuple[Any, Any]]) -> bytes:
    """A msgpack map from key/value pairs in order, duplicate keys allowed (a dict cannot)."""
    packer = msgpack.Packer(use_bin_type=True)
    return packer.pack_map_header(len(pairs)) + b"".join(packer.pack(k) + packer.pack(v) for k, v in pairs)


# ---- Arrow tables ------------------------------------------------------------------------------

def read_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_file(pa.py_buffer(data)).read_all()


def write_ipc(table: pa.Table, compression: str | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _forge_strings(arr: pa.Array, row: int, rng: random.Random) -> pa.Array:
    values = [v.encode() for v in arr.to_pylist()]
    values[row] = edge_string(rng, arr.to_pylist())
    binary = pa.large_binary() if pa.types.is_large_string(arr.type) else pa.binary()
    return pa.array(values, binary).view(arr.type)  # no UTF-8 check: the reader must make it


def _forge_column(arr: pa.Array, row: int, rng: random.Random) -> tuple[pa.Array, str]:
    t = arr.type
    if pa.types.is_dictionary(t):
        if rng.random() < 0.5:
            at = row % len(arr.dictionary)
            return pa.DictionaryArray.from_arrays(arr.indices, _forge_strings(arr.dictionary, at, rng)), \
                f"dictionary[{at}] edge string"
        idx = arr.indices.to_numpy(zero_copy_only=False).copy()
        idx[row] = wrap(rng.choice((-1, len(arr.dictionary), 2**31 - 1, 2**15)), idx.dtype)
        return pa.DictionaryArray.from_arrays(pa.array(idx, t.index_type), arr.dictionary, safe=False), \
            f"dictionary index {idx[row]}"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _forge_strings(arr, row, rng), "edge string"
    values = arr.to_numpy(zero_copy_only=False).copy()
    if pa.types.is_boolean(t):
        values[row] = not values[row]
    else:
        values[row] = wrap(rng.choice(EDGE_INTS), values.dtype)
    return pa.array(values, t), f"= {values[row]}"


def forge_table(table: pa.Table, rng: random.Random) -> tuple[pa.Table, str]:
    """One value set to an edge, or the rows reordered, one duplicated or one dropped."""
    n = table.num_rows
    if n == 0:
        return table, "empty table left as is"
    meta = table.schema.metadata
    kind = rng.choice(("value",) * 6 + ("reorder", "duplicate", "drop"))
    if kind == "reorder":
        out, what = table.take(pa.array(rng.sample(range(n), n))), "rows reordered"
    elif kind == "duplicate":
        row = rng.randrange(n)
        out, what = pa.concat_tables([table, table.slice(row, 1)]), f"row {row} duplicated"
    elif kind == "drop":
        row = rng.randrange(n)
        out, what = pa.concat_tables([table.slice(0, row), table.slice(row + 1)]), f"row {row} dropped"
    else:
        col, row = rng.randrange(table.num_columns), rng.randrange(n)
        field = table.schema.field(col)
        arr, change = _forge_column(table.column(col).combine_chunks(), row, rng)
        out, what = table.set_column(col, field, arr), f"{field.name}[{row}] {change}"
    return out.replace_schema_metadata(meta), what
