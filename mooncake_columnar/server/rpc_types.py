"""The upstream master's RPCs as struct_pack types: each call's argument struct and return type
(upstream ``rpc_service.h`` and ``types.h``/``replica.h`` field order; the literals these derive
agree with captured traffic, see tests/server/test_wire_golden.py), and its coro_rpc function id."""
from __future__ import annotations

import hashlib

from .struct_pack import (BOOL, I32, I64, STR, U8, U32, U64, Expected, KeyVec, Message, MetaVec, Opt, Struct, Trivial,
                          U64Vec, Variant, Vec, VOID)

UUID = Trivial(U64, U64, align=8, pack=8)  # std::pair<u64, u64>
SEGMENT = Struct(UUID, STR, U64, U64, STR, STR, STR)  # id, name, base, size, te_endpoint, protocol, host_id
REPLICATE_CONFIG = Struct(
    U64, U64, U64,      # replica_num, nof_replica_num, dfs_replica_num
    U8, Opt(U64),       # soft_pin_action, soft_pin_ttl_ms
    BOOL,               # with_hard_pin
    Vec(STR), STR,      # preferred_segments, preferred_segment
    Vec(STR), BOOL,     # preferred_nof_segments, prefer_alloc_in_same_node
    U8, STR,            # data_type, host_id
    Opt(Vec(STR)),      # group_ids
)
OBJECT_META = Struct(STR, Opt(U64))  # key, checksum
_BUFFER = Struct(U64, U64, STR, STR)  # size, buffer address, protocol, transport endpoint
DESCRIPTOR = Struct(U64, Variant(
    Struct(_BUFFER),                      # memory
    Struct(_BUFFER),                      # NoF
    Struct(STR, U64),                     # disk: file path, object size
    Struct(UUID, U64, STR),               # local disk: client id, object size, transport endpoint
    Struct(STR, U64, U64, U64, I32),      # distributed FS: path, offset, size, aligned size, shard
), I32)
GET_REPLICA_LIST_RESPONSE = Struct(Vec(DESCRIPTOR), U64, Opt(U64))  # replicas, lease_ttl_ms, checksum
TASK_ASSIGNMENT = Struct(UUID, I32, STR, I64, U32)

MEMORY_DESCRIPTOR = 0  # the variant alternative of a memory replica


class Rpc:
    """One RPC: its name, function id, request (None: no arguments, an empty body) and response."""

    def __init__(self, name: str, request: Struct | Trivial | None, response: object) -> None:
        self.name = name
        self.function_id = function_id(name)
        self.request = Message(request) if request is not None else None
        self.response = Message(response)  # type: ignore[arg-type]


def function_id(method: str) -> int:
    """coro_rpc's handler key: the first four MD5 bytes (big-endian) of the qualified name."""
    return int.from_bytes(hashlib.md5(f"mooncake::WrappedMasterService::{method}".encode()).digest()[:4], "big")


_VOID = Expected(VOID)
_VOIDS = Vec(_VOID)
_REPLICAS = Expected(Vec(DESCRIPTOR))

RPCS = {rpc.name: rpc for rpc in (
    Rpc("ServiceReady", None, Expected(STR)),
    Rpc("GetFsdir", None, Expected(STR)),
    Rpc("GetStorageConfig", None, Expected(Struct(STR, BOOL, U64))),
    Rpc("Ping", UUID, Expected(Struct(I64, I32))),
    Rpc("MountSegment", Struct(SEGMENT, UUID), _VOID),
    Rpc("ReMountSegment", Struct(Vec(SEGMENT), UUID), _VOID),
    Rpc("UnmountSegment", Struct(UUID, UUID), _VOID),
    Rpc("FetchTasks", Struct(UUID, U64), Expected(Vec(TASK_ASSIGNMENT))),
    Rpc("PutStart", Struct(UUID, STR, U64, REPLICATE_CONFIG, STR), _REPLICAS),
    Rpc("PutEnd", Struct(UUID, OBJECT_META, I32, STR), _VOID),
    Rpc("PutRevoke", Struct(UUID, STR, I32, STR), _VOID),
    Rpc("BatchPutStart", Struct(UUID, KeyVec(), U64Vec(), REPLICATE_CONFIG, STR), Vec(_REPLICAS)),
    Rpc("BatchPutEnd", Struct(UUID, MetaVec(), I32, STR), _VOIDS),
    Rpc("BatchPutRevoke", Struct(UUID, KeyVec(), I32, STR), _VOIDS),
    Rpc("GetReplicaList", Struct(STR, STR), Expected(GET_REPLICA_LIST_RESPONSE)),
    Rpc("BatchGetReplicaList", Struct(KeyVec(), STR), Vec(Expected(GET_REPLICA_LIST_RESPONSE))),
    Rpc("ExistKey", Struct(STR, STR), Expected(BOOL)),
    Rpc("BatchExistKey", Struct(KeyVec(), STR), Vec(Expected(BOOL))),
    Rpc("Remove", Struct(STR, BOOL, STR), _VOID),
    Rpc("BatchRemove", Struct(KeyVec(), BOOL, STR), _VOIDS),
    Rpc("RemoveByRegex", Struct(STR, BOOL, STR), Expected(I64)),
    Rpc("RemoveAll", Struct(BOOL, STR), I64),
)}
