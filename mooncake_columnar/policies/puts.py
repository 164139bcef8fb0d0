"""Puts: the ReplicateConfig rules, abandoned-put discard at put_start, tenant quota admission,
replica width, and put_end (journaled: a range of keys completes only once its entries hold
window space)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import compile_helper
from ..clock import NS_PER_MS
from ..config import MAX_TTL_MS, MasterConfig
from ..errors import ErrorCode, InvalidParams
from ..kernels import objects as ok
from ..messages import ReplicateConfig
from ..schema import (FLAG_HARD_PINNED, FLAG_LIVE, FLAG_PENDING_SOFT_PIN, FLAG_PROCESSING, MAX_KEY_BYTES, NO_DEADLINE,
                      ST_COMPLETE, ObjectDataType, ReplicaStatus, SoftPinAction)
from ..store.metadata import MetadataStore
from ..validation import require_bool, require_int, require_str, validate_tenant
from . import eviction as ev

if TYPE_CHECKING:
    from .service import Service


def resolve_put_config(store: MetadataStore, cfg: MasterConfig, config: ReplicateConfig) -> tuple[int, int, int]:
    """Validate a ReplicateConfig; returns (tenant code, flags, pending soft-pin ttl ns)."""
    if not isinstance(config, ReplicateConfig):
        raise InvalidParams("config must be a ReplicateConfig")
    require_int("replica_num", config.replica_num, 1, cfg.max_replica_num)
    hard = require_bool("hard_pin", config.hard_pin)
    require_str("group_id", config.group_id, allow_empty=True)
    tenant = validate_tenant(config.tenant_id)
    try:
        ObjectDataType(config.data_type)
    except (ValueError, TypeError):
        raise InvalidParams(f"unknown data_type {config.data_type!r}") from None
    for s in config.preferred_segments:
        require_str("preferred_segments item", s)
    ttl_ms = resolve_soft_pin(cfg, config)
    flags = int(FLAG_LIVE | FLAG_PROCESSING) | (int(FLAG_HARD_PINNED) if hard else 0)
    if ttl_ms:
        flags |= int(FLAG_PENDING_SOFT_PIN)
    return store.tenants.code(tenant), flags, ttl_ms * NS_PER_MS


def resolve_soft_pin(cfg: MasterConfig, config: ReplicateConfig) -> int:
    """Upstream ResolveSoftPinRequest; returns the ENABLE ttl in ms (0: no pin)."""
    try:
        action = SoftPinAction(config.soft_pin_action)
    except (ValueError, TypeError):
        raise InvalidParams(f"unknown soft_pin_action {config.soft_pin_action!r}") from None
    ttl = config.soft_pin_ttl_ms
    if action != SoftPinAction.ENABLE:
        if ttl is not None:
            raise InvalidParams(f"soft_pin_ttl_ms is only valid with ENABLE, not {action.name}")
        return 0
    if ttl is None:
        return cfg.default_kv_soft_pin_ttl_ms
    ttl = require_int("soft_pin_ttl_ms", ttl, 0, MAX_TTL_MS)
    if ttl > cfg.max_kv_soft_pin_ttl_ms:
        raise InvalidParams(f"soft_pin_ttl_ms {ttl} exceeds max_kv_soft_pin_ttl_ms")
    return ttl


def start(m: "Service", offsets: np.ndarray, data: np.ndarray, sizes: np.ndarray, client: str,
          config: ReplicateConfig, *, helper_body: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    """put_start of the keys ``offsets``/``data``: per key, the code and the new row (-1).
    ``helper_body``: what the forked helper of a process's first put runs meanwhile
    (compile_helper.py): calls of the service, which passes it."""
    s, cfg = m.store, m.config
    tenant, flags, pending_ttl_ns = resolve_put_config(s, cfg, config)
    client_code = s.clients.code(client)  # before any change: a full dictionary refuses the put
    now_ms = m.clocks.system_ns() // NS_PER_MS
    o = s.objects
    n = offsets.size - 1
    codes = np.zeros(n, np.int32)
    rows_out = np.full(n, -1, np.int64)
    lengths = np.diff(offsets)
    codes[(lengths == 0) | (lengths > MAX_KEY_BYTES) | (sizes <= 0)] = ErrorCode.INVALID_PARAMS
    s.release_discarded(now_ms)

    discard_ms = cfg.put_start_discard_timeout_s * 1000
    if s.inflight.any_started_before(now_ms - discard_ms):
        # some in-flight put may be abandoned: find existing keys first and discard those
        found = s.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))
        exists = (found >= 0) & (codes == 0)
        rows = found[exists]
        # complete, recently started, or removed but not yet durable (journal): all block
        chains = o.chains(rows)
        status = o.replica_status[chains.rows]
        held = chains.any((status == ST_COMPLETE) | (status == int(ReplicaStatus.REMOVED)))
        blocked = held | (o.put_start_ms(rows) + discard_ms >= now_ms)
        codes[np.flatnonzero(exists)[blocked]] = ErrorCode.OBJECT_ALREADY_EXISTS
        s.discard_puts(np.unique(rows[~blocked]), cfg.put_start_release_timeout_s * 1000)
    # otherwise every existing key is complete or recent: the insert kernel reports it

    picks = np.flatnonzero(codes == 0)
    if s.ledger_on and picks.size:
        picks = admit_quota(m, tenant, config, sizes, picks, codes)
    if picks.size == 0:
        return codes, rows_out
    width = replica_width(s, config.replica_num, offsets, data, picks, tenant)
    preferred = np.array([s.segments.code(name) for name in config.preferred_segments], np.int64)
    helper = compile_helper.start_for_first_put(helper_body)  # None but in a fresh process on an empty Numba cache
    try:
        new = s.insert_puts(picks, offsets, data, tenant, sizes, width, preferred, codes, rows_out)
    finally:
        if helper is not None:
            helper.wait()
    o.client[new] = client_code
    slots = s.inflight.take(new)
    s.inflight.started(slots, now_ms)
    o.set_put_start(new, now_ms)
    s.inflight.pending_soft_pin_ttl_ns[slots] = pending_ttl_ns
    if pending_ttl_ns:  # the deadline's slot, written when put_end commits the pin
        s.soft_pins.add(new, NO_DEADLINE)
    o.flags[new] = flags
    o.data_type[new] = int(config.data_type)
    if config.group_id and new.size:
        gcode = s.group_code(config.tenant_id, config.group_id)
        s.group_of.add(new, gcode)
        ok.link_group_members(new, gcode, s.group_head, s.group_of.links(), o.flags)
    s.charge(new, +1)
    if (codes == ErrorCode.NO_AVAILABLE_HANDLE).any():
        m.metrics.inc("put_start_alloc_failures", int((codes == ErrorCode.NO_AVAILABLE_HANDLE).sum()))
        # PR #3141: arm eviction only when eviction could fix it (enough memory segments)
        if int(s.segments.allocatable.sum()) >= config.replica_num:
            m.eviction_armed = True
    return codes, rows_out


def replica_width(store: MetadataStore, replica_num: int, offsets: np.ndarray, data: np.ndarray,
                  picks: np.ndarray, tenant: int) -> int:
    """Replicas a put may place: at most one per allocatable segment (as upstream). The
    (rows x slots) replica columns widen to at most ``hot_slots_max``, and only when a new
    key may really need more slots than they have (a call whose keys all exist already
    widens nothing); a wider put keeps its other replicas in continuation rows."""
    o = store.objects
    width = max(1, min(replica_num, int(store.segments.allocatable.sum())))
    if o.slots < width <= o.hot_slots_max:
        n = offsets.size - 1
        if (store.keys.lookup_batch(offsets, data, np.full(n, tenant, np.int32))[picks] < 0).any():
            o.ensure_slots(width)
    return width


def admit_quota(m: "Service", tenant: int, config: ReplicateConfig, sizes: np.ndarray, picks: np.ndarray,
                codes: np.ndarray) -> np.ndarray:
    """Multi-tenant admission: keys past the tenant's quota get TENANT_QUOTA_EXCEEDED after
    up to two rounds of evicting that tenant's expired objects (upstream retries)."""
    ledger = m.store.ledger
    quota = m.config.tenant_quota_bytes.get(config.tenant_id)
    if quota is None:
        codes[picks] = ErrorCode.TENANT_NOT_REGISTERED
        return picks[:0]
    need = np.cumsum(sizes[picks] * config.replica_num)
    for _ in range(2):
        deficit = int(need[-1]) - (quota - ledger.used(tenant))
        if deficit <= 0:
            break
        if ev.evict_tenant_for_quota(m, tenant, deficit) == 0:
            break
    over = need > quota - ledger.used(tenant)
    codes[picks[over]] = ErrorCode.TENANT_QUOTA_EXCEEDED
    if over.any():
        m.metrics.inc("tenant_quota_rejects", int(over.sum()), tenant=config.tenant_id)
    return picks[~over]


