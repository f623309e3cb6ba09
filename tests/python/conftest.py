"""Fixtures of the wheel's tests. The wheel under test is the one installed in this venv
(scripts/test-python.sh installs it); the tests never import bindings/python directly."""

from __future__ import annotations

import os

import pytest

from helpers import Buffer, Peer, initialized_engine, this_python

# Quick failure on dead peers; upstream's floor is 5 s.
os.environ.setdefault("MC_TRANSFER_TIMEOUT", "5")
os.environ.setdefault("MC_LOG_LEVEL", "warning")


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
