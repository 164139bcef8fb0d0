"""mooncake-columnar: a columnar object-metadata engine for a Mooncake Store master."""
from . import runtime  # noqa: F401  (first: threading-layer settings before any kernel runs)
from .clock import Clocks, ManualClocks, MonotonicClocks
from .config import MasterConfig
from .errors import ErrorCode, MooncakeError
from .master import MasterService
from .messages import BatchResult, ObjectInfo, ReplicaDescriptor, ReplicateConfig, SegmentInfo
from .schema import (NEVER_LEASED, NO_DEADLINE, ObjectDataType, PingStatus, ReplicaKind, ReplicaStatus,
                     SoftPinAction)
from .store.segments import Segment
from . import warmup  # noqa: F401  (registers the warm-up MasterService.start runs: see warm_up_hook.py)

__all__ = [
    "BatchResult", "Clocks", "ErrorCode", "ManualClocks", "MasterConfig", "MasterService", "MonotonicClocks",
    "MooncakeError", "NEVER_LEASED", "NO_DEADLINE", "ObjectDataType", "ObjectInfo", "PingStatus",
    "ReplicaDescriptor", "ReplicaKind", "ReplicaStatus", "ReplicateConfig", "Segment", "SegmentInfo", "SoftPinAction",
]
