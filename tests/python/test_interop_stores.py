"""Our wheel and the published upstream wheel sharing one metadata store: our HTTP metadata
server (``mooncake_http_metadata_server``) and a throw-away etcd (Debian's ``etcd-server``,
started here on loopback with a temporary data directory), verified bytes both ways.
Needs UPSTREAM_PYTHON (scripts/setup-upstream.sh) and ``etcd`` on PATH
(scripts/install-deps.sh)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import Buffer, Peer, free_port, pattern, run_peer_initiator, sha256
from mooncake.engine import TransferEngine

MIB = 1 << 20
BIN = Path(sys.executable).parent
# Upstream publishes its first non-loopback address unless told: keep everything on loopback.
UPSTREAM_ENV = {"MC_FORCE_TCP": "1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
_names = itertools.count(1)


def _name() -> str:
    # Only a name with a store; the port part is not bound.
    return f"127.0.0.1:{40000 + next(_names)}"


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def http_store():
    port = free_port()
    proc = subprocess.Popen(
        [BIN / "mooncake_http_metadata_server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert "serving" in proc.stdout.readline()
        yield f"http://127.0.0.1:{port}/metadata"
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def etcd_store():
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.fail("etcd not found: run scripts/install-deps.sh (Debian package etcd-server)", pytrace=False)
    client, peer = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="te-etcd-")
    proc = subprocess.Popen(
        [etcd, "--name", "t", "--data-dir", data,
         "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/health", timeout=2) as r:
                return b"true" in r.read()
        except OSError:
            return False

    try:
        _wait(healthy, 30, "etcd")
        yield f"etcd://127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["http", "etcd"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


def test_our_engine_and_upstreams_share_a_store(store, upstream_python):
    # Upstream's engine serves a pattern(5) buffer, found by name through the store.
    target = Peer(upstream_python, 4 * MIB, seed=5, env=UPSTREAM_ENV, host=_name(), metadata=store)
    ours = TransferEngine()
    try:
        assert ours.initialize(_name(), store, "tcp", "") == 0, TransferEngine.last_error()
        local = Buffer(4 * MIB)
        assert ours.register_memory(local.addr, local.size) == 0
        sid = target.session_id
        assert ours.get_first_buffer_address(sid) == target.buffer
        assert ours.transfer_sync_read(sid, local.addr, target.buffer, 4 * MIB) == 0
        assert local.read() == pattern(5, 0, 4 * MIB)
        local.write(0, pattern(9, 0, MIB))
        assert ours.transfer_sync_write(sid, local.addr, target.buffer, MIB) == 0
        assert target.check(0, MIB, 9) == "ok"

        # Upstream's engine as initiator against ours, found through the store.
        our_name = _name()
        t = TransferEngine()
        assert t.initialize(our_name, store, "tcp", "") == 0, TransferEngine.last_error()
        buf = Buffer(MIB, fill=pattern(3, 0, MIB))
        assert t.register_memory(buf.addr, buf.size) == 0
        result = run_peer_initiator(
            upstream_python, our_name, buf.addr, MIB, 11,
            "--metadata", store, "--host", _name(), "--expect-peer-seed", "3",
        )
        assert result["ok"] and result["_rc"] == 0, result
        assert result["final_peer_sha256"] == sha256(buf.read())
        assert buf.read() == pattern(11, 0, MIB)
    finally:
        target.stop()
