"""The stored formats under fuzz: for each, pristine corpora, forgers, and the loader.

A corpus is ``{relative path: bytes}``: a snapshot directory, an oplog store's files or etcd
keys, or one encoded oplog batch. A forger decodes part of a corpus, changes one value to an
edge (or reorders, duplicates, drops) and re-encodes it with the digest or checksum recomputed,
so the decoder's own validation is what gets tested. ``reseal`` recomputes those digests after a
raw byte mutation. A loader decodes a corpus and loads it into a fresh :class:`MasterService`
the way restore, standby bootstrap or a standby poll does; the caller runs ``verify()``.

Everything is deterministic: fixed clocks and keys, and a ``random.Random`` per case.
"""
from __future__ import annotations

import base64
import json
import os
import random
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import msgpack
import numpy as np

from ..clock import NS_PER_S, ManualClocks
from ..config import MasterConfig
from ..errors import NoUsableSnapshot
from ..ha.apply import apply_batch
from ..ha.oplog import OpLogBatch, OpLogOp, OpType, PutEndPayload, ReplicaDescriptor, SegmentPayload, \
    _WIRE_ARRAYS, _checksum, decode_batch, encode_batch
from ..ha.standby import standby_snapshot_of, state_of_standby
from ..ha.stores import EtcdOpLogStore, FileOpLogStore
from ..master import MasterService
from ..messages import ReplicateConfig
from ..snapshots.arrow_codec import DIGEST_FILE, PAYLOAD_FILES, digest_of, encode_state
from ..snapshots.complete import cleanup_state, decode_candidate
from ..snapshots.manifest import manifest_checksum, snapshot_id_for, v2_manifest
from ..snapshots.repository import SnapshotRepository
from ..snapshots.standby import STANDBY_CLUSTER_SUFFIX, StandbySnapshotStore, standby_manifest
from .fuzz_mutate import (
    EDGE_INTS,
    forge_leaf,
    forge_table,
    mutate_zstd,
    pack_pairs,
    read_ipc,
    unzstd,
    wrap,
    write_ipc,
    zstd_frame,
)

Corpus = dict[str, bytes]
Mutation = tuple[Corpus, str]  # the mutated corpus and what was done to it
FrameMutator = Callable[[bytes, random.Random], tuple[bytes, str]]  # a zstd frame -> another one

CLUSTER = "fuzz"
WRITER = "3001-3002"
CONFIG = MasterConfig(default_kv_lease_ttl_ms=10_000, client_live_ttl_s=10)
SYSTEM_NS = 1_796_000_000 * NS_PER_S
STEADY_NS = 1_000 * NS_PER_S
V1_FIXTURES_ENV = "MOONCAKE_FUZZ_V1_FIXTURES"  # tests/fixtures/mooncake_v1 (the tests set it)
ETCD_ENV = "MOONCAKE_FUZZ_ETCD"  # endpoint of the etcd server the etcd store's cases use
COUNTER_EDGES = (b"0", b"-1", b"01", b" 1", b"1\n\n", b"", b"9223372036854775807", b"9223372036854775808",
                 b"9999999999999999999", b"18446744073709551615", b"99999999999999999999", b"1e3", b"\xff")


def clocks() -> ManualClocks:
    return ManualClocks(steady_ns=STEADY_NS, system_ns=SYSTEM_NS)


def source_master(in_flight: bool = True) -> MasterService:
    """A small engine with a bit of everything: tenants, groups, pins, 1-2 replicas on three
    segments, a lease, and (``in_flight``) one object still being written."""
    m = MasterService(CONFIG, clocks=clocks())
    for i, name in enumerate(("seg_a", "seg_b", "seg_c")):
        m.mount_segment(name, endpoint=f"{name}:1", client_id=f"100{i}-200{i}", base=(i + 1) << 32, size=1 << 24)
    for i in range(24):
        cfg = ReplicateConfig(replica_num=1 + i % 2, hard_pin=i % 5 == 0, group_id="g1" if i % 4 == 0 else "",
                              tenant_id="t2" if i % 3 == 0 else "default")
        m.put_start(f"key{i:03d}", 1024 * (i % 5 + 1), client_id=WRITER, config=cfg)
        if i != 7 or not in_flight:
            m.put_end(f"key{i:03d}", client_id=WRITER, tenant_id=cfg.tenant_id)
    m.get_replica_list("key001")
    return m


