"""Scratch buffers are kept between calls: the same memory comes back while it is long enough."""
from __future__ import annotations

import numpy as np

from mooncake_columnar.store.scratch import Scratch


def test_scratch_hands_back_the_kept_buffer_and_grows_it_with_room_to_spare():
    s = Scratch()
    a = s.array("codes", 800, np.uint8)
    assert a.shape == (800,) and a.dtype == np.uint8
    a[:] = 7
    b = s.array("codes", 500, np.uint8)
    assert b.base is a.base and (b == 7).all()  # kept: no fresh memory, contents left as they were
    c = s.array("codes", 1000, np.uint8)
    assert c.base is not a.base and c.shape == (1000,) and c.base.shape[0] == 1125
    assert s.array("codes", 10, np.int64).dtype == np.int64  # another dtype: made anew
    assert s.nbytes == 11 * 8  # only the latest buffer of each name is kept


_CYCLE_BUFFERS = (("census codes", np.uint8), ("census listed rows", np.uint32), ("census listed deadlines", np.int64))


def test_two_eviction_cycles_reuse_the_census_buffers(master, clocks):
    """The census's codes and its listing of the earliest candidates go into the same kept
    buffers at every cycle, which hold a byte per row and the listing's rooms (12 bytes an entry),
    with an eighth to spare."""
    from mooncake_columnar.kernels import eviction as ek
    from mooncake_columnar.tools.synthetic import fill, mount_segments

    mount_segments(master, 2, 64 << 20)
    fill(master, 2000, object_bytes=4096)
    clocks.advance(s=3600)
    first = master.evict(target=0.1)
    scratch = master.store.scratch
    kept = [scratch.array(name, 1, dtype).base for name, dtype in _CYCLE_BUFFERS]
    second = master.evict(target=0.1)
    assert first.evicted_objects > 0 and second.evicted_objects > 0
    again = [scratch.array(name, 1, dtype).base for name, dtype in _CYCLE_BUFFERS]
    assert all(a is b for a, b in zip(again, kept))
    rows = master.objects.high_water
    assert scratch.nbytes <= 1.125 * (rows + 12 * ek.listing_entries(rows, 1.0)) + 64
    master.verify()
