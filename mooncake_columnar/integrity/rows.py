"""Segment registry, free rows, in-flight slots, group lists, the tenant ledger, replica ids."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ..kernels.jit import njit
from ..kernels.chains import next_row
from ..kernels.predicates import is_grouped, is_live, is_put_in_flight
from ..kernels.slot_index import find_slot
from ..schema import FLAG_GROUPED, FLAG_LIVE
from ..store.side_table import RowSideTable
from ..store.rare_fields import SOFT_PIN_FLAGS
from ..store.upstream_ids import is_upstream_uuid

from .report import MEM, COMPLETE, EMPTY, PROCESSING, fail, row_name, seg_name

_SOFT_PIN_FLAGS = int(SOFT_PIN_FLAGS)

if TYPE_CHECKING:
    from .engine import Engine


# ================================================================================ segments, rows
def check_segment_registry(m: "Engine") -> None:
    s = m.store.segments
    for code, info in enumerate(s.info):  # one iteration per segment code
        if info is None:
            if s.used[code] or s.extents.count[code] or s.allocatable[code]:
                fail("segment_registry", f"unmounted segment code {code} keeps allocator state")
        elif s.by_name.get(info.name) != code or s.capacity[code] != info.size:
            fail("segment_registry", f"{seg_name(m, code)}: name index or capacity disagrees")
        elif not is_upstream_uuid(info.segment_id) or s.by_id.get(info.segment_id) != code:
            fail("segment_registry", f"{seg_name(m, code)}: segment id {info.segment_id!r} is not an "
                                      "upstream UUID string, or the id index disagrees")
    if len(s.by_name) != sum(i is not None for i in s.info) or len(s.by_id) != len(s.by_name):
        fail("segment_registry", "segment name or id index holds unmounted segments")


@njit(cache=True, nogil=True)
def _check_free_stack(free_rows, free_count, hw, flags):
    """(0, -1) or (problem, stack position): 1 out of range, 2 LIVE, 3 listed twice."""
    seen = np.zeros(hw, np.bool_)
    for i in range(free_count):
        r = free_rows[i]
        if r < 0 or r >= hw:
            return 1, i
        if is_live(flags[r]):
            return 2, i
        if seen[r]:
            return 3, i
        seen[r] = True
    return 0, -1


@njit(cache=True, nogil=True)
def _claim_chains(hw, flags, more, cont_owner, sizes, claimed):
    """Walk the chain of every LIVE row of [0, hw), marking its continuation rows in
    ``claimed``. (0, -1) or (problem, row): 1 a link out of range, 2 a continuation row that is
    LIVE, 3 a row reached twice (a shared tail or a cycle), 4 a continuation row that does not
    name its object or carries another size."""
    for r in range(hw):
        if not is_live(flags[r]):
            continue
        c = next_row(more, r)
        while c >= 0:
            if c >= hw:
                return 1, r
            if is_live(flags[c]):
                return 2, c
            if claimed[c]:
                return 3, c
            if cont_owner[c] != r or sizes[c] != sizes[r]:
                return 4, c
            claimed[c] = True
            c = next_row(more, c)
    return 0, -1


def check_chains(m: "Engine") -> np.ndarray:
    """Replica chains (kernels/chains.py): each continuation row belongs to exactly one LIVE
    object's chain, names it and carries its size; no other row links anywhere. Returns the
    continuation rows as a mask over [0, high_water)."""
    o = m.store.objects
    hw = o.high_water
    claimed = np.zeros(hw, np.bool_)
    if not o.replica_more.size:
        if o.cont_count:
            fail("replica_chain", f"cont_count is {o.cont_count} but no row has a continuation")
        return claimed
    owners = o.continuation_owner
    _check_side_table(owners, "continuation_owner")
    held, owner = owners.held()
    if held.size and (held.min() < 0 or held.max() >= hw):
        fail("replica_chain", f"the continuation owner table names an object for a row outside [0, {hw})")
    problem, r = _claim_chains(hw, o.flags, o.replica_more, owners.dense(held, owner, hw), o.size_bytes, claimed)
    if problem:
        what = {1: f"{row_name(m, r)} links past high_water {hw}",
                2: f"continuation row {r} is LIVE", 3: f"row {r} is in two chains or in a cycle",
                4: f"continuation row {r} does not name its object or has another size"}[problem]
        fail("replica_chain", what)
    stray = np.flatnonzero((o.replica_more[:hw] >= 0) & ~claimed & ((o.flags[:hw] & FLAG_LIVE) == 0))
    if stray.size:
        fail("replica_chain", f"row {int(stray[0])} is neither LIVE nor in a chain but links to row "
                               f"{int(o.replica_more[stray[0]])}")
    unclaimed = held[~claimed[held]]
    if unclaimed.size:
        fail("replica_chain", f"row {int(unclaimed[0])} names an object but is in no chain")
    if int(claimed.sum()) != o.cont_count:
        fail("replica_chain", f"{int(claimed.sum())} continuation rows in chains, cont_count is {o.cont_count}")
    return claimed


def check_rows(m: "Engine") -> np.ndarray:
    """Free stack, live and continuation rows; returns the rows that may hold replica slots
    (LIVE rows and their continuation rows) as a mask over [0, high_water)."""
    o = m.store.objects
    hw = o.high_water
    live = int(np.count_nonzero(o.flags[:hw] & FLAG_LIVE))
    if live != o.live_count:
        fail("live_count", f"{live} LIVE rows below high_water {hw}, live_count is {o.live_count}")
    if not 0 <= o.free_count <= o.free_rows.size:
        fail("free_rows", f"free_count {o.free_count} outside the free stack of {o.free_rows.size}")
    problem, at = _check_free_stack(o.free_rows, o.free_count, hw, o.flags)
    if problem:
        r = int(o.free_rows[at])
        what = {1: f"row {r} is outside [0, high_water {hw})", 2: f"{row_name(m, r)} is LIVE",
                3: f"row {r} is listed twice"}[problem]
        fail("free_rows", f"free stack position {at}: {what}")
    conts = check_chains(m)
    listed = o.free_rows[:o.free_count]
    if conts[listed].any():
        fail("free_rows", f"continuation row {int(listed[conts[listed]][0])} is on the free stack")
    if o.free_count + o.live_count + o.cont_count != hw:
        fail("free_rows", f"free_count {o.free_count} + live_count {o.live_count} + continuation rows "
                           f"{o.cont_count} != high_water {hw}")
    return conts | ((o.flags[:hw] & FLAG_LIVE) != 0)


# ================================================================================ in-flight
@njit(cache=True, nogil=True)
def _claim_slots(hw, flags, index, in_use, owner, claims):
    """Count the LIVE rows holding each in-flight slot (a row's slot: found through ``index``,
    with no per-row column of slots). (0, -1) or (problem, row): 1 PROCESSING
    without a slot, 2 slot out of range, 3 a slot without PROCESSING, 4 the slot is free,
    5 a second row claims the slot, 6 the slot names another owner row, 7 a freed row keeps a
    slot (release_rows drops it, so background work can never reach a freed row)."""
    cap = in_use.shape[0]
    for r in range(hw):
        f = flags[r]
        slot = find_slot(index, owner, r)
        if not is_live(f):
            if slot != -1:
                return 7, r
            continue
        if slot == -1:
            if is_put_in_flight(f):
                return 1, r
            continue
        if slot < 0 or slot >= cap:
            return 2, r
        if not is_put_in_flight(f):
            return 3, r
        if not in_use[slot]:
            return 4, r
        claims[slot] += 1
        if claims[slot] > 1:
            return 5, r
        if owner[slot] != r:
            return 6, r
    return 0, -1


def _check_side_table(t: RowSideTable, what: str) -> None:
    """A row side table's own bookkeeping (store/side_table.py): its free stack is the exact
    complement of the in-use slots, only in-use slots name an owner row, and its row index holds
    exactly the in-use slots. ``what`` prefixes the check names."""
    cap = t.in_use.size
    if not 0 <= t.free_count <= min(cap, t.free_slots.size):
        fail(f"{what}_slots", f"free_count {t.free_count} outside [0, capacity {cap}]")
    free = t.free_slots[:t.free_count]
    if free.size and (free.min() < 0 or free.max() >= cap):
        fail(f"{what}_slots", f"free slot stack holds a slot outside [0, {cap})")
    if t.in_use[free].any():
        fail(f"{what}_slots", f"slot {int(free[t.in_use[free]][0])} is both free and in use")
    if np.bincount(free, minlength=1).max() > 1:
        fail(f"{what}_slots", f"slot {int(np.argmax(np.bincount(free)))} is on the free stack twice")
    in_use = int(np.count_nonzero(t.in_use))
    if in_use + t.free_count != cap:
        fail(f"{what}_slots", f"{in_use} in-use + {t.free_count} free slots != capacity {cap}")
    stray = np.flatnonzero(~t.in_use & (t.row[:cap] != -1))
    if stray.size:
        fail(f"{what}_slots", f"free slot {int(stray[0])} still names owner row {int(t.row[stray[0]])}")
    indexed = t.index[t.index >= 0]
    if t.index.size & (t.index.size - 1) or 2 * indexed.size > t.index.size:
        fail(f"{what}_index", f"row index of {t.index.size} entries holds {indexed.size}: not a power of two "
                              "at most half full")
    if indexed.size != in_use or (indexed.size and (indexed.max() >= cap or not t.in_use[indexed].all())):
        fail(f"{what}_index", f"row index holds {indexed.size} slots, not the {in_use} in-use ones")


def check_inflight(m: "Engine") -> None:
    t, o = m.store.inflight, m.store.objects
    _check_side_table(t, "inflight")
    cap = t.in_use.size
    claims = np.zeros(cap, np.int32)
    problem, r = _claim_slots(o.high_water, o.flags, t.index, t.in_use, t.row, claims)
    if problem:
        slot = int(t.slots_of(np.array([r]))[0])
        what = {1: "is PROCESSING without an in-flight slot", 2: f"points at slot {slot} (out of range)",
                3: f"holds in-flight slot {slot} but is not PROCESSING",
                4: f"points at free in-flight slot {slot}",
                5: f"claims in-flight slot {slot}, which another LIVE row already holds",
                6: f"claims in-flight slot {slot}, whose owner is row {int(t.row[max(slot, 0)])}",
                7: f"is free but keeps in-flight slot {slot}"}[problem]
        fail("inflight_claim" if problem in (5, 6) else "inflight_row", f"{row_name(m, r)} {what}")
    orphan = np.flatnonzero(t.in_use & (claims == 0))
    if orphan.size:
        s = int(orphan[0])
        fail("inflight_claim", f"in-flight slot {s} is in use (owner row {int(t.row[s])}) but no LIVE row "
                                f"holds it")


@njit(cache=True, nogil=True)
def _pin_rows(hw, flags, index, owner):
    """(0, -1) or (problem, row): 1 the first soft-pinned (or pin-awaiting) LIVE row without a
    deadline slot, else 2 the first row not LIVE that holds one (slots found through ``index``,
    with no per-row column of slots)."""
    stray = -1
    for r in range(hw):
        live = is_live(flags[r])
        if live and not (flags[r] & _SOFT_PIN_FLAGS):
            continue
        slot = find_slot(index, owner, r)
        if live and slot < 0:
            return 1, r
        if not live and slot >= 0 and stray < 0:
            stray = r
    return (0, -1) if stray < 0 else (2, stray)


def check_soft_pins(m: "Engine") -> None:
    t, o = m.store.soft_pins, m.store.objects
    _check_side_table(t, "soft_pin")
    hw = o.high_water
    problem, r = _pin_rows(hw, o.flags, t.index, t.row)
    if problem:
        what = ("is soft-pinned (or awaits its pin) without a deadline slot" if problem == 1
                else "is not a LIVE object but holds a soft-pin slot")
        fail("soft_pin_row", f"{row_name(m, r)} {what}")
    held = np.flatnonzero(t.in_use)
    owner = t.row[held]
    found = (owner >= 0) & (owner < hw)
    found[found] = t.slots_of(owner[found]) == held[found]
    lost = ~found
    if lost.any():
        fail("soft_pin_claim", f"soft-pin slot {int(held[lost][0])} is in use (owner row {int(owner[lost][0])}) "
                               "but no row holds it")


# ================================================================================ groups
@njit(cache=True, nogil=True)
def _link_pass(hw, flags, group, group_next, n_groups, members, indegree):
    """Per grouped LIVE row: its code is known and its successor (``group_next``: dense, from
    the group table's links) is a LIVE member of the same group. Counts members and
    predecessors. (0, -1) or (problem, row): 1 bad code, 2 successor outside the group."""
    for r in range(hw):
        f = flags[r]
        if not is_live(f) or not is_grouped(f):
            continue
        nxt = np.int64(group_next[r])
        g = group[r]
        if g < 0 or g >= n_groups:
            return 1, r
        if nxt < 0 or nxt >= hw:
            return 2, r
        fn = flags[nxt]
        if not is_live(fn) or not is_grouped(fn) or group[nxt] != g:
            return 2, r
        members[g] += 1
        indegree[nxt] += 1
    return 0, -1


@njit(cache=True, nogil=True)
def _walk_groups(group_head, group_next, flags, group, members, hw):
    """(0, -1) or (problem, group code): 1 head invalid, 2 the members are not one cycle.
    group_next is a permutation of the grouped rows here, so a walk from the head returns to it."""
    for g in range(group_head.shape[0]):
        h = group_head[g]
        if g >= members.shape[0] or members[g] == 0:
            if h != -1:
                return 1, g
            continue
        if h < 0 or h >= hw:
            return 1, g
        if not is_live(flags[h]) or not is_grouped(flags[h]) or group[h] != g:
            return 1, g
        n = 1
        r = np.int64(group_next[h])
        while r != h:
            n += 1
            r = np.int64(group_next[r])
        if n != members[g]:
            return 2, g
    return 0, -1


def check_groups(m: "Engine") -> None:
    o = m.store.objects
    hw = o.high_water
    n_groups = len(m.store.group_names)
    if len(m.store.groups) != n_groups or m.store.group_head.size < n_groups:
        fail("group_head", f"{len(m.store.groups)} group codes, {n_groups} names, {m.store.group_head.size} heads")
    members = np.zeros(max(1, n_groups), np.int64)
    indegree = np.zeros(hw, np.int32)
    t = m.store.group_of
    _check_side_table(t, "group_table")
    held, _ = t.held()
    if held.size and (held.min() < 0 or held.max() >= hw
                      or ((o.flags[held] & (FLAG_LIVE | FLAG_GROUPED)) != (FLAG_LIVE | FLAG_GROUPED)).any()):
        fail("group_member", f"the group table holds a code for {held.size} rows, not all of them grouped LIVE rows")
    grouped = (o.flags[:hw] & (FLAG_LIVE | FLAG_GROUPED)) == (FLAG_LIVE | FLAG_GROUPED)
    # no grouped row and no code held (the usual case): no member list, only the heads to check
    # (_walk_groups reads the columns of groups with members only)
    lists = bool(held.size) or bool(grouped.any())
    n = hw if lists else 0
    group = t.dense(*t.held(), n)
    group_next = np.full(n, -1, np.int64)  # the member lists as a column: -1 where no slot
    if lists:
        slots = np.flatnonzero(t.in_use)
        group_next[t.row[slots]] = t.next[slots]
        problem, r = _link_pass(hw, o.flags, group, group_next, n_groups, members, indegree)
        if problem:
            what = {1: f"has unknown group code {int(group[r])}",
                    2: f"links to row {int(group_next[r])}, not a LIVE member of its group {int(group[r])}"}[problem]
            fail("group_member", f"{row_name(m, r)} {what}")
        bad = np.flatnonzero(grouped & (indegree != 1))
        if bad.size:
            r = int(bad[0])
            fail("group_link", f"{row_name(m, r)} has {int(indegree[r])} predecessors in its group list")
    problem, g = _walk_groups(m.store.group_head, group_next, o.flags, group, members[:n_groups], hw)
    if problem:
        name = m.store.group_names[g] if g < n_groups else "?"
        what = (f"head {int(m.store.group_head[g])} is not a LIVE member" if problem == 1
                else f"the {int(members[g])} members are not one circular list")
        fail("group_head" if problem == 1 else "group_link", f"group {g} ({name!r}): {what}")


# ================================================================================ ledger, ids
@njit(cache=True, nogil=True)
def _ledger_sums(hw, flags, tenant, size, status, kind, more, n_tenants):
    """store.ledger.TenantLedger.charge over every LIVE row: (pending, committed, bad row or -1)."""
    pending = np.zeros(n_tenants, np.int64)
    committed = np.zeros(n_tenants, np.int64)
    for r in range(hw):
        if not is_live(flags[r]):
            continue
        t = tenant[r]
        if t < 0 or t >= n_tenants:
            return pending, committed, r
        rr = np.int64(r)
        while rr >= 0:
            for j in range(status.shape[1]):
                if kind[rr, j] != MEM:
                    continue
                if status[rr, j] == PROCESSING:
                    pending[t] += size[r]
                elif status[rr, j] == COMPLETE:
                    committed[t] += size[r]
            rr = next_row(more, rr)
    return pending, committed, -1


def check_ledger(m: "Engine") -> None:
    if not m.config.enable_multi_tenants:
        return
    o, ledger = m.store.objects, m.store.ledger
    n = max(len(m.store.tenants), ledger.pending.size, ledger.committed.size)
    pending, committed, r = _ledger_sums(o.high_water, o.flags, o.tenant, o.size_bytes, o.replica_status,
                                         o.replica_kind, o.replica_more, n)
    if r >= 0:
        fail("tenant_ledger", f"row {r} has unknown tenant code {int(o.tenant[r])}")
    for name, want in (("pending", pending), ("committed", committed)):
        have = np.zeros(n, np.int64)
        got = getattr(ledger, name)
        have[:got.size] = got
        bad = np.flatnonzero(have != want)
        if bad.size:
            t = int(bad[0])
            who = repr(m.store.tenants.name(t)) if t < len(m.store.tenants) else f"code {t}"
            fail("tenant_ledger", f"tenant {who}: {name} is {int(have[t])}, its LIVE rows hold {int(want[t])}")


@njit(cache=True, nogil=True)
def _first_duplicate_id(hw, status, rep_id, words):
    """(row, slot) of the first in-use slot whose id an earlier slot already has, via a bitmap
    over [0, next id) (ids were range-checked by _slot_pass), or (-1, -1)."""
    seen = np.zeros(words, np.uint64)
    for r in range(hw):
        for j in range(status.shape[1]):
            if status[r, j] == EMPTY:
                continue
            i = rep_id[r, j]
            w = np.int64(i >> np.uint64(6))
            b = np.uint64(1) << (i & np.uint64(63))
            if seen[w] & b:
                return r, j
            seen[w] |= b
    return -1, -1


def check_replica_ids(m: "Engine") -> None:
    o = m.store.objects
    hw = o.high_water
    in_use = int(np.count_nonzero(o.replica_status[:hw]))
    if m.store.next_replica_id <= 64 * (in_use + (1 << 20)):  # a bitmap of at most ~8 bytes per replica
        r, j = _first_duplicate_id(hw, o.replica_status, o.replica_id, (m.store.next_replica_id + 63) // 64)
        if r < 0:
            return
    else:  # ids spread far wider than the replicas: sort instead
        ids = o.replica_id[:hw][o.replica_status[:hw] != EMPTY]
        ids.sort()
        dup = np.flatnonzero(ids[1:] == ids[:-1])
        if not dup.size:
            return
        hit = (o.replica_id[:hw] == ids[dup[0]]) & (o.replica_status[:hw] != EMPTY)
        r, j = (int(x[0]) for x in np.nonzero(hit))
    fail("replica_id_unique", f"{row_name(m, int(r))} slot {int(j)}: replica id {int(o.replica_id[r, j])} "
                               f"is used twice")


