"""Key hashing and open-addressing probing.

A table slot is an int64: ``(tag << 32) | row`` where ``tag`` is 31 bits of the key's hash, so
most non-matching probes are rejected without touching the object columns; a tag match is
verified against the key bytes in the arena (tenant, length and bytes). EMPTY = -1. The table
may have any size (the key index sizes it to its load, not to a power of two): the home slot is
the tag scaled to the table, ``(tag * size) >> 31`` (multiply-shift range reduction: no
division, and monotone in the tag, so a table grows by a sequential pass, store/growth.py).
Deletion shifts later entries back (linear probing without tombstones: lookups never slow down
under put/remove churn).
An object's ``key_ref`` packs its arena offset and key length: ``(offset << 16) | length``.
"""
from __future__ import annotations

import numpy as np

from .dispatch import BATCH_MIN, variant
from .jit import kernel_only, njit
from .nrt_free import nrt_free, nrt_free_core
from .prefetch import prefetch

EMPTY_SLOT = -1
KEY_LENGTH_BITS = 16

_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
ROW_MASK = np.int64(0xFFFFFFFF)
_LEN_MASK = np.int64((1 << KEY_LENGTH_BITS) - 1)


@njit(inline="always", cache=True)
def mix64(h):
    # splitmix64 finalizer: spreads FNV's weak low bits over the whole word
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@njit(inline="always", cache=True)
def load_word(data, i, count):
    """``count`` (<= 8) bytes from data[i] as a little-endian integer. Unsigned indices: no
    negative-index fix-up per byte, so the full-word case compiles to plain loads."""
    w = np.uint64(0)
    for k in range(count):
        w |= np.uint64(data[np.uint64(i + k)]) << np.uint64(8 * k)
    return w


@kernel_only()
def hash_key(data, start, length, tenant):
    """Hash of (tenant code, key bytes data[start:start+length]): eight bytes per multiply (a
    byte-at-a-time hash waits one multiply per byte), then the splitmix64 finalizer."""
    # (tenant, length) seed the state through the finalizer: equal bytes under another tenant
    # or of another length (zero padding) start from an unrelated state
    h = mix64(_FNV_OFFSET ^ (np.uint64(np.uint32(tenant)) << np.uint64(32)) ^ np.uint64(length))
    end = start + length
    i = start
    while i + 8 <= end:
        h = (h ^ load_word(data, i, 8)) * _FNV_PRIME
        h ^= h >> np.uint64(29)
        i += 8
    if i < end:
        h = (h ^ load_word(data, i, end - i)) * _FNV_PRIME
    return mix64(h)


# hash_key inlined into the caller's loop, for passes that hash millions of keys: a call from one
# cached kernel to another stays a call (the callee is linked as machine code), which doubled the
# hash pass of a restore's key-index build (10M 32-byte keys: 0.55 -> 0.28 s of CPU inlined)
hash_key_inline = njit(inline="always", cache=True)(getattr(hash_key, "py_func", hash_key))


@njit(inline="always", cache=True)
def key_ref(offset, length):
    return (np.int64(offset) << KEY_LENGTH_BITS) | np.int64(length)


@njit(inline="always", cache=True)
def ref_offset(ref):
    return ref >> KEY_LENGTH_BITS


@njit(inline="always", cache=True)
def ref_length(ref):
    return ref & _LEN_MASK


TAG_SHIFT = 33  # a slot stores the hash's top 31 bits (its tag) above the 32-bit row


@njit(inline="always", cache=True)
def hash_tag(h):
    """The 31-bit tag of hash ``h``: the home slot and the stored tag both derive from it."""
    return np.uint32((h >> np.uint64(TAG_SHIFT)) & np.uint64(0x7FFFFFFF))


@njit(inline="always", cache=True)
def _tag(h):
    return np.int64(hash_tag(h))


@njit(inline="always", cache=True)
def slot_entry(h, row):
    return (_tag(h) << 32) | np.int64(row)


@njit(inline="always", cache=True)
def same_tag(slot, h):
    return (slot >> 32) == _tag(h)


