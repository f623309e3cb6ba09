"""Two processes over TCP with the P2P handshake: this process's engine against a target
engine in another process (our wheel), moving bytes that the receiving side verifies."""

from __future__ import annotations

import ctypes
import os
import random
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from helpers import (
    Buffer,
    Peer,
    elapsed,
    initialized_engine,
    listening_ports,
    pattern,
    sha256,
    this_python,
    unread_bytes,
    wait_until,
)
from mooncake.engine import Read, TransferEngine, TransferNotify, TransferOpcode, Write

MIB = 1 << 20


# --- sync -----------------------------------------------------------------------------


def test_sync_write_then_read_is_verified_by_both_sides(engine, peer, local_buffer):
    eng, _ = engine
    off, n = 3 * 4096 + 5, MIB + 3
    data = pattern(11, off, n)
    local_buffer.write(0, data)
    assert eng.transfer_sync_write(peer.session_id, local_buffer.addr, peer.buffer + off, n) == 0
    assert peer.check(off, n, 11) == "ok"
    local_buffer.clear()
    assert eng.transfer_sync_read(peer.session_id, local_buffer.addr + 7, peer.buffer + off, n) == 0
    assert local_buffer.read(7, n) == data


def test_ctypes_string_buffer(engine, peer):
    eng, _ = engine
    n = 64 * 1024
    src = ctypes.create_string_buffer(pattern(12, 0, n), n)
    dst = ctypes.create_string_buffer(n)
    for b in (src, dst):
        assert eng.register_memory(ctypes.addressof(b), n) == 0
    try:
        assert eng.transfer_sync_write(peer.session_id, ctypes.addressof(src), peer.buffer, n) == 0
        assert peer.check(0, n, 12) == "ok"
        assert eng.transfer_sync_read(peer.session_id, ctypes.addressof(dst), peer.buffer, n) == 0
        assert dst.raw == src.raw
    finally:
        for b in (src, dst):
            assert eng.unregister_memory(ctypes.addressof(b)) == 0


@pytest.mark.parametrize(
    "write_op,read_op",
    [
        (TransferOpcode.Write, TransferOpcode.Read),
        (Write, Read),
        (TransferEngine.TransferOpcode.Write, TransferEngine.TransferOpcode.Read),
        (1, 0),
    ],
    ids=["enum", "module-level", "class-attribute", "int"],
)
def test_transfer_sync_with_opcode(engine, peer, local_buffer, write_op, read_op):
    eng, _ = engine
    off, n = 2 * MIB, 100_000
    local_buffer.write(0, pattern(13, off, n))
    assert eng.transfer_sync(peer.session_id, local_buffer.addr, peer.buffer + off, n, write_op) == 0
    assert peer.check(off, n, 13) == "ok"
    local_buffer.clear()
    assert eng.transfer_sync(peer.session_id, local_buffer.addr, peer.buffer + off, n, read_op, None) == 0
    assert local_buffer.read(0, n) == pattern(13, off, n)


def test_keyword_arguments(engine, peer, local_buffer):
    eng, _ = engine
    n = 5000
    local_buffer.write(0, pattern(14, 0, n))
    rc = eng.transfer_sync_write(
        target_hostname=peer.session_id, buffer=local_buffer.addr, peer_buffer_address=peer.buffer, length=n,
        transport_hint="tcp",
    )
    assert rc == 0 and peer.check(0, n, 14) == "ok"
    rc = eng.batch_transfer_sync(
        target_hostname=peer.session_id, buffers=[local_buffer.addr + MIB], peer_buffer_addresses=[peer.buffer],
        lengths=[n], opcode=TransferOpcode.Read, notify=None,
    )
    assert rc == 0 and local_buffer.read(MIB, n) == pattern(14, 0, n)


# --- batches ----------------------------------------------------------------------------


def reversed_blocks(local_buffer, peer, k, bs, seed):
    """Local block j holds what peer block k-1-j must end up with (pattern(seed))."""
    for j in range(k):
        local_buffer.write(j * bs, pattern(seed, (k - 1 - j) * bs, bs))
    locs = [local_buffer.addr + j * bs for j in range(k)]
    remotes = [peer.buffer + (k - 1 - j) * bs for j in range(k)]
    return locs, remotes, [bs] * k


