"""Faulting fresh memory in from several threads at once, before bulk work needs it.

On a VM whose balloon driver reports freed guest pages back to the host (free page reporting:
Firecracker, many cloud VMs), a page not used for a few seconds costs a host fault on its next
first touch: about 2 ms per MB here, ten times the memcpy, and one faulting thread leaves the
host mostly idle. Those faults overlap across threads (measured here: 1 GiB in 1.7 s from one
thread, 0.65 s from four), so a snapshot or restore of a large master faults its memory in from
:data:`FAULT_THREADS` threads first. On hosts whose free memory stays resident this costs one
extra pass over the same bytes (tens of ms per GB) and can be turned off.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable

import numpy as np

FAULT_THREADS = 4
MIN_FAULT_BYTES = 64 << 20  # below this, thread start-up costs more than the faults


def _split(arrays: Iterable[np.ndarray], parts: int) -> list[list[np.ndarray]]:
    """Byte views of ``arrays`` cut into ``parts`` lists of about equal size."""
    flat = [a.reshape(-1).view(np.uint8) for a in arrays if a.nbytes]
    total = sum(a.size for a in flat)
    share = -(-total // parts)
    out: list[list[np.ndarray]] = [[] for _ in range(parts)]
    part, room = 0, share
    for a in flat:
        while a.size:
            take = min(room, a.size)
            out[part].append(a[:take])
            a, room = a[take:], room - take
            if room == 0 and part + 1 < parts:
                part, room = part + 1, share
    return out


def _start(work: list[list], touch) -> list[threading.Thread]:
    threads = [threading.Thread(target=lambda views=views: [touch(v) for v in views], daemon=True)
               for views in work]
    for t in threads:
        t.start()
    return threads


def _run(work: list[list], touch) -> None:
    for t in _start(work, touch):
        t.join()


def prefault(arrays: Iterable[np.ndarray], threads: int = FAULT_THREADS) -> None:
    """Fault in every page of ``arrays`` (contiguous NumPy arrays about to be written) from
    ``threads`` threads, writing zeros: call it on freshly allocated arrays only, before filling
    them (an ``np.zeros`` array keeps its contents). NumPy releases the GIL while it fills large
    arrays."""
    arrays = [a for a in arrays if a.nbytes]
    if not arrays or sum(a.nbytes for a in arrays) < MIN_FAULT_BYTES:
        return
    if any(not a.flags.c_contiguous or not a.flags.writeable for a in arrays):
        raise ValueError("prefault needs writable C-contiguous arrays")
    _run(_split(arrays, threads), lambda v: v.fill(0))


def free_memory_bytes() -> int:
    """Bytes of physical memory the kernel reports free (0 where unknown)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


class FreeMemoryWarmer:
    """:func:`warm_free_memory` in the background: started on construction, :meth:`wait` before
    the allocations it is for. Work that allocates little (decoding memory-mapped files) can run
    meanwhile."""

    def __init__(self, nbytes: int, threads: int = FAULT_THREADS) -> None:
        nbytes = min(int(nbytes), free_memory_bytes() // 2)  # transient extra memory
        self._threads: list[threading.Thread] = []
        if nbytes > 0 and nbytes >= MIN_FAULT_BYTES:
            share = -(-nbytes // threads)
            self._threads = _start([[None]] * threads, lambda _: np.ones(share, np.uint8))

    def wait(self) -> None:
        for t in self._threads:
            t.join()
        self._threads = []


def warm_free_memory(nbytes: int, threads: int = FAULT_THREADS) -> None:
    """Touch about ``nbytes`` of fresh memory from ``threads`` threads and free it again, so that
    allocations right after (the page cache of a file about to be written) find pages the host
    has backed. Never more than half the free memory: it is transient extra memory."""
    FreeMemoryWarmer(nbytes, threads).wait()
