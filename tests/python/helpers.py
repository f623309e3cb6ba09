"""Shared pieces of the wheel's tests: buffers, the data pattern, and peer processes.

A peer process is ``tests/interop/upstream_peer.py`` (see its docstring) run by any
python that has a ``mooncake.engine``: this venv's (our wheel) or the upstream venv's.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PEER_SCRIPT = REPO / "tests" / "interop" / "upstream_peer.py"
HOST = "127.0.0.1"


def pattern(seed: int, offset: int, length: int) -> bytes:
    """``upstream_peer.py``'s pattern(seed)[offset:offset+length]."""
    i = np.arange(offset, offset + length, dtype=np.uint64)
    v = i * np.uint64(131) + np.uint64(seed * 7) + (i >> np.uint64(8)) + (i >> np.uint64(16))
    return (v & np.uint64(0xFF)).astype(np.uint8).tobytes()


class Buffer:
    """Page-aligned host memory (anonymous mmap) with its address."""

    def __init__(self, size: int, fill: Optional[bytes] = None):
        self.size = size
        self.mm = mmap.mmap(-1, size)
        self._anchor = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(self._anchor)
        if fill is not None:
            self.mm[: len(fill)] = fill

    def read(self, offset: int = 0, length: Optional[int] = None) -> bytes:
        length = self.size - offset if length is None else length
        return self.mm[offset : offset + length]

    def write(self, offset: int, data: bytes) -> None:
        self.mm[offset : offset + len(data)] = data

    def clear(self, byte: int = 0) -> None:
        ctypes.memset(self.addr, byte, self.size)


def initialized_engine():
    from mooncake.engine import TransferEngine

    engine = TransferEngine()
    rc = engine.initialize(HOST, "P2PHANDSHAKE", "tcp", "")
    assert rc == 0, TransferEngine.last_error()
    return engine, f"{HOST}:{engine.get_rpc_port()}"


class Peer:
    """A target engine in its own process, serving one pattern-filled buffer.

    ``check(off, len, seed)`` and ``sha256(off, len)`` ask the process about its own view of
    the buffer, so a transfer is verified by the side that received it.
    """

    def __init__(self, python: str, size: int, seed: int = 0, env: Optional[dict] = None,
                 host: str = HOST, metadata: str = "P2PHANDSHAKE"):
        self.size = size
        self.seed = seed
        self.proc = subprocess.Popen(
            [python, str(PEER_SCRIPT), "target", "--host", host, "--metadata", metadata,
             "--size", str(size), "--pattern-seed", str(seed)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            cwd="/",
        )
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError(f"peer did not start: {self.proc.stderr.read()}")
        info = json.loads(hello)
        assert info["ok"], info
        self.session_id: str = info["session_id"]
        self.buffer: int = info["buffer"]

    def ask(self, command: str) -> str:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"peer exited: {self.proc.stderr.read()}"
        return line.strip()

    def check(self, offset: int, length: int, seed: int) -> str:
        return self.ask(f"check {offset} {length} {seed}")

    def sha256(self, offset: int, length: int) -> str:
        return self.ask(f"dump {offset} {length}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def run_peer_initiator(python: str, peer_sid: str, peer_buf: int, size: int, seed: int, *extra: str, timeout: float = 120):
    """``upstream_peer.py initiator`` against a target; returns its JSON result."""
    out = subprocess.run(
        [python, str(PEER_SCRIPT), "initiator", "--host", HOST, "--peer", peer_sid,
         "--peer-buffer", str(peer_buf), "--size", str(size), "--seed", str(seed), *extra],
        capture_output=True, text=True, timeout=timeout, cwd="/",
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert lines, f"initiator printed nothing (rc {out.returncode}): {out.stderr[-4000:]}"
    result = json.loads(lines[-1])
    result["_rc"] = out.returncode
    result["_stderr"] = out.stderr[-4000:]
    return result


def free_port() -> int:
    """A TCP port free on 127.0.0.1 just now."""
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def elapsed(fn, *args):
    t0 = time.perf_counter()
    rc = fn(*args)
    return rc, time.perf_counter() - t0


def this_python() -> str:
    return sys.executable


def _tcp_sockets():
    """(inode, local port, state, unread bytes) of every TCP socket on this host
    (``/proc/net/tcp`` and ``tcp6``; state ``0A`` is LISTEN)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            rx_queue = int(f[4].split(":")[1], 16)
            yield int(f[9]), int(f[1].rsplit(":", 1)[1], 16), f[3], rx_queue


def listening_ports(pid: int) -> set:
    """The TCP ports process ``pid`` listens on (its handshake and data ports)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(int(link[len("socket:[") : -1]))
    return {port for inode, port, state, _ in _tcp_sockets() if inode in inodes and state == "0A"}


def unread_bytes(ports: set) -> int:
    """Bytes that arrived on connections to ``ports`` and that nobody has read yet
    (accepted or still in the accept queue)."""
    return sum(rx for _, port, state, rx in _tcp_sockets() if port in ports and state != "0A")


def wait_until(condition, timeout: float, what: str) -> None:
    """Polls ``condition`` until it holds; fails with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)