def test_batch_sync_write_and_read(engine, peer, local_buffer):
    eng, _ = engine
    k, bs = 16, 64 * 1024 + 3
    locs, remotes, lens = reversed_blocks(local_buffer, peer, k, bs, 21)
    want = local_buffer.read(0, k * bs)
    assert eng.batch_transfer_sync_write(peer.session_id, locs, remotes, lens) == 0
    assert peer.check(0, k * bs, 21) == "ok"
    local_buffer.clear()
    assert eng.batch_transfer_sync_read(peer.session_id, locs, remotes, lens) == 0
    assert local_buffer.read(0, k * bs) == want


def test_batch_transfer_sync_with_opcode(engine, peer, local_buffer):
    eng, _ = engine
    k, bs = 8, 100_000
    locs, remotes, lens = reversed_blocks(local_buffer, peer, k, bs, 22)
    want = local_buffer.read(0, k * bs)
    assert eng.batch_transfer_sync(peer.session_id, locs, remotes, lens, TransferOpcode.Write) == 0
    assert peer.check(0, k * bs, 22) == "ok"
    local_buffer.clear()
    assert eng.batch_transfer_sync(peer.session_id, locs, remotes, lens, TransferOpcode.Read) == 0
    assert local_buffer.read(0, k * bs) == want


def test_async_batches_and_status(engine, peer, local_buffer):
    eng, _ = engine
    k, bs = 8, 128 * 1024
    locs, remotes, lens = reversed_blocks(local_buffer, peer, k, bs, 23)
    want = local_buffer.read(0, k * bs)
    bid = eng.batch_transfer_async_write(peer.session_id, locs, remotes, lens)
    assert bid != 0, TransferEngine.last_error()
    assert eng.get_batch_transfer_status([bid]) == 0
    assert peer.check(0, k * bs, 23) == "ok"

    local_buffer.clear()
    half = k // 2
    ids = [
        eng.batch_transfer_async_read(peer.session_id, locs[:half], remotes[:half], lens[:half]),
        eng.batch_transfer_async(peer.session_id, locs[half:], remotes[half:], lens[half:], TransferOpcode.Read),
    ]
    assert 0 not in ids and ids[0] != ids[1]
    assert eng.get_batch_transfer_status(ids) == 0
    assert local_buffer.read(0, k * bs) == want
    # Completed batches are freed: their ids are unknown now.
    assert eng.get_batch_transfer_status(ids) == -1
    assert "unknown batch id" in TransferEngine.last_error()


def test_submit_write_and_check_status(engine, peer, local_buffer):
    eng, _ = engine
    off, n = 5 * MIB, 3 * MIB
    local_buffer.write(0, pattern(24, off, n))
    bid = eng.transfer_submit_write(peer.session_id, local_buffer.addr, peer.buffer + off, n)
    assert bid != 0
    deadline = time.monotonic() + 20
    status = 0
    while status == 0 and time.monotonic() < deadline:
        status = eng.transfer_check_status(bid)
        time.sleep(0.001)
    assert status == 1
    assert peer.check(off, n, 24) == "ok"
    assert eng.transfer_check_status(bid) == -1  # freed once it reported 1


# --- numpy and managed buffers ---------------------------------------------------------------


def test_numpy_buffers(engine, peer):
    eng, _ = engine
    src = np.arange(256 * 1024, dtype=np.float32) * np.float32(0.5)
    dst = np.zeros_like(src)
    for a in (src, dst):
        assert eng.register_memory(a.ctypes.data, a.nbytes) == 0
    try:
        assert eng.transfer_sync_write(peer.session_id, src.ctypes.data, peer.buffer, src.nbytes) == 0
        assert peer.sha256(0, src.nbytes) == sha256(src.tobytes())
        # numpy integers as addresses and lengths, a numpy array as a list of addresses
        locs = np.array([dst.ctypes.data], dtype=np.uint64)
        assert eng.batch_transfer_sync_read(peer.session_id, locs, [np.uint64(peer.buffer)], [np.int64(src.nbytes)]) == 0
        assert np.array_equal(src, dst)
    finally:
        for a in (src, dst):
            assert eng.unregister_memory(a.ctypes.data) == 0


