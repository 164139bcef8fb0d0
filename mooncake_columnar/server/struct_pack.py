"""struct_pack, as yalantinglibs' coro_rpc frames it for Mooncake (a wheel built without NDEBUG,
so every body carries its type literal; see ../shared/spec/upstream-rpc.md section 3).

A type is a small tree (:class:`Prim`, :class:`Str`, :class:`Vec`, ...) from which its literal, its
hash and its encoder and decoder follow: the type is written once, the literal derived from it
(tests compare the literals with captured traffic). This module handles the per-call values of
small messages; batch vectors are decoded and encoded by kernels/wire.py, which the types here
hand off to (:class:`KeyVec`, :class:`MetaVec`, :class:`U64Vec`).

Every decode is bounds-checked and raises :class:`WireDecodeError`: a count is checked against the
bytes left before anything of its size is allocated.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..kernels import wire as wk

# metainfo byte: bit 2 = the type literal follows; bits 3-4 = container size width (1, 2, 4, 8 bytes)
_HAS_LITERAL = 0b100
_WIDTHS = (1, 2, 4, 8)
_SIZE_FORMATS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}


Decoder = Callable[[memoryview, int], "tuple[Any, int]"]  # (body, offset) -> (value, offset after it)


class WireDecodeError(ValueError):
    """A body that is not a valid struct_pack encoding of the expected type."""


class Type:
    """A struct_pack type: its literal, and how a value of it is written and read."""

    def literal(self) -> bytes:
        raise NotImplementedError

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        raise NotImplementedError

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        raise NotImplementedError

    def decoder(self, width: int) -> Decoder:
        """``decode`` with the width bound (messages decode through these: primitives, strings
        and structs make closures with their checks inline instead of a call per check)."""
        return lambda buf, pos: self.decode(buf, pos, width)


def _need(buf: memoryview, pos: int, n: int) -> None:
    if n < 0 or pos + n > len(buf):
        raise WireDecodeError(f"truncated body: need {n} bytes at offset {pos}, have {len(buf) - pos}")


def read_size(buf: memoryview, pos: int, width: int) -> tuple[int, int]:
    _need(buf, pos, width)
    return int.from_bytes(buf[pos:pos + width], "little"), pos + width


class Prim(Type):
    def __init__(self, code: int, fmt: str) -> None:
        self.code, self.fmt = code, fmt
        self.size = struct.calcsize(fmt)
        self._struct = struct.Struct(fmt)

    def literal(self) -> bytes:
        return bytes([self.code])

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        out += self._struct.pack(value)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        _need(buf, pos, self.size)
        return self._struct.unpack_from(buf, pos)[0], pos + self.size

    def decoder(self, width: int) -> Decoder:
        unpack, size = self._struct.unpack_from, self.size

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            end = pos + size
            if end > len(buf):
                _need(buf, pos, size)
            return unpack(buf, pos)[0], end
        return decode


class Bool(Prim):
    def __init__(self) -> None:
        super().__init__(0x0B, "<B")

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        out.append(1 if value else 0)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        _need(buf, pos, 1)
        if buf[pos] > 1:
            raise WireDecodeError(f"bool byte {buf[pos]} at offset {pos}")
        return bool(buf[pos]), pos + 1

    def decoder(self, width: int) -> Decoder:
        return lambda buf, pos: self.decode(buf, pos, width)


I32, U32, I64, U64 = Prim(0x01, "<i"), Prim(0x02, "<I"), Prim(0x03, "<q"), Prim(0x04, "<Q")
I8, U8, I16, U16 = Prim(0x05, "<b"), Prim(0x06, "<B"), Prim(0x07, "<h"), Prim(0x08, "<H")
BOOL = Bool()


class Str(Type):
    """std::string as raw bytes (keys are bytes on the wire; :data:`STR` decodes UTF-8)."""

    def __init__(self, text: bool = True) -> None:
        self.text = text

    def literal(self) -> bytes:
        return b"\x80\x0c"

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        raw = value.encode() if isinstance(value, str) else bytes(value)
        out += len(raw).to_bytes(width, "little")
        out += raw

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        n, pos = read_size(buf, pos, width)
        _need(buf, pos, n)
        raw = bytes(buf[pos:pos + n])
        if not self.text:
            return raw, pos + n
        try:
            return raw.decode(), pos + n
        except UnicodeDecodeError:
            raise WireDecodeError(f"string at offset {pos} is not UTF-8") from None

    def decoder(self, width: int) -> Decoder:
        text = self.text

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            start = pos + width
            if start > len(buf):
                _need(buf, pos, width)
            n = buf[pos] if width == 1 else int.from_bytes(buf[pos:start], "little")
            end = start + n
            if end > len(buf):
                _need(buf, start, n)
            raw = bytes(buf[start:end])
            if not text:
                return raw, end
            try:
                return raw.decode(), end
            except UnicodeDecodeError:
                raise WireDecodeError(f"string at offset {start} is not UTF-8") from None
        return decode


STR = Str()


class Vec(Type):
    def __init__(self, item: Type) -> None:
        self.item = item

    def literal(self) -> bytes:
        return b"\x84" + self.item.literal()

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        out += len(value).to_bytes(width, "little")
        for v in value:
            self.item.encode(v, width, out)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        n, pos = read_size(buf, pos, width)
        _need(buf, pos, n)  # every element takes at least one byte
        out = []
        for _ in range(n):
            v, pos = self.item.decode(buf, pos, width)
            out.append(v)
        return out, pos


class Opt(Type):
    def __init__(self, item: Type) -> None:
        self.item = item

    def literal(self) -> bytes:
        return b"\x85" + self.item.literal()

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.item.encode(value, width, out)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        has, pos = BOOL.decode(buf, pos, width)
        return self.item.decode(buf, pos, width) if has else (None, pos)


class Struct(Type):
    """A reflected struct (fields in declaration order); a C++ call's arguments are one too."""

    def __init__(self, *fields: Type) -> None:
        self.fields = fields

    def literal(self) -> bytes:
        return b"\xfd" + b"".join(f.literal() for f in self.fields) + b"\xff"

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        for f, v in zip(self.fields, value, strict=True):
            f.encode(v, width, out)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        out = []
        for f in self.fields:
            v, pos = f.decode(buf, pos, width)
            out.append(v)
        return tuple(out), pos

    def decoder(self, width: int) -> Decoder:
        fields = [f.decoder(width) for f in self.fields]

        def decode(buf: memoryview, pos: int) -> tuple[Any, int]:
            out = []
            for f in fields:
                v, pos = f(buf, pos)
                out.append(v)
            return tuple(out), pos
        return decode


