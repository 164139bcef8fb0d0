"""Kernels compile before a master serves: after warm_up_kernels, no serving path compiles."""
from __future__ import annotations

import sys

import numba
import numpy as np

from mooncake_columnar.warmup import warm_up_kernels


def _compiled_signatures() -> dict[tuple[str, str], int]:
    from numba.core.registry import CPUDispatcher
    return {(name, attr): len(obj.signatures)
            for name, mod in list(sys.modules.items()) if name.startswith("mooncake_columnar")
            for attr, obj in list(vars(mod).items()) if isinstance(obj, CPUDispatcher)}


def test_after_warmup_a_failover_with_remounts_compiles_no_kernel(capsys):
    from mooncake_columnar.tools.demo import run_demo
    warm_up_kernels()
    before = _compiled_signatures()
    assert before and numba.config.DISABLE_JIT == 0
    run_demo(objects=3_000)  # journal, standby, promotion, remounts, eviction: other sizes than warmup's
    after = _compiled_signatures()
    compiled = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not compiled, f"compiled on the serving path after warmup: {compiled}"
    assert "visible" in capsys.readouterr().out


def test_after_warmup_an_eviction_at_the_default_ratio_compiles_no_kernel():
    """The usual cycle (5% of a large master) lists its earliest candidates in the census, whose
    rows are uint32: the kernels that take them were compiled by the warm-up."""
    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.config import MasterConfig
    from mooncake_columnar.kernels import eviction as ek
    from mooncake_columnar.tools.synthetic import build_master
    warm_up_kernels()
    clocks = ManualClocks()
    m = build_master(40_000, clocks=clocks)
    clocks.advance(s=3_600)
    o = m.objects
    o.lease_deadline_ns[: o.high_water] -= np.random.default_rng(4).integers(0, 10**12, o.high_water)
    ratio = MasterConfig().eviction_ratio
    assert ek.listing_bound(ratio, clocks.steady_ns(), o.high_water, o.tenant, -1, o.flags, o.lease_deadline_ns,
                            m.store.soft_pins.parts(), o.replica_status, o.replica_kind, o.replica_segment,
                            o.replica_refcnt, m.store.segments.readable, o.replica_more) is not None
    before = _compiled_signatures()
    assert m.evict(target=ratio).evicted_objects == 2_000
    after = _compiled_signatures()
    compiled = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not compiled, f"compiled by the eviction after warmup: {compiled}"


def test_warmup_runs_once_per_process():
    warm_up_kernels()
    assert warm_up_kernels() == 0.0


def test_after_warmup_restoring_a_snapshot_written_in_ranges_compiles_no_kernel(tmp_path):
    """A large master's snapshot holds several record batches per file (snapshots/streamed.py),
    whose columns convert to NumPy as copies, not read-only views: the restore's kernels must
    still run the signatures the warm-up compiled."""
    from mooncake_columnar.clock import ManualClocks
    from mooncake_columnar.snapshots import streamed
    from mooncake_columnar.snapshots.manager import restore_master
    from mooncake_columnar.snapshots.repository import SnapshotRepository
    from mooncake_columnar.snapshots.writer import publish_payloads
    from mooncake_columnar.store.arrow_export import freeze
    from mooncake_columnar.tools.synthetic import build_master
    warm_up_kernels()
    clocks = ManualClocks()
    m = build_master(3_000, clocks=clocks)
    repo = SnapshotRepository(tmp_path)
    publish_payloads(repo, streamed.frozen_payloads(freeze(m.store, None), None, rows=1_000),
                     clocks.system_ns(), clocks.steady_ns())
    before = _compiled_signatures()
    restored, _ = restore_master(repo, clocks=clocks, drop_expired=False, prefault=False)
    assert restored.object_count() == 3_000
    after = _compiled_signatures()
    compiled = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    assert not compiled, f"compiled by the restore after warmup: {compiled}"