def read_tree(root: Path) -> Corpus:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_tree(files: Corpus, root: Path) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _pick(files: Corpus, rng: random.Random, suffixes: tuple[str, ...]) -> str | None:
    paths = sorted(p for p in files if p.endswith(suffixes))
    return rng.choice(paths) if paths else None


def _manifest_path(files: Corpus) -> str:
    return next(p for p in sorted(files) if p.endswith("manifest.txt"))


def _with_digest(files: Corpus, version: int) -> Corpus:
    """Recompute digest.json over the Arrow payloads beside it (a forger's integrity pass)."""
    digest = next((p for p in files if p.endswith(DIGEST_FILE)), None)
    if digest is None:
        return files
    folder = digest[:-len(DIGEST_FILE)]
    payloads = {name: files[folder + name] for name in PAYLOAD_FILES if folder + name in files}
    return {**files, digest: digest_of(payloads, version=version)}


def _reseal_digest(version: int) -> Callable[[Corpus, str], Corpus]:
    return lambda files, mutated: files if mutated.endswith((DIGEST_FILE, "manifest.txt", "latest.txt")) \
        else _with_digest(files, version)


# ---- v2 complete snapshots -----------------------------------------------------------------------

_V2_COMPRESSION = (None, "zstd")  # one corpus per variant


def v2_corpus(variant: int) -> Corpus:
    with tempfile.TemporaryDirectory(prefix="mooncake-fuzz-") as tmp:
        repo = SnapshotRepository(tmp, CLUSTER)
        sid = snapshot_id_for(SYSTEM_NS)
        payloads = encode_state(source_master().export_state(), _V2_COMPRESSION[variant])
        repo.publish(sid, payloads, v2_manifest(sid, SYSTEM_NS, STEADY_NS).encode())
        return read_tree(Path(tmp))


def _forge_manifest_v2(text: str, rng: random.Random) -> tuple[str, str]:
    parts = text.split("|")
    at = rng.choice((3, 4))
    old = int(parts[at])
    parts[at] = str(rng.choice((old + 10**15, old - 10**15, 0, -1, 2**63 - 1, -2**63, old + 1)))
    fields = "|".join(parts[:5])
    return f"{fields}|{manifest_checksum(fields)}", f"manifest field {at}: {old} -> {parts[at]} (checksum recomputed)"


def v2_forge(files: Corpus, variant: int, rng: random.Random) -> Mutation:
    files = dict(files)
    target = rng.choice(PAYLOAD_FILES * 3 + ("replica_next_id", "manifest"))
    if target == "manifest":
        path = _manifest_path(files)
        text, what = _forge_manifest_v2(files[path].decode(), rng)
        files[path] = text.encode()
        return files, what
    path = next(p for p in files if p.endswith(target if target in PAYLOAD_FILES else "replicas.arrow"))
    table = read_ipc(files[path])
    if target == "replica_next_id":
        value = str(rng.choice(EDGE_INTS + (2**64,))).encode()
        table = table.replace_schema_metadata({b"mooncake.replica_next_id": value})
        what = f"replica_next_id = {value!r}"
    else:
        table, what = forge_table(table, rng)
    files[path] = write_ipc(table, _V2_COMPRESSION[variant])
    return _with_digest(files, 2), f"{target}: {what} (digest recomputed)"


# Objects the last snapshot load's cleanup dropped (puts without a COMPLETE replica: a mutated
# status legitimately drops its object, and restore counts it): not a silent partial restore.
cleanup_dropped = [0]


def _snapshot_master(root: Path) -> MasterService:
    """restore_master's steps for the newest candidate, without its catch-all fallback (so the
    error type of a rejection is visible): decode, clean up, load, (caller) verify."""
    cluster = CLUSTER if (root / CLUSTER).is_dir() else "mooncake_cluster"  # the v1 fixtures' cluster
    repo = SnapshotRepository(root, cluster)
    ids = repo.candidates()
    if not ids:
        raise NoUsableSnapshot("no candidate left")
    state, _, now_ns = decode_candidate(repo, ids[0], clocks(), check_unique_keys=False)
    state, dropped = cleanup_state(state, now_ns, drop_expired=False)
    cleanup_dropped[0] = dropped
    return MasterService.from_state(state, config=CONFIG, clocks=clocks(), segments_readable=True, validated=True)


# ---- v1 (upstream) complete snapshots ----------------------------------------------------------------

_V1_CASES = ("small_6", "many_1000")


