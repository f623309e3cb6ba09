"""Console scripts ``transfer_engine_bench`` and ``transfer_engine_topology_dump``.

Both run in Rust; Ctrl-C ends them as it ends a native program.
"""

import signal
import sys

from mooncake import _native


def _native_signals() -> None:
    # The work runs with the GIL released; let SIGINT end the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def transfer_engine_bench() -> None:
    _native_signals()
    sys.exit(_native.run_bench(sys.argv))


def transfer_engine_topology_dump() -> None:
    _native_signals()
    sys.exit(_native.run_topology_dump(sys.argv))