@njit(inline="always", cache=True)
def key_equals(arena, ref, data, start, length):
    """The key at ``ref`` in the arena is data[start:start+length] (compared eight bytes at a time)."""
    if ref_length(ref) != length:
        return False
    off = ref_offset(ref)
    i = 0
    while i + 8 <= length:
        if load_word(arena, off + i, 8) != load_word(data, start + i, 8):
            return False
        i += 8
    if i < length:
        return load_word(arena, off + i, length - i) == load_word(data, start + i, length - i)
    return True


@njit(inline="always", cache=True)
def tag_home(tag, size):
    """The home slot of a stored tag (31 bits) in a table of ``size`` slots."""
    return np.int64((np.uint64(tag) * np.uint64(size)) >> np.uint64(31))


@njit(inline="always", cache=True)
def home_slot(h, size):
    return tag_home(hash_tag(h), size)


@njit(inline="always", cache=True)
def next_slot(i, size):
    i += 1
    return i if i < size else i - size


@njit(inline="always", cache=True)
def region_of(slot, size, regions):
    """Which of ``regions`` equal ranges of a ``size``-slot table holds ``slot`` (slots and home
    slots: bulk passes split the table into regions that threads work on alone)."""
    return np.int64(slot) * regions // size


@njit(inline="always", cache=True)
def region_start(g, size, regions):
    """The first slot of region ``g`` (0 for ``g == regions``: a probe running past the last
    region wraps to slot 0)."""
    if g >= regions:
        return np.int64(0)
    return (np.int64(g) * size + regions - 1) // regions


@kernel_only()
def probe_until(table, arena, key_refs, row_tenant, data, start, length, tenant, h, stop):
    """(row, -1) if (tenant, key) is present, else (-1, the slot an insert would take); (-1, -1)
    if the probe steps onto slot ``stop`` first (-1: no limit; else a bulk build's window end,
    taken modulo the table size)."""
    size = table.shape[0]
    i = home_slot(h, size)
    while True:
        v = table[i]
        if v == EMPTY_SLOT:
            return -1, i
        if same_tag(v, h):
            r = v & ROW_MASK
            if row_tenant[r] == tenant:
                if key_equals(arena, key_refs[r], data, start, length):
                    return r, -1
        i = next_slot(i, size)
        if i == stop:
            return -1, -1


@njit(inline="always", cache=True)
def find_or_empty_slot(table, arena, key_refs, row_tenant, data, start, length, tenant, h):
    """(row, -1) if (tenant, key) is present, else (-1, the slot an insert would take)."""
    return probe_until(table, arena, key_refs, row_tenant, data, start, length, tenant, h, -1)


@njit(inline="always", cache=True)
def find_row(table, arena, key_refs, row_tenant, data, start, length, tenant, h):
    """Row of (tenant, key) or -1."""
    return find_or_empty_slot(table, arena, key_refs, row_tenant, data, start, length, tenant, h)[0]


@njit(inline="always", cache=True)
def fill_slot(table, slot, h, row):
    table[slot] = slot_entry(h, row)


@njit(inline="always", cache=True)
def delete_in(table, want, home, stop, empty_before=-1):
    """Backward-shift delete of slot value ``want`` whose probe starts at ``home``, touching only
    slots before slot ``stop`` (the end of the caller's window; -1: no limit). Returns 1 deleted,
    0 absent, -1 not attempted (its probe run reaches ``stop``; nothing was changed).
    ``empty_before``: an empty slot of the window (-1: none known); a run found before it ends
    there at the latest, so it is not walked first to check that it ends inside the window."""
    size = table.shape[0]
    i = home
    while table[i] != want:
        if table[i] == EMPTY_SLOT:
            return 0
        i = next_slot(i, size)
        if i == stop:
            return -1
    if stop >= 0 and not i < empty_before:  # the run after the hole must also end inside the window
        end = i
        while table[end] != EMPTY_SLOT:
            end = next_slot(end, size)
            if end == stop:
                return -1
    j = i
    while True:
        j = next_slot(j, size)
        v = table[j]
        if v == EMPTY_SLOT:
            break
        # move v into the hole at i unless its home lies cyclically in (i, j]: its probe distance
        # (home to j) is at least the hole's. Two wrapped differences, not an and/or chain of
        # cyclic cases (several data-dependent branches per slot: this loop was most of a delete)
        dv = j - tag_home(v >> 32, size)
        di = j - i
        if dv < 0:
            dv += size
        if di < 0:
            di += size
        if dv >= di:
            table[i] = v
            i = j
    table[i] = EMPTY_SLOT
    return 1


