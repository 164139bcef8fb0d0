"""Read kernels (get_replica_list, exist_key and their batches): lookup, readability, the read
lease, and the readable replicas' descriptors.

The batch kernel is staged by blocks of keys so that their cache misses overlap instead of
following one another (hashing.locate_block: hashes, home slots, candidate rows, key bytes);
the candidates' own columns are prefetched too, speculatively, before any key is verified; only
then is each key verified and classified, its data by now in cache. Batches run its parallel
variant, which is also the faster one on a single thread (1.6-2.2x the serial compile of the same
function on 1M keys, measured with one thread).

Per-key helpers here are inlined and loop-free where they receive arrays, and the rare calls
(an index probe past a foreign tag, a group's lease walk) are made from the kernel body:
see kernels/leases.grant_read_lease for what the other shapes cost.
"""
from __future__ import annotations

import numpy as np
from numba import prange, set_parallel_chunksize

from .jit import njit

from ..errors import ErrorCode
from ..schema import CODE_DTYPE, KIND_MEMORY
from . import hashing as hk
from .allocation import offset_shift
from .chains import next_row
from .dispatch import BATCH_MIN, variant
from .leases import grant_group_read_lease, grant_read_lease
from .nrt_free import nrt_free, nrt_free_core
from .predicates import is_readable_replica, slot_in_use, slot_is_removed
from .prefetch import prefetch
from .read_columns import columns_at, key_view

OK = int(ErrorCode.OK)
NOT_FOUND = int(ErrorCode.OBJECT_NOT_FOUND)
NOT_READY = int(ErrorCode.REPLICA_IS_NOT_READY)
_BLOCK = 64
_MEM_KIND = int(KIND_MEMORY)  # its replicas' segment column is a segment code
_TENANT = CODE_DTYPE.type  # the tenant column's dtype


@njit(inline="always", cache=True)
def read_code(r, rep_status, rep_kind, rep_seg, seg_readable, more):
    """get/exist of row ``r`` before its lease: OK (some replica readable), NOT_FOUND (also
    r < 0, or every replica REMOVED) or NOT_READY."""
    if r < 0:
        return NOT_FOUND
    readable = False
    all_removed = True
    rr = r
    while rr >= 0:
        for j in range(rep_status.shape[1]):
            st = rep_status[rr, j]
            if not slot_in_use(st):
                continue
            if not slot_is_removed(st):
                all_removed = False
            if is_readable_replica(st, rep_kind[rr, j], rep_seg[rr, j], seg_readable):
                readable = True
        rr = next_row(more, rr)
    if readable:
        return OK
    return NOT_FOUND if all_removed else NOT_READY


@njit(inline="always", cache=True)
def _prefetch_rows(m, cand, flags, lease, rep_status, rep_kind, rep_seg):
    """Prefetch the candidate rows' columns that the classification reads (speculatively: a
    candidate is the key's row unless another key shares its tag)."""
    for t in range(m):
        r = cand[t]
        if r >= 0:
            prefetch(flags, r)
            prefetch(lease, r)
            prefetch(rep_status, (r, 0))
            prefetch(rep_kind, (r, 0))
            prefetch(rep_seg, (r, 0))


@njit(inline="always", cache=True)
def _prefetch_descriptors(m, cand, size_bytes, rep_id, rep_offset):
    """Prefetch the candidate rows' columns that the descriptors read."""
    for t in range(m):
        r = cand[t]
        if r >= 0:
            prefetch(size_bytes, r)
            prefetch(rep_id, (r, 0))
            prefetch(rep_offset, (r, 0))


@njit(inline="always", cache=True)
def _describe_key(i, r, k, end, rep_status, rep_kind, rep_seg, seg_readable, more, rep_id, rep_offset, size_bytes,
                  seg_base, seg_unit_bits, out_i, out_id, out_seg, out_addr, out_size):
    """The readable replicas of key ``i`` (row ``r``) written from output slot ``k`` on, those
    at slot ``end`` and past it left out; returns the slot after its last (written or not)."""
    other = seg_base.shape[0] - 1
    rr = r
    while rr >= 0:
        for j in range(rep_status.shape[1]):
            kind = rep_kind[rr, j]
            if not is_readable_replica(rep_status[rr, j], kind, rep_seg[rr, j], seg_readable):
                continue
            if k < end:
                s = rep_seg[rr, j] if kind == _MEM_KIND else other
                out_i[k] = i
                out_id[k] = rep_id[rr, j]
                out_seg[k] = s
                out_addr[k] = seg_base[s] + (np.int64(rep_offset[rr, j]) << seg_unit_bits[s])
                out_size[k] = size_bytes[rr]
            k += 1
        rr = next_row(more, rr)
    return k


