"""engine.pyi and store.pyi match the built module (mypy's stubtest, as pydantic-core does)."""

from __future__ import annotations

import subprocess
import sys


def test_stubtest(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mooncake.engine"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_store_stubtest(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "mooncake.store"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
