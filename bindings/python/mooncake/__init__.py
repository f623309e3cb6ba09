"""Mooncake Transfer Engine, re-implemented in Rust.

Use ``from mooncake.engine import TransferEngine, TransferOpcode, TransferNotify``;
the native module ``mooncake._native`` is private.
"""

from mooncake._native import __version__

__all__ = ["__version__"]