_SPANS = 64  # the batch's blocks are split into this many spans of consecutive blocks, which the
             # parallel variant's threads take one at a time (``set_parallel_chunksize(1)``): with the
             # default static split into one share per thread, a thread that the busy host
             # deschedules holds up the whole call (2 threads were slower than 1 on a loaded host)


@njit(cache=True)
def _read_batch(table, arena, key_refs, row_tenant, offsets, data, tenants, now, ttl_ns, flags, lease, group_links,
                rep_status, rep_kind, rep_seg, seg_readable, more, rep_id, rep_offset, size_bytes, seg_base,
                seg_unit_bits, want_replicas, codes, key_base, k0, out_i, out_id, out_seg, out_addr, out_size):
    """Read codes of keys ``offsets``/``data`` (``tenants``: hashing.tenant_at) into
    ``codes``, the read lease granted on OK; and, if ``want_replicas``, the readable replicas
    of the OK keys as columns ``(key index, replica id, segment code, address, size)`` in key
    order, key ``i`` as index ``key_base + i``: written to ``out_*`` from slot ``k0`` on when
    they fit there with a full row of slots per key, else to new arrays; returns ``(count,
    fits, the new arrays)`` (empty when they fit). A memory replica's segment code is its
    segment (address: ``seg_base[code]`` + its offset column shifted by
    ``seg_unit_bits[code]``, see allocation.offset_shift); any other replica's is
    ``len(seg_base) - 1`` (``seg_base`` and ``seg_unit_bits`` end with 0: its address is the
    offset).

    One pass over spans of blocks (``prange``: the parallel variant runs spans on several
    threads, the serial one in order): each span classifies its keys and grants their leases,
    then writes their readable replicas while its rows are still in cache, into the span's
    region of ``out_*`` (a full row of slots per key); the regions are then moved together.
    A span whose replicas overflow its region (an object with continuation rows) only counts
    them, and a second pass writes every descriptor to new arrays at its place counted from
    the spans' totals instead.

    Leases granted concurrently are the same as one after another. Every write here is a
    max-update of ``lease`` to the one value ``now + ttl_ns`` or the clearing of the group
    refresh bit in ``flags`` (the only bit written, under the master lock: nothing else
    writes these rows meanwhile). Two threads racing on a row (a key twice in the batch, two
    keys of one group) both write that same value, so the row ends at max(old, now + ttl_ns)
    and the bit cleared either way. A group is walked when one of its keys finds a stale lease
    or the refresh mark; a walk only makes the group's leases fresh and clears the mark, so the
    groups walked are those with such a key before the batch, in any order (a racing key may
    walk its group twice, writing the same values). The codes and descriptors read neither
    column.
    """
    n = offsets.shape[0] - 1
    blocks = (n + _BLOCK - 1) // _BLOCK
    per_span = (blocks + _SPANS - 1) // _SPANS
    spans = (blocks + per_span - 1) // per_span if blocks else 0
    width = rep_status.shape[1] if want_replicas else 0  # output slots per key in a span's region
    if k0 + n * width > out_i.shape[0]:  # no room (the slots widened since the outputs were made)
        width = 0
    # np.empty: the parallel variant makes np.full and np.zeros parallel loops of their own, a
    # region to start per call (chunks of a batch are small); the spans write every entry
    rows = np.empty(n if want_replicas else 0, np.int64)  # of the OK keys (-1: not OK), for a second pass
    span_count = np.empty(spans + 1, np.int64)
    span_count[0] = 0
    hs = np.empty((spans, _BLOCK), np.uint64)
    cand = np.empty((spans, _BLOCK), np.int64)
    # each span's loops are a call without reference counting (:mod:`.nrt_free`): lowered here,
    # the per-key helpers' array references cost atomic counts per key
    # (two calls, not one: at about 25 arrays, Numba's reference-count pruning leaves a call's
    # increfs and decrefs in the serial variant's loop, tests/kernels/test_refcounts.py)
    for c in prange(spans):
        _classify_span(c, c * per_span * _BLOCK, min(n, (c + 1) * per_span * _BLOCK), hs, cand, table, arena,
                       key_refs, row_tenant, offsets, data, tenants, now, ttl_ns, flags, lease, group_links,
                       rep_status, rep_kind, rep_seg, seg_readable, more, size_bytes, rep_id, rep_offset,
                       want_replicas, codes, rows)
        span_count[c + 1] = 0
        if want_replicas:  # the span's rows are still in cache
            lo, hi = c * per_span * _BLOCK, min(n, (c + 1) * per_span * _BLOCK)
            span_count[c + 1] = _describe_span(lo, hi, k0 + lo * width, k0 + hi * width, key_base, rows, rep_status,
                                               rep_kind, rep_seg, seg_readable, more, rep_id, rep_offset, size_bytes,
                                               seg_base, seg_unit_bits, out_i, out_id, out_seg, out_addr,
                                               out_size) - k0 - lo * width
    fits = True
    for c in range(spans):
        if span_count[c + 1] > (min(n, (c + 1) * per_span * _BLOCK) - c * per_span * _BLOCK) * width:
            fits = False
        span_count[c + 1] += span_count[c]
    total = span_count[spans]
    if fits:
        _pack_spans(spans, k0, per_span * _BLOCK * width, span_count, out_i, out_id, out_seg, out_addr, out_size)
        total_new = 0
    else:
        total_new = total
    new_i = np.empty(total_new, np.int64)
    new_id = np.empty(total_new, rep_id.dtype)
    new_seg = np.empty(total_new, out_seg.dtype)
    new_addr = np.empty(total_new, np.int64)
    new_size = np.empty(total_new, np.int64)
    for c in prange(0 if fits else spans):
        _describe_span(c * per_span * _BLOCK, min(n, (c + 1) * per_span * _BLOCK), span_count[c], total, key_base,
                       rows, rep_status, rep_kind, rep_seg, seg_readable, more, rep_id, rep_offset, size_bytes,
                       seg_base, seg_unit_bits, new_i, new_id, new_seg, new_addr, new_size)
    return total, fits, new_i, new_id, new_seg, new_addr, new_size


