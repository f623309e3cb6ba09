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
