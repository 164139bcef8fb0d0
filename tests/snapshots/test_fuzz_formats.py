"""Seeded fuzz of every stored format (issue 13): damaged and forged snapshots, oplog batches and
oplog store records are refused with a typed error or load into an engine that passes
``verify()``; never a crash, an untyped error, a hang, a broken engine or a silent partial restore.

The default run does MOONCAKE_FUZZ_CASES (default 200) cases per format, fixed seeds, in worker
subprocesses (mooncake_columnar/testing/fuzz.py); ``make fuzz`` runs 1000 per format and prints
the summary table.
"""
from __future__ import annotations

import os

import pytest

from mooncake_columnar.testing.fuzz import FAILURE_OUTCOMES, failure_report, mutate, run_case, run_cases, summary_table
from mooncake_columnar.testing.fuzz_formats import ETCD_ENV, FORMATS, V1_FIXTURES_ENV
from tests.fixtures import MOONCAKE_V1 as FIXTURES

CASES = int(os.environ.get("MOONCAKE_FUZZ_CASES", "200"))
# The first test that asks for the results runs every case: about 0.15 s per case for all formats.
FUZZ_TIMEOUT = pytest.mark.timeout(300 + CASES)

INTEGRITY_ERRORS = ("SnapshotDigestError", "OpLogChecksumError")


@pytest.fixture
def v1_fixtures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(V1_FIXTURES_ENV, str(FIXTURES))


@pytest.fixture(scope="module")
def fuzz_results(etcd) -> dict[str, list[dict]]:
    results = run_cases(FORMATS, CASES, env={V1_FIXTURES_ENV: str(FIXTURES), ETCD_ENV: etcd.endpoint})
    print("\n" + summary_table(results) + "\n" + failure_report(results))
    return results


@FUZZ_TIMEOUT
@pytest.mark.parametrize("name", list(FORMATS))
def test_fuzzed_format_is_refused_typed_or_loads_a_verified_engine(fuzz_results, name: str) -> None:
    results = fuzz_results[name]
    assert len(results) == CASES
    failures = [r for r in results if r["outcome"] in FAILURE_OUTCOMES]
    assert not failures, failure_report({name: failures})


@FUZZ_TIMEOUT
@pytest.mark.parametrize("name", list(FORMATS))
def test_fuzz_cases_get_past_the_integrity_checks(fuzz_results, name: str) -> None:
    # Forged cases recompute digests and checksums: most cases must reach the decoder's own
    # validation or load, or the fuzz would only test the digest.
    results = fuzz_results[name]
    past = [r for r in results if r.get("error") not in INTEGRITY_ERRORS]
    assert len(past) > CASES // 2
    assert any(r["outcome"] == "accepted" for r in results)
    assert any(r["outcome"] == "rejected" for r in results)


def test_a_case_is_the_same_mutation_for_the_same_seed(v1_fixtures) -> None:
    for fmt in FORMATS.values():
        first, again = mutate(fmt, 5), mutate(fmt, 5)
        assert first == again
        assert mutate(fmt, 6)[:2] != first[:2]


def test_a_crash_and_a_hang_are_counted_and_the_run_continues() -> None:
    results = run_cases(["harness_selftest"], 5, timeout_s=5)["harness_selftest"]
    assert [r["outcome"] for r in results] == ["crash", "hang", "untyped", "rejected", "accepted"]
    assert "Segmentation fault" in results[0]["detail"]
    assert "exit status -11" in results[0]["error"]


def test_a_v1_shard_key_collision_is_never_a_silent_accept(v1_fixtures) -> None:
    # Two shards under one msgpack map key: a dict keeps one of them. The harness must flag the
    # accepted-with-fewer-objects result (or the decoder must refuse it): never "accepted".
    fmt = FORMATS["v1"]
    seed = next(s for s in range(500) if "duplicate map key" in mutate(fmt, s)[1])
    assert run_case("v1", seed)["outcome"] in ("partial", "rejected")
