"""Hostile upstream v1 snapshots: the decoder fails closed.

A zstd bomb is refused before its output is allocated; a repeated msgpack map key (a bit flip
that turns one shard's key into another's) or a key filed in the wrong shard fails the whole
candidate, and a restore falls back to an older snapshot; every other damage raises a typed
SnapshotError naming the file and field. Seeded mutations of the real upstream fixtures run in
a subprocess, so that a crash is counted rather than fatal.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pyarrow as pa
import pytest
import zstandard

from mooncake_columnar.clock import NS_PER_S, ManualClocks
from mooncake_columnar.errors import (
    InvalidParams,
    MooncakeError,
    NoUsableSnapshot,
    SnapshotDecompressionLimit,
    SnapshotError,
    SnapshotPayloadFieldError,
)
from mooncake_columnar.config import MasterConfig
from mooncake_columnar.master import MasterService
from mooncake_columnar.snapshots.manager import restore_master
from mooncake_columnar.snapshots.mooncake_v1 import (
    METADATA_FILE,
    SEGMENTS_FILE,
    TASK_MANAGER_FILE,
    V1_FILES,
    decode_v1,
    shard_index,
    shard_indices,
)
from mooncake_columnar.snapshots.repository import SnapshotRepository
from mooncake_columnar.testing.builders import restore_later, snapshot_series
from tests.fixtures import MOONCAKE_V1 as FIXTURES
from tests.fixtures import V1_CASES as CASES

ROOT = Path(__file__).resolve().parents[2]
MB = 1 << 20


# ---- helpers ------------------------------------------------------------------------------------
def _payloads(case: str) -> dict[str, bytes]:
    repo = SnapshotRepository(FIXTURES / case / "mooncake_master_snapshot")
    return {k: bytes(v) for k, v in repo.read_payloads(repo.latest(), V1_FILES).items()}


def _decode(payloads: dict[str, bytes], **kw):
    return decode_v1(payloads, restore_system_ns=0, restore_steady_ns=0, **kw)


def _raw_map(pairs: list[tuple]) -> bytes:
    """A msgpack map written pair by pair: keys may repeat (as a damaged file's can)."""
    n = len(pairs)
    head = bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")
    return head + b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in pairs)


def _metadata_with_shards(top: dict, shard_pairs: list[tuple]) -> bytes:
    """The metadata payload ``top`` with its shards map replaced by ``shard_pairs``."""
    return (b"\x83" + msgpack.packb("shards") + _raw_map(shard_pairs)
            + msgpack.packb("discarded_replicas") + msgpack.packb(top["discarded_replicas"])
            + msgpack.packb("replica_next_id") + msgpack.packb(top["replica_next_id"]))


def _unzstd(blob: bytes):
    return msgpack.unpackb(zstandard.ZstdDecompressor().decompress(blob), strict_map_key=False)


def _zstd(value) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(msgpack.packb(value))


def _run_child(*args: str, timeout: int = 300) -> dict:
    """Run this module's ``__main__`` in a fresh interpreter; its last stdout line is JSON."""
    path = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"child crashed (rc {proc.returncode}): {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- zstd bombs -----------------------------------------------------------------------------------
def _bomb(size: int, declare_size: bool, prefix: bytes = b"", fill: bytes = b"\0") -> bytes:
    """One zstd frame of ``prefix`` then ``fill`` bytes, ``size`` bytes in all (tens of KB
    stored), compressed a MB at a time."""
    cobj = zstandard.ZstdCompressor(level=3).compressobj(size=size if declare_size else -1)
    parts, chunk, left = [cobj.compress(prefix)], fill * MB, size - len(prefix)
    while left > 0:
        parts.append(cobj.compress(chunk[:min(left, MB)]))
        left -= MB
    return b"".join(parts) + cobj.flush()


