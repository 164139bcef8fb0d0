"""After a v1 rollback, clients remount with their REAL segment ids: does upstream see one segment
each, with no overlapping buffers? (issue #14; needs the upstream interop driver, not run in CI)

Drives the ``probe-ids`` command of ``../shared/tools/upstream-interop/interop_driver`` (built by
that directory's build_and_run.sh): the real upstream MasterService restores a v1 snapshot this
project wrote, the owner of one segment calls ReMountSegment with the segment id it holds, fills
the segment with 1 MiB buffers (two allocators over one memory would hand out overlapping
buffers), then UnmountSegment with that id (which must close the restored segment). Every
segment of every scenario is probed in turn.

    python tools/rollback_remount_probe.py DRIVER WORKDIR [scenario ...]

Scenarios: both real fixtures (upstream -> engine -> v1); a fresh engine whose clients mount with
their own ids; a promoted state whose clients remount with their ids (adopted at remount); a
journaled primary -> standby -> promotion -> remount. Prints one line per probe and a summary;
exit status 1 if any probe fails.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.ha.standby import StandbyService
from mooncake_columnar.ha.stores import FileOpLogStore
from mooncake_columnar.ha.writer import OpLogWriter
from mooncake_columnar.snapshots.manager import SnapshotManager, restore_master
from mooncake_columnar.snapshots.repository import SnapshotRepository

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mooncake_v1"
MB = 1 << 20
WRITER = "4242-4343"


def client(i: int) -> str:
    return f"{7000 + i}-{9000 + 3 * i}"


def real_id(i: int) -> str:  # what a client's Segment.id would be
    return f"{123456789 + i}-{987654321 + 11 * i}"


def clocks() -> ManualClocks:
    return ManualClocks(steady_ns=9_000_000_000_000, system_ns=time.time_ns())


def config() -> MasterConfig:
    return MasterConfig(default_kv_lease_ttl_ms=3_600_000, require_upstream_client_ids=True)


SEGMENTS = [("seg_p", 0x10_0000_0000, (24 << 20) + 1234), ("seg_q", 0x20_0000_0000, 16 << 20)]


def seg_dict(i: int, *, with_id: bool = True) -> dict:
    name, base, size = SEGMENTS[i]
    d = dict(name=name, endpoint=f"10.0.0.{i + 1}:17777", client=client(i), base=base, size=size)
    return dict(d, segment_id=real_id(i)) if with_id else d


def fill(m: MasterService, n: int = 300) -> None:
    for i in range(n):
        m.put_start(f"k/{i:05d}", 700 + (i * 977) % 20_000, client_id=WRITER,
                    config=ReplicateConfig(replica_num=2 if i % 10 == 0 else 1))
        m.put_end(f"k/{i:05d}", client_id=WRITER)
    for i in range(0, n, 4):
        m.remove(f"k/{i:05d}", force=True)


def write_v1(m: MasterService, root: Path) -> None:
    if root.exists():
        shutil.rmtree(root)
    with SnapshotManager(m, SnapshotRepository(root / "mooncake_master_snapshot"), write_v1=True) as sm:
        sm.snapshot_now()


def client_segments(m: MasterService) -> list[dict]:
    """Each segment as its owner holds it (the segment id the engine knows it by)."""
    return [{"name": s.name, "segment_id": s.segment_id, "owner_client_id": s.client, "base": s.base,
             "size": s.capacity, "te_endpoint": s.endpoint} for s in m.segment_info().values()]


# ---- scenarios: each returns (root of the v1 snapshot, the segments as their clients hold them) ---
def fixture(name: str, work: Path) -> tuple[Path, list[dict]]:
    expected = json.loads((FIXTURES / name / "expected.json").read_text())
    m, _ = restore_master(SnapshotRepository(FIXTURES / name / "mooncake_master_snapshot"), clocks=clocks(),
                          drop_expired=False, config=MasterConfig(default_kv_lease_ttl_ms=3_600_000))
    write_v1(m, work / "root")
    return work / "root", [dict(s) for s in expected["segments"]]  # the ids upstream's clients hold


def fresh_with_client_ids(work: Path) -> tuple[Path, list[dict]]:
    m = MasterService(config(), clocks=clocks())
    for i in range(len(SEGMENTS)):
        d = seg_dict(i)
        m.mount_segment(d["name"], endpoint=d["endpoint"], client_id=d["client"], base=d["base"], size=d["size"],
                        segment_id=d["segment_id"])
    fill(m)
    write_v1(m, work / "root")
    return work / "root", client_segments(m)


def promoted_then_remounted(work: Path) -> tuple[Path, list[dict]]:
    src = MasterService(config(), clocks=clocks())
    for i in range(len(SEGMENTS)):  # mounted without ids: the master generated them
        d = seg_dict(i, with_id=False)
        src.mount_segment(d["name"], endpoint=d["endpoint"], client_id=d["client"], base=d["base"], size=d["size"])
    fill(src)
    m = MasterService.from_state(src.export_state(), config=src.config, clocks=src.clocks, segments_readable=False)
    for i in range(len(SEGMENTS)):  # the clients remount with their own ids
        m.remount_segments(client(i), [seg_dict(i)])
    write_v1(m, work / "root")
    return work / "root", client_segments(m)


def standby_promoted(work: Path) -> tuple[Path, list[dict]]:
    c = clocks()
    store_dir = work / "oplog"
    if store_dir.exists():
        shutil.rmtree(store_dir)
    writer = OpLogWriter(FileOpLogStore(store_dir), window=4096, clocks=c)
    m = MasterService(config(), clocks=c, journal=writer)
    for i in range(len(SEGMENTS)):
        d = seg_dict(i)
        m.mount_segment(d["name"], endpoint=d["endpoint"], client_id=d["client"], base=d["base"], size=d["size"],
                        segment_id=d["segment_id"])
    fill(m)
    writer.flush()
    standby = StandbyService(FileOpLogStore(store_dir), config=config(), clocks=c)
    standby.bootstrap()
    new = standby.promote(timeout_s=5.0)
    for i in range(len(SEGMENTS)):
        new.remount_segments(client(i), [seg_dict(i)])
    write_v1(new, work / "root")
    return work / "root", client_segments(new)


SCENARIOS = {
    "fixture_small_6": lambda w: fixture("small_6", w),
    "fixture_many_1000": lambda w: fixture("many_1000", w),
    "fresh_with_client_ids": fresh_with_client_ids,
    "promoted_then_remounted": promoted_then_remounted,
    "standby_promoted": standby_promoted,
}


def probe(driver: str, root: Path, segs: list[dict], first: int, out: Path) -> dict:
    order = segs[first:] + segs[:first]  # the driver probes the first segment listed
    segs_file = out.with_suffix(".segs.json")
    segs_file.write_text(json.dumps(order))
    with open(out.with_suffix(".log"), "w") as log:
        rc = subprocess.run([driver, "probe-ids", str(root), str(out), str(segs_file)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "TZ": "UTC"}).returncode
    if rc != 0:
        return {"error": f"driver rc={rc}, see {out.with_suffix('.log')}"}
    return json.loads(out.read_text())


def verdict(p: dict, seg: dict) -> list[str]:
    """What is wrong with one probe (empty: the real id found its restored segment)."""
    if "error" in p:
        return [p["error"]]
    bad = []
    named = [s for s in p["after_remount"] if s["name"] == seg["name"]]
    if [s["segment_id"] for s in named] != [seg["segment_id"]]:
        bad.append(f"after remount: {len(named)} segment(s) named {seg['name']} {named}")
    if p["remount_with_client_id"] != 0:
        bad.append(f"remount error {p['remount_with_client_id']}")
    chk = p["buffers_after_remount_fill"]
    if chk["overlaps"] or chk["outside"]:
        bad.append(f"overlaps {chk['overlaps']}, outside {chk['outside']}")
    if p["unmount_with_client_id"] != 0 or any(s["name"] == seg["name"] for s in p["after_unmount"]):
        bad.append("UnmountSegment with the real id left the segment mounted")
    if p["putstart_after_unmount"] != f"not on {seg['name']}":
        bad.append(f"after unmount a put landed {p['putstart_after_unmount']}")
    return bad


def main() -> int:
    driver, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    failures, probes = 0, 0
    for name in sys.argv[3:] or SCENARIOS:
        build = SCENARIOS[name]
        case = work / name
        case.mkdir(exist_ok=True)
        root, segs = build(case)
        for i, seg in enumerate(segs):
            p = probe(driver, root, segs, i, case / f"probe_{seg['name']}.json")
            bad = verdict(p, seg)
            probes += 1
            failures += bool(bad)
            chk = p.get("buffers_after_remount_fill", {})
            print(f"{name} {seg['name']} id={seg['segment_id']}: "
                  + ("PASS" if not bad else "FAIL " + "; ".join(bad))
                  + f" (segments after remount {len(p.get('after_remount', []))}, 1 MiB fills "
                    f"{p.get('fill_1MiB_after_remount')}, buffers {chk.get('buffers')}, "
                    f"overlaps {chk.get('overlaps')})",
                  flush=True)
    print(f"remount probes: {probes - failures}/{probes} pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
