"""The console scripts, as installed by the wheel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


def test_topology_dump():
    out = subprocess.run([BIN / "transfer_engine_topology_dump"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "cpu:0" in json.loads(out.stdout)
    assert subprocess.run([BIN / "transfer_engine_topology_dump", "--bogus"], capture_output=True).returncode == 2


def test_bench_help_and_bad_flags():
    out = subprocess.run([BIN / "transfer_engine_bench", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--segment_id" in out.stdout
    assert subprocess.run([BIN / "transfer_engine_bench", "--no-such-flag"], capture_output=True).returncode != 0


def test_bench_target_and_initiator():
    env = {**os.environ, "MC_LOG_LEVEL": "warning"}
    target = subprocess.Popen(
        [BIN / "transfer_engine_bench", "--mode=target", "--local_server_name=127.0.0.1", "--buffer_size=67108864"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        line = target.stdout.readline()
        m = re.match(r"segment_id=(\S+)", line)
        assert m, f"{line!r} {target.stderr.read() if target.poll() is not None else ''}"
        t0 = time.monotonic()
        out = subprocess.run(
            [BIN / "transfer_engine_bench", "--local_server_name=127.0.0.1", f"--segment_id={m.group(1)}",
             "--operation=write", "--block_size=1048576", "--batch_size=8", "--threads=2", "--duration=1",
             "--buffer_size=67108864", "--json"],
            capture_output=True, text=True, timeout=60, env=env,
        )
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - t0 < 30
        figures = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1])
        assert figures, out.stdout
    finally:
        target.terminate()
        assert target.wait(timeout=20) == 0


def test_http_metadata_server_script_serves_engines():
    import urllib.error
    import urllib.request

    from helpers import Buffer, free_port
    from mooncake.engine import TransferEngine

    port = free_port()
    server = subprocess.Popen(
        [BIN / "mooncake_http_metadata_server", "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        line = server.stdout.readline()
        assert "serving http://127.0.0.1" in line, f"{line!r} {server.stderr.read() if server.poll() is not None else ''}"
        url = f"http://127.0.0.1:{port}/metadata"
        # Upstream's status codes: blank key 400, missing key 404.
        for q, code in (("", 400), ("?key=nothing", 404)):
            try:
                urllib.request.urlopen(url + q, timeout=10)
                raise AssertionError("no error status")
            except urllib.error.HTTPError as e:
                assert e.code == code
        a, b = TransferEngine(), TransferEngine()
        assert a.initialize("127.0.0.1:1", url, "tcp", "") == 0
        assert b.initialize("127.0.0.1:2", url, "tcp", "") == 0
        src, dst = Buffer(1 << 20, fill=os.urandom(1 << 20)), Buffer(1 << 20)
        assert b.register_memory(src.addr, src.size) == 0
        assert a.register_memory(dst.addr, dst.size) == 0
        assert a.transfer_sync_read("127.0.0.1:2", dst.addr, src.addr, src.size) == 0
        assert dst.read() == src.read()
    finally:
        server.kill()
        server.wait()


def test_http_metadata_server_script_bad_flags():
    assert subprocess.run([BIN / "mooncake_http_metadata_server", "--host", "nohost"], capture_output=True).returncode == 2
    out = subprocess.run([BIN / "mooncake_http_metadata_server", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--liveness-interval-sec" in out.stdout
