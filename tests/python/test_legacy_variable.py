"""The legacy HCA variable `MOONCAKE_RDMA_DEVICES`: every way it reaches the engine logs the
exact deprecation line naming `MC_TE_FILTERS` as its replacement, whatever else is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

ALONE = (
    'MOONCAKE_RDMA_DEVICES="mlx5_0" is deprecated and MC_TE_FILTERS replaces it (the old name is '
    'honoured only while MC_TE_FILTERS is unset); set MC_TE_FILTERS="mlx5_0" instead'
)
BOTH = (
    'MOONCAKE_RDMA_DEVICES="mlx5_0" is deprecated and MC_TE_FILTERS replaces it: '
    'MC_TE_FILTERS="mlx5_1" and MOONCAKE_RDMA_DEVICES are both set, MC_TE_FILTERS wins; '
    "unset MOONCAKE_RDMA_DEVICES"
)

# initialize with `protocol`; the variable comes from the child's environment unless
# `set_late` names it, in which case os.environ gets it after the import.
CHILD = """
import os, sys
from mooncake.engine import TransferEngine
for kv in sys.argv[2:]:
    k, _, v = kv.partition("=")
    os.environ[k] = v
e = TransferEngine()
print("rc", e.initialize("127.0.0.1", "P2PHANDSHAKE", sys.argv[1], ""), flush=True)
"""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MC_TE_FILTERS", "MOONCAKE_RDMA_DEVICES")}
    env.update(MC_LOG_LEVEL="info", **extra)
    return env


def run_child(protocol: str, env: dict[str, str], late: list[str] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHILD, protocol, *late],
        capture_output=True, text=True, timeout=60, env=env,
    )


def warned(out: subprocess.CompletedProcess, line: str) -> None:
    hits = [ln for ln in out.stderr.splitlines() if ln.endswith(line) and " WARN " in ln]
    assert len(hits) == 1, f"want one WARN line ending {line!r}; stderr:\n{out.stderr}"


@pytest.mark.parametrize("protocol", ["tcp", "rdma"])
def test_set_before_import(protocol):
    # This host has no mlx5_0: with rdma the engine also warns of the missing HCA (or
    # fails); the deprecation line is there either way.
    out = run_child(protocol, child_env(MOONCAKE_RDMA_DEVICES="mlx5_0"))
    warned(out, ALONE)
    if protocol == "tcp":
        assert "rc 0" in out.stdout, out.stderr


def test_set_after_import():
    out = run_child("tcp", child_env(), ["MOONCAKE_RDMA_DEVICES=mlx5_0"])
    warned(out, ALONE)
    assert "rc 0" in out.stdout, out.stderr


def test_set_beside_the_new_variable():
    out = run_child("tcp", child_env(MOONCAKE_RDMA_DEVICES="mlx5_0", MC_TE_FILTERS="mlx5_1"))
    warned(out, BOTH)


def test_said_even_when_another_variable_is_bad():
    out = run_child("tcp", child_env(MOONCAKE_RDMA_DEVICES="mlx5_0", MC_TCP_LANES_PER_PEER="lots"))
    warned(out, ALONE)
    assert "rc -1" in out.stdout, out.stderr


def test_console_scripts_say_it():
    env = child_env(MOONCAKE_RDMA_DEVICES="mlx5_0")
    out = subprocess.run([BIN / "transfer_engine_topology_dump"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    warned(out, ALONE)
