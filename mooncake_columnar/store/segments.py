"""SegmentTable: mounted memory segments, endpoint validity and one offset allocator each.

Segments are few (one per client buffer), so their descriptive fields are plain Python; the
arrays the kernels read (readable, allocatable, capacity, used, free extents) are NumPy.

Each segment carries upstream's identity besides its name: ``segment_id`` (upstream's segment
UUID, ``"<u64>-<u64>"``, unique among mounted segments; one is generated at mount when none is
given) and ``host_id`` (upstream ``Segment.host_id``, may be empty). A v1 rollback writes them
back, so a client that remounts with its real segment id finds its segment (never a second one
over the same memory).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
import pyarrow as pa

from ..errors import EngineInvariantError, InvalidParams, NameLimitExceeded, SegmentExtentsCorrupt
from ..kernels import rebuild as rk
from ..kernels.offset_allocator_v1 import multiplier_bits
from ..kernels.predicates import memory_on_segment_mask
from ..kernels.replica_offsets import column_offsets_of
from ..schema import MAX_CODES, SEGMENTS_ARROW_SCHEMA
from .array_epoch import ArrayEpoch
from .free_extents import FreeExtents
from .upstream_ids import new_upstream_uuid


@dataclass(frozen=True)
class Segment:
    name: str
    endpoint: str
    client: str
    base: int
    size: int
    segment_id: str = ""  # upstream segment UUID string; "" only before mount assigns one
    host_id: str = ""

    def same_mount(self, other: "Segment") -> bool:
        """``other`` describes this segment: same name, endpoint, client, base and size, and the
        same id and host id where ``other`` gives them (a mount request without an id matches)."""
        return ((self.name, self.endpoint, self.client, self.base, self.size)
                == (other.name, other.endpoint, other.client, other.base, other.size)
                and other.segment_id in ("", self.segment_id) and other.host_id in ("", self.host_id))


class SegmentTable(ArrayEpoch):
    def __init__(self, capacity: int = 16) -> None:
        self.info: list[Segment | None] = []
        self.by_name: dict[str, int] = {}
        self.by_id: dict[str, int] = {}  # segment_id -> code
        self.readable = np.zeros(capacity, np.bool_)      # endpoint valid: replicas can serve reads
        self.allocatable = np.zeros(capacity, np.bool_)   # mounted and accepting new allocations
        self.capacity = np.zeros(capacity, np.int64)
        # allocation unit 1 << unit_bits: upstream's for this capacity, so replicas never share one
        self.unit_bits = np.zeros(capacity, np.int64)
        self.used = np.zeros(capacity, np.int64)      # bytes held (whole units, ak.held_end)
        self.extents = FreeExtents(capacity)

    def __len__(self) -> int:
        return len(self.by_name)

    def code(self, name: str) -> int:
        return self.by_name.get(name, -1)

    def get(self, name: str) -> Segment | None:
        c = self.by_name.get(name)
        return None if c is None else self.info[c]

    def mounted(self, code: int) -> Segment:
        """The segment mounted as ``code``, which the caller knows to be mounted (a code from
        ``by_name``/``by_id``, or one a replica or an extent refers to)."""
        seg = self.info[code]
        if seg is None:
            raise EngineInvariantError("segment_mounted", f"segment code {code} is not mounted")
        return seg

    def codes_of_client(self, client: str) -> list[int]:
        return [c for c, s in enumerate(self.info) if s is not None and s.client == client]

    def code_of_id(self, segment_id: str) -> int:
        return self.by_id.get(segment_id, -1)

    def mount(self, seg: Segment, *, readable: bool = True) -> int:
        """Register a segment with one free extent covering it; returns its code. A segment
        without an id gets a fresh one; an id already mounted raises InvalidParams."""
        if not seg.segment_id:
            seg = replace(seg, segment_id=self.fresh_id())
        elif seg.segment_id in self.by_id:
            raise InvalidParams(f"segment id {seg.segment_id!r} of {seg.name!r} is already mounted as "
                             f"{self.mounted(self.by_id[seg.segment_id]).name!r}")
        self.check_room([seg])
        # the lowest free code (no scan while every code is taken: mounting many stays linear)
        code = len(self.info) if len(self.by_name) == len(self.info) else self.info.index(None)
        if code == len(self.info):
            self.info.append(None)
            self._grow(code + 1)
        self.info[code] = seg
        self.by_name[seg.name] = code
        self.by_id[seg.segment_id] = code
        self.capacity[code] = seg.size
        self.unit_bits[code] = multiplier_bits(np.int64(seg.size))
        self.used[code] = 0
        self.extents.install(code, np.zeros(1, np.int64), np.full(1, seg.size, np.int64))
        self.readable[code] = readable
        # an unreadable (standby-restored) segment takes no new allocations until its remount
        self.allocatable[code] = readable
        return code

    def check_room(self, segs: Sequence[Segment]) -> None:
        """NameLimitExceeded when mounting ``segs`` too would need a code past MAX_CODES (the
        replica_segment column holds it): callers check before they change anything."""
        free = MAX_CODES - len(self.by_name)
        if len(segs) > free:
            raise NameLimitExceeded("segments", segs[max(free, 0)].name, MAX_CODES)

    def fresh_id(self) -> str:
        """An upstream-style segment id no mounted segment has."""
        while True:
            segment_id = new_upstream_uuid()
            if segment_id not in self.by_id:
                return segment_id

    def replace_info(self, code: int, seg: Segment) -> None:
        """Describe mounted segment ``code`` by ``seg`` (same name; a remount may bring the base,
        and the real segment id and host id); InvalidParams if another segment holds the id."""
        old = self.info[code]
        assert old is not None and old.name == seg.name and seg.segment_id
        if self.by_id.get(seg.segment_id, code) != code:
            raise InvalidParams(f"segment id {seg.segment_id!r} is already mounted as "
                             f"{self.mounted(self.by_id[seg.segment_id]).name!r}")
        del self.by_id[old.segment_id]
        self.info[code] = seg
        self.by_id[seg.segment_id] = code

    def unmount(self, code: int) -> None:
        seg = self.info[code]
        assert seg is not None
        del self.by_name[seg.name]
        del self.by_id[seg.segment_id]
        self.info[code] = None
        self.readable[code] = False
        self.allocatable[code] = False
        self.extents.count[code] = 0
        self.used[code] = 0
        self.capacity[code] = 0
        self.unit_bits[code] = 0

    def byte_offsets(self, column: np.ndarray, kind: np.ndarray | np.uint8, seg: np.ndarray) -> np.ndarray:
        """The byte offsets (int64) of replica slots whose ``replica_offset`` values are ``column``."""
        return byte_offsets(column, offset_shifts(kind, seg, self.unit_bits))

    def column_offsets(self, offsets: np.ndarray, kind: np.ndarray, seg: np.ndarray) -> np.ndarray:
        """``replica_offset`` values of replicas at byte ``offsets``: a memory replica's on a unit
        boundary of its mounted segment, another kind's below 2**32 (store/snapshot_state.py checks both)."""
        return column_offsets_of(offsets, kind, seg, self.unit_bits)

    def free(self, code: int, offset: int, size: int) -> None:
        """Free the extent held by a replica at ``offset`` of ``size`` bytes."""
        if not self.extents.free_one(self.used, self.unit_bits, self.capacity, code, offset, size):
            raise RuntimeError(f"double free of [{offset}, {offset + size}) on segment {self.info[code]}")

    def rebuild_allocator(self, code: int, offsets: np.ndarray, sizes: np.ndarray) -> None:
        """Replace the allocator of ``code`` by one whose free space is the gaps between the held
        extents of replicas (offset, object size); SegmentExtentsCorrupt if they overlap or share a
        unit."""
        on = np.zeros(code + 1, np.bool_)
        on[code] = True
        status, fault, starts, lengths, lo, hi, used = rk.free_extents_sorted(
            np.full(len(offsets), code), offsets, sizes, on, self.capacity[:code + 1], self.unit_bits[:code + 1])
        if status != rk.OK:
            raise SegmentExtentsCorrupt(self.mounted(code).name, rk.fault_message(status, fault, self.unit_bits,
                                                                                  self.capacity))
        self.install_allocator(code, starts[lo[code]:hi[code]], lengths[lo[code]:hi[code]], int(used[code]))

    def install_allocator(self, code: int, starts: np.ndarray, lengths: np.ndarray, used: int) -> None:
        self.extents.install(code, starts, lengths)
        self.used[code] = used

    def _grow(self, need: int) -> None:
        cap = self.readable.shape[0]
        if need <= cap:
            return
        new_cap = max(need, 2 * cap)
        for name in ("readable", "allocatable", "capacity", "unit_bits", "used"):
            old = getattr(self, name)
            grown = np.zeros(new_cap, old.dtype)
            grown[:cap] = old
            setattr(self, name, grown)
        self.extents.grow(new_cap)