def test_managed_buffers(engine, peer):
    eng, sid = engine
    n = 100_000
    a = eng.allocate_managed_buffer(n)
    b = eng.allocate_managed_buffer(n)
    assert a and b and abs(a - b) >= n
    data = pattern(31, 0, n)
    assert eng.write_bytes_to_buffer(a, data, n) == 0
    assert eng.read_bytes_from_buffer(a, n) == data
    assert eng.transfer_sync_write(peer.session_id, a, peer.buffer, n) == 0
    assert peer.check(0, n, 31) == "ok"
    assert eng.transfer_sync_read(peer.session_id, b, peer.buffer, n) == 0
    assert eng.read_bytes_from_buffer(b, n) == data
    # Managed memory is registered: the engine's own segment lists it.
    assert eng.get_first_buffer_address(sid) != 0
    assert eng.free_managed_buffer(a, n) == 0
    assert eng.free_managed_buffer(b, n) == 0
    assert eng.free_managed_buffer(b, n) == -1  # double free is refused, not a crash
    assert "not a managed buffer" in TransferEngine.last_error()


def test_managed_allocator_sizes_and_reuse(engine):
    eng, _ = engine
    sizes = [1, 8192, 8193, 65536, 1 << 20, 3 << 20, 256 << 20, (256 << 20) + 1]
    addrs = [eng.allocate_managed_buffer(s) for s in sizes]
    assert all(addrs), TransferEngine.last_error()
    spans = sorted(zip(addrs, sizes))
    for (a, la), (b, _) in zip(spans, spans[1:]):
        assert a + la <= b, "managed buffers overlap"
    for a, s in zip(addrs, sizes):
        eng.write_bytes_to_buffer(a, b"\xab" * min(s, 64), min(s, 64))
    for a, s in zip(addrs, sizes):
        assert eng.free_managed_buffer(a, s) == 0
    # A freed block is handed out again.
    again = eng.allocate_managed_buffer(8192)
    assert again in addrs
    assert eng.free_managed_buffer(again, 8192) == 0
    assert eng.allocate_managed_buffer(0) == 0


# --- many small transfers ------------------------------------------------------------------


def test_1000_random_small_writes_and_reads(engine, peer, local_buffer):
    eng, _ = engine
    region = MIB
    rng = random.Random(1234)
    assert eng.transfer_sync_read(peer.session_id, local_buffer.addr, peer.buffer, region) == 0
    mirror = bytearray(local_buffer.read(0, region))
    scratch = region  # local offsets used for single requests
    t0 = time.perf_counter()
    for i in range(1000):
        n = rng.randint(1, 4096)
        off = rng.randrange(0, region - n)
        loff = scratch + rng.randrange(0, MIB)
        if rng.random() < 0.5:
            data = rng.randbytes(n)
            local_buffer.write(loff, data)
            assert eng.transfer_sync_write(peer.session_id, local_buffer.addr + loff, peer.buffer + off, n) == 0, i
            mirror[off : off + n] = data
        else:
            assert eng.transfer_sync_read(peer.session_id, local_buffer.addr + loff, peer.buffer + off, n) == 0, i
            assert local_buffer.read(loff, n) == mirror[off : off + n], f"read {i} at {off}+{n}"
    took = time.perf_counter() - t0
    assert peer.sha256(0, region) == sha256(bytes(mirror))
    print(f"1000 random small transfers in {took:.3f} s")


# --- failures ----------------------------------------------------------------------------------