def _child_bomb(where: str) -> dict:
    """Decode a fixture with one frame replaced by a 1.5 GB bomb; report the memory rise."""
    import resource

    payloads = _payloads("small_6")
    size = 1536 * MB
    if where == "segments_declared":
        payloads[SEGMENTS_FILE] = _bomb(size, True)
    elif where == "segments_unknown_size":
        payloads[SEGMENTS_FILE] = _bomb(size, False)
    elif where == "task_manager_declared":
        payloads[TASK_MANAGER_FILE] = _bomb(size, True)
    elif where == "shard_valid_msgpack":  # {"metadata": [[], [], ...]}: parses if decompressed
        top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
        head = b"\x81" + msgpack.packb("metadata") + b"\xdd" + (size - 15).to_bytes(4, "big")
        top["shards"][next(iter(top["shards"]))] = _bomb(size, True, head, b"\x90")
        payloads[METADATA_FILE] = msgpack.packb(top)
    elif where == "shard_within_ratio":  # the most Python objects a frame inside the cap holds:
        # 64 x 32 KB of empty arrays (1 byte stored, about 64 in memory each) beside 32 KB of
        # random bytes, so that the frame stays inside the ratio
        top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
        n = 64 * (32 << 10)
        raw = (b"\x81" + msgpack.packb("metadata") + b"\xdd" + (n + 1).to_bytes(4, "big")
               + b"\x90" * n + msgpack.packb(os.urandom(32 << 10)))
        top["shards"][next(iter(top["shards"]))] = zstandard.ZstdCompressor(level=3).compress(raw)
        payloads[METADATA_FILE] = msgpack.packb(top)
    # Linux keeps ru_maxrss across exec: this process starts with pytest's peak. A fork's starts
    # at the size of the process it forks from, so the decode runs in one.
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            _decode(payloads)
            error = None
        except Exception as e:  # the parent asserts the type
            error = f"{type(e).__module__}.{type(e).__qualname__}"
        rise = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
        os.write(write_end, json.dumps([error, rise]).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        report = reader.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the decoding fork died: wait status {status}"
    error, rise = json.loads(report)
    return {"error": error, "rise": rise, "stored": max(len(v) for v in payloads.values())}


@pytest.mark.parametrize("where", ["segments_declared", "segments_unknown_size",
                                   "task_manager_declared", "shard_valid_msgpack"])
def test_zstd_bomb_is_refused_with_little_memory(where: str) -> None:
    got = _run_child("bomb", where)
    assert got["error"] == f"{SnapshotDecompressionLimit.__module__}.SnapshotDecompressionLimit", got
    assert got["stored"] < 100_000  # a small frame ...
    assert got["rise"] < 300 * MB, got  # ... that would be 1.5 GB decompressed


def test_worst_msgpack_inside_the_ratio_cap_stays_under_300_mb() -> None:
    got = _run_child("bomb", "shard_within_ratio")
    assert got["error"] == f"{SnapshotPayloadFieldError.__module__}.SnapshotPayloadFieldError", got  # decoded
    assert got["stored"] < 100_000 and got["rise"] < 300 * MB, got


def test_configured_maximum_refuses_a_file_within_the_ratio() -> None:
    payloads = _payloads("many_1000")
    assert _decode(payloads).objects.num_rows == 1000  # the default maximum fits a real file
    with pytest.raises(SnapshotDecompressionLimit,
                       match=r"metadata shard \d+: zstd frame: over the payload's cap of 100000"):
        _decode(payloads, max_decompressed_bytes=100_000)  # the shards hold 186 KB
    with pytest.raises(SnapshotDecompressionLimit, match="segments"):
        _decode(payloads, max_decompressed_bytes=60_000)  # segments holds 98 KB
    # a frame compressing 4:1 (inside the ratio) but over the configured maximum
    data = np.random.default_rng(0).integers(0, 4, 4 * MB, dtype=np.uint8).tobytes()
    payloads[TASK_MANAGER_FILE] = zstandard.ZstdCompressor().compress(data)
    with pytest.raises(SnapshotDecompressionLimit,
                       match="task_manager: zstd frame: over the payload's cap"):
        _decode(payloads, max_decompressed_bytes=2 * MB)


def test_restore_applies_the_configured_maximum(tmp_path: Path) -> None:
    """MasterConfig.snapshot_max_decompressed_bytes reaches the v1 decoder of restore_master: a
    maximum below the files' size refuses every candidate, typed; the default restores them."""
    repo = SnapshotRepository(tmp_path)
    _, clocks, (_, newer) = snapshot_series(repo, 2, write_v1=True)
    with pytest.raises(NoUsableSnapshot) as info:
        restore_master(repo, clocks=clocks, config=MasterConfig(snapshot_max_decompressed_bytes=16))
    assert all(isinstance(e, SnapshotDecompressionLimit) for _, e in info.value.stats.rejections)
    assert len(info.value.stats.rejections) == 2
    assert restore_master(repo, clocks=clocks, config=MasterConfig())[1].snapshot_id == newer


@pytest.mark.parametrize("bad", [0, -1, 1.5, "4096", True])
def test_configured_maximum_must_be_a_positive_int(bad) -> None:
    with pytest.raises(InvalidParams):
        _decode(_payloads("small_6"), max_decompressed_bytes=bad)


# ---- lost shards, keys in the wrong shard -------------------------------------------------------
def test_duplicate_shard_key_rejects_the_whole_candidate() -> None:
    payloads = _payloads("many_1000")
    top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
    keys = list(top["shards"])
    # the second shard's key flipped into the first's: a dict would keep one of the two
    pairs = [(keys[0] if i == 1 else k, top["shards"][k]) for i, k in enumerate(keys)]
    payloads[METADATA_FILE] = _metadata_with_shards(top, pairs)
    with pytest.raises(SnapshotPayloadFieldError,
                       match=f"metadata: msgpack map: map key {keys[0]} appears"):
        _decode(payloads)


def test_duplicate_key_in_a_nested_map_rejects_the_candidate() -> None:
    payloads = _payloads("small_6")
    seg = _unzstd(payloads[SEGMENTS_FILE])
    ms = list(seg["ms"].items())
    raw = _raw_map([(k, v if k != "ms" else None) for k, v in seg.items()])
    ms_raw = _raw_map([*ms, ms[0]])  # a mounted segment listed twice under one UUID
    raw = raw.replace(msgpack.packb("ms") + b"\xc0", msgpack.packb("ms") + ms_raw)
    payloads[SEGMENTS_FILE] = zstandard.ZstdCompressor().compress(raw)
    with pytest.raises(SnapshotPayloadFieldError, match="segments: msgpack map: map key .* appears"):
        _decode(payloads)


def test_lost_shard_falls_back_to_the_older_snapshot(tmp_path: Path) -> None:
    repo = SnapshotRepository(tmp_path)
    _, clocks, (older, newer) = snapshot_series(repo, 2, write_v1=True)  # k0; k0 and k1
    meta_path = tmp_path / "mooncake_cluster" / newer / METADATA_FILE
    top = msgpack.unpackb(meta_path.read_bytes(), strict_map_key=False)
    keys = list(top["shards"])
    assert len(keys) == 2  # k0 and k1 route to different shards
    meta_path.write_bytes(_metadata_with_shards(top, [(keys[0], top["shards"][k]) for k in keys]))
    master, stats = restore_later(repo, clocks)
    assert stats.snapshot_id == older and stats.fallbacks == 1
    assert stats.failures[0][0] == newer and "appears more than once" in stats.failures[0][1]
    assert master.exist_key("k0") and not master.exist_key("k1")  # nothing of the newer one


def test_key_in_the_wrong_shard_rejects_the_candidate() -> None:
    payloads = _payloads("many_1000")
    top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
    a, b = list(top["shards"])[:2]
    shard_a, shard_b = _unzstd(top["shards"][a]), _unzstd(top["shards"][b])
    moved = shard_a["metadata"].pop()
    shard_b["metadata"].append(moved)
    top["shards"][a], top["shards"][b] = _zstd(shard_a), _zstd(shard_b)
    payloads[METADATA_FILE] = msgpack.packb(top)
    with pytest.raises(SnapshotPayloadFieldError, match=f"metadata shard {b}: key: '{moved[1]}' belongs "
                                                 f"in shard {a}"):
        _decode(payloads)


def test_shard_indices_match_upstream_hash() -> None:
    rng = random.Random(7)
    keys = ["", "a", "12345678", "123456789", *(
        "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(0xA0, 0x2FFF))))
                for _ in range(rng.randrange(40))) for _ in range(2000))]
    got = shard_indices(pa.chunked_array([pa.array(keys[:7]), pa.array(keys[7:])]))
    assert got.tolist() == [shard_index(k) for k in keys]
    assert shard_indices(pa.array([], pa.string())).size == 0