def offset_shifts(kind: np.ndarray | np.uint8, seg: np.ndarray, unit_bits: np.ndarray) -> np.ndarray:
    """Per replica slot (its kind and segment column values): the bits its ``replica_offset`` is
    shifted by, as :func:`..kernels.allocation.offset_shift` says (memory: the segment's units)."""
    memory = memory_on_segment_mask(np.asarray(kind), seg)
    return np.where(memory, unit_bits[np.where(memory, seg, 0)], 0)


def byte_offsets(column: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Byte offsets (int64) of ``replica_offset`` column values shifted by ``shifts``."""
    return column.astype(np.int64) << shifts


def segments_table(infos: Sequence[Segment], used: np.ndarray, readable: np.ndarray) -> pa.Table:
    """Segments as a snapshot segments table (``SEGMENTS_ARROW_SCHEMA``), one row per segment of
    ``infos`` with its ``used`` bytes and readability (segments are few: plain lists)."""
    return pa.table({
        "name": [s.name for s in infos], "endpoint": [s.endpoint for s in infos],
        "client": [s.client for s in infos], "base": pa.array([s.base for s in infos], pa.uint64()),
        "size": pa.array([s.size for s in infos], pa.int64()),
        "used": pa.array(np.asarray(used, np.int64)), "readable": pa.array(np.asarray(readable, np.bool_)),
        "segment_id": [s.segment_id for s in infos], "host_id": [s.host_id for s in infos],
    }, schema=SEGMENTS_ARROW_SCHEMA)