def test_unknown_peer_fails_quickly_with_upstream_values(engine, local_buffer):
    eng, _ = engine
    dead = "127.0.0.1:1"
    a = local_buffer.addr
    for fn, args, want in [
        (eng.transfer_sync_write, (dead, a, a, 64), -1),
        (eng.transfer_sync_read, (dead, a, a, 64), -1),
        (eng.transfer_sync, (dead, a, a, 64, TransferOpcode.Write), -1),
        (eng.batch_transfer_sync_write, (dead, [a], [a], [64]), -1),
        (eng.batch_transfer_sync_read, (dead, [a], [a], [64]), -1),
        (eng.batch_transfer_async_write, (dead, [a], [a], [64]), 0),
        (eng.batch_transfer_async_read, (dead, [a], [a], [64]), 0),
        (eng.batch_transfer_async, (dead, [a], [a], [64], TransferOpcode.Read), 0),
        (eng.transfer_submit_write, (dead, a, a, 64), 0),
    ]:
        rc, took = elapsed(fn, *args)
        assert rc == want, fn.__name__
        assert took < 2.0, f"{fn.__name__} took {took:.2f} s"
        assert dead in TransferEngine.last_error()


def test_bad_requests_fail_without_harm(engine, peer, local_buffer):
    eng, _ = engine
    a = local_buffer.addr
    before = peer.sha256(peer.size - 4096, 4096)
    # Past the end of the peer's registered buffer.
    assert eng.transfer_sync_write(peer.session_id, a, peer.buffer + peer.size - 8, 64) == -1
    assert "rejected" in TransferEngine.last_error()
    assert eng.transfer_sync_read(peer.session_id, a, peer.buffer + peer.size - 8, 64) == -1
    assert peer.sha256(peer.size - 4096, 4096) == before
    # Lists of different lengths.
    assert eng.batch_transfer_sync_write(peer.session_id, [a, a], [peer.buffer], [8, 8]) == -1
    assert "differ in length" in TransferEngine.last_error()
    assert eng.batch_transfer_async_write(peer.session_id, [a], [peer.buffer], []) == 0
    # Unknown batch ids.
    assert eng.get_batch_transfer_status([123456789]) == -1
    assert eng.transfer_check_status(987654321) == -1
    # The peer is still fine.
    assert eng.transfer_sync_read(peer.session_id, a, peer.buffer, 4096) == 0


def test_probe_live_and_dead_peer(engine, peer, local_buffer):
    eng, _ = engine
    assert eng.send_probe(peer.session_id) == 0
    assert eng.get_first_buffer_address(peer.session_id) == peer.buffer
    short = Peer(this_python(), 1 << 16, seed=3)
    sid, buf = short.session_id, short.buffer
    assert eng.send_probe(sid) == 0
    assert eng.transfer_sync_read(sid, local_buffer.addr, buf, 4096) == 0
    short.kill()
    rc, took = elapsed(eng.send_probe, sid)
    assert rc != 0 and took < 2.0
    rc, took = elapsed(eng.batch_transfer_sync_write, sid, [local_buffer.addr], [buf], [4096])
    assert rc != 0 and took < 6.0, f"dead peer: rc {rc} after {took:.2f} s"
    assert eng.send_probe(peer.session_id) == 0


# --- notify --------------------------------------------------------------------------------------


def test_notify_round_trip():
    a, _ = initialized_engine()
    b, b_sid = initialized_engine()
    src, dst = Buffer(1 << 16, fill=pattern(41, 0, 1 << 16)), Buffer(1 << 16)
    assert a.register_memory(src.addr, src.size) == 0
    assert b.register_memory(dst.addr, dst.size) == 0
    assert b.get_notifies() == []
    note = TransferNotify("req-1", "kv ready")
    assert a.transfer_sync(b_sid, src.addr, dst.addr, 4096, TransferOpcode.Write, note) == 0
    assert dst.read(0, 4096) == src.read(0, 4096)
    assert a.batch_transfer_sync(
        b_sid, [src.addr + 4096], [dst.addr + 4096], [4096], TransferOpcode.Write, notify=TransferNotify("req-2", "")
    ) == 0
    got = b.get_notifies()
    assert [(n.name, n.msg) for n in got] == [("req-1", "kv ready"), ("req-2", "")]
    assert got[0] == TransferNotify("req-1", "kv ready")
    assert b.get_notifies() == []


