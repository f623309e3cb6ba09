"""initialize's protocol and device_name, MC_FORCE_HCA / MC_TE_FILTERS, and the topology
dump over synthetic sysfs trees (MC_SYSFS_ROOT) written here in the kernel's layout.

This machine has no RDMA device and no verbs loader is built in yet, so "rdma" always
falls back to TCP here; what is checked is that the fallback says so once, and that the
refusals carry their reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers import HOST

BIN = Path(sys.executable).parent
DUMP = BIN / "transfer_engine_topology_dump"


def write_tree(root: Path, hcas: list[tuple[str, int, str]]) -> Path:
    """A sysfs tree with NUMA nodes 0 and 1 and, per (name, node, state), an HCA on its own
    PCI function under that node's root complex, port 1 with a RoCE v1 and a v2 GID."""
    for n in (0, 1):
        (root / f"devices/system/node/node{n}").mkdir(parents=True, exist_ok=True)
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    for i, (name, node, state) in enumerate(hcas):
        bdf = f"0000:{0x10 * (i + 1) + 0x80 * node:02x}:00.0"
        path = f"pci0000:{0x80 * node:02x}/0000:{0x80 * node:02x}:{i + 1:02x}.0/{bdf}"
        func = root / "devices" / path
        func.mkdir(parents=True)
        (func / "numa_node").write_text(f"{node}\n")
        (root / "bus/pci/devices" / bdf).symlink_to(f"../../../devices/{path}")
        dev = root / "class/infiniband" / name
        (dev / "ports/1/gids").mkdir(parents=True)
        (dev / "ports/1/gid_attrs/types").mkdir(parents=True)
        (dev / "device").symlink_to(f"../../../devices/{path}")
        port = dev / "ports/1"
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("Ethernet\n")
        (port / "lid").write_text("0x0\n")
        gids = ["fe80:0000:0000:0000:0000:0000:0000:0001", f"0000:0000:0000:0000:0000:ffff:0a00:{i + 1:02x}01"]
        for index, (gid, kind) in enumerate(zip(gids, ["IB/RoCE v1", "RoCE v2"])):
            (port / f"gids/{index}").write_text(gid + "\n")
            (port / f"gid_attrs/types/{index}").write_text(kind + "\n")
    return root


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "MC_LOG_LEVEL": "warning", **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full)


def dump(*args: str, **env: str) -> dict:
    out = subprocess.run([DUMP, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_unserved_protocol_fails_and_last_error_names_it():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    assert engine.initialize(HOST, "P2PHANDSHAKE", "nvlink", "") == -1
    reason = TransferEngine.last_error()
    assert reason and 'protocol "nvlink"' in reason and "not served" in reason, reason
    assert engine.initialize(HOST, "P2PHANDSHAKE", "rmda", "") == -1
    assert 'unknown protocol "rmda"' in TransferEngine.last_error()


def test_rdma_without_rdma_falls_back_to_tcp_with_one_warning():
    code = (
        "from mooncake.engine import TransferEngine\n"
        "for _ in range(2):\n"
        "    e = TransferEngine()\n"
        f"    assert e.initialize({HOST!r}, 'P2PHANDSHAKE', 'rdma', '') == 0, TransferEngine.last_error()\n"
        "print('OK')\n"
    )
    out = run_python(code)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr
    lines = [l for l in out.stderr.splitlines() if "falling back to TCP" in l]
    assert len(lines) == 1, out.stderr
    assert "MC_FORCE_HCA=1" in lines[0], lines[0]


def test_force_hca_without_rdma_fails_with_the_reason(monkeypatch):
    from mooncake.engine import TransferEngine

    monkeypatch.setenv("MC_FORCE_HCA", "1")
    engine = TransferEngine()
    assert engine.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == -1
    reason = TransferEngine.last_error()
    assert "MC_FORCE_HCA is set but RDMA cannot be used" in reason, reason
    # MC_FORCE_TCP wins: the bisecting switch works with MC_FORCE_HCA still exported.
    monkeypatch.setenv("MC_FORCE_TCP", "1")
    assert engine.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0, TransferEngine.last_error()


def test_topology_dump_of_synthetic_trees(tmp_path):
    empty = write_tree(tmp_path / "none", [])
    assert dump(MC_SYSFS_ROOT=str(empty)) == {"cpu:0": [[], []], "cpu:1": [[], []]}

    down = write_tree(tmp_path / "down", [("mlx5_0", 0, "1: DOWN")])
    assert dump(MC_SYSFS_ROOT=str(down)) == {"cpu:0": [[], []], "cpu:1": [[], []]}

    four = write_tree(
        tmp_path / "four",
        [("mlx5_0", 0, "4: ACTIVE"), ("mlx5_1", 0, "4: ACTIVE"), ("mlx5_2", 1, "4: ACTIVE"), ("mlx5_3", 1, "4: ACTIVE")],
    )
    topo = dump(MC_SYSFS_ROOT=str(four), MC_CUSTOM_TOPO_JSON="/nonexistent.json")
    assert topo["cpu:0"] == [["mlx5_0", "mlx5_1"], ["mlx5_2", "mlx5_3"]]
    assert topo["cpu:1"] == [["mlx5_2", "mlx5_3"], ["mlx5_0", "mlx5_1"]]
    assert dump("--sys-root", str(four), MC_TE_FILTERS="mlx5_1,mlx5_2")["cpu:0"] == [["mlx5_1"], ["mlx5_2"]]
    legacy = dump(MC_SYSFS_ROOT=str(four), MOONCAKE_RDMA_DEVICES="mlx5_3")
    assert legacy["cpu:0"] == [[], ["mlx5_3"]]
    both = dump(MC_SYSFS_ROOT=str(four), MOONCAKE_RDMA_DEVICES="mlx5_3", MC_TE_FILTERS="mlx5_0")
    assert both["cpu:1"] == [[], ["mlx5_0"]]
    assert dump("--device_name", "mlx5_2", MC_SYSFS_ROOT=str(four))["cpu:1"] == [["mlx5_2"], []]

    # get_local_topology names what a filter asks for that the host lacks.
    code = (
        "from mooncake.engine import TransferEngine\n"
        "print(TransferEngine().get_local_topology('mlx5_0'))\n"
    )
    out = run_python(code, MC_SYSFS_ROOT=str(four), MC_TE_FILTERS="mlx5_9,mlx5_0")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["cpu:0"] == [["mlx5_0"], []]
    assert "mlx5_9" in out.stderr and "HCAs present: mlx5_0, mlx5_1, mlx5_2, mlx5_3" in out.stderr, out.stderr