@nrt_free
def delete_row(table, row, h):
    """Remove ``row`` and shift back the entries that probed past it."""
    return delete_in(table, slot_entry(h, row), home_slot(h, table.shape[0]), -1) == 1


@njit(cache=True)
def row_hash(arena, key_refs, row_tenant, row):
    ref = key_refs[row]
    return hash_key(arena, ref_offset(ref), ref_length(ref), row_tenant[row])


@njit(cache=True)
def slot_rows(table):
    """Rows held by a table (for rebuilds)."""
    n = 0
    for i in range(table.shape[0]):
        if table[i] >= 0:
            n += 1
    out = np.empty(n, np.int64)
    k = 0
    for i in range(table.shape[0]):
        if table[i] >= 0:
            out[k] = table[i] & ROW_MASK
            k += 1
    return out


_BLOCK = 64


@njit(inline="always", cache=True)
def tenant_at(tenants, i):
    """Key i's tenant: ``tenants`` holds one per key, or one (a length-1 array) for all."""
    return tenants[i] if tenants.shape[0] > 1 else tenants[0]


@njit(inline="always", cache=True)
def locate_block(b, m, table, arena, key_refs, row_tenant, offsets, data, tenants, hs, cand):
    """First stages of a batch lookup of keys b..b+m (see :func:`_find_rows`): ``hs[t]`` the
    hash of key b+t; ``cand[t]`` the row in the first slot of its probe that holds its tag, or
    -1 if an empty slot comes first (the key is absent). Each stage issues one independent
    cache miss per key (home slot, then the candidate's key ref and tenant, then its key bytes)
    as a prefetch, so a block's misses overlap; the caller may prefetch the candidates' own
    columns before it verifies them (:func:`verified_row`)."""
    size = table.shape[0]
    for t in range(m):
        i = b + t
        h = hash_key(data, offsets[i], offsets[i + 1] - offsets[i], tenant_at(tenants, i))
        hs[t] = h
        prefetch(table, home_slot(h, size))
    for t in range(m):
        cand[t] = candidate_row(table, hs[t])
        if cand[t] >= 0:
            prefetch(key_refs, cand[t])
            prefetch(row_tenant, cand[t])
    for t in range(m):
        if cand[t] >= 0:
            prefetch(arena, ref_offset(key_refs[cand[t]]))


@njit(inline="always", cache=True)
def candidate_row(table, h):
    """The row in the first slot of hash ``h``'s probe that holds its tag, or -1 if an empty slot
    comes first (the key is absent): the key's row unless another key shares the tag."""
    size = table.shape[0]
    i = home_slot(h, size)
    v = table[i]
    while v != EMPTY_SLOT and not same_tag(v, h):
        i = next_slot(i, size)
        v = table[i]
    return np.int64(-1) if v == EMPTY_SLOT else v & ROW_MASK


PROBE_ON = -2  # verified_row: the candidate is another key with the same tag


@njit(inline="always", cache=True)
def verified_row(i, r, arena, key_refs, row_tenant, offsets, data, tenants):
    """Key i's row after :func:`locate_block` found candidate ``r``: ``r`` if it holds the key,
    -1 if the key is absent (no candidate), else PROBE_ON: the caller probes on with
    :func:`find_row` (rare; called from the kernel's own loop, not from here, see
    kernels/leases.grant_read_lease)."""
    if r < 0:
        return np.int64(-1)
    s = offsets[i]
    if row_tenant[r] == tenant_at(tenants, i):
        if key_equals(arena, key_refs[r], data, s, offsets[i + 1] - s):
            return r
    return np.int64(PROBE_ON)


@njit(cache=True)
def _find_rows(table, arena, key_refs, row_tenant, offsets, data, tenants):
    """Rows of a batch of keys (-1 for absent); ``tenants``: see :func:`tenant_at`.

    Staged by blocks: all hashes and home slots of a block, then all candidate rows' key refs
    and tenants, then their key bytes, then the verification, so the cache misses of
    independent keys overlap (:func:`locate_block`). The loop runs without reference counting
    (:mod:`.nrt_free`).
    """
    out = np.empty(offsets.shape[0] - 1, np.int64)
    _find_rows_into(out, np.empty(_BLOCK, np.uint64), np.empty(_BLOCK, np.int64),
                    table, arena, key_refs, row_tenant, offsets, data, tenants)
    return out


