"""FreeExtents: the free extents of every segment in two flat arrays (CSR-like regions).

Segment s's free extents are ``start/length[base[s]:base[s] + count[s]]``, sorted by start and
never adjacent (see :mod:`..kernels.allocation`); its region has room for ``room[s]``. Plain
arrays rather than a list of arrays per segment: kernels take them as four ``int64[::1]``
arguments, which Numba types and lowers far faster than typed-List methods (the first put of a
fresh process compiles them). Kernels never grow a region: whoever may add extents makes room
first (:meth:`FreeExtents.make_room`), here in Python, per segment (segments are few).
"""
from __future__ import annotations

import numpy as np

from ..kernels import allocation as ak
from ..kernels.dispatch import BATCH_MIN
from .array_epoch import ArrayEpoch

_MIN_ROOM = 8


class FreeExtents(ArrayEpoch):
    def __init__(self, segments: int) -> None:
        self.start = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.int64)
        self.base = np.zeros(segments, np.int64)
        self.room = np.zeros(segments, np.int64)
        self.count = np.zeros(segments, np.int64)
        self.top = 0  # the pool's end in use: regions lie below it

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(start, length, base, count): the kernels' arguments (fetch again after make_room)."""
        return self.start, self.length, self.base, self.count

    def of(self, code: int) -> tuple[np.ndarray, np.ndarray]:
        """Segment ``code``'s free extents (starts, lengths): views into the pool."""
        lo = int(self.base[code])
        hi = lo + int(self.count[code])
        return self.start[lo:hi], self.length[lo:hi]

    def grow(self, segments: int) -> None:
        """Entries for ``segments`` codes (new ones without extents or room)."""
        for name in ("base", "room", "count"):
            old = getattr(self, name)
            grown = np.zeros(segments, np.int64)
            grown[:old.size] = old
            setattr(self, name, grown)

    def make_room(self, need: np.ndarray) -> None:
        """Room for ``need[c]`` extents in the region of each code c < ``need.size``. A short region
        gets at least twice its room and moves to the pool's end when the pool has space there.
        When it has not, the pool is made anew: every region packed in code order, half as much
        again to spare, and only the extents in use copied (not the space that moved regions
        left behind, nor the pool's unused tail: fresh pages cost their faults, and at 100M
        objects, with every segment's region growing at each eviction, copying the whole pool
        took 0.6-1.3 s of a cycle). Amortised linear: a region's room only doubles, and a new
        pool copies at most the extents in use."""
        short = np.flatnonzero(need > self.room[:need.size])
        if not short.size:
            return
        room = np.maximum(np.maximum(need[short], 2 * self.room[short]), _MIN_ROOM)
        if self.top + int(room.sum()) > self.start.size:
            self._repack(short, room)
            return
        base = self.top + np.concatenate(([0], np.cumsum(room[:-1])))
        for c, b in zip(short.tolist(), base.tolist()):  # one iteration per segment that grows
            lo, n = int(self.base[c]), int(self.count[c])
            self.start[b:b + n] = self.start[lo:lo + n]
            self.length[b:b + n] = self.length[lo:lo + n]
        self.base[short] = base
        self.room[short] = room
        self.top += int(room.sum())

    def _repack(self, short: np.ndarray, room: np.ndarray) -> None:
        rooms = self.room.copy()
        rooms[short] = room
        base = np.concatenate(([0], np.cumsum(rooms[:-1]))).astype(np.int64)
        top = int(rooms.sum())
        start, length = np.empty(top + top // 2, np.int64), np.empty(top + top // 2, np.int64)
        for c in np.flatnonzero(self.count).tolist():  # one iteration per segment with free extents
            lo, b, n = int(self.base[c]), int(base[c]), int(self.count[c])
            start[b:b + n] = self.start[lo:lo + n]
            length[b:b + n] = self.length[lo:lo + n]
        self.start, self.length, self.base, self.room, self.top = start, length, base, rooms, top

    def install(self, code: int, starts: np.ndarray, lengths: np.ndarray) -> None:
        """Make ``starts``/``lengths`` (copied) the free extents of segment ``code``."""
        n = len(starts)
        self.room_for(code, n)
        b = int(self.base[code])
        self.start[b:b + n] = starts
        self.length[b:b + n] = lengths
        self.count[code] = n

    def room_for(self, code: int, n: int) -> None:
        """Room for ``n`` extents in segment ``code``'s region."""
        if n <= self.room[code]:  # the common case: no array made
            return
        need = np.zeros(code + 1, np.int64)
        need[code] = n
        self.make_room(need)

    def free_one(self, used: np.ndarray, unit_bits: np.ndarray, capacity: np.ndarray, code: int, offset: int,
                 size: int) -> bool:
        """Return the extent held by a replica at ``offset`` of ``size`` bytes to segment ``code``
        (see :func:`..kernels.allocation.free_extent`); False (nothing changed) on overlap."""
        self.room_for(code, int(self.count[code]) + 1)
        return bool(ak.free_extent(*self.arrays(), used, unit_bits, capacity, code, offset, size))

    def free_many(self, segs: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, used: np.ndarray,
                  unit_bits: np.ndarray, capacity: np.ndarray) -> int:
        """Free the held extents of many replicas (segment, offset, object size) at once: sorted per
        segment, then merged linearly (one O(n + m) pass per segment instead of one array
        insertion per extent). Returns how many were rejected."""
        if segs.size == 0:
            return 0
        segs, offsets, sizes = (np.ascontiguousarray(a, np.int64) for a in (segs, offsets, sizes))
        small = segs.size < BATCH_MIN  # one remove: keep the GIL (see :mod:`..kernels.dispatch`)
        per_segment, offs, lens, ascending = (ak.by_segment_small if small else ak.by_segment)(
            segs, offsets, sizes, used.shape[0])
        return self.free_grouped(per_segment, offs, lens, ascending, used, unit_bits, capacity)

    def free_grouped(self, per_segment: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, ascending: bool,
                     used: np.ndarray, unit_bits: np.ndarray, capacity: np.ndarray) -> int:
        """:meth:`free_many` of int64 extents already grouped by segment in code order
        (``per_segment[s]`` of segment s's, as a slot clear returns them), sorted by offset
        within each segment when ``ascending``."""
        if offsets.size == 0:
            return 0
        if not ascending:  # sorted by (segment, offset): each segment's extents stay where they are
            order = ak.order_by_segment_offset(np.repeat(np.arange(per_segment.size), per_segment), offsets)
            offsets, sizes = offsets[order], sizes[order]
        if offsets.size == 1:  # one remove: a scalar check
            code = int(np.argmax(per_segment))
            self.room_for(code, int(self.count[code]) + 1)
        else:
            self.make_room(self.count[:per_segment.size] + per_segment)
        free_sorted = ak.free_sorted_small if offsets.size < BATCH_MIN else ak.free_sorted
        return int(free_sorted(per_segment, offsets, sizes, *self.arrays(), used, unit_bits, capacity))
