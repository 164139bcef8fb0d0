"""Plain-Python reference model of the master (dicts and lists, upstream semantics).

It is deliberately naive: one Python object per stored object, linear scans. Tests drive it in
lockstep with MasterService and compare every observable result. Codes are ErrorCode ints.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..clock import INT64_MAX, INT64_MIN, NS_PER_MS
from ..errors import ErrorCode as E

PROCESSING, COMPLETE = 2, 3


@dataclass
class RefReplica:
    replica_id: int
    segment: str
    offset: int
    status: int = PROCESSING


@dataclass
class RefObject:
    client: str
    size: int
    replicas: list[RefReplica]
    put_start_ms: int
    hard: bool
    group: str
    pending_ttl_ns: int = 0
    soft_enabled: bool = False
    soft_deadline: int = INT64_MIN
    lease: int = INT64_MIN
    processing: bool = True


@dataclass
class RefSegment:
    endpoint: str
    client: str
    base: int
    size: int
    free: list[list[int]] = field(default_factory=list)  # sorted [start, length]
    used: int = 0

    def alloc(self, size: int) -> int:
        for i, (start, length) in enumerate(self.free):
            if length >= size:
                if length == size:
                    del self.free[i]
                else:
                    self.free[i] = [start + size, length - size]
                self.used += size
                return start
        return -1

    def release(self, off: int, size: int) -> None:
        self.free.append([off, size])
        self.free.sort()
        merged: list[list[int]] = []
        for s, ln in self.free:
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1][1] += ln
            else:
                merged.append([s, ln])
        self.free = merged
        self.used -= size


class ReferenceMaster:
    def __init__(self, *, lease_ttl_ms: int = 10_000, default_soft_pin_ttl_ms: int = 1_800_000,
                 max_soft_pin_ttl_ms: int = 86_400_000, discard_timeout_s: int = 30,
                 release_timeout_s: int = 600, client_live_ttl_s: int = 10):
        self.ttl = lease_ttl_ms * NS_PER_MS
        self.default_soft_ttl_ms = default_soft_pin_ttl_ms
        self.max_soft_ttl_ms = max_soft_pin_ttl_ms
        self.discard_ms = discard_timeout_s * 1000
        self.release_ms = release_timeout_s * 1000
        self.client_ttl = client_live_ttl_s * 1_000_000_000
        self.objects: dict[tuple[str, str], RefObject] = {}
        self.segment_slots: list[str | None] = []   # segment code order, as the engine assigns codes
        self.segments: dict[str, RefSegment] = {}
        self.group_refresh: set[tuple[str, str]] = set()
        self.discarded: list[tuple[str, int, int, int]] = []  # (segment, offset, size, release_ms)
        self.next_id = 1
        self.ok_clients: set[str] = set()
        self.client_deadline: dict[str, int] = {}
        self.eviction_armed = False
        self.eviction_ratio = 0.05
        self.high_watermark = 0.90
        self.allow_soft = True

    # ---- segments ----------------------------------------------------------------------------
    def mount(self, name, endpoint, client, base, size, now) -> int:
        self.client_deadline[client] = now + self.client_ttl
        seg = self.segments.get(name)
        if seg is not None:
            same = (seg.endpoint, seg.client, seg.base, seg.size) == (endpoint, client, base, size)
            return E.OK if same else E.SEGMENT_ALREADY_EXISTS
        self.segments[name] = RefSegment(endpoint, client, base, size, [[0, size]])
        if None in self.segment_slots:
            self.segment_slots[self.segment_slots.index(None)] = name
        else:
            self.segment_slots.append(name)
        return E.OK

    def unmount(self, name) -> int:
        if name not in self.segments:
            return E.OK
        for k, obj in list(self.objects.items()):
            before = len(obj.replicas)
            obj.replicas = [r for r in obj.replicas if r.segment != name]
            if before and not obj.replicas:
                self._erase(k, free=False)
        self.discarded = [d for d in self.discarded if d[0] != name]
        del self.segments[name]
        self.segment_slots[self.segment_slots.index(name)] = None
        return E.OK

    def ping(self, client, now) -> int:
        self.client_deadline[client] = now + self.client_ttl
        return 0 if client in self.ok_clients else 1

    def expire_clients(self, now) -> list[str]:
        expired = [c for c, d in self.client_deadline.items() if d < now]
        for c in expired:
            del self.client_deadline[c]
            self.ok_clients.discard(c)
            for name in [n for n, s in self.segments.items() if s.client == c]:
                self.unmount(name)
        return expired

    # ---- puts --------------------------------------------------------------------------------
    def put_start(self, tenant, key, size, client, now_ms, *, replica_num=1, hard=False,
                  soft_ttl_ms=0, group="", preferred=(), release=True) -> int:
        if release:  # the engine releases due discarded space once per (batch) put_start
            self._release(now_ms)
        obj = self.objects.get((tenant, key))
        if obj is not None:
            if any(r.status == COMPLETE for r in obj.replicas) or obj.put_start_ms + self.discard_ms >= now_ms:
                return E.OBJECT_ALREADY_EXISTS
            for r in obj.replicas:
                if r.status == PROCESSING:
                    self.discarded.append((r.segment, r.offset, obj.size, obj.put_start_ms + self.release_ms))
            obj.replicas = []
            self._erase((tenant, key), free=False)
        replicas: list[tuple[str, int]] = []
        tried = set()
        for name in preferred:
            if len(replicas) == replica_num:
                break
            if name not in self.segments or name in tried:
                continue
            tried.add(name)
            off = self.segments[name].alloc(size)
            if off >= 0:
                replicas.append((name, off))
        while len(replicas) < replica_num:
            cands = [(-(s.size - s.used), self.segment_slots.index(n), n) for n, s in self.segments.items()
                     if n not in tried and s.size - s.used >= size]
            if not cands:
                break
            name = min(cands)[2]
            tried.add(name)
            off = self.segments[name].alloc(size)
            if off >= 0:
                replicas.append((name, off))
        if not replicas:
            if len(self.segments) >= replica_num:  # eviction could help: arm it (PR #3141)
                self.eviction_armed = True
            return E.NO_AVAILABLE_HANDLE
        reps = []
        for name, off in replicas:
            reps.append(RefReplica(self.next_id, name, off))
            self.next_id += 1
        self.objects[(tenant, key)] = RefObject(client, size, reps, now_ms, hard, group,
                                                pending_ttl_ns=soft_ttl_ms * NS_PER_MS)
        if group:
            self.group_refresh.add((tenant, group))
        return E.OK

    def put_end(self, tenant, key, client, now) -> int:
        obj = self.objects.get((tenant, key))
        if obj is None:
            return E.OBJECT_NOT_FOUND
        if obj.client != client:
            return E.ILLEGAL_CLIENT
        if not obj.processing:
            return E.OK if all(r.status == COMPLETE for r in obj.replicas) else E.INVALID_WRITE
        had_complete = any(r.status == COMPLETE for r in obj.replicas)
        completed = 0
        for r in obj.replicas:
            if r.status == PROCESSING:
                r.status = COMPLETE
                completed += 1
        if obj.pending_ttl_ns and not had_complete and completed:
            obj.soft_deadline = min(INT64_MAX, now + obj.pending_ttl_ns)
            obj.soft_enabled = True
            obj.pending_ttl_ns = 0
        obj.processing = False
        obj.lease = max(obj.lease, now)
        return E.OK

    def put_revoke(self, tenant, key, client) -> int:
        obj = self.objects.get((tenant, key))
        if obj is None:
            return E.OBJECT_NOT_FOUND
        if obj.client != client:
            return E.ILLEGAL_CLIENT
        if not obj.processing or any(r.status != PROCESSING for r in obj.replicas):
            return E.INVALID_WRITE
        self._erase((tenant, key))
        return E.OK

    def _release(self, now_ms) -> int:
        keep = []
        for d in self.discarded:
            if d[3] <= now_ms:
                self.segments[d[0]].release(d[1], d[2])
            else:
                keep.append(d)
        released = len(self.discarded) - len(keep)
        self.discarded = keep
        return released

    def discard_expired_puts(self, now_ms) -> None:
        for k, obj in list(self.objects.items()):
            if obj.processing and obj.put_start_ms + self.release_ms < now_ms and \
                    not any(r.status == COMPLETE for r in obj.replicas):
                for r in obj.replicas:
                    self.discarded.append((r.segment, r.offset, obj.size, obj.put_start_ms + self.release_ms))
                obj.replicas = []
                self._erase(k, free=False)

    # ---- eviction ----------------------------------------------------------------------------
    def _evictable(self, obj) -> bool:
        return any(self.readable(r) for r in obj.replicas)

    def _candidate(self, obj, now, allow_soft) -> bool:
        if obj.hard or now < obj.lease or not self._evictable(obj):
            return False
        return allow_soft or not (obj.soft_enabled and now < obj.soft_deadline)

    def evict(self, target, lower, now, now_ms, row_of) -> int:
        """BatchEvict; ties in lease are broken by the engine's row (``row_of``)."""
        lower = min(lower, target)
        base = sum(1 for o in self.objects.values() if not o.hard and self._evictable(o))
        if base == 0:
            self.eviction_armed = False
            return 0
        order = sorted(self.objects, key=lambda k: (self.objects[k].lease, row_of[k]))
        soft_active = {k for k in order if self.objects[k].soft_enabled and now < self.objects[k].soft_deadline}
        taken: list = []

        def take(keys, want, allow_soft):
            n = 0
            for k in keys:
                if n >= want:
                    break
                obj = self.objects[k]
                if k in taken or not self._candidate(obj, now, allow_soft):
                    continue
                if not obj.group:
                    taken.append(k)
                    n += 1
                    continue
                members = [m for m in self.objects if m[0] == k[0] and self.objects[m].group == obj.group]
                if any(now < self.objects[m].lease for m in members):
                    continue
                for m in members:
                    if m not in taken and self._candidate(self.objects[m], now, allow_soft):
                        taken.append(m)
                        n += 1
            return n

        nopin = [k for k in order if k not in soft_active]
        soft = [k for k in order if k in soft_active] if self.allow_soft else []
        take(nopin, math.ceil(base * target), False)
        released = self._release(now_ms)
        second = math.ceil(base * lower) - len(taken) - released
        if second > 0:
            got = take(nopin, second, False)
            if got < second and self.allow_soft:
                take(soft, second - got, True)
        for k in taken:
            self._erase(k)
        if taken or released:
            self.eviction_armed = False
        return len(taken)

    def tick(self, now, now_ms, row_of) -> int | None:
        self.expire_clients(now)
        self.discard_expired_puts(now_ms)
        cap = sum(s.size for s in self.segments.values())
        used = sum(s.used for s in self.segments.values()) / cap if cap else 0.0
        evicted = None
        if used > self.high_watermark or (self.eviction_armed and self.eviction_ratio > 0):
            target = max(self.eviction_ratio, used - self.high_watermark + self.eviction_ratio)
            lower = max(target * 0.5, used - self.high_watermark)
            evicted = self.evict(target, lower, now, now_ms, row_of)
        self._release(now_ms)
        return evicted

    # ---- reads -------------------------------------------------------------------------------
    def readable(self, r: RefReplica) -> bool:
        return r.status == COMPLETE and r.segment in self.segments

    def _classify(self, tenant, key, now) -> int:
        obj = self.objects.get((tenant, key))
        if obj is None:
            return E.OBJECT_NOT_FOUND
        if any(self.readable(r) for r in obj.replicas):
            self._grant_read(tenant, key, obj, now)
            return E.OK
        return E.REPLICA_IS_NOT_READY

    def _grant_read(self, tenant, key, obj, now) -> None:
        if not obj.group:
            obj.lease = max(obj.lease, now + self.ttl)
            return
        g = (tenant, obj.group)
        if obj.lease <= now + self.ttl // 2 or g in self.group_refresh:
            for (t, _k), o in self.objects.items():
                if t == tenant and o.group == obj.group:
                    o.lease = max(o.lease, now + self.ttl)
            self.group_refresh.discard(g)

    def get(self, tenant, key, now) -> tuple[int, list[tuple[str, int]]]:
        code = self._classify(tenant, key, now)
        if code != E.OK:
            return code, []
        obj = self.objects[(tenant, key)]
        return code, sorted((r.segment, r.replica_id) for r in obj.replicas if self.readable(r))

    def exist(self, tenant, key, now) -> bool:
        return self._classify(tenant, key, now) == E.OK

    # ---- removal -----------------------------------------------------------------------------
    def _removal_code(self, obj, now, force) -> int:
        if not force and now < obj.lease:
            return E.OBJECT_HAS_LEASE
        if any(r.status != COMPLETE for r in obj.replicas):
            return E.REPLICA_IS_NOT_READY
        return E.OK

    def remove(self, tenant, key, now, force=False) -> int:
        obj = self.objects.get((tenant, key))
        if obj is None:
            return E.OBJECT_NOT_FOUND
        code = self._removal_code(obj, now, force)
        if code == E.OK:
            self._erase((tenant, key))
        return code

    def remove_all(self, now, force=False, tenant=None) -> int:
        doomed = [k for k, o in self.objects.items()
                  if (tenant is None or k[0] == tenant) and self._removal_code(o, now, force) == E.OK]
        for k in doomed:
            self._erase(k)
        return len(doomed)

    def remove_by_regex(self, tenant, pattern, now, force=False) -> int:
        rx = re.compile(pattern)
        doomed = [k for k, o in self.objects.items()
                  if k[0] == tenant and rx.search(k[1]) and self._removal_code(o, now, force) == E.OK]
        for k in doomed:
            self._erase(k)
        return len(doomed)

    def _erase(self, k, free=True) -> None:
        obj = self.objects.pop(k)
        if free:
            for r in obj.replicas:
                if r.segment in self.segments:
                    self.segments[r.segment].release(r.offset, obj.size)

    # ---- inspection --------------------------------------------------------------------------
    def usage(self) -> dict[str, tuple[int, int]]:
        return {n: (s.used, s.size) for n, s in self.segments.items()}
