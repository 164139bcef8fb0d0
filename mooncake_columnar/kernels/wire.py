"""struct_pack batch payloads as arrays: a request's vector of keys decoded into one (offsets,
data) buffer, and a batch response's per-key results encoded from code and replica columns, so
a batch of a million keys costs no Python object per key (server/struct_pack.py frames them).

Sizes on the wire are little-endian integers of ``width`` bytes (1, 2, 4 or 8). A decode that
runs out of bytes returns a negative end position; the caller raises the typed error.
"""
from __future__ import annotations

import numpy as np

from .jit import kernel_only, njit

# one replica descriptor, not counting its segment's protocol and endpoint strings: replica id
# (8), variant index (1), buffer size (8), buffer address (8), status (4)
DESCRIPTOR_FIXED_BYTES = 29


@kernel_only(inline="always")
def _read_size(buf, p, width):
    v = np.uint64(0)
    for i in range(width):
        v |= np.uint64(buf[p + i]) << np.uint64(8 * i)
    return v


@kernel_only(inline="always")
def _write_uint(out, p, value, width):
    v = np.uint64(value)
    for i in range(width):
        out[p + i] = np.uint8((v >> np.uint64(8 * i)) & np.uint64(0xFF))
    return p + width


@njit(cache=True)
def decode_strings(buf, pos, n, width):
    """vector<string> of ``n`` items from ``pos`` (its count already read): (int64 offsets from 0,
    uint8 bytes, end position), end -1 when the body ends inside it."""
    offsets = np.zeros(n + 1, np.int64)
    end = buf.shape[0]
    p = pos
    for i in range(n):
        if p + width > end:
            return offsets, np.empty(0, np.uint8), -1
        length = _read_size(buf, p, width)
        p += width
        if length > np.uint64(end - p):
            return offsets, np.empty(0, np.uint8), -1
        p += np.int64(length)
        offsets[i + 1] = offsets[i] + np.int64(length)
    data = np.empty(offsets[n], np.uint8)
    p = pos
    for i in range(n):
        length = offsets[i + 1] - offsets[i]
        p += width
        data[offsets[i]:offsets[i + 1]] = buf[p:p + length]
        p += length
    return offsets, data, p


@njit(cache=True)
def decode_object_metas(buf, pos, n, width):
    """vector<ObjectMeta{string key, optional<u64> checksum}> of ``n`` items from ``pos``: key
    offsets and bytes, has-checksum flags, checksums, end position (-1 when malformed)."""
    offsets = np.zeros(n + 1, np.int64)
    has = np.zeros(n, np.bool_)
    checksum = np.zeros(n, np.uint64)
    starts = np.empty(n, np.int64)
    end = buf.shape[0]
    p = pos
    for i in range(n):
        if p + width > end:
            return offsets, np.empty(0, np.uint8), has, checksum, -1
        length = _read_size(buf, p, width)
        p += width
        if length >= np.uint64(end - p):  # the key, then at least the optional's flag byte
            return offsets, np.empty(0, np.uint8), has, checksum, -1
        starts[i] = p
        p += np.int64(length)
        offsets[i + 1] = offsets[i] + np.int64(length)
        flag = buf[p]
        p += 1
        if flag == 1:
            if p + 8 > end:
                return offsets, np.empty(0, np.uint8), has, checksum, -1
            has[i] = True
            checksum[i] = _read_size(buf, p, 8)
            p += 8
        elif flag != 0:
            return offsets, np.empty(0, np.uint8), has, checksum, -1
    data = np.empty(offsets[n], np.uint8)
    for i in range(n):
        data[offsets[i]:offsets[i + 1]] = buf[starts[i]:starts[i] + offsets[i + 1] - offsets[i]]
    return offsets, data, has, checksum, p


@njit(cache=True)
def encode_expected_results(codes, found, with_bool, width):
    """vector<expected<void, ErrorCode>> payload (``with_bool`` False), or vector<expected<bool,
    ErrorCode>> with the bools in ``found``: per item 0x01 (and the bool), or 0x00 and the int32 code."""
    n = codes.shape[0]
    ok_size = 2 if with_bool else 1
    size = width
    for i in range(n):
        size += ok_size if codes[i] == 0 else 5
    out = np.empty(size, np.uint8)
    p = _write_uint(out, 0, n, width)
    for i in range(n):
        if codes[i] == 0:
            out[p] = 1
            if with_bool:
                out[p + 1] = 1 if found[i] else 0
            p += ok_size
        else:
            out[p] = 0
            p = _write_uint(out, p + 1, np.uint32(np.int64(codes[i]) & 0xFFFFFFFF), 4)
    return out


@njit(cache=True)
def encode_replica_lists(codes, key_index, replica_id, segment, address, size, strings, string_offsets,
                         status, lease_ttl_ms, with_lease, width):
    """A batch of expected<vector<Replica::Descriptor>> (``with_lease`` False: BatchPutStart) or
    of expected<GetReplicaListResponse{descriptors, lease_ttl_ms, no checksum}> (True:
    BatchGetReplicaList), the vector's count first. Replica ``i`` belongs to key
    ``key_index[i]`` (non-decreasing); ``strings[string_offsets[s]:string_offsets[s + 1]]`` is
    segment ``s``'s protocol and endpoint, each already written with its ``width``-byte size.
    Every descriptor is a memory buffer of the object's size with the given ``status``.
    Returns the payload, or an empty array when ``key_index`` is not in batch order."""
    n = codes.shape[0]
    m = key_index.shape[0]
    total = width
    for i in range(m):
        k = key_index[i]
        if k < 0 or k >= n or (i > 0 and k < key_index[i - 1]):
            return np.empty(0, np.uint8)
        s = segment[i]
        total += DESCRIPTOR_FIXED_BYTES + string_offsets[s + 1] - string_offsets[s]
    tail = 9 if with_lease else 0  # lease_ttl_ms (8) and the absent checksum's flag (1)
    for k in range(n):
        total += 1 + width + tail if codes[k] == 0 else 5
    out = np.empty(total, np.uint8)
    p = _write_uint(out, 0, n, width)
    i = 0
    for k in range(n):
        while i < m and key_index[i] < k:  # replicas of keys that failed are not sent
            i += 1
        if codes[k] != 0:
            out[p] = 0
            p = _write_uint(out, p + 1, np.uint32(np.int64(codes[k]) & 0xFFFFFFFF), 4)
            continue
        j = i
        while j < m and key_index[j] == k:
            j += 1
        out[p] = 1
        p = _write_uint(out, p + 1, j - i, width)
        for r in range(i, j):
            p = _write_uint(out, p, replica_id[r], 8)
            out[p] = 0  # variant alternative 0: a memory descriptor
            p = _write_uint(out, p + 1, size[r], 8)
            p = _write_uint(out, p, address[r], 8)
            s = segment[r]
            a, b = string_offsets[s], string_offsets[s + 1]
            out[p:p + b - a] = strings[a:b]
            p = _write_uint(out, p + b - a, status, 4)
        if with_lease:
            p = _write_uint(out, p, lease_ttl_ms, 8)
            out[p] = 0
            p += 1
        i = j
    return out[:p]
