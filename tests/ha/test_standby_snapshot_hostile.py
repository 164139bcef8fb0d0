"""Hostile standby snapshots: forged payloads fail closed with typed errors (never a crash),
bootstrap falls back to the older standby snapshot (or the oplog alone) and the standby still
ends equal to the primary; new snapshot ids sort above planted directories.

Decodes that could crash the interpreter (forged Arrow offsets, the seeded mutation loop) run in
a child process, so a crash fails the test instead of killing pytest.
"""
from __future__ import annotations

import itertools
import json
import os
import pickle
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from mooncake_columnar.clock import ManualClocks
from mooncake_columnar.errors import (
    MooncakeError,
    NoUsableStandbySnapshot,
    SnapshotDigestError,
    SnapshotIntegrityError,
    SnapshotPayloadError,
    SnapshotPublishError,
    StandbySnapshotUnreplayable,
)
from mooncake_columnar.ha.standby import master_of_standby, standby_snapshot_of
from mooncake_columnar.ha.stores import EtcdOpLogStore, FileOpLogStore, OpLogStore
from mooncake_columnar.master import MasterService
from mooncake_columnar.messages import ReplicateConfig
from mooncake_columnar.snapshots.arrow_codec import (
    DIGEST_FILE,
    OBJECTS_FILE,
    PAYLOAD_FILES,
    REPLICAS_FILE,
    SEGMENTS_FILE,
    digest_of,
)
from mooncake_columnar.snapshots.standby import (
    StandbySnapshotStore,
    decode_standby,
    encode_standby,
)
from mooncake_columnar.testing.builders import canonical, primary, put_objects, standby
from mooncake_columnar.testing.etcd_server import EtcdServer
from mooncake_columnar.testing.fuzz_mutate import write_ipc

ROOT = Path(__file__).resolve().parents[2]
Payloads = dict[str, bytes]


# --- forging ---------------------------------------------------------------------------------------


def with_digest(payloads: Payloads) -> Payloads:
    """``payloads`` with digest.json recomputed (sha256, as the standby writer does): a forger
    with write access can always do this, so only the decoder's checks stand in the way."""
    body = {k: v for k, v in payloads.items() if k != DIGEST_FILE}
    return {**body, DIGEST_FILE: digest_of(body, version=1)}


def table_of(payloads: Payloads, name: str) -> pa.Table:
    return pa.ipc.open_file(payloads[name]).read_all()


def with_value(table: pa.Table, column: str, row: int, value: object) -> pa.Table:
    """``table`` with one cell replaced: still well-formed Arrow of the same schema."""
    idx = table.schema.get_field_index(column)
    values = table.column(idx).to_pylist()
    values[row] = value
    return table.set_column(idx, table.schema.field(idx), pa.array(values, table.schema.field(idx).type))


def forge_value(payloads: Payloads, name: str, column: str, row: int, value: object) -> Payloads:
    """One cell of a payload forged, digest recomputed."""
    return with_digest({**payloads, name: write_ipc(with_value(table_of(payloads, name), column, row, value))})


def column_buffer_at(raw: bytes, table: pa.Table, column: str) -> tuple[int, int]:
    """(position in the IPC file, byte length) of ``column``'s offsets (strings) or values
    buffer: found by content, as a forger editing the file in place would."""
    array = table.column(column).combine_chunks()
    width = 4 if pa.types.is_string(array.type) else array.type.bit_width // 8
    length = width * (len(array) + (1 if pa.types.is_string(array.type) else 0))
    data = bytes(array.buffers()[1])[:length]
    return raw.find(data), length


def forge_string_offset(payloads: Payloads, name: str, table: pa.Table, column: str, value: int) -> Payloads:
    """The last offset of a string column set to ``value`` in the stored bytes, digest recomputed."""
    raw = bytearray(payloads[name])
    at, length = column_buffer_at(bytes(raw), table, column)
    assert at >= 0
    raw[at + length - 4:at + length] = value.to_bytes(4, "little", signed=True)
    return with_digest({**payloads, name: bytes(raw)})


def invalid_utf8_key(payloads: Payloads, key: str) -> Payloads:
    """``key``'s first byte replaced by 0xFF (never valid UTF-8) in objects.arrow, digest recomputed."""
    raw = payloads[OBJECTS_FILE]
    at = raw.find(key.encode())
    assert at >= 0
    return with_digest({**payloads, OBJECTS_FILE: raw[:at] + b"\xff" + raw[at + 1:]})