def v1_corpus(variant: int) -> Corpus:
    root = Path(os.environ[V1_FIXTURES_ENV]) / _V1_CASES[variant] / "mooncake_master_snapshot"
    return read_tree(root)


def _v1_metadata(files: Corpus) -> tuple[str, list[tuple], dict]:
    """(path, shard pairs in stored order, the rest of the top map)."""
    path = next(p for p in sorted(files) if p.endswith("/metadata"))
    top = msgpack.unpackb(files[path], raw=False, strict_map_key=False)
    return path, list(top["shards"].items()), top


def _v1_pack_metadata(top: dict, shards: list[tuple]) -> bytes:
    packer = msgpack.Packer(use_bin_type=True)
    out = packer.pack_map_header(len(top))
    for key, value in top.items():
        out += packer.pack(key) + (pack_pairs(shards) if key == "shards" else packer.pack(value))
    return out


def _shard_items(blob: bytes) -> dict:
    return msgpack.unpackb(unzstd(blob), raw=False, strict_map_key=False)


def _shard_blob(shard: dict) -> bytes:
    return zstd_frame(msgpack.packb(shard, use_bin_type=True))


def v1_forge(files: Corpus, variant: int, rng: random.Random) -> Mutation:
    files = dict(files)
    path, shards, top = _v1_metadata(files)
    kind = rng.choice(("collision", "shard_key", "wrong_shard", "item", "item", "item", "duplicate", "top",
                       "segments", "segments", "task_manager"))
    if kind in ("segments", "task_manager"):
        target = _pick(files, rng, (f"/{kind}",))
        assert target is not None  # a v1 snapshot has both files
        value = msgpack.unpackb(unzstd(files[target]), raw=False, strict_map_key=False)
        what = forge_leaf(value, rng)
        files[target] = zstd_frame(msgpack.packb(value, use_bin_type=True))
        return files, f"{kind}: {what}"
    i = rng.randrange(len(shards))
    key, blob = shards[i]
    if kind == "collision" and len(shards) > 1:  # two shards under one map key: a dict keeps one
        other = rng.choice([k for k, _ in shards if k != key])
        shards[i], what = (other, blob), f"shard key {key} -> {other} (a duplicate map key)"
    elif kind in ("collision", "shard_key"):
        new = rng.choice((1024, 2**64 - 1, -1, str(key), key + 1))
        shards[i], what = (new, blob), f"shard key {key} -> {new!r}"
    elif kind == "top":
        top["replica_next_id"] = rng.choice(EDGE_INTS)
        what = f"replica_next_id = {top['replica_next_id']}"
    else:
        shard = _shard_items(blob)
        items = shard["metadata"]
        if kind == "item":
            what = f"shard {key} item {forge_leaf(items, rng)}"
        elif kind == "duplicate":
            items.append(items[rng.randrange(len(items))])
            what = f"shard {key}: an item duplicated"
        else:  # an item moved into another shard (or a shard that does not exist yet)
            j = rng.randrange(len(shards))
            item = items.pop(rng.randrange(len(items)))
            if j == i:
                shards.append(((key + 1) % 1024, _shard_blob({"metadata": [item]})))
                what = f"an item of shard {key} moved to new shard {(key + 1) % 1024}"
            else:
                other = _shard_items(shards[j][1])
                other["metadata"].append(item)
                shards[j] = (shards[j][0], _shard_blob(other))
                what = f"an item of shard {key} moved to shard {shards[j][0]}"
        shards[i] = (key, _shard_blob(shard))
    files[path] = _v1_pack_metadata(top, shards)
    return files, what


def v1_zstd_inner(files: Corpus, rng: random.Random, mutator: FrameMutator = mutate_zstd) -> Mutation:
    """``mutator`` applied to one metadata shard's zstd frame (the frames nested in ``metadata``)."""
    files = dict(files)
    path, shards, top = _v1_metadata(files)
    i = rng.randrange(len(shards))
    blob, what = mutator(shards[i][1], rng)
    shards[i] = (shards[i][0], blob)
    files[path] = _v1_pack_metadata(top, shards)
    return files, f"metadata shard {shards[i][0]}: {what}"


# ---- standby snapshots ------------------------------------------------------------------------------

def standby_corpus(variant: int) -> Corpus:
    with tempfile.TemporaryDirectory(prefix="mooncake-fuzz-") as tmp:
        store = StandbySnapshotStore(SnapshotRepository(tmp, CLUSTER + STANDBY_CLUSTER_SUFFIX))
        store.publish(standby_snapshot_of(source_master(in_flight=False), 42), clocks())
        return read_tree(Path(tmp))