@nrt_free_core
def _find_rows_into(out, hs, cand, table, arena, key_refs, row_tenant, offsets, data, tenants):
    n = out.shape[0]
    for b in range(0, n, _BLOCK):
        m = min(_BLOCK, n - b)
        locate_block(b, m, table, arena, key_refs, row_tenant, offsets, data, tenants, hs, cand)
        for t in range(m):
            i = b + t
            r = verified_row(i, cand[t], arena, key_refs, row_tenant, offsets, data, tenants)
            if r == PROBE_ON:
                r = find_row(table, arena, key_refs, row_tenant, data, offsets[i], offsets[i + 1] - offsets[i],
                             tenant_at(tenants, i), hs[t])
            out[i] = r


_find_rows_nogil = variant(_find_rows, "_nogil", nogil=True)


@nrt_free
def _find_one(table, arena, key_refs, row_tenant, offsets, data, tenants):
    """The row of :func:`_find_rows`' one key: a single-key call (put_end, remove) compiles only
    this small kernel over :func:`hash_key` and :func:`probe_until`, which a put has already
    compiled for these types, not the staged batch kernel (seconds on an empty Numba cache). It
    returns a scalar, so it allocates nothing: no ``np.empty`` to compile, no reference counting."""
    s = offsets[0]
    n = offsets[1] - s
    return find_row(table, arena, key_refs, row_tenant, data, s, n, tenants[0], hash_key(data, s, n, tenants[0]))


def find_rows(table, arena, key_refs, row_tenant, offsets, data, tenants):
    """See :func:`_find_rows`; one key takes :func:`_find_one`; batches drop the GIL while they
    probe (:mod:`.dispatch`)."""
    if offsets.shape[0] == 2:
        out = np.empty(1, np.int64)
        out[0] = _find_one(table, arena, key_refs, row_tenant, offsets, data, tenants)
        return out
    if offsets.shape[0] <= BATCH_MIN:
        return _find_rows(table, arena, key_refs, row_tenant, offsets, data, tenants)
    return _find_rows_nogil(table, arena, key_refs, row_tenant, offsets, data, tenants)


@njit(cache=True)
def last_of_each_key(offsets, data, tenants):
    """Mask of the rows that are the last occurrence of their (tenant, key bytes ``data``,
    ``offsets``; keys at most 2**KEY_LENGTH_BITS - 1 bytes). A pass from the end through a
    temporary table of this module's layout (the key index's hash, tags, probing and byte check)
    that reads the keys in place: ``data`` is its arena."""
    n = offsets.shape[0] - 1
    cap = 16
    while cap < 2 * n:
        cap *= 2
    last = np.zeros(n, np.bool_)
    _mark_last(np.full(cap, EMPTY_SLOT, np.int64), np.empty(n, np.int64), offsets, data, tenants, last)
    return last


@nrt_free_core
def _mark_last(table, refs, offsets, data, tenants, last):
    n = last.shape[0]
    for i in range(n):
        refs[i] = key_ref(offsets[i], offsets[i + 1] - offsets[i])
    for i in range(n - 1, -1, -1):
        s = offsets[i]
        length = offsets[i + 1] - s
        h = hash_key(data, s, length, tenants[i])
        row, slot = find_or_empty_slot(table, data, refs, tenants, data, s, length, tenants[i], h)
        if row < 0:  # no later row holds this key
            fill_slot(table, slot, h, i)
            last[i] = True


@njit(nogil=True, cache=True)
def rehash_slots(old, lo, hi, new):
    """Insert the entries of ``old[lo:hi]`` into the larger table ``new`` by their stored tags:
    a slot keeps the top bits of its key's hash, and the home slot derives from them, so a
    table grows without reading a key (store/growth.py). Home slots rise with the tag, so
    old slots in order land in new slots in (nearly) ascending order."""
    size = new.shape[0]
    for s in range(lo, hi):
        v = old[s]
        if v >= 0:
            i = tag_home(v >> 32, size)
            while new[i] >= 0:
                i = next_slot(i, size)
            new[i] = v