# --- threads and the GIL --------------------------------------------------------------------------


def test_ten_threads_transfer_while_python_keeps_running(engine, peer):
    eng, _ = engine
    threads_n, k, bs, rounds = 10, 8, 64 * 1024, 5
    per = k * bs  # 512 KiB of the peer per thread
    bufs = [Buffer(2 * per) for _ in range(threads_n)]
    for b in bufs:
        assert eng.register_memory(b.addr, b.size) == 0
    errors: list[str] = []
    count = 0
    stop = threading.Event()

    def counter():
        nonlocal count
        while not stop.is_set():
            count += 1

    def worker(t: int):
        b = bufs[t]
        base = t * per
        for r in range(rounds):
            seed = 50 + t * rounds + r
            b.write(0, pattern(seed, base, per))
            locs = [b.addr + j * bs for j in range(k)]
            remotes = [peer.buffer + base + j * bs for j in range(k)]
            if eng.batch_transfer_sync_write(peer.session_id, locs, remotes, [bs] * k) != 0:
                errors.append(f"thread {t} write: {TransferEngine.last_error()}")
                return
            back = [b.addr + per + j * bs for j in range(k)]
            if eng.batch_transfer_sync_read(peer.session_id, back, remotes, [bs] * k) != 0:
                errors.append(f"thread {t} read: {TransferEngine.last_error()}")
                return
            if b.read(per, per) != pattern(seed, base, per):
                errors.append(f"thread {t} round {r}: data differs")
                return

    c = threading.Thread(target=counter)
    c.start()
    workers = [threading.Thread(target=worker, args=(t,)) for t in range(threads_n)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    during = count
    stop.set()
    c.join()
    for b in bufs:
        assert eng.unregister_memory(b.addr) == 0
    assert not errors, errors
    assert during > 1000, f"the counter thread barely ran ({during})"
    for t in range(threads_n):
        assert peer.check(t * per, per, 50 + t * rounds + rounds - 1) == "ok"


def test_gil_is_released_during_one_long_transfer():
    """With a long switch interval, a thread holding the GIL keeps it for the whole call; the
    counter can only advance during the call if the call released the GIL."""
    a, _ = initialized_engine()
    b, b_sid = initialized_engine()
    n = 128 * MIB
    src, dst = Buffer(n), Buffer(n)
    src.clear(0x5A)
    dst.clear(0)
    assert a.register_memory(src.addr, n) == 0 and b.register_memory(dst.addr, n) == 0
    count = 0
    stop, running = threading.Event(), threading.Event()

    def counter():
        nonlocal count
        running.set()
        while not stop.is_set():
            count += 1

    old = sys.getswitchinterval()
    c = threading.Thread(target=counter)
    c.start()
    assert running.wait(30), "the counter thread did not start"
    sys.setswitchinterval(0.5)
    try:
        deltas = []
        for _ in range(2):
            before = count
            rc = a.transfer_sync_write(b_sid, src.addr, dst.addr, n)
            deltas.append(count - before)
            assert rc == 0
    finally:
        sys.setswitchinterval(old)
        stop.set()
        c.join()
    assert dst.read(n - 4096, 4096) == b"\x5a" * 4096
    assert min(deltas) > 1000, deltas


INTERRUPT_SCRIPT = r"""
import ctypes, signal, sys, time
from mooncake.engine import TransferEngine
# A shell that starts jobs in the background leaves SIGINT ignored, and Python keeps it so:
# install Python's own handler, as an interactive process has it.
signal.signal(signal.SIGINT, signal.default_int_handler)
sid, remote = sys.argv[1], int(sys.argv[2])
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = ctypes.create_string_buffer(1 << 20)
a = ctypes.addressof(buf)
assert e.register_memory(a, 1 << 20) == 0
assert e.transfer_sync_write(sid, a, remote, 4096) == 0
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
try:
    rc = e.transfer_sync_write(sid, a, remote, 1 << 20)
    print(f"returned {rc} after {time.monotonic() - t0:.2f}", flush=True)
except KeyboardInterrupt:
    print(f"interrupted after {time.monotonic() - t0:.2f}", flush=True)
"""


def test_ctrl_c_interrupts_a_waiting_transfer():
    """A peer that stops answering (SIGSTOP) leaves a transfer waiting for its deadline
    (30 s here); Ctrl-C on the main thread ends the wait at once with KeyboardInterrupt.

    Ctrl-C is sent once the transfer's bytes sit unread at the stopped peer: the child is then
    inside the call (which returns only when the bytes are acknowledged), not before it."""
    peer = Peer(this_python(), 1 << 20, seed=1)
    env = {**os.environ, "MC_TRANSFER_TIMEOUT": "30", "MC_LOG_LEVEL": "error"}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPT_SCRIPT, peer.session_id, str(peer.buffer)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        ports = listening_ports(peer.proc.pid)
        assert ports, "the peer listens on no TCP port"
        os.kill(peer.proc.pid, signal.SIGSTOP)
        assert unread_bytes(ports) == 0, "the peer had unread bytes before the transfer"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        wait_until(lambda: unread_bytes(ports) > 0, 20, "the transfer's bytes at the stopped peer")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=10)
        assert out.startswith("interrupted after"), (out, err[-2000:])
        assert float(out.split()[-1]) < 3.0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.kill(peer.proc.pid, signal.SIGCONT)
        peer.stop()


