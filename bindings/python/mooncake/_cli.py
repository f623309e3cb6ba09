"""Console scripts ``transfer_engine_bench``, ``transfer_engine_topology_dump``, ``mooncake_master``,
``mooncake-doctor`` and ``mooncake_http_metadata_server``.

All run in Rust; Ctrl-C ends them as it ends a native program.
"""

import os
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
    # As upstream's script: discovery only, no log lines around the JSON.
    os.environ["MC_LOG_LEVEL"] = "ERROR"
    os.environ["MC_CUSTOM_TOPO_JSON"] = ""
    _native_signals()
    sys.exit(_native.run_topology_dump(sys.argv))


def mooncake_http_metadata_server() -> None:
    _native_signals()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    sys.exit(_native.run_http_metadata_server(sys.argv))


def mooncake_doctor() -> None:
    from mooncake import doctor

    sys.exit(doctor.main(sys.argv))


def mooncake_master() -> None:
    # The master stops on SIGINT and SIGTERM itself (it finishes the calls in flight).
    sys.exit(_native.run_master(sys.argv))


def mooncake_client() -> None:
    sys.stderr.write(
        "mooncake_client: upstream's standalone store client process is not provided by this "
        "mooncake; serving processes call MooncakeDistributedStore.setup(...) directly "
        "(setup_dummy is refused for the same reason)\n"
    )
    sys.exit(2)