@nrt_free_core
def _pack_spans(spans, k0, region, span_count, out_i, out_id, out_seg, out_addr, out_size):
    """The spans' replicas together from slot ``k0`` on: span ``c``'s, written from its region's
    start ``k0 + c * region``, moved to ``k0 + span_count[c]``. In span order, each moves down or
    stays, so none lands on replicas not yet moved."""
    for c in range(spans):
        src, k = k0 + c * region, k0 + span_count[c]
        for q in range(span_count[c + 1] - span_count[c] if src != k else 0):
            out_i[k + q] = out_i[src + q]
            out_id[k + q] = out_id[src + q]
            out_seg[k + q] = out_seg[src + q]
            out_addr[k + q] = out_addr[src + q]
            out_size[k + q] = out_size[src + q]


@nrt_free_core
def _classify_span(c, lo, hi, span_hs, span_cand, table, arena, key_refs, row_tenant, offsets, data, tenants, now,
                   ttl_ns, flags, lease, group_links, rep_status, rep_kind, rep_seg, seg_readable, more, size_bytes,
                   rep_id, rep_offset, want_replicas, codes, rows):
    """:func:`_read_batch`'s pass over keys lo..hi (whole blocks) of span ``c`` (its scratch
    rows of ``span_hs``/``span_cand``: views taken here count no references): codes, leases,
    rows; with ``want_replicas`` the candidates' descriptor columns are prefetched too, for
    :func:`_describe_span` right after."""
    hs, cand = span_hs[c], span_cand[c]
    for b in range(lo, hi, _BLOCK):
        m = min(_BLOCK, hi - b)
        hk.locate_block(b, m, table, arena, key_refs, row_tenant, offsets, data, tenants, hs, cand)
        _prefetch_rows(m, cand, flags, lease, rep_status, rep_kind, rep_seg)
        if want_replicas:
            _prefetch_descriptors(m, cand, size_bytes, rep_id, rep_offset)
        for t in range(m):
            i = b + t
            r = hk.verified_row(i, cand[t], arena, key_refs, row_tenant, offsets, data, tenants)
            if r == hk.PROBE_ON:
                s = offsets[i]
                r = hk.find_row(table, arena, key_refs, row_tenant, data, s, offsets[i + 1] - s,
                                hk.tenant_at(tenants, i), hs[t])
            code = read_code(r, rep_status, rep_kind, rep_seg, seg_readable, more)
            codes[i] = code
            if code == OK and grant_read_lease(r, now, ttl_ns, lease, flags):
                grant_group_read_lease(r, now, ttl_ns, lease, flags, group_links)
            if want_replicas:
                rows[i] = r if code == OK else -1


@nrt_free_core
def _describe_span(lo, hi, k, end, key_base, rows, rep_status, rep_kind, rep_seg, seg_readable, more, rep_id,
                   rep_offset, size_bytes, seg_base, seg_unit_bits, out_i, out_id, out_seg, out_addr, out_size):
    """The readable replicas of the OK keys lo..hi (``rows``: -1 where a key is not OK) written
    from output slot ``k`` on, those at slot ``end`` and past it only counted; returns the slot
    after the last."""
    for i in range(lo, hi):
        if rows[i] >= 0:
            k = _describe_key(key_base + i, rows[i], k, end, rep_status, rep_kind, rep_seg, seg_readable, more, rep_id,
                              rep_offset, size_bytes, seg_base, seg_unit_bits, out_i, out_id, out_seg, out_addr,
                              out_size)
    return k


