"""SegmentTable: mounted memory segments, endpoint validity and one offset allocator each.

Segments are few (one per client buffer), so their descriptive fields are plain Python; the
arrays the kernels read (readable, allocatable, capacity, used, free extents) are NumPy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba.typed import List

from ..kernels import allocation as ak
from ..kernels.offset_allocator_v1 import multiplier_bits


@dataclass(frozen=True)
class Segment:
    name: str
    endpoint: str
    client: str
    base: int
    size: int


class SegmentTable:
    def __init__(self, capacity: int = 16) -> None:
        self.info: list[Segment | None] = []
        self.by_name: dict[str, int] = {}
        self.readable = np.zeros(capacity, np.bool_)      # endpoint valid: replicas can serve reads
        self.allocatable = np.zeros(capacity, np.bool_)   # mounted and accepting new allocations
        self.capacity = np.zeros(capacity, np.int64)
        # allocation unit 1 << unit_bits: upstream's for this capacity, so replicas never share one
        self.unit_bits = np.zeros(capacity, np.int64)
        self.used = np.zeros(capacity, np.int64)      # bytes held (whole units, ak.held_end)
        self.extent_counts = np.zeros(capacity, np.int64)
        self.extent_starts = List([np.empty(8, np.int64) for _ in range(capacity)])
        self.extent_lengths = List([np.empty(8, np.int64) for _ in range(capacity)])

    def __len__(self) -> int:
        return len(self.by_name)

    def code(self, name: str) -> int:
        return self.by_name.get(name, -1)

    def get(self, name: str) -> Segment | None:
        c = self.by_name.get(name)
        return None if c is None else self.info[c]

    def codes_of_client(self, client: str) -> list[int]:
        return [c for c, s in enumerate(self.info) if s is not None and s.client == client]

    def mounted_codes(self) -> np.ndarray:
        return np.array([c for c, s in enumerate(self.info) if s is not None], np.int64)

    def mount(self, seg: Segment, *, readable: bool = True) -> int:
        """Register a segment with one free extent covering it; returns its code."""
        code = next((c for c, s in enumerate(self.info) if s is None), len(self.info))
        if code == len(self.info):
            self.info.append(None)
            self._grow(code + 1)
        self.info[code] = seg
        self.by_name[seg.name] = code
        self.capacity[code] = seg.size
        self.unit_bits[code] = multiplier_bits(np.int64(seg.size))
        self.used[code] = 0
        self.extent_starts[code][0] = 0
        self.extent_lengths[code][0] = seg.size
        self.extent_counts[code] = 1
        self.readable[code] = readable
        # an unreadable (standby-restored) segment takes no new allocations until its remount
        self.allocatable[code] = readable
        return code

    def unmount(self, code: int) -> None:
        seg = self.info[code]
        assert seg is not None
        del self.by_name[seg.name]
        self.info[code] = None
        self.readable[code] = False
        self.allocatable[code] = False
        self.extent_counts[code] = 0
        self.used[code] = 0
        self.capacity[code] = 0
        self.unit_bits[code] = 0

    def free(self, code: int, offset: int, size: int) -> None:
        """Free the extent held by a replica at ``offset`` of ``size`` bytes."""
        if not ak.free_extent(self.extent_starts, self.extent_lengths, self.extent_counts, self.used,
                              self.unit_bits, self.capacity, code, offset, size):
            raise RuntimeError(f"double free of [{offset}, {offset + size}) on segment {self.info[code]}")

    def rebuild_allocator(self, code: int, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Replace the allocator of ``code`` by one whose free space is the gaps between the held
        extents of replicas (offset, object size); ValueError if they overlap or share a unit."""
        starts, lengths, used = ak.free_extents_from_occupied(int(self.capacity[code]), offsets, sizes,
                                                              int(self.unit_bits[code]))
        self.install_allocator(code, starts, lengths, used)

    def install_allocator(self, code: int, starts: np.ndarray, lengths: np.ndarray, used: int) -> None:
        n = starts.size
        self.extent_starts[code] = np.concatenate((starts, np.empty(max(8, n), np.int64)))
        self.extent_lengths[code] = np.concatenate((lengths, np.empty(max(8, n), np.int64)))
        self.extent_counts[code] = n
        self.used[code] = used

    def _grow(self, need: int) -> None:
        cap = self.readable.shape[0]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for name in ("readable", "allocatable", "capacity", "unit_bits", "used", "extent_counts"):
            old = getattr(self, name)
            grown = np.zeros(new_cap, old.dtype)
            grown[:cap] = old
            setattr(self, name, grown)
        for _ in range(new_cap - cap):
            self.extent_starts.append(np.empty(8, np.int64))
            self.extent_lengths.append(np.empty(8, np.int64))
