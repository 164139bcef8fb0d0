"""The key index: exactly the live rows, each found by its own key."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import prange

from ..kernels.jit import njit
from ..kernels import hashing as hk
from ..kernels.predicates import is_live
from ..schema import FLAG_LIVE

from .report import CHUNKS, ROW_MASK, fail, row_name

if TYPE_CHECKING:
    from .engine import Engine


# ================================================================================ key index
@njit(cache=True, nogil=True, parallel=True)
def _check_key_refs(hw, flags, key_refs, row_tenant, arena_used, n_tenants):
    """First LIVE row whose key reference lies outside the arena or tenant is unknown, or -1."""
    step = (hw + CHUNKS - 1) // CHUNKS
    bad = np.full(CHUNKS, -1, np.int64)
    for c in prange(CHUNKS):
        for r in range(c * step, min(hw, (c + 1) * step)):
            if not is_live(flags[r]):
                continue
            ref = key_refs[r]
            off = hk.ref_offset(ref)
            ln = hk.ref_length(ref)
            t = row_tenant[r]
            if ln == 0 or off < 0 or off + ln > arena_used or t < 0 or t >= n_tenants:
                bad[c] = r
                break
    for c in range(CHUNKS):
        if bad[c] >= 0:
            return bad[c]
    return -1


_NOT_LIVE = np.uint32(0xFFFFFFFF)  # above every 31-bit tag


@njit(cache=True, nogil=True, parallel=True)
def _row_tags(hw, flags, key_refs, row_tenant, arena):
    """The index tag (hashing.hash_tag of hashing.hash_key) of every LIVE row, _NOT_LIVE for the
    others, in row order: a sequential pass over the key bytes. The index scan then reads one
    array per slot instead of two (its row accesses are the random ones)."""
    tags = np.empty(hw, np.uint32)
    step = (hw + CHUNKS - 1) // CHUNKS
    for c in prange(CHUNKS):
        for r in range(c * step, min(hw, (c + 1) * step)):
            if is_live(flags[r]):  # a free row's key_ref is stale: never read through it
                ref = key_refs[r]
                tags[r] = hk.hash_tag(hk.hash_key(arena, hk.ref_offset(ref), hk.ref_length(ref), row_tenant[r]))
            else:
                tags[r] = _NOT_LIVE
    return tags


@njit(inline="always", cache=True)
def _same_key(arena, ref_a, tenant_a, ref_b, tenant_b):
    """Two rows hold the same (tenant, key) (rows whose refs are known to lie in the arena)."""
    if tenant_a != tenant_b:
        return False
    n = hk.ref_length(ref_a)
    if hk.ref_length(ref_b) != n:
        return False
    a, b = hk.ref_offset(ref_a), hk.ref_offset(ref_b)
    for i in range(n):
        if arena[a + i] != arena[b + i]:
            return False
    return True


_IX_OK, _IX_SLOT, _IX_LOOKUP, _IX_FULL = 0, 1, 2, 3


@njit(inline="always", cache=True)
def _earlier_equal_key(table, i, home, v, arena, key_refs, row_tenant, tags, hw):
    """Does a slot of the probe run from ``home`` up to slot i hold another row with slot i's
    (tenant, key)? Then a lookup stops there first (only tag matches compare key bytes). A slot
    naming no LIVE row is skipped here: its own visit reports it, and its key is not read."""
    r = v & ROW_MASK
    p = home
    while p != i:
        w = table[p]
        if (w >> 32) == (v >> 32):
            other = w & ROW_MASK
            if other < hw and tags[other] != _NOT_LIVE:
                if _same_key(arena, key_refs[r], row_tenant[r], key_refs[other], row_tenant[other]):
                    return True
        p = hk.next_slot(p, table.shape[0])
    return False


@njit(cache=True, nogil=True, parallel=True)
def _scan_index(table, tags, hw, key_refs, row_tenant, arena):
    """One sequential pass over the index table (regions in parallel). A lookup of row r's own
    key (hashing.find_row) finds r exactly when: r's slot holds r's tag, r's home slot (from
    its tag, hashing.tag_home) lies in the same run of occupied slots at or before it, and no earlier slot
    of that run holds an equal key. Returns (occupied slots, first bad slot or -1, problem)."""
    size = table.shape[0]
    regions = min(CHUNKS, size)
    bad = np.full(regions, -1, np.int64)
    problem = np.zeros(regions, np.int64)
    count = np.zeros(regions, np.int64)
    for g in prange(regions):
        lo = hk.region_start(g, size, regions)
        hi = size if g == regions - 1 else hk.region_start(g + 1, size, regions)
        run = lo  # the run holding slot lo starts after the last empty slot before it
        for back in range(1, size + 1):
            if table[(lo - back) % size] == hk.EMPTY_SLOT:
                run = (lo - back + 1) % size
                break
            if back == size:
                run = -1  # no empty slot at all: a probe for a missing key would never end
        if run < 0:
            bad[g] = lo
            problem[g] = _IX_FULL
            continue
        n = 0
        for i in range(lo, hi):
            v = table[i]
            if v == hk.EMPTY_SLOT:
                run = hk.next_slot(i, size)
                continue
            r = v & ROW_MASK
            if v < 0 or r >= hw or tags[r] == _NOT_LIVE:
                bad[g] = i
                problem[g] = _IX_SLOT
                break
            tag = v >> 32
            home = hk.tag_home(tag, size)
            if tag != tags[r] or (i - home) % size > (i - run) % size:
                bad[g] = i
                problem[g] = _IX_LOOKUP
                break
            if _earlier_equal_key(table, i, home, v, arena, key_refs, row_tenant, tags, hw):
                bad[g] = i
                problem[g] = _IX_LOOKUP
                break
            n += 1
        count[g] = n
    for g in range(regions):
        if bad[g] >= 0:
            return count.sum(), bad[g], problem[g]
    return count.sum(), -1, _IX_OK


def check_key_index(m: "Engine", *, lookups: bool = True) -> None:
    """The index's count and every LIVE row's key reference; with ``lookups``, also that every
    index slot names a LIVE row found by its own key (a pass that hashes every key and walks the
    table: the most expensive check of verify_engine)."""
    o, k = m.store.objects, m.store.keys
    hw = o.high_water
    if k.count != o.live_count:
        fail("index_count", f"key index count {k.count} != live_count {o.live_count}")
    if not 0 <= k.arena_used <= k.arena.size:
        fail("key_ref", f"arena_used {k.arena_used} outside the arena of {k.arena.size} bytes")
    r = _check_key_refs(hw, o.flags, o.key_ref, o.tenant, k.arena_used, len(m.store.tenants))
    if r >= 0:
        fail("key_ref", f"row {r}: key_ref {int(o.key_ref[r]):#x} / tenant code {int(o.tenant[r])} "
                         f"outside the arena ({k.arena_used} bytes) or the tenant dictionary")
    if not lookups:
        return
    tags = _row_tags(hw, o.flags, o.key_ref, o.tenant, k.arena)
    occupied, slot, problem = _scan_index(k.table, tags, hw, o.key_ref, o.tenant, k.arena)
    if problem == _IX_FULL:
        fail("index_count", f"index table of {k.table.size} slots has no empty slot")
    if problem == _IX_SLOT:
        v = int(k.table[slot])
        fail("index_slot", f"index slot {slot} holds {v:#x}: row {v & 0xFFFFFFFF} is not a LIVE row")
    if problem == _IX_LOOKUP:
        fail("index_lookup", f"{row_name(m, int(k.table[slot]) & 0xFFFFFFFF)} (index slot {slot}) is not "
                              f"found by its own key")
    if occupied != o.live_count:  # every slot holds a distinct LIVE row: some LIVE row is missing
        indexed = np.zeros(hw, np.bool_)
        indexed[hk.slot_rows(k.table)] = True
        missing = np.flatnonzero(((o.flags[:hw] & FLAG_LIVE) != 0) & ~indexed)
        who = row_name(m, int(missing[0])) if missing.size else "a LIVE row"
        fail("index_lookup", f"{occupied} index entries for {o.live_count} LIVE rows: {who} is not found "
                              f"by its own key")


