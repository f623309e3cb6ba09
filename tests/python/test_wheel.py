"""The built wheel itself: a fresh venv with nothing but the wheel imports it and moves
bytes; the extension links no vendor library; metadata and tags are right."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

FORBIDDEN = ("libibverbs", "libmlx5", "librdmacm", "libmusa", "libmusart", "libcudart", "libcuda.", "libnuma", "libcurl")

SMOKE = r"""
import ctypes, sys
from mooncake.engine import TransferEngine, TransferOpcode
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, TransferEngine.last_error()
n = 1 << 20
src = ctypes.create_string_buffer(bytes(range(256)) * (n // 256), n)
dst = ctypes.create_string_buffer(n)
assert a.register_memory(ctypes.addressof(src), n) == 0
assert b.register_memory(ctypes.addressof(dst), n) == 0
sid = f"127.0.0.1:{b.get_rpc_port()}"
assert a.transfer_sync_write(sid, ctypes.addressof(src), ctypes.addressof(dst), n) == 0
assert dst.raw == src.raw
print("transfer ok", sys.version_info[:2])
"""


def needed(so_bytes: bytes) -> list[str]:
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(so_bytes)
        f.flush()
        out = subprocess.run(["readelf", "-d", f.name], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def test_wheel_links_and_bundles_no_vendor_library(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        sos = [n for n in names if re.search(r"\.so(\.|$)", n)]
        assert sos == ["mooncake/_native.abi3.so"], sos
        deps = needed(z.read(sos[0]))
    assert deps, "readelf found no NEEDED entries"
    bad = [d for d in deps if d.startswith(FORBIDDEN)]
    assert not bad, f"vendor libraries linked: {bad} (all: {deps})"
    assert not any("libpython" in d for d in deps), deps
    assert set(deps) <= {"libgcc_s.so.1", "libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2", "libpthread.so.0", "libdl.so.2"}, deps


def test_wheel_metadata_and_tags(wheel):
    name = Path(wheel).name
    assert name.startswith("mooncake_transfer_engine_musa-") and "-cp39-abi3-" in name, name
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
        entry = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
        files = z.namelist()
    assert "Name: mooncake-transfer-engine-musa" in text
    assert "Requires-Python: >=3.9" in text
    assert "Requires-Dist" not in text
    workspace_version = re.search(r'^version = "([^"]+)"', (Path(__file__).parents[2] / "Cargo.toml").read_text(), re.M)
    assert f"Version: {workspace_version.group(1)}" in text
    assert "transfer_engine_bench=mooncake._cli:transfer_engine_bench" in entry.replace(" ", "")
    assert "transfer_engine_topology_dump" in entry
    assert "mooncake_http_metadata_server=mooncake._cli:mooncake_http_metadata_server" in entry.replace(" ", "")
    for f in ("mooncake/engine.py", "mooncake/engine.pyi", "mooncake/py.typed", "mooncake/__init__.py"):
        assert f in files


def test_distribution_name_matches_release_toml(wheel):
    if sys.version_info < (3, 11):
        pytest.fail("reading release.toml needs tomllib: make the test venv (PY_VENV) with Python 3.11+", pytrace=False)
    import tomllib

    release = Path(__file__).parents[2] / "release.toml"
    want = tomllib.loads(release.read_text())["distribution"]
    pyproject = tomllib.loads((Path(__file__).parents[2] / "bindings" / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == want
    assert Path(wheel).name.startswith(want.replace("-", "_") + "-")


def test_clean_venv_imports_and_transfers(tmp_path, wheel):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # Install with this venv's pip into the fresh one: no index, no dependencies.
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--target", site, wheel], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LD_"))}
    env["MC_LOG_LEVEL"] = "warning"
    out = subprocess.run([py, "-I", "-c", SMOKE], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "transfer ok" in out.stdout
    # Only the wheel (and the interpreter's stdlib) is on that venv's path.
    listing = sorted(p.name for p in Path(site).iterdir())
    assert [n for n in listing if not n.startswith(("mooncake", "_distutils")) and n != "bin"] == [], listing
