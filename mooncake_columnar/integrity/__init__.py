"""The engine's self-check: every structural invariant of a MasterService, in columnar passes.

:func:`verify_engine` runs one check after another and raises :class:`EngineInvariantError` on
the first violation (``.check`` is a stable id, the message names the offending segment, row or
key). Every per-row pass is a Numba kernel or a vectorised NumPy expression; Python loops only
over segments, tenants and group codes (few).

Checks, in order:

* ``segment_registry``: ``by_name``/``info`` agree; unmounted codes hold no allocator state.
* ``live_count``, ``free_rows``, ``replica_chain``: LIVE rows below high_water == live_count;
  each continuation row (kernels/chains.py) is in exactly one LIVE object's chain, names it
  (ObjectTable.continuation_owner, which names no other row; ``continuation_owner_slots`` and
  ``_index``: its side-table bookkeeping) and carries its size, and their number is
  cont_count; the free-row stack is duplicate-free, below high_water, holds no LIVE or
  continuation row, and free + live + continuation == high_water.
* ``replica_row``, ``replica_id``, ``replica_segment``, ``replica_extent``,
  ``replica_alignment``: every in-use replica slot belongs to a LIVE row (or one of its
  continuation rows) and has an id in
  [1, next_replica_id); every in-use MEMORY slot (and every pending discarded extent) lies on a
  mounted segment, inside its capacity, at an offset aligned to its allocation unit (a slot's
  offset column counts units, so only a discarded extent can be unaligned).
* ``free_list``, ``extent_overlap``, ``free_overlap``, ``free_list_gap``, ``segment_used``:
  each segment's free list is sorted, non-empty, coalesced and inside capacity; held extents
  (ak.held_end rule, discarded ones included) do not overlap each other or free space; on an
  allocatable segment free + held tile the whole capacity and ``used`` is the held sum. A
  mounted segment that takes no allocations (a standby's, or a promoted or unreadably restored
  one awaiting its remount) keeps an allocator nobody maintains: oplog apply places replicas
  without allocating (ha.apply), frees skip it (objects.clear_slots), and the remount rebuilds
  it from the replicas (recovery). There only its own shape, ``used + free == capacity`` and
  the no-overlap rule among held extents hold.
* ``index_count``, ``index_slot``, ``key_ref``, ``index_lookup``: the key index holds exactly
  live_count entries, each pointing at a LIVE row, and every LIVE row is found by its own key
  (hashing.find_row's answer, checked as one sequential pass over the table: see _scan_index).
* ``inflight_slots``, ``inflight_index``, ``inflight_row``, ``inflight_claim``: the
  InflightTable's free stack is the exact complement of its in-use slots, only in-use slots name
  an owner row, and its row index holds exactly the in-use slots; a LIVE row holds a slot (found
  through the index) iff it is PROCESSING, and every in-use slot is held by exactly one LIVE
  row; a free row holds none.
* ``soft_pin_slots``, ``soft_pin_index``, ``soft_pin_row``, ``soft_pin_claim``: the SoftPinTable
  keeps the same bookkeeping; a LIVE row that is SOFT_PIN_ENABLED or PENDING_SOFT_PIN holds a
  deadline slot, a row that is not LIVE holds none, and every in-use slot's owner finds it.
* ``group_table_slots``, ``group_table_index``, ``group_member``, ``group_link``, ``group_head``:
  the GroupTable (side table of group codes) keeps its bookkeeping and holds a code for grouped
  LIVE rows only; grouped LIVE rows form one circular list per group code (the table's
  ``next`` links), members share the code and FLAG_GROUPED, ``group_head[g]`` is a member of g
  or -1 for an empty group.
* ``tenant_ledger`` (multi-tenant mode): pending/committed equal a from-scratch charge of every
  LIVE row (store.ledger.TenantLedger.charge).
* ``replica_id_unique``: no replica id is used twice.
* ``standby_replica_ids`` (a standby container): its replica-id index (store/replica_ids.py) holds
  exactly the ids of the held replicas.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

from ..errors import EngineInvariantError

from .extents import check_allocators, check_slots
from .key_index import check_key_index
from .rows import (check_groups, check_inflight, check_ledger, check_replica_ids, check_rows, check_soft_pins,
                   check_segment_registry)

if TYPE_CHECKING:
    from .engine import Engine


# ================================================================================ entry point
def verify_engine(m: "Engine", *, key_lookups: bool = True) -> None:
    """Raise EngineInvariantError naming the first broken invariant (caller holds the lock).
    ``key_lookups=False`` leaves out the ``index_slot`` / ``index_lookup`` pass: for an engine
    whose key index was just bulk-built from its rows (kernels/index_load.py inserts each LIVE
    row once, at the end of its own probe run, after checking its (tenant, key) is absent), which
    establishes exactly what that pass checks.

    The checks run on two threads (their kernels release the GIL): the row, slot, extent, ledger
    and id checks here (the ledger and id kernels walk chains and ids only those before them
    proved sound), the index and side-table checks (which read nothing unchecked) on the other.
    Each thread stops at its first violation, and the one raised is the first in the order above."""
    def extents() -> None:
        check_segment_registry(m)
        check_allocators(m, check_slots(m, check_rows(m)))

    tables = (partial(check_key_index, m, lookups=key_lookups), partial(check_inflight, m),
              partial(check_soft_pins, m), partial(check_groups, m))
    after = [partial(check_ledger, m), partial(check_replica_ids, m)]
    if m.standby_replica_ids is not None:
        after.append(partial(m.standby_replica_ids.verify, m.store))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mooncake-verify") as pool:
        other = pool.submit(_run, tables)
        first = _run((extents,))
        if first is None:
            first = _run(after)  # ordered after the other thread's checks: its failure comes first
            first = other.result() or first
    if first is not None:
        raise first


def _run(checks: Sequence[Callable[[], None]]) -> EngineInvariantError | None:
    """Run ``checks`` in order; the first violation, or None."""
    try:
        for check in checks:
            check()
    except EngineInvariantError as e:
        return e
    return None