def standby_forge(files: Corpus, variant: int, rng: random.Random) -> Mutation:
    files = dict(files)
    target = rng.choice(PAYLOAD_FILES * 3 + ("manifest",))
    if target == "manifest":
        path = _manifest_path(files)
        sid = files[path].decode().split("|")[2]
        seq = rng.choice((0, 2**63 - 1, 2**63, 2**64, 10**30))
        files[path] = standby_manifest(sid, seq).encode()
        return files, f"manifest last_sequence_id = {seq}"
    path = next(p for p in files if p.endswith(target))
    table, what = forge_table(read_ipc(files[path]), rng)
    files[path] = write_ipc(table)
    return _with_digest(files, 1), f"{target}: {what} (digest recomputed)"


def _standby_master(root: Path) -> MasterService:
    """StandbyService.bootstrap's steps for the newest candidate."""
    store = StandbySnapshotStore(SnapshotRepository(root, CLUSTER + STANDBY_CLUSTER_SUFFIX))
    ids = store.repo.candidates()
    if not ids:
        raise NoUsableSnapshot("no candidate left")
    snap = store.load(ids[0])
    return MasterService.from_state(state_of_standby(snap), config=CONFIG, clocks=clocks(), segments_readable=False)


# ---- the oplog wire format ----------------------------------------------------------------------------

def oplog_ops() -> list[OpLogOp]:
    """What a primary logs for source_master(): segment mounts, the objects' PUT_ENDs, then a
    REMOVE, a re-put and an unmount of an empty segment."""
    m = source_master(in_flight=False)
    state = m.export_state()
    seg = state.segments.to_pylist()
    ops = [OpLogOp(OpType.SEGMENT_MOUNT, "default", s["name"], SegmentPayload(s["name"], s["endpoint"], s["size"],
                                                                             s["client"])) for s in seg]
    ops.append(OpLogOp(OpType.SEGMENT_MOUNT, "default", "seg_x", SegmentPayload("seg_x", "seg_x:1", 1 << 20, "9-9")))
    objects, replicas = state.objects.to_pylist(), state.replicas.to_pylist()
    puts = []
    for i, o in enumerate(objects):
        reps = tuple(ReplicaDescriptor(r["replica_id"], r["kind"], r["segment"], r["offset"], r["size"], r["status"],
                                       f"{r['segment']}:1") for r in replicas if r["object_index"] == i)
        puts.append(OpLogOp(OpType.PUT_END, o["tenant"], o["key"], PutEndPayload(
            o["client"], o["size_bytes"], reps, o["data_type"], o["group"], o["hard_pinned"], o["soft_pin_enabled"])))
    ops += puts
    ops += [OpLogOp(OpType.REMOVE, puts[2].tenant, puts[2].key), puts[2],
            OpLogOp(OpType.SEGMENT_UNMOUNT, "default", "seg_x", SegmentPayload("seg_x", "seg_x:1", 1 << 20, "9-9"))]
    return ops


def oplog_batches() -> list[OpLogBatch]:
    """The ops in three batches, as a writer would append them."""
    ops = oplog_ops()
    cuts = [0, 6, 20, len(ops)]
    return [OpLogBatch(a + 1, [op.at(a + 1 + k) for k, op in enumerate(ops[a:b])]) for a, b in zip(cuts, cuts[1:])]


def wire_corpus(variant: int) -> Corpus:
    ops = oplog_ops()
    return {"batch": encode_batch(OpLogBatch(1, [op.at(1 + k) for k, op in enumerate(ops)]))}


# the oplog's own wire dtypes (bools as bytes, so a forged value may be any byte)
_WIRE_DTYPES = {name: "u1" if dt == "?" else dt for name, dt in _WIRE_ARRAYS.items()}


def _sealed_batch(top: dict) -> bytes:
    top["checksum"] = _checksum(top["first_sequence_id"], top["count"], top["columns"]) \
        if all(type(top.get(k)) is int and 0 <= top[k] < 2**64 for k in ("first_sequence_id", "count")) \
        and type(top.get("columns")) is bytes else top.get("checksum")
    return msgpack.packb(top, use_bin_type=True)


