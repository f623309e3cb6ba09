"""``mooncake.engine``: the Transfer Engine's Python API, as upstream's module has it.

Everything here comes from the native module ``mooncake._native``; this file only
re-exports it under upstream's names (see ``engine.pyi`` for the documented API).
"""

from mooncake._native import (
    SUPPORT_CUDA,
    SUPPORT_EFA,
    SUPPORT_HIP,
    SUPPORT_INTRA_NVLINK,
    SUPPORT_MNNVL,
    SUPPORT_MUSA,
    InnerTransferEngine,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    Write,
    __version__,
)

__all__ = [
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "InnerTransferEngine",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "__version__",
]