class Trivial(Struct):
    """A trivially copyable struct of primitives (memcpy'd: no size fields), e.g. UUID."""

    def __init__(self, *fields: Prim, align: int, pack: int) -> None:
        super().__init__(*fields)
        self.align, self.pack = align, pack

    def literal(self) -> bytes:
        # two size literals (the struct's alignment and its packing alignment): n < 127 is the byte n + 129
        sizes = bytes([self.align + 129, self.pack + 129])
        return b"\xfd" + b"".join(f.literal() for f in self.fields) + sizes + b"\xff"


class Variant(Type):
    def __init__(self, *alternatives: Type) -> None:
        self.alternatives = alternatives

    def literal(self) -> bytes:
        return b"\x86" + b"".join(a.literal() for a in self.alternatives) + b"\xff"

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        index, v = value
        out.append(index)
        self.alternatives[index].encode(v, width, out)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        _need(buf, pos, 1)
        index = buf[pos]
        if index >= len(self.alternatives):
            raise WireDecodeError(f"variant index {index} of {len(self.alternatives)} at offset {pos}")
        v, pos = self.alternatives[index].decode(buf, pos + 1, width)
        return (index, v), pos


class Void(Type):
    def literal(self) -> bytes:
        return b"\xfa"

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        pass

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        return None, pos


VOID = Void()


@dataclass(frozen=True)
class Err:
    """The error side of a tl::expected (an upstream ErrorCode)."""

    code: int


class Expected(Type):
    """tl::expected<T, ErrorCode>: a value, or :class:`Err`."""

    def __init__(self, item: Type, error: Type = I32) -> None:
        self.item, self.error = item, error

    def literal(self) -> bytes:
        return b"\x87" + self.item.literal() + self.error.literal()

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        if isinstance(value, Err):
            out.append(0)
            self.error.encode(value.code, width, out)
        else:
            out.append(1)
            self.item.encode(value, width, out)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        ok, pos = BOOL.decode(buf, pos, width)
        if ok:
            return self.item.decode(buf, pos, width)
        code, pos = self.error.decode(buf, pos, width)
        return Err(code), pos


@dataclass(frozen=True)
class KeyColumn:
    """A vector<string> decoded into one buffer: int64 offsets (n + 1, from 0) and uint8 bytes."""

    offsets: np.ndarray
    data: np.ndarray

    def __len__(self) -> int:
        return self.offsets.size - 1


class KeyVec(Vec):
    """vector<string>, decoded by a kernel into a :class:`KeyColumn` (no Python string per key)."""

    def __init__(self) -> None:
        super().__init__(Str(text=False))

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        n, pos = read_size(buf, pos, width)
        _need(buf, pos, n * width)
        offsets, data, end = wk.decode_strings(np.frombuffer(buf, np.uint8), pos, n, width)
        if end < 0:
            raise WireDecodeError(f"truncated vector<string> of {n} at offset {pos}")
        return KeyColumn(offsets, data), int(end)

    @staticmethod
    def _rows(value: Any) -> Any:
        if not isinstance(value, KeyColumn):
            return value
        return [value.data[a:b].tobytes() for a, b in zip(value.offsets[:-1], value.offsets[1:])]

    def encode(self, value: Any, width: int, out: bytearray) -> None:  # tests and warm-up: per key
        super().encode(self._rows(value), width, out)