# ---- each decode failure is typed and names its file and field -----------------------------------
def _forge_first_object(payloads: dict[str, bytes], mutate) -> None:
    top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
    idx = next(iter(top["shards"]))
    shard = _unzstd(top["shards"][idx])
    mutate(shard["metadata"][0])
    top["shards"][idx] = _zstd(shard)
    payloads[METADATA_FILE] = msgpack.packb(top)


@pytest.mark.parametrize("damage,file,field", [
    ("trailing_bytes", "metadata", "msgpack"),
    ("not_bytes", "segments", "payload"),
    ("uuid_half_above_u64", "metadata", "objects.client"),
    ("map_as_map_key", "segments", "msgpack map"),
    ("buffer_offset_above_int64", "metadata", "replicas.buffer_ptr"),
    ("segment_base_above_int64", "segments", "malformed MountedSegment"),
    ("shard_not_zstd", "metadata shard", "zstd frame"),
    ("invalid_utf8_key", "metadata shard", "msgpack"),
    ("replica_status_out_of_range", "metadata", "replicas.status"),
])
def test_decode_failures_are_typed_and_named(damage: str, file: str, field: str) -> None:
    payloads = _payloads("small_6")
    if damage == "trailing_bytes":
        payloads[METADATA_FILE] += b"\x00"
    elif damage == "not_bytes":
        payloads[SEGMENTS_FILE] = bytearray(payloads[SEGMENTS_FILE])
    elif damage == "uuid_half_above_u64":
        _forge_first_object(payloads, lambda item: item[2].__setitem__(0, "18446744073709551616-1"))
    elif damage == "map_as_map_key":
        raw = zstandard.ZstdDecompressor().decompress(payloads[SEGMENTS_FILE])
        # one more pair in the top map (a fixmap): {{}: 1, ...}
        payloads[SEGMENTS_FILE] = zstandard.ZstdCompressor().compress(
            bytes([raw[0] + 1]) + b"\x80\x01" + raw[1:])
    elif damage == "buffer_offset_above_int64":
        _forge_first_object(payloads, lambda item: item[2][8][3].__setitem__(1, (1 << 64) - 1))
    elif damage == "segment_base_above_int64":
        seg = _unzstd(payloads[SEGMENTS_FILE])
        next(iter(seg["ms"].values()))[2] = 1 << 63
        payloads[SEGMENTS_FILE] = _zstd(seg)
    elif damage == "shard_not_zstd":
        top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
        top["shards"][next(iter(top["shards"]))] = b"\x28\xb5\x2f\xfd garbage"
        payloads[METADATA_FILE] = msgpack.packb(top)
    elif damage == "invalid_utf8_key":
        top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
        idx = next(iter(top["shards"]))
        shard = _unzstd(top["shards"][idx])
        shard["metadata"][0][1] = "\x00MARK"
        raw = msgpack.packb(shard).replace(b"\xa5\x00MARK", b"\xa5\xff\xfeMAR")
        top["shards"][idx] = zstandard.ZstdCompressor().compress(raw)
        payloads[METADATA_FILE] = msgpack.packb(top)
    elif damage == "replica_status_out_of_range":
        _forge_first_object(payloads, lambda item: item[2][8].__setitem__(1, 1 << 40))
    with pytest.raises(SnapshotError) as info:
        _decode(payloads)
    assert isinstance(info.value, SnapshotPayloadFieldError), info.value
    assert info.value.file.startswith(file) and field in str(info.value), info.value