# --- a subprocess that decodes -----------------------------------------------------------------------


def decode_outcome(payloads: Payloads, last_sequence_id: int) -> str:
    """What loading a candidate does: "ok" (decoded, built into an engine that passed verify()),
    the typed error's class and message, or "UNTYPED ..." for anything else."""
    try:
        master_of_standby(decode_standby(payloads, last_sequence_id), clocks=ManualClocks())
    except MooncakeError as e:
        return f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - the finding: an error outside the hierarchy
        return f"UNTYPED {type(e).__name__}: {e}"
    return "ok"


def child_main(cases_path: str) -> None:
    """Child process: decode every case, one JSON line per outcome; the label goes to stderr
    first, so a crash names the case that caused it."""
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    for label, payloads, seq in cases:
        print(label, file=sys.stderr, flush=True)
        print(json.dumps([label, decode_outcome(payloads, seq)]), flush=True)


def decode_in_child(tmp_path: Path, cases: list[tuple[str, Payloads, int]]) -> dict[str, str]:
    """label -> outcome of each case, decoded in a child process; a crash fails the test."""
    path = tmp_path / "cases.pickle"
    path.write_bytes(pickle.dumps(cases))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = f"import sys; from {__name__} import child_main; child_main(sys.argv[1])"
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)  # the exit status is asserted below
    outcomes = dict(json.loads(line) for line in done.stdout.splitlines())
    started = done.stderr.splitlines()
    assert done.returncode == 0, (f"the decoder crashed (exit {done.returncode}) on case "
                                  f"{started[-1] if started else '?'}; stderr ends: {started[-5:]}")
    assert len(outcomes) == len(cases)
    return outcomes


# --- a primary and its standby snapshots -------------------------------------------------------------

KEYS = ["key-alpha", "key-beta", "key-gamma"]


def small_primary() -> MasterService:
    """A few objects on two segments, pinned, grouped and in two tenants."""
    clocks = ManualClocks()
    m = MasterService(clocks=clocks)
    for i in range(2):
        m.mount_segment(f"seg{i}", endpoint=f"10.0.0.{i}:1", client_id=f"c{i}", base=(i + 1) << 30, size=1 << 22)
    for i, key in enumerate(KEYS + [f"k{i}" for i in range(6)]):
        cfg = ReplicateConfig(hard_pin=i % 3 == 0, group_id="g" if i % 4 == 1 else "",
                              tenant_id="t2" if i % 5 == 4 else "default")
        m.put_start(key, 1000 + 64 * i, client_id="c0", config=cfg)
        m.put_end(key, client_id="c0", tenant_id=cfg.tenant_id)
    return m


def good_payloads() -> tuple[Payloads, int]:
    snap = standby_snapshot_of(small_primary(), 9)
    return {k: bytes(v) for k, v in encode_standby(snap).items()}, snap.last_sequence_id


def history(store: OpLogStore, follower: OpLogStore, snaps: StandbySnapshotStore,
            clocks: ManualClocks) -> tuple[MasterService, list[tuple[str, int]]]:
    """A primary journaling to ``store``; a standby following ``follower`` publishes an older and
    a newer snapshot between rounds of changes, and more changes follow. Returns the primary and
    [(older id, its sequence id), (newer id, its sequence id)]."""
    p, w = primary(store, clocks, max_batch_entries=4)
    sb = standby(follower, clocks, snapshot_repo=snaps)
    published = []
    for keys, removed in ((KEYS, None), (["key-delta", "key-epsilon"], "key-beta"), (["late"], "key-gamma")):
        put_objects(p, keys)
        put_objects(p, [keys[0] + "-hard"], hard_pin=True)
        if removed:
            p.remove(removed, force=True)
        w.flush()
        sb.poll()
        if len(published) < 2:
            published.append((sb.write_snapshot(), sb.applied_sequence_id))
    return p, published


def snapshot_dir(tmp_path: Path, sid: str) -> Path:
    return tmp_path / "snaps" / "c-standby" / sid


def damage(directory: Path, forge: Callable[[Payloads], Payloads]) -> None:
    """Rewrite a stored snapshot's payloads through ``forge``."""
    payloads = {name: (directory / name).read_bytes() for name in (*PAYLOAD_FILES, DIGEST_FILE)}
    for name, data in forge(payloads).items():
        (directory / name).write_bytes(data)


