"""``mooncake.store``: Mooncake Store's Python API, as upstream's module has it.

``MooncakeDistributedStore`` is a client of a ``mooncake_master``; everything here comes
from the native module ``mooncake._native`` (see ``store.pyi``).
"""

from mooncake._native import (
    BufferHandle,
    MooncakeDistributedStore,
    ReplicaDescriptor,
    ReplicateConfig,
)

__all__ = [
    "BufferHandle",
    "MooncakeDistributedStore",
    "ReplicaDescriptor",
    "ReplicateConfig",
]
