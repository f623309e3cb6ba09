"""Pieces of the Mooncake Store tests (``test_store_*.py``): which implementation, a master
on loopback, and client processes (``store_client.py``) driven over JSON lines.

Every store test runs twice, once per ``impl``:

- ``upstream``: the published wheel's ``mooncake_master`` and ``mooncake.store``; python =
  ``UPSTREAM_PYTHON`` or ``<repo>/.venv-upstream/bin/python`` (scripts/setup-upstream.sh);
  the master is the ``mooncake_master`` beside it.
- ``ours``: python = ``$PY_VENV/bin/python`` (default ``<repo>/.venv-test``, where
  scripts/test-python.sh installs our wheel); the master is that venv's ``mooncake_master``.

A missing venv or program fails the test and says how to provide it; nothing is skipped.
The test process never imports ``mooncake.store``: every store call is made by a client
process of the implementation under test.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from store_client import digest, pattern  # noqa: F401  (re-exported for the tests)

REPO = Path(__file__).resolve().parents[2]
CLIENT_SCRIPT = Path(__file__).resolve().parent / "store_client.py"
HOST = "127.0.0.1"
KIB, MIB = 1 << 10, 1 << 20
IMPLS = ["upstream", "ours"]

# Upstream's ErrorCode values that the consumers compare (reference/store.md).
OK = 0
INTERNAL_ERROR = -1
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
TRANSFER_FAIL = -800

# Every client process: logs quiet, sockets on loopback.
CLIENT_ENV = {"MC_LOG_LEVEL": "warning", "MC_TCP_BIND_ADDRESS": HOST, "MC_TRANSFER_TIMEOUT": "5"}


# --- implementations ---------------------------------------------------------------------

@dataclass(frozen=True)
class Impl:
    name: str
    python: str
    master_bin: str

    def __str__(self) -> str:
        return self.name


def resolve_impl(name: str) -> Impl:
    """The python and ``mooncake_master`` of ``name``; fails the test, saying how to set
    them up, when they are missing."""
    if name == "upstream":
        python = os.environ.get("UPSTREAM_PYTHON") or str(REPO / ".venv-upstream" / "bin" / "python")
        how = "run scripts/setup-upstream.sh, or set UPSTREAM_PYTHON to the python of a venv with the upstream wheel"
    elif name == "ours":
        venv = os.environ.get("PY_VENV") or str(REPO / ".venv-test")
        python = str(Path(venv) / "bin" / "python")
        how = "run scripts/test-python.sh (it installs our wheel into PY_VENV, default .venv-test), or set PY_VENV"
    else:
        raise ValueError(name)
    master = str(Path(python).parent / "mooncake_master")
    for what, path in (("python", python), ("mooncake_master", master)):
        if not os.access(path, os.X_OK):
            pytest.fail(f"{name}: {what} {path} is not an executable; {how}", pytrace=False)
    return Impl(name, python, master)


@pytest.fixture(scope="module", params=IMPLS)
def impl(request) -> Impl:
    """The implementation under test (module-scoped so a module's tests share one master)."""
    return resolve_impl(request.param)


# --- the master ----------------------------------------------------------------------------

def free_ports(n: int) -> list:
    """``n`` distinct TCP ports free on 127.0.0.1 just now."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def can_connect(port: int, timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def http_get(url: str, timeout: float = 2.0):
    """(status, body) of a GET; (None, error text) when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def pid_listening_on(port: int) -> Optional[int]:
    """The pid of the process that has a LISTEN socket on ``port`` (the master's own pid,
    whatever launcher started it)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                try:
                    if os.readlink(fd) in inodes:
                        return int(proc.name)
                except OSError:
                    pass
        except OSError:
            continue
    return None


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")


class Master:
    """A ``mooncake_master`` on free loopback ports; ``stop()`` / ``kill()`` end it and
    ``start()`` brings it back on the same ports."""

    def __init__(self, impl: Impl, http_metadata: bool = False, extra: tuple = (), ready_timeout: float = 20):
        self.impl = impl
        self.http_metadata = http_metadata
        self.extra = tuple(extra)
        self.ready_timeout = ready_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.log = tempfile.NamedTemporaryFile(prefix=f"store-master-{impl.name}-", suffix=".log", delete=False)
        self.rpc_port, self.metrics_port, self.http_port = free_ports(3)
        self.start()

    @property
    def address(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    @property
    def metadata_url(self) -> str:
        assert self.http_metadata, "this master serves no HTTP metadata store"
        return f"http://{HOST}:{self.http_port}/metadata"

    def argv(self) -> list:
        argv = [self.impl.master_bin, f"--rpc_port={self.rpc_port}", f"--rpc_address={HOST}",
                f"--metrics_port={self.metrics_port}", f"--metrics_host={HOST}"]
        if self.http_metadata:
            argv += ["--enable_http_metadata_server=true", f"--http_metadata_server_port={self.http_port}",
                     f"--http_metadata_server_host={HOST}"]
        return argv + list(self.extra)

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd="/", start_new_session=True)
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.impl} master exited with {self.proc.returncode}: {self.log_tail()}")
            if self.ready():
                return
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"{self.impl} master not ready after {self.ready_timeout} s: {self.log_tail()}")
            time.sleep(0.05)

    def ready(self) -> bool:
        if not can_connect(self.rpc_port):
            return False
        if self.http_metadata and not can_connect(self.http_port):
            return False
        status, _ = http_get(f"http://{HOST}:{self.metrics_port}/health", timeout=1)
        # Our own process must be the one answering (a port taken by someone else makes the
        # master exit; the poll above then says so).
        return status == 200 and self.pid() is not None

    def pid(self) -> Optional[int]:
        """The pid of the process serving the RPC port (the master binary itself)."""
        pid = pid_listening_on(self.rpc_port)
        if pid is None or self.proc is None or self.proc.poll() is not None:
            return None
        return pid

    def rss_kib(self) -> int:
        pid = self.pid()
        assert pid is not None, "master not running"
        return rss_kib(pid)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _signal_group(self, sig) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        """SIGKILL, no clean-up (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal_group(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, n: int = 4000) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def close(self) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)


# A read leases an object for ``default_kv_lease_ttl`` (upstream: 10 s), and a leased object is
# not removed: the shared master's is 1 s so that a test can remove what it has just read.
SHARED_MASTER_FLAGS = ("--default_kv_lease_ttl=1000",)
LEASE_S = 1.0


@pytest.fixture(scope="module")
def master(impl):
    """A master of ``impl`` shared by a module's tests, with an HTTP metadata store and a
    1 s lease (``SHARED_MASTER_FLAGS``)."""
    m = Master(impl, http_metadata=True, extra=SHARED_MASTER_FLAGS)
    yield m
    m.close()


@pytest.fixture
def own_master(impl):
    """A master of ``impl`` of the test's own (for tests that kill or fill it); call it
    with extra flags: ``own_master("--default_kv_lease_ttl=500")``."""
    made = []

    def make(*extra, http_metadata: bool = False) -> Master:
        m = Master(impl, http_metadata=http_metadata, extra=extra)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


# --- client processes ---------------------------------------------------------------------

class ClientError(AssertionError):
    pass


class StoreClient:
    """A ``store_client.py`` process of ``impl``. ``call(method, *args)`` returns the value
    the store returned (``bytes`` come back described, see ``store_client.digest``); a
    Python exception in the client raises ``ClientError``; every reply is awaited at most
    ``timeout`` seconds."""

    def __init__(self, impl: Impl, role: str = "client", env: Optional[dict] = None, timeout: float = 30):
        self.impl, self.role, self.timeout = impl, role, timeout
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [impl.python, str(CLIENT_SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
            text=True, cwd="/", env={**os.environ, **CLIENT_ENV, **(env or {})}, start_new_session=True,
        )
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        hello = self.recv(timeout=60)
        if not hello.get("ok"):
            raise ClientError(f"{self}: could not start: {hello} {self.stderr_tail()}")

    def __str__(self) -> str:
        return f"{self.impl} {self.role} (pid {self.proc.pid})"

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    # --- protocol ---
    def send(self, op: str, **fields) -> None:
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: Optional[float] = None) -> dict:
        timeout = self.timeout if timeout is None else timeout
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise ClientError(f"{self}: no reply within {timeout} s (hung?) {self.stderr_tail()}") from None
        if line is None:
            rc = self.wait(timeout=5)
            raise ClientError(f"{self}: exited with {describe_exit(rc)} {self.stderr_tail()}")
        return json.loads(line)

    def do(self, op: str, timeout: Optional[float] = None, **fields) -> dict:
        self.send(op, **fields)
        out = self.recv(timeout)
        if not out.get("ok"):
            raise ClientError(f"{self}: {op} {fields.get('method', '')} raised {out.get('exc')}: {out.get('msg')}")
        return out

    def try_call(self, method: str, *args, timeout: Optional[float] = None, store: str = "s", **kwargs) -> dict:
        """The whole reply: ``ok`` and ``value``, or ``exc`` / ``msg``; ``secs`` it took."""
        self.send("call", method=method, args=list(args), kwargs=kwargs, store=store)
        return self.recv(timeout)

    def call(self, method: str, *args, timeout: Optional[float] = None, store: str = "s", **kwargs):
        out = self.try_call(method, *args, timeout=timeout, store=store, **kwargs)
        if not out.get("ok"):
            raise ClientError(f"{self}: {method} raised {out.get('exc')}: {out.get('msg')}")
        return out["value"]

    # --- memory ---
    def alloc(self, name: str, size: int) -> int:
        return self.do("alloc", name=name, size=size)["addr"]

    def fill(self, name: str, off: int, length: int, seed: str) -> None:
        self.do("fill", name=name, off=off, len=length, seed=seed)

    def check(self, name: str, off: int, length: int, seed: str) -> bool:
        return self.do("check", name=name, off=off, len=length, seed=seed)["match"]

    def memset(self, name: str, off: int, length: int, byte: int) -> None:
        self.do("memset", name=name, off=off, len=length, byte=byte)

    def region_bytes(self, name: str, off: int, length: int) -> dict:
        return self.do("bytes", name=name, off=off, len=length)

    # --- set-up forms ---
    def setup(self, master: Master, metadata: str = "P2PHANDSHAKE", segment: int = 16 * MIB,
              local_buffer: int = 16 * MIB, timeout: float = 30) -> int:
        """The positional form (vLLM, LMCache); returns what ``setup`` returned."""
        return self.call("setup", HOST, metadata, segment, local_buffer, "tcp", "", master.address, timeout=timeout)

    def hostname(self) -> str:
        return self.call("get_hostname")

    # --- lifetime ---
    def wait(self, timeout: float = 10) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise ClientError(f"{self}: did not exit within {timeout} s") from None

    def quit(self, timeout: float = 15) -> int:
        """Ends the process without ``close()`` (the store's own teardown runs at exit)."""
        if self.proc.poll() is None:
            try:
                self.send("quit")
            except (BrokenPipeError, OSError):
                pass
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def close(self, timeout: float = 20) -> None:
        """``close()`` (asserted 0), then ends the process (asserted clean)."""
        assert self.call("close", timeout=timeout) == 0
        rc = self.quit()
        assert rc == 0, f"{self}: exited with {describe_exit(rc)} {self.stderr_tail()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            self.err.flush()
            self.err.seek(0)
            text = self.err.read()
        except (OSError, ValueError):
            return ""
        return f"\n--- {self} stderr ---\n{text[-n:]}" if text else ""

    def cleanup(self) -> None:
        """At teardown: a client still running (a failed test) is closed politely first, so
        that its segment does not linger in a shared master until its TTL; then killed."""
        if self.proc.poll() is None:
            try:
                self.send("call", method="close", args=[], kwargs={}, store="s")
                self.recv(timeout=5)
                self.send("quit")
                self.proc.wait(timeout=5)
            except (ClientError, OSError, ValueError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.err.close()


def close_all(*clients: StoreClient, timeout: float = 20) -> None:
    """``close()`` on every client at once (upstream's takes about a second), each asserted
    0, then each process ended and asserted clean."""
    for c in clients:
        c.send("call", method="close", args=[], kwargs={}, store="s")
    for c in clients:
        out = c.recv(timeout)
        assert out.get("ok") and out["value"] == 0, f"{c}: close: {out}"
    for c in clients:
        c.send("quit")
    for c in clients:
        rc = c.wait(timeout)
        assert rc == 0, f"{c}: exited with {describe_exit(rc)} {c.stderr_tail()}"


def describe_exit(rc: Optional[int]) -> str:
    if rc is None:
        return "no exit yet"
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return f"status {rc}"


@pytest.fixture
def clients(impl):
    """``clients(role)`` starts a client process of ``impl``; all are killed at teardown."""
    made = []

    def make(role: str = "client", **kw) -> StoreClient:
        c = StoreClient(impl, role, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.cleanup()


# --- helpers for the tests ---------------------------------------------------------------

def ptr(region: str, off: int = 0) -> dict:
    """A pointer argument: region ``region`` of the client, plus ``off``."""
    return {"ptr": region, "off": off}


def cfg(**attrs) -> dict:
    """A ReplicateConfig argument (``preferred_segment="$hostname"`` = the client's own)."""
    return {"cfg": attrs}


def bytes_of(seed: str, length: int) -> dict:
    """A ``bytes`` argument: ``pattern(seed, length)``."""
    return {"bytes_of": seed, "len": length}


def described(seed: str, length: int) -> dict:
    """What a client replies for a ``bytes`` result equal to ``pattern(seed, length)``."""
    return digest(pattern(seed, length))


EMPTY = digest(b"")


def unique(prefix: str) -> str:
    """A key prefix of the test's own (tests share a master)."""
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns()}"


def wait_until(condition, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)
