"""mooncake-doctor from the installed wheel (console script and ``python -m
mooncake.doctor``) over an empty synthetic host, and the typed cause that
``TransferEngine.last_error_info()`` gives after a failed initialize and failed transfers.
The Rust tests (doctor/tests/doctor.rs) cover each failure of the FAQ tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from mooncake.engine import TransferEngine

BIN = Path(sys.executable).parent
DOCTOR = BIN / "mooncake-doctor"


def host_env(tmp_path: Path, **extra: str) -> dict:
    """An empty synthetic host: no HCA, no /dev/infiniband, no verbs library, no GPU."""
    for d in ("sys", "proc", "dev"):
        (tmp_path / d).mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MC_", "MOONCAKE_"))}
    env.update(
        MC_SYSFS_ROOT=str(tmp_path / "sys"),
        MC_PROCFS_ROOT=str(tmp_path / "proc"),
        MC_DEV_ROOT=str(tmp_path / "dev"),
        MC_IBVERBS_PATH=str(tmp_path / "no-libibverbs.so.1"),
        MC_GPU_RUNTIME="none",
        MC_LOG_LEVEL="ERROR",
    )
    env.update(extra)
    return env


def run(cmd: list, env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


def checks(out: subprocess.CompletedProcess) -> dict:
    doc = json.loads(out.stdout)
    assert doc["doctor"] == 1 and doc["exit_code"] == out.returncode, doc
    return {c["id"]: c for c in doc["checks"]}


def test_console_script_json_all_ok_over_tcp(tmp_path):
    t0 = time.monotonic()
    out = run([DOCTOR, "--json", "--protocol", "tcp"], host_env(tmp_path))
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    c = checks(out)
    # Python's facts reached Rust: the installed wheel's tags, and ours as the one
    # distribution shipping `mooncake`.
    assert c["python.wheel"]["status"] == "ok", c["python.wheel"]
    assert "fits" in c["python.wheel"]["saw"]
    assert c["python.wheel"]["data"]["tags"], c["python.wheel"]
    dists = c["python.distributions"]["data"]["distributions"]
    assert [d["name"] for d in dists] == ["mooncake-transfer-engine-musa"], dists
    assert c["decision"]["data"]["transports"] == ["tcp"]
    assert took < 5, f"doctor took {took:.2f} s"


def test_python_m_and_exit_codes(tmp_path):
    env = host_env(tmp_path)
    warn = run([sys.executable, "-m", "mooncake.doctor", "--json"], env)
    assert warn.returncode == 1, warn.stdout + warn.stderr
    assert checks(warn)["rdma.hcas"]["status"] == "warn"
    fail = run([sys.executable, "-m", "mooncake.doctor"], dict(env, MC_FORCE_HCA="1"))
    assert fail.returncode == 2, fail.stdout + fail.stderr
    assert "fail  decision" in fail.stdout and "MC_FORCE_HCA" in fail.stdout
    assert "\x1b[" not in fail.stdout  # no colour on a pipe
    assert run([DOCTOR, "--no-such-flag"], env).returncode == 64


def test_selftest_and_dead_peer(tmp_path):
    out = run([DOCTOR, "--json", "--protocol", "tcp", "--selftest", "--peer", "127.0.0.1:1", "--timeout", "2"],
              host_env(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    c = checks(out)
    assert c["selftest"]["status"] == "ok", c["selftest"]
    assert c["selftest"]["data"]["verified"] is True
    assert c["peer"]["status"] == "fail"
    assert "probe of 127.0.0.1:1" in c["peer"]["saw"]


def test_peer_against_a_live_engine(tmp_path):
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
    buf = engine.allocate_managed_buffer(1 << 20)
    assert buf
    session = f"127.0.0.1:{engine.get_rpc_port()}"
    out = run([DOCTOR, "--json", "--protocol", "tcp", "--peer", session], host_env(tmp_path))
    peer = checks(out)["peer"]
    assert peer["status"] == "ok", peer
    assert peer["data"]["protocols"] == ["tcp"] and peer["data"]["buffers"] >= 1


def test_last_error_info_after_failed_initialize():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "efa", "") == -1
    info = TransferEngine.last_error_info()
    assert info["kind"] == "protocol_not_served", info
    assert info["fault"] == "caller", info
    assert info["call"] == "initialize" and info["code"] == -1
    assert info["message"] == TransferEngine.last_error()
    assert "efa" in info["message"] and "tcp" in info["hint"]
    assert info["peer"] is None
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert TransferEngine.last_error_info() is None


def test_last_error_info_rdma_forced_and_the_first_failure_points_at_the_doctor(tmp_path):
    code = (
        "from mooncake.engine import TransferEngine as T\n"
        "e = T()\n"
        "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', '') == -1\n"
        "i = T.last_error_info()\n"
        "assert i['kind'] == 'rdma_unavailable' and i['fault'] == 'host', i\n"
        "assert 'MC_FORCE_HCA' in i['hint'] and 'mooncake-doctor' in i['hint'], i\n"
        "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'efa', '') == -1\n"
    )
    out = run([sys.executable, "-c", code], host_env(tmp_path, MC_FORCE_HCA="1", MC_LOG_LEVEL="WARNING"))
    assert out.returncode == 0, out.stderr
    pointers = [l for l in out.stderr.splitlines() if "run `mooncake-doctor`" in l]
    assert len(pointers) == 1, out.stderr


def test_last_error_info_after_failed_transfers(engine, peer, local_buffer):
    eng, _ = engine
    a = local_buffer.addr
    assert eng.transfer_sync_write(peer.session_id, a, peer.buffer + peer.size - 8, 64) == -1
    info = TransferEngine.last_error_info()
    assert info["kind"] == "address_rejected" and info["fault"] == "caller", info
    assert info["peer"] and info["hint"]
    dead = "127.0.0.1:1"
    assert eng.transfer_sync_write(dead, a, a, 64) == -1
    info = TransferEngine.last_error_info()
    assert info["kind"] in ("peer_unreachable", "timeout") and info["fault"] == "peer", info
    assert dead in info["peer"] and f"mooncake-doctor --peer {dead}" in info["hint"], info
    assert eng.batch_transfer_sync_write(peer.session_id, [a, a], [peer.buffer], [8, 8]) == -1
    info = TransferEngine.last_error_info()
    assert info["kind"] == "invalid_argument" and info["fault"] == "caller", info


def test_two_distributions_shipping_mooncake_fail(tmp_path):
    # A second distribution on the path that ships `mooncake/` files, as upstream's wheel does.
    site = tmp_path / "site"
    info = site / "mooncake_transfer_engine-0.3.12.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mooncake-transfer-engine\nVersion: 0.3.12\n")
    (info / "RECORD").write_text("mooncake/__init__.py,,\nmooncake/engine.cpython-310-x86_64-linux-gnu.so,,\n")
    env = host_env(tmp_path, PYTHONPATH=str(site))
    out = run([DOCTOR, "--json", "--protocol", "tcp"], env)
    assert out.returncode == 2, out.stdout + out.stderr
    c = checks(out)["python.distributions"]
    assert c["status"] == "fail", c
    names = sorted(d["name"] for d in c["data"]["distributions"])
    assert names == ["mooncake-transfer-engine", "mooncake-transfer-engine-musa"], c
    # The one to remove is upstream's: ours ships mooncake/_native.
    assert "`pip uninstall mooncake-transfer-engine`" in c["fix"], c["fix"]