def end(m: "Service", offsets: np.ndarray, data: np.ndarray, client: str, tenant_id: str) -> np.ndarray:
    """put_end of the keys ``offsets``/``data`` by ``client``: per-key codes."""
    s = m.store
    rows = s.lookup(offsets, data, tenant_id)
    codes = np.where(rows < 0, np.int32(ErrorCode.OBJECT_NOT_FOUND), np.int32(0)).astype(np.int32)
    client_code = s.clients.find(client)
    journal = m.journal
    if journal is None:
        s.complete_puts(rows, client_code, m.clocks.steady_ns(), codes)
        return codes
    # Journaled: a range of keys completes only once the PUT_END entries of the puts it
    # completes hold window space, so no object is ever visible without its entry; ranges
    # cut at every window's worth of completions (a loop per window, not per key).
    o = s.objects
    pos = np.flatnonzero(rows >= 0)
    completes = (o.client[rows[pos]] == client_code) & ((o.flags[rows[pos]] & FLAG_PROCESSING) != 0)
    pos = pos[completes]
    if pos.size > 1:  # a key named twice completes at its first position
        _, first = np.unique(rows[pos], return_index=True)
        pos = np.sort(pos[first])
    w = journal.window
    bounds = np.concatenate(([0], pos[w::w], [rows.size]))
    for i in range(bounds.size - 1):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        done = rows[pos[i * w:(i + 1) * w]]
        res = journal.reserve(int(done.size)) if done.size else None
        if done.size and res is None:  # window stayed full: these keys stay PROCESSING
            rest = codes[lo:]
            refused = rest == 0
            rest[refused] = ErrorCode.UNAVAILABLE_IN_CURRENT_STATUS
            m.metrics.inc("put_end_oplog_backpressure", int(refused.sum()))
            break
        s.complete_puts(rows[lo:hi], client_code, m.clocks.steady_ns(), codes[lo:hi])
        if res is not None:
            journal.submit_put_ends(res, done)
    return codes