def flip_digest(payloads: Payloads) -> Payloads:
    raw = bytearray(payloads[SEGMENTS_FILE])
    raw[len(raw) // 2] ^= 0x40
    return {**payloads, SEGMENTS_FILE: bytes(raw)}


def duplicate_key(payloads: Payloads) -> Payloads:
    return forge_value(payloads, OBJECTS_FILE, "key", 1, table_of(payloads, OBJECTS_FILE).column("key")[0].as_py())


# Damages a forger with write access can do; the segment of history() is 64 MiB.
DAMAGES = {
    "invalid-utf8-key": lambda p: invalid_utf8_key(p, "key-alpha"),
    "payload-bytes-changed": flip_digest,
    "extent-past-capacity": lambda p: forge_value(p, REPLICAS_FILE, "offset", 0, (1 << 26) - 1),
    "object-size-past-its-extent": lambda p: forge_value(p, OBJECTS_FILE, "size", 0, 1 << 40),
    "duplicate-key": duplicate_key,
    "empty-key": lambda p: forge_value(p, OBJECTS_FILE, "key", 0, ""),  # today only verify() refuses it
}


# --- decoding ----------------------------------------------------------------------------------------


def test_forged_out_of_range_string_offset_with_recomputed_digest_is_a_typed_error_not_a_crash(
        tmp_path: Path) -> None:
    payloads, seq = good_payloads()
    replicas, objects = table_of(payloads, REPLICAS_FILE), table_of(payloads, OBJECTS_FILE)
    cases = [("replicas.segment", forge_string_offset(payloads, REPLICAS_FILE, replicas, "segment", 1 << 30), seq),
             ("objects.key", forge_string_offset(payloads, OBJECTS_FILE, objects, "key", 1 << 30), seq),
             ("objects.tenant negative", forge_string_offset(payloads, OBJECTS_FILE, objects, "tenant", -8), seq),
             ("untouched", payloads, seq)]
    outcomes = decode_in_child(tmp_path, cases)
    assert outcomes.pop("untouched") == "ok"
    for label, outcome in outcomes.items():
        assert outcome.startswith("SnapshotPayloadError"), (label, outcome)
        file, field = label.split()[0].split(".")
        assert f"{file}.arrow.{field}" in outcome, outcome  # names the file and the field


def test_invalid_utf8_key_is_rejected_with_a_typed_error_naming_the_file_and_row() -> None:
    payloads, seq = good_payloads()
    row = table_of(payloads, OBJECTS_FILE).column("key").to_pylist().index("key-alpha")
    with pytest.raises(SnapshotPayloadError, match=rf"objects\.arrow\.key: .*UTF8.* {row}\b"):
        decode_standby(invalid_utf8_key(payloads, "key-alpha"), seq)


def test_field_name_that_is_not_utf8_is_a_typed_error_naming_the_file() -> None:
    payloads, seq = good_payloads()
    raw = payloads[OBJECTS_FILE].replace(b"soft_pin_enabled", b"soft_pin_enable\xe4")
    with pytest.raises(SnapshotPayloadError, match=r"objects\.arrow: .*utf-8"):
        decode_standby(with_digest({**payloads, OBJECTS_FILE: raw}), seq)


def test_forged_object_index_is_a_typed_error_naming_file_field_and_row() -> None:
    payloads, seq = good_payloads()
    with pytest.raises(SnapshotIntegrityError, match=r"replicas\.arrow: object_index 1099511627776 at row 3"):
        decode_standby(forge_value(payloads, REPLICAS_FILE, "object_index", 3, 1 << 40), seq)


def test_manifest_sequence_id_that_disagrees_with_the_payloads_rejects_the_snapshot(tmp_path: Path) -> None:
    """One digit off in the manifest would make the replay skip an entry (or apply one twice)."""
    clocks = ManualClocks()
    store = StandbySnapshotStore.open(str(tmp_path), "c")
    m = small_primary()
    older = store.publish(standby_snapshot_of(m, 3), clocks)
    newer = store.publish(standby_snapshot_of(m, 12), clocks)
    manifest = tmp_path / "c-standby" / newer / "manifest.txt"
    manifest.write_text(manifest.read_text().replace("|12", "|13"))
    notes: list[str] = []
    sid, snap = store.load_latest(notes)
    assert (sid, snap.last_sequence_id) == (older, 3)
    assert len(notes) == 1 and newer in notes[0] and "ManifestError" in notes[0]
    assert "last_sequence_id 13" in notes[0] and "replicas.arrow" in notes[0]


# --- bootstrap fallback ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_damaged_newest_standby_snapshot_falls_back_to_the_older_one_and_replays_the_oplog(
        tmp_path: Path, kind: str) -> None:
    clocks = ManualClocks()
    snaps = StandbySnapshotStore.open(str(tmp_path / "snaps"), "c")
    p, [(_, older_seq), (newer, _)] = history(FileOpLogStore(tmp_path / "log"),
                                                  FileOpLogStore(tmp_path / "log"), snaps, clocks)
    damage(snapshot_dir(tmp_path, newer), DAMAGES[kind])

    sb = standby(FileOpLogStore(tmp_path / "log"), clocks, snapshot_repo=snaps)
    assert sb.bootstrap() == older_seq
    assert len(sb.bootstrap_notes) == 1 and newer in sb.bootstrap_notes[0]
    sb.master.verify()
    assert sb.poll() > 0
    sb.master.verify()
    assert canonical(sb.master) == canonical(p)


