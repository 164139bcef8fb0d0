"""Manifest parsing/encoding and clock-domain conversion (RFC Phase 2 adapter, Phase 3 mapping)."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mooncake_columnar.clock import INT64_MAX, INT64_MIN, NS_PER_MS, NS_PER_S
from mooncake_columnar.errors import ClockConversionError, DeserializeFail, ManifestError
from mooncake_columnar.snapshots.convert import (
    convert_legacy_ms_deadlines,
    convert_steady_deadlines,
    legacy_system_deadline_ms,
)
from mooncake_columnar.snapshots.manifest import (
    SnapshotManifest,
    is_valid_snapshot_id,
    parse_manifest,
    snapshot_id_for,
    v1_manifest,
    v2_manifest,
)

SID = "20261130_062511_535"
int64s = st.integers(min_value=INT64_MIN, max_value=INT64_MAX)
snapshot_ids = st.builds(lambda d: f"{d[:8]}_{d[8:14]}_{d[14:]}",
                         st.text(alphabet="0123456789", min_size=17, max_size=17))


# ---- manifest -----------------------------------------------------------------------------------
def test_phase3_v2_manifest_round_trip() -> None:
    m = v2_manifest(SID, 1_796_019_911_535_000_000, -42)
    text = m.encode()
    fields = f"arrow-ipc|2.0.0|{SID}|1796019911535000000|-42"
    # the sixth field checksums the five before it (tag, version, id, clock pair)
    assert text == f"{fields}|sha256:{hashlib.sha256(fields.encode()).hexdigest()}"
    assert parse_manifest(text) == m and parse_manifest(text.encode()) == m
    assert m.is_v2 and parse_manifest(text).checksummed


def test_phase3_v1_manifest_accepted() -> None:
    m = parse_manifest(f"messagepack|1.0.0|{SID}")
    assert m == SnapshotManifest("messagepack", "1.0.0", SID) == v1_manifest(SID)
    assert not m.is_v2 and m.system_now_ns is None and m.steady_now_ns is None
    assert m.encode() == f"messagepack|1.0.0|{SID}"


@pytest.mark.parametrize("text", [
    f"arrow-ipc|2.0.0|{SID}",                  # no clock fields
    f"arrow-ipc|2.0.0|{SID}|1",                # one clock field
    f"arrow-ipc|2.0.0|{SID}||5",               # empty system field
    f"arrow-ipc|2.0.0|{SID}|5|",               # empty steady field
    f"arrow-ipc|2.0.0|{SID}|1|2|3",            # extra field
    f"messagepack|1.0.0|{SID}|1|2",            # v2 fields under v1
    "messagepack|1.0.0",
])
def test_phase3_missing_clock_fields_rejected(text: str) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(text)


@pytest.mark.parametrize("field", ["+1", "01", "-01", "-0", " 1", "1 ", "1\n", "", "1e3", "0x10",
                                   "1_000", "١٢", str(2**63), str(-(2**63) - 1), "--1", "1.0"])
def test_phase3_invalid_integers_rejected(field: str) -> None:
    for text in (f"arrow-ipc|2.0.0|{SID}|{field}|0", f"arrow-ipc|2.0.0|{SID}|0|{field}"):
        with pytest.raises(ManifestError):
            parse_manifest(text)


@pytest.mark.parametrize("text", [
    f"messagepack|2.0.0|{SID}|1|2",   # the RFC's tag with our version: not our payload format
    f"arrow-ipc|1.0.0|{SID}", f"arrow-ipc|2.0.1|{SID}|1|2", f"ARROW-IPC|2.0.0|{SID}|1|2",
    f"json|1.0.0|{SID}", "", "messagepack", f"messagepack|1.0.0|{SID}\n", f" messagepack|1.0.0|{SID}",
    b"messagepack|1.0.0|\xff\xfe",
])
def test_phase3_unknown_or_malformed_manifest_rejected(text: str | bytes) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(text)
    assert isinstance(info.value, DeserializeFail)  # a candidate-level deserialization failure


@pytest.mark.parametrize("sid,ok", [
    (SID, True), ("00000000_000000_000", True), ("2026113_0062511_535", False),
    ("20261130-062511_535", False), ("20261130_062511_53", False), ("20261130_062511_5355", False),
    ("2026113a_062511_535", False), ("20261130_06251١_535", False), ("20261130_062511-535", False),
])
def test_snapshot_id_validation(sid: str, ok: bool) -> None:
    assert is_valid_snapshot_id(sid) is ok
    if not ok:
        with pytest.raises(ManifestError):
            parse_manifest(f"messagepack|1.0.0|{sid}")


def test_snapshot_id_for_formats_utc_milliseconds() -> None:
    # The upstream fixture (TZ=UTC) was taken at wall clock 1796019911535 ms.
    assert snapshot_id_for(1_796_019_911_535 * NS_PER_MS + 999_999) == SID
    assert snapshot_id_for(0) == "19700101_000000_000"
    assert snapshot_id_for(INT64_MIN) == "16770921_001243_145"   # the int64 range fits 19 chars
    assert snapshot_id_for(INT64_MAX) == "22620411_234716_854"
    with pytest.raises(ManifestError):
        snapshot_id_for(INT64_MAX + 1)


@given(snapshot_ids, int64s, int64s)
def test_phase3_manifest_round_trip_property(sid: str, system: int, steady: int) -> None:
    m = v2_manifest(sid, system, steady)
    assert parse_manifest(m.encode()) == m


@settings(max_examples=300)
@given(st.one_of(
    st.text(max_size=80),
    st.builds(lambda a, b, c, d, e: "|".join((a, b, c, d, e)),
              st.sampled_from(["arrow-ipc", "messagepack", "x"]), st.sampled_from(["2.0.0", "1.0.0"]),
              st.one_of(snapshot_ids, st.text(max_size=20)), st.text(max_size=22),
              st.text(max_size=22)),
))
def test_manifest_fuzz_is_strict_and_canonical(text: str) -> None:
    """Anything accepted re-encodes to exactly the same text; anything else is a ManifestError."""
    try:
        m = parse_manifest(text)
    except ManifestError:
        return
    assert m.encode() == text


# ---- clock conversion ---------------------------------------------------------------------------
S0, C0 = 1_796_000_000 * NS_PER_S, 5_000 * NS_PER_S      # snapshot pair (old process)
C1 = 77 * NS_PER_S                                         # new process's steady epoch differs


def _v2(deadlines: list[int], s1: int, c1: int = C1) -> np.ndarray:
    return convert_steady_deadlines(np.array(deadlines, dtype=np.int64), snapshot_system_ns=S0,
                                    snapshot_steady_ns=C0, restore_system_ns=s1,
                                    restore_steady_ns=c1)


def test_phase3_active_lease_conversion_with_downtime() -> None:
    # 10 s left at snapshot time, 3 s of downtime: 7 s left in the new steady domain.
    out = _v2([C0 + 10 * NS_PER_S], s1=S0 + 3 * NS_PER_S)
    assert out.tolist() == [C1 + 7 * NS_PER_S]


def test_phase3_expired_stays_expired() -> None:
    out = _v2([C0 - NS_PER_S, C0, C0 + 2 * NS_PER_S, INT64_MIN], s1=S0 + 5 * NS_PER_S)
    assert (out[:3] <= C1).all()  # already expired or expired during downtime: no TTL granted
    assert out.tolist()[:3] == [C1 - 6 * NS_PER_S, C1 - 5 * NS_PER_S, C1 - 3 * NS_PER_S]
    assert out[3] == INT64_MIN     # sentinel untouched


def test_phase3_positive_and_negative_skew() -> None:
    d = [C0 + 60 * NS_PER_S]
    # Restoring machine's wall clock 20 s ahead (1 s real downtime): lease looks 20 s shorter.
    ahead = _v2(d, s1=S0 + 21 * NS_PER_S)
    # 20 s behind: lease looks 20 s longer, as the documented formula says (no skew policy).
    behind = _v2(d, s1=S0 - 19 * NS_PER_S)
    assert ahead.tolist() == [C1 + 39 * NS_PER_S]
    assert behind.tolist() == [C1 + 79 * NS_PER_S]


def test_phase3_checked_arithmetic_overflow() -> None:
    with pytest.raises(ClockConversionError):
        _v2([INT64_MAX - 1], s1=S0 - 10**18, c1=INT64_MAX - 10)
    with pytest.raises(ClockConversionError):
        _v2([INT64_MIN + 1], s1=S0)  # D0 - C0 underflows
    with pytest.raises(ClockConversionError):
        convert_steady_deadlines(np.array([0]), snapshot_system_ns=2**63, snapshot_steady_ns=0,
                                 restore_system_ns=0, restore_steady_ns=0)
    assert _v2([INT64_MIN, INT64_MIN], s1=S0).tolist() == [INT64_MIN, INT64_MIN]


@given(st.lists(int64s, max_size=6), int64s, int64s, int64s, int64s)
@example([0], 0, 1, INT64_MIN, 0)  # S1 = INT64_MIN: its negation does not fit int64
def test_conversion_matches_exact_formula_or_raises(ds: list[int], s0: int, c0: int, s1: int,
                                                    c1: int) -> None:
    def exact(d: int) -> int | None:
        vals = [d - c0]
        vals.append(s0 + vals[-1])
        vals.append(vals[-1] - s1)
        vals.append(c1 + vals[-1])
        return vals[-1] if all(INT64_MIN <= v <= INT64_MAX for v in vals) and vals[-1] != INT64_MIN \
            else None

    expected = [d if d == INT64_MIN else exact(d) for d in ds]
    arr = np.array(ds, dtype=np.int64)
    if any(e is None for e in expected):
        with pytest.raises(ClockConversionError):
            convert_steady_deadlines(arr, snapshot_system_ns=s0, snapshot_steady_ns=c0,
                                     restore_system_ns=s1, restore_steady_ns=c1)
    else:
        out = convert_steady_deadlines(arr, snapshot_system_ns=s0, snapshot_steady_ns=c0,
                                       restore_system_ns=s1, restore_steady_ns=c1)
        assert out.tolist() == expected


def test_phase2_v1_system_ms_converts_to_steady() -> None:
    s1 = 1_796_019_911_546 * NS_PER_MS
    ms = np.array([1_796_019_916_535, 1_796_019_911_535, 0], dtype=np.int64)
    out = convert_legacy_ms_deadlines(ms, restore_system_ns=s1, restore_steady_ns=C1)
    assert out.tolist() == [C1 + 4_989 * NS_PER_MS, C1 - 11 * NS_PER_MS, INT64_MIN]
    with pytest.raises(ClockConversionError):
        convert_legacy_ms_deadlines(np.array([INT64_MAX // 1000]), restore_system_ns=s1,
                                    restore_steady_ns=C1)


def test_phase2_legacy_writer_adapter_round_trips() -> None:
    system_now, steady_now = 1_796_019_911_546_123_456, 9 * NS_PER_S
    d = np.array([steady_now + 5 * NS_PER_S + 999_999, steady_now - NS_PER_S, INT64_MIN],
                 dtype=np.int64)
    ms = legacy_system_deadline_ms(d, system_now_ns=system_now, steady_now_ns=steady_now)
    assert ms.tolist() == [(system_now + 5 * NS_PER_S + 999_999) // NS_PER_MS,
                           (system_now - NS_PER_S) // NS_PER_MS, 0]
    back = convert_legacy_ms_deadlines(ms, restore_system_ns=system_now, restore_steady_ns=steady_now)
    assert back[2] == INT64_MIN
    assert (back[:2] <= d[:2]).all() and (d[:2] - back[:2] < NS_PER_MS).all()  # never extended