# ---- seeded mutations over the real fixtures ----------------------------------------------------
_FORGED = (-1, 0, 1, 255, 256, 1 << 31, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, -(1 << 63),
           "", "x", "0-0", "18446744073709551615-1", "99999999999999999999-0", None, True, False,
           [], {}, 1.5, b"\x00", [1, 2, 3], {"a": 1}, "\x00MARK")


def _nodes(value, path=()):
    """The path of every node of a decoded msgpack value, map keys included (("key", k))."""
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield (*path, ("key", k))
            yield from _nodes(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*path, i))


def _replace(value, path, new):
    """``value`` with the leaf at ``path`` replaced by ``new`` (a map key: the entry renamed)."""
    if not path:
        return new
    head = path[0]
    if isinstance(head, tuple):  # a map key renamed; onto another existing key, the entry is lost
        old = head[1]
        if new in value and new != old:
            return {k: v for k, v in value.items() if k != old}
        return {(new if k == old else k): v for k, v in value.items()}
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = _replace(value[head], path[1:], new)
    return copy


def _pack(value) -> bytes:
    # "\x00MARK" stands for a string of invalid UTF-8 (msgpack-python cannot write one)
    return msgpack.packb(value).replace(b"\xa5\x00MARK", b"\xa5\xff\xfe\xfdK")


def _frames(payloads: dict[str, bytes]) -> list[tuple[str, object]]:
    """(name, shard key or None) of every zstd frame the decoder opens."""
    top = msgpack.unpackb(payloads[METADATA_FILE], strict_map_key=False)
    return [(SEGMENTS_FILE, None), (TASK_MANAGER_FILE, None),
            *((METADATA_FILE, k) for k in top["shards"])]