def test_every_standby_snapshot_damaged_bootstraps_from_the_oplog_alone(tmp_path: Path) -> None:
    clocks = ManualClocks()
    snaps = StandbySnapshotStore.open(str(tmp_path / "snaps"), "c")
    p, published = history(FileOpLogStore(tmp_path / "log"), FileOpLogStore(tmp_path / "log"), snaps, clocks)
    for (sid, _), kind in zip(published, ("invalid-utf8-key", "extent-past-capacity")):
        damage(snapshot_dir(tmp_path, sid), DAMAGES[kind])

    sb = standby(FileOpLogStore(tmp_path / "log"), clocks, snapshot_repo=snaps)
    assert sb.bootstrap() == 0
    notes = sb.bootstrap_notes
    assert [sid in note for note, (sid, _) in zip(notes, reversed(published))] == [True, True]
    assert "oplog from sequence id 1" in notes[2]
    sb.poll()
    sb.master.verify()
    assert canonical(sb.master) == canonical(p)


@pytest.fixture(params=["file", "etcd"])
def log_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], OpLogStore]:
    """A factory of handles on one oplog: a local directory, or a real etcd."""
    if request.param == "file":
        return lambda: FileOpLogStore(tmp_path / "log")
    server: EtcdServer = request.getfixturevalue("etcd")
    cluster = f"hostile{os.getpid()}-{tmp_path.name}"
    return lambda: EtcdOpLogStore(server.endpoint, cluster)


def test_older_snapshot_behind_compacted_oplog_is_rejected_and_bootstrap_fails_typed(
        tmp_path: Path, log_stores: Callable[[], OpLogStore]) -> None:
    clocks = ManualClocks()
    snaps = StandbySnapshotStore.open(str(tmp_path / "snaps"), "c")
    store = log_stores()
    _, [(older, _), (newer, newer_seq)] = history(store, log_stores(), snaps, clocks)
    assert store.compact_through(newer_seq) > 0  # the older snapshot's next entries are gone
    damage(snapshot_dir(tmp_path, newer), DAMAGES["invalid-utf8-key"])

    sb = standby(log_stores(), clocks, snapshot_repo=snaps)
    with pytest.raises(NoUsableStandbySnapshot) as raised:
        sb.bootstrap()
    message = str(raised.value)
    assert newer in message and older in message and "objects.arrow" in message
    assert StandbySnapshotUnreplayable.__name__ in message and "oplog alone" in message
    assert len(raised.value.notes) == 2
    assert sb.applied_sequence_id == 0 and sb.master.object_count() == 0  # nothing half-loaded
    sb.master.verify()


# --- snapshot ids ------------------------------------------------------------------------------------


@pytest.mark.parametrize("planted", ["20991231_235959_999",   # the far future
                                     "22620411_000000_000"])  # near the end of int64 ns
def test_planted_directory_with_a_huge_id_still_sorts_below_the_next_publish(
        tmp_path: Path, planted: str) -> None:
    clocks = ManualClocks()
    store = StandbySnapshotStore.open(str(tmp_path), "c")
    snap = standby_snapshot_of(small_primary(), 3)
    first = store.publish(snap, clocks)
    (tmp_path / "c-standby" / planted).mkdir()  # planted after this store last listed
    second = store.publish(snap, clocks)
    assert second > planted > first
    assert store.repo.list()[0] == second
    notes: list[str] = []
    assert store.load_latest(notes)[0] == second and notes == []


