"""remount_segments fails with typed errors (errors.py) only: extents that cannot be rebuilt, a
segment given as a dict with unknown fields, and an injected fault."""
from __future__ import annotations

import pytest

from mooncake_columnar import ManualClocks, MasterConfig, MasterService, ReplicateConfig
from mooncake_columnar.errors import (InvalidParams, MooncakeError, RecoveryFault, SegmentExtentsCorrupt)
from mooncake_columnar.policies.recovery import RecoveryFault as RecoveryFaultFromRecovery

SEG = dict(name="seg0", endpoint="10.0.0.1:1234", client="client0", base=1 << 40, size=1 << 24)


def _promoted(keys: int = 3) -> MasterService:
    """A master as promotion leaves it: ``keys`` objects of 4096 bytes on one unreadable segment."""
    src = MasterService(MasterConfig(), clocks=ManualClocks())
    src.mount_segment(SEG["name"], endpoint=SEG["endpoint"], client_id=SEG["client"], base=SEG["base"],
                      size=SEG["size"])
    for i in range(keys):
        src.put_start(f"k{i}", 4096, client_id=SEG["client"], config=ReplicateConfig())
        src.put_end(f"k{i}", client_id=SEG["client"])
    return MasterService.from_state(src.export_state(), config=src.config, clocks=ManualClocks(),
                                    segments_readable=False)


@pytest.mark.parametrize("row, onto", [(1, 0), (2, 0)], ids=["in_offset_order", "out_of_offset_order"])
def test_extents_that_cannot_be_rebuilt_fail_the_remount_with_a_typed_error(row: int, onto: int) -> None:
    m = _promoted()
    rows = m.objects.live_rows()
    m.objects.replica_offset[rows[row], 0] = m.objects.replica_offset[rows[onto], 0]  # corrupt: overlap
    with pytest.raises(SegmentExtentsCorrupt, match="overlap") as info:
        m.remount_segments("client0", [SEG])
    assert isinstance(info.value, MooncakeError) and info.value.segment == "seg0"
    assert not m.segments.readable[0]


def test_a_segment_dict_with_unknown_fields_is_invalid_params() -> None:
    m = _promoted()
    with pytest.raises(InvalidParams, match="segment"):
        m.remount_segments("client0", [{**SEG, "colour": "blue"}])
    with pytest.raises(InvalidParams, match="segment"):
        m.remount_segments("client0", [{"name": "seg0"}])


def test_an_injected_fault_is_typed_and_importable_from_recovery() -> None:
    assert RecoveryFaultFromRecovery is RecoveryFault and issubclass(RecoveryFault, MooncakeError)
    m = _promoted()

    def fault(step: str) -> None:
        if step == "verify":
            raise RecoveryFault(step)

    m.remount_fault = fault
    with pytest.raises(RecoveryFault):
        m.remount_segments("client0", [SEG])
    m.remount_fault = None
    assert m.remount_segments("client0", [SEG]).matched_objects == 3
