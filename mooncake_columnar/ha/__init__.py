"""High availability: the oplog wire model, its durable stores and the ordered writer."""
from .oplog import (
    STANDBY_WIRE_VERSION,
    OpLogBatch,
    OpLogColumns,
    OpLogEntry,
    OpLogOp,
    OpType,
    PutEndPayload,
    ReplicaDescriptor,
    SegmentPayload,
    decode_batch,
    encode_batch,
)
from .stores import EtcdOpLogStore, FileOpLogStore, OpLogStore
from .writer import OpLogWriter, Reservation

__all__ = [
    "STANDBY_WIRE_VERSION",
    "EtcdOpLogStore",
    "FileOpLogStore",
    "OpLogBatch",
    "OpLogColumns",
    "OpLogEntry",
    "OpLogOp",
    "OpLogStore",
    "OpLogWriter",
    "OpType",
    "PutEndPayload",
    "ReplicaDescriptor",
    "Reservation",
    "SegmentPayload",
    "decode_batch",
    "encode_batch",
]