def forge_batch(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One batch with a header field, a column value or a segment payload field changed to an
    edge, or two rows of a column swapped; the checksum recomputed."""
    top = msgpack.unpackb(data, raw=False)
    if rng.random() < 0.15:
        field = rng.choice(("first_sequence_id", "count", "version"))
        return _forge_header(top, field, rng)
    cols = msgpack.unpackb(top["columns"], raw=False)
    if rng.random() < 0.15:
        what = "segments " + forge_leaf(cols["segments"], rng)
    else:
        name = rng.choice([n for n, raw in cols.items() if n != "segments" and raw])
        values = np.frombuffer(cols[name], _WIRE_DTYPES[name]).copy()
        i = rng.randrange(values.size)
        if rng.random() < 0.2 and values.size > 1:
            j = rng.randrange(values.size)
            values[[i, j]] = values[[j, i]]
            what = f"{name}[{i}] and [{j}] swapped"
        else:
            edges = (0xFF, 0x80, 0xC0, 0) if name.endswith("_bytes") else EDGE_INTS + (int(values[i]) + 1,)
            values[i] = wrap(rng.choice(edges), values.dtype)
            what = f"{name}[{i}] = {values[i]}"
        cols[name] = values.tobytes()
    top["columns"] = msgpack.packb(cols, use_bin_type=True)
    return _sealed_batch(top), f"{what} (checksum recomputed)"


def _forge_header(top: dict, field: str, rng: random.Random) -> tuple[bytes, str]:
    old = top[field]
    top[field] = rng.choice(("mooncake-columnar-standby/1", "", "\x00") if field == "version"
                            else (0, 2**63 - 1, 2**63, 2**64 - 1, old + 1, old - 1))
    return _sealed_batch(top), f"header {field}: {old!r} -> {top[field]!r} (checksum recomputed)"


def reseal_batch(data: bytes) -> bytes:
    """Recompute the checksum of a (raw-mutated) batch when its header still decodes."""
    try:
        top = msgpack.unpackb(data, raw=False)
    except Exception:  # noqa: BLE001 - an undecodable header is left as the mutation made it
        return data
    return _sealed_batch(top) if isinstance(top, dict) else data


def wire_forge(files: Corpus, variant: int, rng: random.Random) -> Mutation:
    data, what = forge_batch(files["batch"], rng)
    return {"batch": data}, what


def _apply_all(batches: list[OpLogBatch]) -> MasterService:
    """A standby container with the batches applied in order (what StandbyService.poll does)."""
    m = MasterService(CONFIG, clocks=clocks())
    for b in batches:
        apply_batch(m, b)
    return m


def _wire_master(root: Path) -> MasterService:
    return _apply_all([decode_batch((root / "batch").read_bytes())])


# ---- the oplog stores' stored forms ------------------------------------------------------------------

def _store_image() -> dict[str, bytes]:
    """The file store's files after a writer appended the three batches (the lock file aside)."""
    with tempfile.TemporaryDirectory(prefix="mooncake-fuzz-") as tmp:
        store = FileOpLogStore(tmp)
        store.set_producer_view(1)
        for b in oplog_batches():
            store.append_batch(b)
        return {k: v for k, v in read_tree(Path(tmp)).items() if k != "lock"}


def file_store_corpus(variant: int) -> Corpus:
    return _store_image()


def etcd_store_corpus(variant: int) -> Corpus:
    """The same log as the etcd store keeps it: keys under /oplog/<cluster>/, no file suffix."""
    return {k.removesuffix(".msgpack"): v for k, v in _store_image().items()}


def store_forge(files: Corpus, variant: int, rng: random.Random) -> Mutation:
    files = dict(files)
    batches = sorted(p for p in files if p.startswith("batches/"))
    suffix = ".msgpack" if batches and batches[0].endswith(".msgpack") else ""
    kind = rng.choice(("counter", "counter", "batch", "batch", "batch", "rename", "drop", "copy", "swap", "foreign"))
    if kind == "counter":
        name = rng.choice(("durable_prefix", "producer_view"))
        files[name] = rng.choice(COUNTER_EDGES + (str(rng.randrange(1, 40)).encode(),))
        return files, f"{name} = {files[name]!r}"
    path = rng.choice(batches)
    if kind == "batch":
        files[path], what = forge_batch(files[path], rng)
        return files, f"{path}: {what}"
    new = f"batches/{rng.choice((0, 1, 2, 5, 21, 40, 41, 10**19)):020d}{suffix}"
    if kind == "rename":
        files[new] = files.pop(path)
        return files, f"{path} renamed to {new}"
    if kind == "drop":
        del files[path]
        return files, f"{path} deleted"
    if kind == "copy":
        files[new] = files[path]
        return files, f"{path} copied to {new}"
    if kind == "swap" and len(batches) > 1:
        other = rng.choice([b for b in batches if b != path])
        files[path], files[other] = files[other], files[path]
        return files, f"{path} and {other} swapped"
    foreign = rng.choice((f"0000000000000000000x{suffix}", "\u0660" * 19 + "\u0661" + suffix,  # Arabic-Indic digits
                          f"{1:020d}{suffix}\n", f"{1:021d}{suffix}"))
    files[f"batches/{foreign}"] = files[path]
    return files, f"{path} copied to a foreign name {foreign!r}"


def _reseal_store(files: Corpus, mutated: str) -> Corpus:
    return {**files, mutated: reseal_batch(files[mutated])} if mutated.startswith("batches/") else files


def _read_store(store: FileOpLogStore | EtcdOpLogStore) -> MasterService:
    """What a standby does with a store: read the counters and every batch, apply them, then
    compact the first batch away (as after publishing a standby snapshot)."""
    store.producer_view()
    store.durable_prefix()
    batches = store.read_batches(0)
    master = _apply_all(batches)
    if batches:  # an empty log (prefix 0) is a valid store
        store.compact_through(batches[0].last_sequence_id)
    return master


def _file_store_master(root: Path) -> MasterService:
    return _read_store(FileOpLogStore(root))


_ETCD_BASE = f"/oplog/{CLUSTER}/"


def _etcd_stage(files: Corpus, root: Path) -> None:
    """Replace every key under the fuzz cluster's prefix with ``files`` (etcd's v3 JSON gateway)."""
    def post(path: str, body: dict) -> None:
        req = urllib.request.Request(os.environ[ETCD_ENV] + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def b64(v: str | bytes) -> str:
        return base64.b64encode(v.encode() if isinstance(v, str) else v).decode()

    post("/v3/kv/deleterange", {"key": b64(_ETCD_BASE), "range_end": b64(_ETCD_BASE[:-1] + "0")})
    post("/v3/kv/txn", {"success": [{"request_put": {"key": b64(_ETCD_BASE + k), "value": b64(v)}}
                                    for k, v in files.items()]})


def _etcd_store_master(root: Path) -> MasterService:
    return _read_store(EtcdOpLogStore(os.environ[ETCD_ENV], CLUSTER))


# ---- the table of formats -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Format:
    """One stored format and how to fuzz it."""

    name: str
    variants: int  # how many pristine corpora (case seed % variants picks one)
    corpus: Callable[[int], Corpus]
    forge: Callable[[Corpus, int, random.Random], Mutation]
    load: Callable[[Path], MasterService]  # decode what ``stage`` stored under the directory, and load it
    stage: Callable[[Corpus, Path], None] = write_tree  # store a corpus (files in a directory, etcd keys)
    reseal: Callable[[Corpus, str], Corpus] = lambda files, mutated: files  # digests after a raw edit
    zstd_files: tuple[str, ...] = ()  # suffixes of files that are one zstd frame
    zstd_inner: Callable[[Corpus, random.Random, FrameMutator], Mutation] | None = None  # frames nested in a file
    keeps_objects: bool = False  # an accepted mutant must hold every object (no silent partial restore)
    weights: tuple[int, int, int, int] = (35, 15, 45, 5)  # raw bytes, zstd, forged, a file deleted


FORMATS: dict[str, Format] = {f.name: f for f in (
    Format("v2", 2, v2_corpus, v2_forge, _snapshot_master, reseal=_reseal_digest(2)),
    Format("v1", 2, v1_corpus, v1_forge, _snapshot_master, zstd_files=("/segments", "/task_manager"),
           zstd_inner=v1_zstd_inner, keeps_objects=True),
    Format("standby", 1, standby_corpus, standby_forge, _standby_master, reseal=_reseal_digest(1)),
    Format("oplog_wire", 1, wire_corpus, wire_forge, _wire_master,
           reseal=lambda files, mutated: {"batch": reseal_batch(files["batch"])}),
    Format("file_store", 1, file_store_corpus, store_forge, _file_store_master, reseal=_reseal_store),
    Format("etcd_store", 1, etcd_store_corpus, store_forge, _etcd_store_master, stage=_etcd_stage,
           reseal=_reseal_store),
)}
