"""Fixtures of the wheel's tests. The wheel under test is the one installed in this venv
(scripts/test-python.sh installs it); the tests never import bindings/python directly.

Nothing here is skipped for want of set-up: a test that needs the wheel file (``WHEEL``) or
the upstream wheel's venv (``UPSTREAM_PYTHON``) fails and says how to provide it, so a bare
``pytest`` is never green while testing nothing. Run everything with ``scripts/test-python.sh``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import Buffer, Peer, initialized_engine, this_python

# Quick failure on dead peers; upstream's floor is 5 s.
os.environ.setdefault("MC_TRANSFER_TIMEOUT", "5")
os.environ.setdefault("MC_LOG_LEVEL", "warning")


REPO = Path(__file__).resolve().parents[2]
RUN_ALL = "scripts/test-python.sh (it builds and installs the wheel, then sets WHEEL and UPSTREAM_PYTHON)"


try:
    import mooncake.engine  # noqa: F401  (the wheel under test)
except ImportError as e:
    raise pytest.UsageError(f"mooncake.engine is not importable here ({e}). Run {RUN_ALL}.") from e


def required_env(name: str, how: str) -> str:
    """The value of ``name``; fails the calling test, saying how to set it, when it is unset
    or names no file."""
    value = os.environ.get(name, "")
    if not value:
        pytest.fail(f"{name} is not set. Run {RUN_ALL}, or: {how}", pytrace=False)
    if not Path(value).is_file():
        pytest.fail(f"{name}={value} is not a file. Run {RUN_ALL}, or: {how}", pytrace=False)
    return value


@pytest.fixture(scope="session")
def wheel() -> str:
    """Path of the wheel under test (the one installed in this venv)."""
    return required_env("WHEEL", f"scripts/build-wheel.sh, then WHEEL={REPO}/target/wheels/<the .whl> pytest")


@pytest.fixture(scope="session")
def upstream_python() -> str:
    """The python of the venv that holds the published upstream wheel."""
    path = required_env(
        "UPSTREAM_PYTHON",
        f"scripts/setup-upstream.sh, then UPSTREAM_PYTHON={REPO}/.venv-upstream/bin/python pytest",
    )
    if not os.access(path, os.X_OK):
        pytest.fail(f"UPSTREAM_PYTHON={path} is not executable; run scripts/setup-upstream.sh", pytrace=False)
    return path


@pytest.fixture(scope="module")
def engine():
    """An initialized engine of this process, and its session id."""
    eng, sid = initialized_engine()
    yield eng, sid


@pytest.fixture(scope="module")
def peer():
    """A pattern(7)-filled 8 MiB target in another process, served by our wheel."""
    p = Peer(this_python(), 8 << 20, seed=7)
    yield p
    p.stop()


@pytest.fixture
def local_buffer(engine):
    """8 MiB of registered host memory (ctypes / mmap)."""
    eng, _ = engine
    buf = Buffer(8 << 20)
    assert eng.register_memory(buf.addr, buf.size) == 0
    yield buf
    assert eng.unregister_memory(buf.addr) == 0
