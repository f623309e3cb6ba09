"""``mooncake.engine``: the Transfer Engine's Python API, as upstream's module has it.

Everything that moves bytes comes from the native module ``mooncake._native``; this file
re-exports it under upstream's names (see ``engine.pyi`` for the documented API) and
defines the 0.3.14 classes this engine does not serve (``SharedSegment``,
``RpcInterface``), which refuse with the reason rather than do nothing.
"""

from typing import Any

from mooncake._native import (
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MULTI_PROTOCOL,
    SUPPORT_MUSA,
    InnerTransferEngine,
    Read,
    ScatterTransferCompletionStatus,
    ScatterTransferTicket,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
    __version__,
)

_NO_SHARED_SEGMENT = (
    "SharedSegment is not available in this engine: it has no process-shared segment "
    "allocator (upstream's mmap / Ascend VMM sharing). Register each rank's memory with "
    "TransferEngine.register_memory instead."
)

_NO_RPC = (
    "RpcInterface (CoroRPCInterface) is not available in this engine: upstream's is a "
    "coro_rpc (yalantinglibs) client/server whose wire format this engine does not speak. "
    "Move bytes with TransferEngine's transfer calls (and TransferNotify for messages)."
)


class SharedSegment:
    """Upstream's process-shared host segment; not served here (``supported()`` is False)."""

    @staticmethod
    def supported(mmap: bool = True, host_register: bool = False) -> bool:
        return False

    @staticmethod
    def create(
        name: str,
        size: int,
        world_size: int,
        rank_id: int,
        owner_rank: int = 0,
        device_id: int = 0,
        mmap: bool = True,
        host_register: bool = False,
    ) -> Any:
        raise RuntimeError(_NO_SHARED_SEGMENT)

    def __init__(self) -> None:
        raise RuntimeError(_NO_SHARED_SEGMENT)


class ReceivedData:
    """Upstream's received-message type of ``RpcInterface``; never produced here."""

    def __init__(self) -> None:
        raise RuntimeError(_NO_RPC)


class ReceivedTensor:
    """Upstream's received-tensor type of ``RpcInterface``; never produced here."""

    def __init__(self) -> None:
        raise RuntimeError(_NO_RPC)


class RpcInterface:
    """Upstream's coro_rpc messaging; constructing one raises ``RuntimeError`` with why."""

    def __init__(self) -> None:
        raise RuntimeError(_NO_RPC)


CoroRPCInterface = RpcInterface


def create_rpc_client(local_rank: int = 0, world_size: int = 1) -> RpcInterface:
    raise RuntimeError(_NO_RPC)


def create_rpc_server(local_rank: int = 0, world_size: int = 1) -> RpcInterface:
    raise RuntimeError(_NO_RPC)


__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MULTI_PROTOCOL",
    "SUPPORT_MUSA",
    "CoroRPCInterface",
    "InnerTransferEngine",
    "Read",
    "ReceivedData",
    "ReceivedTensor",
    "RpcInterface",
    "ScatterTransferCompletionStatus",
    "ScatterTransferTicket",
    "SharedSegment",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "__version__",
    "create_rpc_client",
    "create_rpc_server",
]