_read_batch_parallel = variant(_read_batch, "_parallel", nogil=True, parallel=True)


def read_batch(table, arena, key_refs, row_tenant, offsets, *args):
    """See :func:`_read_batch`: batches drop the GIL and run on the threading layer's threads
    (:mod:`.dispatch`)."""
    if offsets.shape[0] <= BATCH_MIN:
        return _read_batch(table, arena, key_refs, row_tenant, offsets, *args)
    previous = set_parallel_chunksize(1)  # spans one at a time (see _SPANS); this thread's setting
    try:
        return _read_batch_parallel(table, arena, key_refs, row_tenant, offsets, *args)
    finally:
        set_parallel_chunksize(previous)


@nrt_free
def read_one(columns, key, tenant, now, ttl_ns):
    """Single-key get_replica_list and exist_key: ``(code, row, group, count, replica_id, kind,
    segment, offset, size)`` with the lease granted on OK. ``columns``: the address of the
    columns' table (kernels/read_columns.py: one integer to unbox, not 15 arrays). ``group``: the
    caller grants the group's lease (leases.grant_group_read_lease over the group table's arrays,
    which only grouped objects need). ``offset``: the replica's byte offset in its segment
    (allocation.offset_shift). ``count``: the object's readable replicas (on OK); when it is 1, the
    rest are that replica's slot values (its row's size), so the caller builds its one descriptor
    without reading the columns again (else they are 0). ``key``: the key's bytes (a ``bytes``
    object: no NumPy array per call); nothing is allocated either."""
    # the key as a put's key buffer (store/keys.py: a read-only uint8 view, no copy) from offset
    # int64 0, and the tenant as its column's dtype: the lookup then reuses the hash and probe that
    # the put path compiled for those types, not specialisations of its own (empty Numba cache).
    # Every array here is a view that holds no reference: no reference counting (nrt_free)
    (table, arena, key_refs, row_tenant, flags, lease, rep_status, rep_kind, rep_seg, seg_readable, more, rep_id,
     rep_offset, size_bytes, unit_bits) = columns_at(columns)
    return _read_one(table, arena, key_refs, row_tenant, flags, lease, rep_status, rep_kind, rep_seg, seg_readable,
                     more, rep_id, rep_offset, size_bytes, unit_bits, key_view(key), _TENANT(tenant), now, ttl_ns)


@nrt_free_core
def _read_one(table, arena, key_refs, row_tenant, flags, lease, rep_status, rep_kind, rep_seg, seg_readable, more,
              rep_id, rep_offset, size_bytes, unit_bits, data, t, now, ttl_ns):
    start = np.int64(0)
    n = data.shape[0]
    h = hk.hash_key(data, start, n, t)
    r = hk.candidate_row(table, h)
    if r >= 0:  # the likely row's cache misses at once, while its key is checked, not one after another
        prefetch(key_refs, r)
        prefetch(row_tenant, r)
        _prefetch_rows(1, (r,), flags, lease, rep_status, rep_kind, rep_seg)
        _prefetch_descriptors(1, (r,), size_bytes, rep_id, rep_offset)
    r = hk.find_row(table, arena, key_refs, row_tenant, data, start, n, t, h)
    code = read_code(r, rep_status, rep_kind, rep_seg, seg_readable, more)
    count = 0
    group = False
    rid = np.uint64(0)  # the replica id column's dtype (a uint64 boxes to an exact Python int)
    kind = seg = offset = size = 0  # int(): plain ints under NUMBA_DISABLE_JIT too
    if code == OK:
        group = grant_read_lease(r, now, ttl_ns, lease, flags)
        rr = r
        while rr >= 0:
            for j in range(rep_status.shape[1]):
                if is_readable_replica(rep_status[rr, j], rep_kind[rr, j], rep_seg[rr, j], seg_readable):
                    count += 1
                    if count == 1:  # int() of int64 values: one specialisation of int() to compile
                        rid = int(rep_id[rr, j])
                        kind = int(np.int64(rep_kind[rr, j]))
                        seg = int(np.int64(rep_seg[rr, j]))
                        offset = int(np.int64(rep_offset[rr, j]) << offset_shift(kind, seg, unit_bits))
                        size = int(np.int64(size_bytes[rr]))
            rr = next_row(more, rr)
    if count != 1:
        rid = np.uint64(0)
        kind = seg = offset = size = 0
    return code, r, group, count, rid, kind, seg, offset, size