def _mutate(payloads: dict[str, bytes], rng: random.Random) -> tuple[str, dict[str, bytes]]:
    out = dict(payloads)
    kind = rng.choice(("raw", "inner", "forged", "forged", "structure"))
    if kind == "raw":  # byte flips, a cut or an inserted byte in a stored file
        name = rng.choice((METADATA_FILE, METADATA_FILE, SEGMENTS_FILE, TASK_MANAGER_FILE))
        data = bytearray(out[name])
        op = rng.random()
        if op < 0.7:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= rng.randint(1, 255)
        elif op < 0.85:
            del data[rng.randrange(len(data)):]
        else:
            data.insert(rng.randrange(len(data) + 1), rng.randrange(256))
        out[name] = bytes(data)
        return f"raw:{name}", out
    name, shard = rng.choice(_frames(out))
    top = msgpack.unpackb(out[METADATA_FILE], strict_map_key=False)
    frame = top["shards"][shard] if shard is not None else out[name]
    raw = zstandard.ZstdDecompressor().decompress(frame)
    if kind == "inner":  # flips inside the decompressed msgpack, compressed again
        data = bytearray(raw)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        new_raw = bytes(data)
    else:
        value = msgpack.unpackb(raw, strict_map_key=False)
        if kind == "forged":  # one value (or map key) forged
            path = rng.choice(list(_nodes(value)))
            new = rng.choice(_FORGED)
            if path and isinstance(path[-1], tuple) and not isinstance(new, (int, str, bytes)):
                new = rng.choice((-1, 1 << 63, "x"))  # a map key stays hashable
            value = _replace(value, path, new)
        else:  # an item dropped, repeated or moved between shards; a top-level field dropped
            container = value.get("metadata", value.get("ms")) if isinstance(value, dict) else value
            if isinstance(container, list) and container:
                i = rng.randrange(len(container))
                if rng.random() < 0.5:
                    container.append(container[i])
                else:
                    del container[i]
            elif isinstance(container, dict) and container:
                del container[rng.choice(list(container))]
        new_raw = _pack(value)
    blob = zstandard.ZstdCompressor(level=3).compress(new_raw)
    if shard is None:
        out[name] = blob
    else:
        top["shards"][shard] = blob
        out[METADATA_FILE] = msgpack.packb(top)
    return f"{kind}:{name}", out


def _child_fuzz(seed: int, cases: int) -> dict:
    rng = random.Random(seed)
    originals = {case: _payloads(case) for case in CASES}
    clocks = ManualClocks(steady_ns=10 * NS_PER_S, system_ns=1_796_019_911 * 10**9)
    counts = {"accepted": 0, "rejected": 0, "untyped": [], "invalid_accepted": [], "by_kind": {}}
    for i in range(cases):
        case = CASES[i % len(CASES)]
        kind, payloads = _mutate(originals[case], rng)
        counts["by_kind"][kind] = counts["by_kind"].get(kind, 0) + 1
        try:
            state = decode_v1(payloads, restore_system_ns=clocks.system_ns(),
                              restore_steady_ns=clocks.steady_ns())
        except SnapshotError:
            counts["rejected"] += 1
            continue
        except Exception as e:
            counts["untyped"].append(f"{i} {kind}: {type(e).__name__}: {e}"[:300])
            continue
        counts["accepted"] += 1
        try:  # what a restore does next with an accepted state
            state.validate()
            MasterService.from_state(state, clocks=clocks, validated=True).verify()
        except MooncakeError as e:
            counts["invalid_accepted"].append(f"{i} {kind}: {type(e).__name__}: {e}"[:300])
        except Exception as e:
            counts["untyped"].append(f"{i} {kind} after load: {type(e).__name__}: {e}"[:300])
    return counts


def test_seeded_mutations_fail_closed() -> None:
    """~300 mutations of the real fixtures in one child: no crash, every rejection typed, every
    accepted state valid and loadable into an engine that passes its self-check."""
    got = _run_child("fuzz", "1301", os.environ.get("V1_FUZZ_CASES", "300"))
    assert got["untyped"] == [] and got["invalid_accepted"] == [], got
    assert got["rejected"] > got["accepted"] > 0, got  # most mutations are caught ...
    assert len(got["by_kind"]) >= 8, got  # ... of every kind, in every file


if __name__ == "__main__":  # the child side of _run_child
    if sys.argv[1] == "bomb":
        result = _child_bomb(sys.argv[2])
    else:
        result = _child_fuzz(int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(result))
