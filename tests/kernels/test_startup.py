"""A fresh process compiles only what its first put and get run, once each, and nothing once
the cache is filled (``bench startup`` times the same processes)."""
from __future__ import annotations

import pytest

from mooncake_columnar.compile_helper import why_not
from mooncake_columnar.tools.bench_startup import first_call_figures

pytestmark = pytest.mark.timeout(600)  # three fresh processes, one compiling: ~10 s alone, minutes on a busy host

# the modules whose kernels a put_start, put_end and get_replica_list run
# put (allocation, objects, hashing), put_end's in-flight slot index, the single get (reads, read_columns)
FIRST_CALL_MODULES = {"mooncake_columnar.kernels.allocation", "mooncake_columnar.kernels.objects",
                      "mooncake_columnar.kernels.hashing", "mooncake_columnar.kernels.slot_index",
                      "mooncake_columnar.kernels.reads", "mooncake_columnar.kernels.read_columns"}

PUT_MODULES = {"mooncake_columnar.kernels.allocation", "mooncake_columnar.kernels.objects",
               "mooncake_columnar.kernels.hashing", "mooncake_columnar.kernels.slot_index"}


def test_first_put_and_get_compile_only_their_kernels_and_a_filled_cache_compiles_none(tmp_path):
    figures = first_call_figures(tmp_path)

    assert figures["kernels_compiled_at_import"] == 0
    compiled = figures["compile_seconds_by_kernel_empty_cache"]
    assert compiled and {name.rsplit(".", 1)[0] for name in compiled} <= FIRST_CALL_MODULES, compiled
    # the key-index helpers (hash_key, probe_until) compile once: put, put_end and the
    # single get hash and probe with the same argument types (read_one views its key bytes as a
    # put's key buffer), and put_end's one key takes no staged batch kernel
    assert figures["most_specialisations_of_one_kernel"] == 1, figures
    assert not {"mooncake_columnar.kernels.hashing._find_rows", "mooncake_columnar.kernels.reads._read_batch"} & set(
        compiled), compiled
    # each kernel's CPU seconds beside its wall seconds, within the process's own CPU seconds
    cpu = figures["compile_cpu_seconds_by_kernel_empty_cache"]
    assert cpu.keys() == compiled.keys() and all(s > 0 for s in cpu.values()), cpu
    assert sum(cpu.values()) <= figures["first_call_cpu_seconds_empty_cache"]
    assert figures["kernels_compiled_filled_cache"] == 0
    assert figures["first_call_seconds_filled_cache"] < figures["first_call_seconds_empty_cache"]


def test_first_call_compiles_put_end_and_get_kernels_in_a_helper_while_the_put_compiles(tmp_path):
    if why_not() in ("no fork on this platform", "one CPU"):
        pytest.skip(why_not())
    figures = first_call_figures(tmp_path)

    # the helper compiled put_end's and the get's kernels into the cache: after the put, this
    # process compiled nothing (it loaded them), and it compiled only the put's modules
    assert figures["compile_helper_outcome_empty_cache"] == "done", figures
    assert figures["kernels_compiled_after_the_put_empty_cache"] == [], figures
    compiled = figures["compile_seconds_by_kernel_empty_cache"]
    assert {name.rsplit(".", 1)[0] for name in compiled} <= PUT_MODULES, compiled
    assert figures["compile_helper_cpu_seconds_empty_cache"] > 0
    # a filled cache forks no helper
    assert figures["compile_helper_outcome_filled_cache"] == "not run: get kernel compiled or cached"