INTERRUPTED_READ_SCRIPT = r"""
import ctypes, signal, sys
from mooncake.engine import TransferEngine
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in INTERRUPT_SCRIPT
sid, remote, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
RW, PRIVATE, ANON, FIXED = 3, 0x02, 0x20, 0x10
buf = libc.mmap(None, size, RW, PRIVATE | ANON, -1, 0)
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert e.transfer_sync_read(sid, buf, remote, 4096) == 0
print("ready", flush=True)
sys.stdin.readline()
try:
    rc = e.transfer_sync_read(sid, buf, remote, size)
    print(f"returned {rc}", flush=True)
    sys.exit(1)
except KeyboardInterrupt:
    pass
# What a serving process does after a failed call: free the buffer; the allocator hands the
# same pages out again.
assert libc.munmap(buf, size) == 0
assert libc.mmap(buf, size, RW, PRIVATE | ANON | FIXED, -1, 0) == buf
ctypes.memset(buf, 0x11, size)
print("freed", flush=True)
sys.stdin.readline()
# The peer runs again and answers new work (and whatever it still had queued).
other = ctypes.create_string_buffer(4096)
assert e.transfer_sync_read(sid, ctypes.addressof(other), remote, 4096) == 0
data = ctypes.string_at(buf, size)
n = data.count(0x11)
print("clean" if n == size else f"dirty: {size - n} bytes changed", flush=True)
"""


def test_ctrl_c_during_a_read_leaves_freed_memory_alone():
    """Ctrl-C while a read waits on a stopped peer; the process frees the buffer and maps new
    memory at the same address; the peer resumes: none of its bytes may land in the new
    memory (the interrupted call cut the connections that were receiving into it)."""
    size = 16 << 20
    peer = Peer(this_python(), size, seed=1)
    env = {**os.environ, "MC_TRANSFER_TIMEOUT": "30", "MC_LOG_LEVEL": "error"}
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPTED_READ_SCRIPT, peer.session_id, str(peer.buffer),
                             str(size)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    stopped = False
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        ports = listening_ports(peer.proc.pid)
        os.kill(peer.proc.pid, signal.SIGSTOP)
        stopped = True
        assert unread_bytes(ports) == 0, "the peer had unread bytes before the transfer"
        proc.stdin.write("go\n")
        proc.stdin.flush()
        wait_until(lambda: unread_bytes(ports) > 0, 20, "the read's request at the stopped peer")
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline().strip() == "freed", proc.stderr.read()
        os.kill(peer.proc.pid, signal.SIGCONT)
        stopped = False
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert out.strip() == "clean", (out, err[-2000:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if stopped:
            os.kill(peer.proc.pid, signal.SIGCONT)
        peer.stop()