@pytest.mark.parametrize("planted", ["99991231_235959_999",   # a calendar time past int64 ns
                                     "99999999_999999_998"])  # not a calendar time at all
def test_no_id_sorts_above_a_planted_id_past_every_calendar_id(tmp_path: Path, planted: str) -> None:
    store = StandbySnapshotStore.open(str(tmp_path), "c")
    (tmp_path / "c-standby" / planted).mkdir(parents=True)
    with pytest.raises(SnapshotPublishError, match=planted):
        store.publish(standby_snapshot_of(small_primary(), 3), ManualClocks())


# --- seeded mutations --------------------------------------------------------------------------------

HOSTILE_VALUES = [0, 1, -1, 7, 255, 1 << 31, -(1 << 31), (1 << 63) - 1, -(1 << 63), 1 << 62, 1 << 40]


def _flip(rng: random.Random, raw: bytes, count: int) -> bytes:
    data = bytearray(raw)
    for _ in range(count):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    return bytes(data)


def _forge_buffer(rng: random.Random, raw: bytes, table: pa.Table) -> bytes:
    """One element of a column's offsets or values buffer overwritten in place."""
    columns = [f.name for f in table.schema if not pa.types.is_boolean(f.type)]
    column = rng.choice(columns)
    at, length = column_buffer_at(raw, table, column)
    array_type = table.schema.field(column).type
    width = 4 if pa.types.is_string(array_type) else array_type.bit_width // 8
    if at < 0 or length < width:
        return _flip(rng, raw, 1)
    pos = at + width * rng.randrange(length // width)
    value = rng.choice(HOSTILE_VALUES) % (1 << (8 * width))
    return raw[:pos] + value.to_bytes(width, "little") + raw[pos + width:]


def _forge_value(rng: random.Random, table: pa.Table) -> pa.Table:
    """A well-formed table with one integer value (or one name) replaced by a hostile one."""
    fields = [f for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_string(f.type)]
    field = rng.choice(fields)
    row = rng.randrange(table.num_rows)
    if pa.types.is_string(field.type):
        value = rng.choice(["", table.column(field.name)[(row + 1) % table.num_rows].as_py(), "x" * 300, "seg9"])
    else:
        info = np.iinfo(field.type.to_pandas_dtype())
        value = min(max(rng.choice(HOSTILE_VALUES), int(info.min)), int(info.max))
    return with_value(table, field.name, row, value)


def mutate(rng: random.Random, payloads: Payloads) -> tuple[str, Payloads]:
    """One seeded mutation: (what was done, the mutated payloads)."""
    name = rng.choice([*PAYLOAD_FILES, DIGEST_FILE])
    kind = rng.choice(["flip", "flip+digest", "buffer+digest", "buffer+digest", "value+digest", "resize+digest"])
    if name == DIGEST_FILE or kind == "flip":
        return f"flip {name}", {**payloads, name: _flip(rng, payloads[name], rng.randint(1, 4))}
    raw = payloads[name]
    if kind == "flip+digest":
        forged = _flip(rng, raw, rng.randint(1, 8))
    elif kind == "resize+digest":
        cut = rng.randrange(len(raw))
        forged = raw[:cut] if rng.random() < 0.5 else raw + bytes(rng.randrange(1, 64))
    else:
        table = table_of(payloads, name)
        forged = _forge_buffer(rng, raw, table) if kind == "buffer+digest" else write_ipc(_forge_value(rng, table))
    return f"{kind} {name}", with_digest({**payloads, name: forged})


def test_seeded_random_mutations_of_standby_payloads_never_crash_or_raise_untyped_errors(
        tmp_path: Path) -> None:
    payloads, seq = good_payloads()
    rng = random.Random(20261202)
    cases = [(f"{i} {what}", forged, seq)
             for i, (what, forged) in zip(itertools.count(), (mutate(rng, payloads) for _ in range(200)))]
    outcomes = decode_in_child(tmp_path, cases)
    untyped = {label: o for label, o in outcomes.items() if o.startswith("UNTYPED")}
    assert untyped == {}
    kinds = Counter(o.split(":")[0] for o in outcomes.values())
    # Every accepted case built an engine that passed verify() (decode_outcome says "ok" only then);
    # the mutations reach past the digest into every decoding stage.
    assert kinds[SnapshotDigestError.__name__] < len(cases) // 2
    assert kinds[SnapshotPayloadError.__name__] > 0 and kinds[SnapshotIntegrityError.__name__] > 0
    assert kinds["ok"] > 0