@dataclass(frozen=True)
class MetaColumn:
    """A vector<ObjectMeta{key, optional<u64> checksum}> as a key column and checksum columns."""

    keys: KeyColumn
    has_checksum: np.ndarray  # bool
    checksum: np.ndarray      # uint64 (0 where absent)


class MetaVec(Vec):
    """vector<ObjectMeta>, decoded by a kernel into a :class:`MetaColumn`."""

    def __init__(self) -> None:
        super().__init__(Struct(Str(text=False), Opt(U64)))

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        n, pos = read_size(buf, pos, width)
        _need(buf, pos, n * (width + 1))
        offsets, data, has, checksum, end = wk.decode_object_metas(np.frombuffer(buf, np.uint8), pos, n, width)
        if end < 0:
            raise WireDecodeError(f"malformed vector<ObjectMeta> of {n} at offset {pos}")
        return MetaColumn(KeyColumn(offsets, data), has, checksum), int(end)

    def _rows(self, value: Any) -> Any:
        if not isinstance(value, MetaColumn):
            return value
        keys = KeyVec._rows(value.keys)
        return [(k, int(c) if h else None) for k, h, c in zip(keys, value.has_checksum, value.checksum)]

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        super().encode(self._rows(value), width, out)


class U64Vec(Vec):
    """vector<u64> as a NumPy array (a view of the body)."""

    def __init__(self) -> None:
        super().__init__(U64)

    def decode(self, buf: memoryview, pos: int, width: int) -> tuple[Any, int]:
        n, pos = read_size(buf, pos, width)
        _need(buf, pos, 8 * n)
        return np.frombuffer(buf, "<u8", n, pos), pos + 8 * n

    def encode(self, value: Any, width: int, out: bytearray) -> None:
        out += len(value).to_bytes(width, "little")
        out += np.asarray(value, "<u8").tobytes()


# ---------------------------------------------------------------------------------- messages
def type_hash(literal: bytes) -> int:
    """The hash a body starts with: MD5's first four bytes (big-endian), bit 0 = metainfo follows."""
    return (int.from_bytes(hashlib.md5(literal).digest()[:4], "big") & 0xFFFFFFFE) | 1


def width_for(max_size: int) -> int:
    """The size width struct_pack picks for a message whose largest length is ``max_size``."""
    for w in _WIDTHS:
        if max_size < 1 << (8 * w):
            return w
    raise ValueError(f"length {max_size} does not fit a size field")


class Message:
    """A message type with its literal, its hash and each width's prologue precomputed."""

    def __init__(self, t: Type) -> None:
        self.type = t
        self.literal = t.literal()
        self.hash = type_hash(self.literal)
        self._prologues = {w: struct.pack("<IB", self.hash, _HAS_LITERAL | (i << 3)) + self.literal + b"\x00"
                           for i, w in enumerate(_WIDTHS)}
        self._decoders = {w: t.decoder(w) for w in _WIDTHS}

    def prologue(self, width: int) -> bytes:
        return self._prologues[width]

    def encode_at(self, value: Any, width: int) -> bytes:
        """The body with ``width``-byte size fields; OverflowError when a length does not fit."""
        out = bytearray(self._prologues[width])
        self.type.encode(value, width, out)
        return bytes(out)

    def encode(self, value: Any) -> bytes:
        # the narrowest size width that fits, found by trying: a size field too narrow for its
        # length raises OverflowError (int.to_bytes), so the usual message is written once
        for width in _WIDTHS:
            try:
                return self.encode_at(value, width)
            except OverflowError:
                continue
        raise ValueError("a length does not fit a size field")

    def body_start(self, body: memoryview) -> tuple[int, int]:
        """Check a body's hash and literal against this type: (payload offset, size width)."""
        if len(body) < 4:
            raise WireDecodeError(f"body of {len(body)} bytes has no type hash")
        got = int.from_bytes(body[:4], "little")
        if got >> 1 != self.hash >> 1:
            raise WireDecodeError(f"type hash {got:#010x} is not this call's ({self.hash:#010x})")
        if not got & 1:  # no metainfo: sizes are one byte
            return 4, 1
        _need(body, 4, 1)
        meta = body[4]
        if meta & 0b11 or meta >> 5:
            raise WireDecodeError(f"metainfo {meta:#04x} has fields this protocol never sends")
        width = _WIDTHS[(meta >> 3) & 0b11]
        pos = 5
        if meta & _HAS_LITERAL:
            n = len(self.literal)
            _need(body, pos, n + 1)
            if body[pos:pos + n] != self.literal or body[pos + n] != 0:
                raise WireDecodeError("type literal does not match this call's")
            pos += n + 1
        return pos, width

    def decode(self, body: memoryview) -> Any:
        pos, width = self.body_start(body)
        value, pos = self._decoders[width](body, pos)
        if pos != len(body):
            raise WireDecodeError(f"{len(body) - pos} bytes left over after the payload")
        return value

