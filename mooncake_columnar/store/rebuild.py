"""Allocators rebuilt from the memory replicas an object table holds (restore and standby loads,
remount recovery): :mod:`..kernels.rebuild` over an ObjectTable and a SegmentTable."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from ..errors import SegmentExtentsCorrupt
from ..kernels import rebuild as rk
from .objects import ObjectTable
from .segments import SegmentTable


@dataclass(frozen=True)
class FreeSpace:
    """Rebuilt free extents of some segments: code c's are ``starts/lengths[lo[c]:hi[c]]``."""

    starts: np.ndarray
    lengths: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    used: np.ndarray

    def install(self, segments: SegmentTable, codes: Iterable[int]) -> None:
        for c in codes:
            lo, hi = self.lo[c], self.hi[c]
            segments.install_allocator(c, self.starts[lo:hi], self.lengths[lo:hi], int(self.used[c]))


def free_space(o: ObjectTable, segments: SegmentTable, bits: np.ndarray, matched: int,
               on_segment: np.ndarray) -> FreeSpace:
    """Free space of the segments flagged in ``on_segment`` from the memory replicas of the
    ``matched`` rows in ``bits`` (with their chains). Raises SegmentExtentsCorrupt naming the
    segment and the extents when two overlap, share an allocation unit or one lies outside it."""
    capacity, unit_bits = segments.capacity[:on_segment.size], segments.unit_bits[:on_segment.size]
    columns = (o.size_bytes, o.replica_status, o.replica_kind, o.replica_segment, o.replica_offset, o.replica_more)
    # replica_offset holds a memory replica's offset in its segment's units: shifted by unit_bits
    status, fault, *space = rk.free_extents(bits, on_segment, capacity, unit_bits, unit_bits, *columns)
    if status == rk.UNSORTED:  # rows not in offset order: gather, sort, stream again
        seg, off, size = rk.gather_extents(bits, matched, on_segment, unit_bits, *columns)
        status, fault, *space = rk.free_extents_sorted(seg, off, size, on_segment, capacity, unit_bits)
    if status != rk.OK:
        raise SegmentExtentsCorrupt(segments.mounted(int(fault[0])).name,
                                    rk.fault_message(status, fault, unit_bits, capacity))
    return FreeSpace(*space)


def rebuild_all(o: ObjectTable, segments: SegmentTable, loaded: int) -> None:
    """Every segment's allocator from the memory replicas of rows [0, ``loaded``): the objects a
    load put into an empty table, all of them."""
    on = np.ones(len(segments.info), np.bool_)
    free_space(o, segments, rk.all_rows(loaded), loaded, on).install(segments, range(on.size))
