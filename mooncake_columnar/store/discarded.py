"""Memory extents of abandoned puts' replicas: they keep their space until their release time
(put start + put_start_release_timeout_s, system ms), as upstream, then it is freed."""
from __future__ import annotations

import numpy as np


class DiscardedExtents:
    """Columns of discarded extents: segment code, offset, size, release time (system ms)."""

    def __init__(self) -> None:
        self.seg = np.empty(0, np.int64)
        self.off = np.empty(0, np.int64)
        self.size = np.empty(0, np.int64)
        self.release_ms = np.empty(0, np.int64)

    def __len__(self) -> int:
        return int(self.seg.size)

    def add(self, seg: np.ndarray, off: np.ndarray, size: np.ndarray, release_ms: np.ndarray) -> None:
        """Hold these extents until ``release_ms``."""
        self.seg = np.concatenate((self.seg, seg.astype(np.int64)))
        self.off = np.concatenate((self.off, off))
        self.size = np.concatenate((self.size, size))
        self.release_ms = np.concatenate((self.release_ms, release_ms))

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the extents where ``mask`` is True."""
        self.seg, self.off = self.seg[mask], self.off[mask]
        self.size, self.release_ms = self.size[mask], self.release_ms[mask]
