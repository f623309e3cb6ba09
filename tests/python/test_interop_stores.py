"""Our wheel and the published upstream wheel sharing one metadata store: our HTTP metadata
server (``mooncake_http_metadata_server``), upstream's Python one (``http_metadata_server.py``
of the upstream wheel, run by Debian's python3 with python3-aiohttp) and a throw-away etcd
(Debian's ``etcd-server``, started here on loopback with a temporary data directory),
verified bytes both ways; and an engine killed with SIGKILL coming back under its name at
once on each store. Needs UPSTREAM_PYTHON (scripts/setup-upstream.sh) and etcd-server,
python3-aiohttp (scripts/install-deps.sh)."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from helpers import Buffer, Peer, free_port, pattern, run_peer_initiator, sha256, this_python
from mooncake.engine import TransferEngine

MIB = 1 << 20
BIN = Path(sys.executable).parent
# Upstream publishes its first non-loopback address unless told: keep everything on loopback.
UPSTREAM_ENV = {"MC_FORCE_TCP": "1", "MC_TCP_BIND_ADDRESS": "127.0.0.1"}
_names = itertools.count(1)


def _name() -> str:
    # Only a name with a store; the port part is not bound.
    return f"127.0.0.1:{40000 + next(_names)}"


def _plain_name() -> str:
    # A pod or role name that no resolver knows: peers must use the published address.
    return f"mc-role-{next(_names)}"


NAMINGS = {"address": _name, "plain": _plain_name}


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


@pytest.fixture(scope="module")
def upstream_http_store(upstream_python):
    where = subprocess.run(
        [upstream_python, "-c",
         "import importlib.util as u; print(u.find_spec('mooncake').submodule_search_locations[0])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    script = Path(where) / "http_metadata_server.py"
    assert script.is_file(), script
    port = free_port()
    # Debian's python3 with python3-aiohttp: the upstream venv is installed --no-deps.
    proc = subprocess.Popen(
        ["/usr/bin/python3", str(script), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}/metadata"

    def answers() -> bool:
        assert proc.poll() is None, proc.stderr.read()
        try:
            urllib.request.urlopen(f"{url}?key=probe", timeout=2)
        except urllib.error.HTTPError as e:
            return e.code == 404
        except OSError:
            return False
        return False

    try:
        _wait(answers, 30, "upstream's HTTP metadata server")
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(params=["http", "upstream_http", "etcd"])
def store(request):
    return request.getfixturevalue(f"{request.param}_store")


@pytest.mark.parametrize("naming", NAMINGS)
def test_our_engine_and_upstreams_share_a_store(store, upstream_python, naming):
    """Both ways, with names that are addresses and with plain names (which no one resolves:
    each engine publishes an address of its host, and the peer connects there)."""
    new_name = NAMINGS[naming]
    # Upstream's engine serves a pattern(5) buffer, found by name through the store.
    target = Peer(upstream_python, 4 * MIB, seed=5, env=UPSTREAM_ENV, host=new_name(), metadata=store)
    ours = TransferEngine()
    try:
        assert ours.initialize(new_name(), store, "tcp", "") == 0, TransferEngine.last_error()
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
        our_name = new_name()
        t = TransferEngine()
        assert t.initialize(our_name, store, "tcp", "") == 0, TransferEngine.last_error()
        buf = Buffer(MIB, fill=pattern(3, 0, MIB))
        assert t.register_memory(buf.addr, buf.size) == 0
        result = run_peer_initiator(
            upstream_python, our_name, buf.addr, MIB, 11,
            "--metadata", store, "--host", new_name(), "--expect-peer-seed", "3",
        )
        assert result["ok"] and result["_rc"] == 0, result
        assert result["final_peer_sha256"] == sha256(buf.read())
        assert buf.read() == pattern(11, 0, MIB)
    finally:
        target.stop()


def test_a_killed_engine_comes_back_under_its_name_at_once(store):
    """Our engine in another process, killed with SIGKILL: its entries are still in the store
    (upstream's server refuses to overwrite rpc_meta), yet a new engine of the same name
    initializes at once, and an engine that talked to the dead one reaches the new one."""
    name = _name()
    first = Peer(this_python(), MIB, seed=21, host=name, metadata=store)
    a = TransferEngine()
    assert a.initialize(_name(), store, "tcp", "") == 0, TransferEngine.last_error()
    local = Buffer(MIB)
    assert a.register_memory(local.addr, local.size) == 0
    assert a.transfer_sync_read(name, local.addr, first.buffer, MIB) == 0
    assert local.read() == pattern(21, 0, MIB)
    first.kill()

    t0 = time.monotonic()
    second = Peer(this_python(), MIB, seed=22, host=name, metadata=store)
    try:
        assert time.monotonic() - t0 < 15
        assert a.transfer_sync_read(name, local.addr, second.buffer, MIB) == 0
        assert local.read() == pattern(22, 0, MIB)
    finally:
        second.stop()
