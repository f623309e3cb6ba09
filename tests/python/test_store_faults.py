"""Mooncake Store under faults: bad buffers and keys, calls after ``close()``, an unreachable
master, a client killed in the middle of a put and of a get, a read's lease held while
eviction runs, a master killed and restarted, a pool filled three times over, garbage on
the master's RPC port, a client meeting the other implementation's master. Each test runs
a master and client processes of one implementation (``impl``, see store_helpers), the
last one a client of each against a master of the other.

Where upstream 0.3.13.post1 is weak (it dies with SIGSEGV after ``close()``, retries an
unreachable master for ~90 s), the upstream case records what it does and only ours is held
to the goal; the comments give upstream's observed values.

    UPSTREAM_PYTHON=.venv-upstream/bin/python pytest test_store_faults.py -k upstream
    PY_VENV=.venv-test pytest test_store_faults.py -k ours
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import tempfile
import time

import pytest

pytest.register_assert_rewrite("store_helpers")
from store_helpers import (  # noqa: E402  (after register_assert_rewrite)
    EMPTY, HOST, INVALID_PARAMS, KIB, MIB, NO_AVAILABLE_HANDLE, OBJECT_NOT_FOUND, OK, Master, StoreClient, bytes_of,
    cfg, close_all, described, describe_exit, free_ports, ptr, resolve_impl, unique, wait_until,
)

# The fixtures impl, master, own_master and clients.
pytest_plugins = ("store_helpers",)

GUARD = 0xEE


def is_negative(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value < 0


def expect_error(impl, value, upstream):
    """Upstream must return exactly ``upstream`` (observed); ours any negative code."""
    if impl.name == "upstream":
        assert value == upstream, f"upstream returned {value!r}, observed before: {upstream!r}"
    else:
        assert is_negative(value), f"expected a negative code, got {value!r}"


# --- buffers and keys ----------------------------------------------------------------------

def test_get_into_too_small_buffer(impl, master, clients):
    key = unique("small")
    size = 1 * MIB
    writer, reader = clients("writer"), clients("reader")
    for c in (writer, reader):
        assert c.setup(master) == OK
    assert writer.call("put", key, bytes_of(key, size)) == OK

    region = 2 * MIB
    reader.alloc("buf", region)
    assert reader.call("register_buffer", ptr("buf"), region) == OK

    def untouched() -> bool:
        return reader.region_bytes("buf", 0, region)["all_byte"] == GUARD

    reader.memset("buf", 0, region, GUARD)
    # Upstream: -600 INVALID_PARAMS ("User buffer too small"), nothing written.
    expect_error(impl, reader.call("get_into", key, ptr("buf"), size // 2), INVALID_PARAMS)
    assert untouched()
    got = reader.call("batch_get_into", [key], [ptr("buf")], [size // 2])
    assert len(got) == 1
    expect_error(impl, got[0], INVALID_PARAMS)
    assert untouched()
    got = reader.call("batch_get_into_multi_buffers", [key], [[ptr("buf"), ptr("buf", MIB)]], [[size // 4, size // 4]])
    assert len(got) == 1
    expect_error(impl, got[0], INVALID_PARAMS)
    assert untouched()
    # The object is intact; an exact-size read writes that much and no further.
    assert reader.call("get_into", key, ptr("buf"), size) == size
    assert reader.check("buf", 0, size, key)
    assert reader.region_bytes("buf", size, region - size)["all_byte"] == GUARD
    close_all(writer, reader)


def test_empty_and_long_keys(impl, master, clients):
    writer, reader = clients("writer"), clients("reader")
    for c in (writer, reader):
        assert c.setup(master) == OK
    for c in (writer, reader):
        c.alloc("buf", 4 * KIB)
        c.fill("buf", 0, 4 * KIB, "buf")
        assert c.call("register_buffer", ptr("buf"), 4 * KIB) == OK

    # Empty key. Upstream: put -600, is_exist 0, get b"", put_from -600, get_into -704,
    # batch_is_exist [0].
    expect_error(impl, writer.call("put", "", bytes_of("e", 100)), INVALID_PARAMS)
    expect_error(impl, writer.call("put_from", "", ptr("buf"), 100, cfg()), INVALID_PARAMS)
    exist = reader.call("is_exist", "")
    assert exist == 0 if impl.name == "upstream" else (exist == 0 or is_negative(exist)), exist
    assert reader.call("get", "") == EMPTY
    expect_error(impl, reader.call("get_into", "", ptr("buf"), 100), OBJECT_NOT_FOUND)
    got = reader.call("batch_is_exist", [""])
    assert len(got) == 1 and (got[0] == 0 or (impl.name == "ours" and is_negative(got[0]))), got

    # A 4096-byte key is a key (our limit; upstream takes it too).
    edge = unique("edge")
    edge += "e" * (4096 - len(edge))
    assert writer.call("put", edge, bytes_of(edge, 1000)) == OK
    assert reader.call("is_exist", edge) == 1
    assert reader.call("get", edge) == described(edge, 1000)

    # A 10 KiB key. Upstream takes it: put 0, is_exist 1, get the bytes, put_from 0,
    # get_into 100. Ours refuses keys over 4096 bytes (INVALID_PARAMS, -600), consistently.
    long_key = unique("long")
    long_key += "k" * (10 * KIB - len(long_key))
    put = writer.call("put", long_key, bytes_of(long_key, 1000))
    put_from = writer.call("put_from", long_key + "2", ptr("buf"), 100, cfg())
    exist = reader.call("is_exist", long_key)
    got = reader.call("get", long_key)
    got_into = reader.call("get_into", long_key + "2", ptr("buf"), 100)
    if impl.name == "upstream":
        assert (put, put_from, exist, got, got_into) == (OK, OK, 1, described(long_key, 1000), 100)
    else:
        assert is_negative(put) and is_negative(put_from), (put, put_from)
        assert exist == 0 or is_negative(exist), exist
        assert got == EMPTY
        assert is_negative(got_into)
    close_all(writer, reader)


# --- after close() -----------------------------------------------------------------------------

def after_close_calls(key: str) -> list:
    """(method, args) called on a closed store, the calls upstream survives first."""
    return [
        ("get", [key]),                                       # upstream: b""
        ("put_from", [key + "x", ptr("buf"), 100, cfg()]),    # upstream: -600
        ("close", []),                                        # upstream: 0
        ("is_exist", [key]),                                  # upstream: SIGSEGV
        ("put", [key + "y", bytes_of("y", 100)]),             # upstream: SIGSEGV
        ("get_into", [key, ptr("buf"), 100]),                 # upstream: SIGSEGV
        ("batch_is_exist", [[key]]),                          # upstream: SIGSEGV
        ("batch_put_from", [[key + "z"], [ptr("buf")], [100]]),
        ("batch_get_into", [[key], [ptr("buf")], [100]]),
        ("get_size", [key]),
        ("remove", [key]),
        ("remove_all", []),                                   # upstream: SIGSEGV
        ("register_buffer", [ptr("buf2"), 4096]),             # upstream: SIGSEGV
        ("get_hostname", []),                                 # upstream: SIGSEGV
    ]


def refused(reply: dict, method: str) -> bool:
    """A closed store's acceptable answer: a Python exception, a negative code (every one,
    for a batch), empty bytes for get; close again: 0; get_hostname: any string."""
    if not reply.get("ok"):
        return True
    v = reply["value"]
    if method == "close":
        return v == OK or is_negative(v)
    if method == "get_hostname":
        return isinstance(v, str)
    if method == "get":
        return v == EMPTY
    if isinstance(v, list):
        return bool(v) and all(is_negative(x) for x in v)
    return is_negative(v)


def test_calls_after_close(impl, own_master, clients):
    # A master of its own: upstream's client dies here, and its segment would stay in a
    # shared master for client_ttl.
    m = own_master()
    key = unique("closed")
    other = clients("other")
    assert other.setup(m) == OK
    c = clients("closing")
    assert c.setup(m) == OK
    c.alloc("buf", 4096)
    c.alloc("buf2", 4096)
    assert c.call("register_buffer", ptr("buf"), 4096) == OK
    assert c.call("put", key, bytes_of(key, 100)) == OK
    assert c.call("close") == OK
    calls = after_close_calls(key)
    if impl.name == "upstream":
        # Observed: get -> b"", put_from -> -600, close -> 0, then is_exist kills the process
        # with SIGSEGV (so do put, get_into, batch_is_exist, remove_all, register_buffer,
        # get_hostname, each tried in a fresh process).
        assert c.call("get", key) == EMPTY
        assert c.call("put_from", key + "x", ptr("buf"), 100, cfg()) == INVALID_PARAMS
        assert c.call("close") == OK
        c.send("call", method="is_exist", args=[key], kwargs={}, store="s")
        rc = c.wait(timeout=20)
        assert rc == -signal.SIGSEGV, f"upstream after close: is_exist ended with {describe_exit(rc)}"
    else:
        for method, args in calls:
            reply = c.try_call(method, *args, timeout=15)
            assert refused(reply, method), f"{method} after close: {reply}"
        assert c.quit() == 0, c.stderr_tail()
    # The other client never noticed.
    assert other.call("put", key + "-other", bytes_of(key, 100)) == OK
    assert other.call("get", key + "-other") == described(key, 100)
    close_all(other)


def test_setup_unreachable_master_fails_fast_ours():
    """Ours only: ``setup`` against a master that is not there fails within ~10 s, and the
    process can set up another store afterwards. Upstream retries for ~90 s and then returns
    -1 (measured with 0.3.13.post1: 89.9 s, -1; reference/store.md "Where upstream is
    weak"), so its case is not run here: waiting 90 s would only record that."""
    ours = resolve_impl("ours")
    (dead_port,) = free_ports(1)  # nothing listens there
    c = StoreClient(ours, "unreachable")
    m = None
    try:
        t0 = time.monotonic()
        reply = c.try_call("setup", HOST, "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", f"{HOST}:{dead_port}",
                           timeout=20)
        took = time.monotonic() - t0
        assert took < 12, f"setup took {took:.1f} s against an unreachable master"
        assert not reply.get("ok") or reply["value"] != OK, reply
        m = Master(ours)
        c.do("new", name="again")
        assert c.call("setup", HOST, "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", m.address, store="again") == OK
        assert c.call("put", "after-unreachable", bytes_of("u", 100), store="again") == OK
        assert c.call("close", store="again") == OK
    finally:
        c.cleanup()
        if m:
            m.close()


# --- a client killed mid-put -------------------------------------------------------------

def test_writer_killed_mid_put(impl, own_master, clients):
    # client_ttl 2 s: the dead writer's segment is dropped soon after.
    m = own_master("--client_ttl=2")
    writer, reader = clients("writer"), clients("reader")
    assert writer.setup(m, segment=16 * MIB) == OK
    assert reader.setup(m, segment=32 * MIB) == OK
    prefix, slots, size = unique("kill") + "-", 8, 1 * MIB
    progress = tempfile.NamedTemporaryFile(prefix="store-progress-", delete=False)
    progress.close()
    try:
        # Rounds of 8 x 1 MiB batch_put_from into the reader's segment, round i's keys
        # removed after round i+2 is in: the pool never fills, the loop never ends, and when
        # round i is in flight round i-1 is complete and still there.
        writer.send("put_loop", prefix=prefix, slots=slots, size=size, rounds=1_000_000,
                    cfg={"preferred_segment": reader.hostname()}, keep_rounds=2, progress=progress.name)
        assert writer.recv(timeout=30) == {"started": True}
        time.sleep(0.6)
        assert writer.lines.empty(), "the put loop ended before it was killed"
        writer.kill()
        with open(progress.name) as f:
            in_flight = int(f.read())
    finally:
        os.unlink(progress.name)
    assert in_flight >= 2, f"only {in_flight} rounds in 0.6 s"

    reader.alloc("buf", size + 4096)
    assert reader.call("register_buffer", ptr("buf"), size + 4096) == OK
    seen = {}
    for rnd in (in_flight - 1, in_flight, in_flight + 1):
        for j in range(slots):
            key = f"{prefix}{rnd}-{j}"
            reader.memset("buf", 0, size + 4096, GUARD)
            n = reader.call("get_into", key, ptr("buf"), size + 4096)
            seen[key] = n
            if n >= 0:
                # Never a part of an object, never another object's bytes.
                assert n == size and reader.check("buf", 0, size, f"{prefix}{j}"), (key, n)
                assert reader.region_bytes("buf", size, 4096)["all_byte"] == GUARD
    # The round before the one in flight had returned: complete, and its bytes are in the
    # reader's segment, so the writer's death does not take them.
    assert all(seen[f"{prefix}{in_flight - 1}-{j}"] == size for j in range(slots)), seen
    # Upstream: the round in flight reads -703 REPLICA_IS_NOT_READY, the next -704.
    assert all(is_negative(seen[f"{prefix}{in_flight + 1}-{j}"]) for j in range(slots)), seen

    # The reader goes on: into its own segment at once; anywhere once the dead writer's
    # segment is gone (upstream: a plain put may get -800 until then).
    key = unique("after-kill")
    assert reader.call("put", key, bytes_of(key, 5000), cfg(preferred_segment="$hostname")) == OK
    assert reader.call("get", key) == described(key, 5000)
    wait_until(lambda: reader.call("put", key + "-plain", bytes_of(key, 5000), timeout=15) == OK, 20,
               "a plain put after the writer died")
    assert reader.call("get", key + "-plain") == described(key, 5000)
    # A new client sees the completed round.
    late = clients("late")
    assert late.setup(m) == OK
    assert late.call("get", f"{prefix}{in_flight - 1}-0") == described(f"{prefix}0", size)
    close_all(reader, late)


# --- a client killed mid-get ---------------------------------------------------------------

def test_reader_killed_mid_get(impl, own_master, clients):
    # A 500 ms lease: the dead reader's last lease runs out soon, and then the object can go.
    m = own_master("--client_ttl=2", "--default_kv_lease_ttl=500")
    writer, reader = clients("writer"), clients("reader")
    assert writer.setup(m, segment=32 * MIB) == OK
    assert reader.setup(m, segment=16 * MIB) == OK
    key, size = unique("kill-get"), 8 * MIB
    assert writer.call("put", key, bytes_of(key, size), cfg(preferred_segment="$hostname")) == OK
    progress = tempfile.NamedTemporaryFile(prefix="store-progress-", delete=False)
    progress.close()
    try:
        reader.send("get_loop", key=key, size=size, progress=progress.name)
        assert reader.recv(timeout=30) == {"started": True}
        time.sleep(0.6)
        assert reader.lines.empty(), f"the get loop ended before it was killed: {reader.recv()}"
        reader.kill()
        with open(progress.name) as f:
            reads = int(f.read() or 0)
    finally:
        os.unlink(progress.name)
    assert reads >= 2, f"only {reads} reads of 8 MiB in 0.6 s"

    # The master and the writer go on; the object is whole for anyone who reads it now.
    assert m.alive(), m.log_tail()
    assert writer.call("get", key) == described(key, size)
    late = clients("late")
    assert late.setup(m) == OK
    assert late.call("get", key) == described(key, size)
    # The dead reader's lease does not pin the object for longer than a lease: the remove
    # succeeds once the leases of the reads above have run out.
    wait_until(lambda: writer.call("remove", key) == OK, 10, "the remove of the object the dead reader was reading")
    assert late.call("is_exist", key) == 0
    # Its segment is dropped after client_ttl: a put preferring it lands elsewhere or
    # nowhere, never in a dead client's memory; a plain put succeeds.
    after = unique("after-kill-get")
    wait_until(lambda: writer.call("put", after, bytes_of(after, 4096), timeout=15) == OK, 20,
               "a plain put after the reader died")
    assert late.call("get", after) == described(after, 4096)
    close_all(writer, late)


# --- a lease held while eviction runs ------------------------------------------------------

def test_a_read_lease_holds_through_eviction(impl, own_master, clients):
    # A 10 s lease (upstream's default): the object read first is the oldest, the first the
    # eviction would take, and must survive two pools' worth of newer puts while leased.
    m = own_master("--default_kv_lease_ttl=10000")
    writer, reader = clients("writer"), clients("reader")
    assert writer.setup(m, segment=16 * MIB) == OK
    assert reader.setup(m, segment=0) == OK  # the pool is the writer's 16 MiB
    size = 1 * MIB
    held = unique("leased")
    assert writer.call("put", held, bytes_of(held, size), cfg(replica_num=1)) == OK
    reader.alloc("buf", size)
    assert reader.call("register_buffer", ptr("buf"), size) == OK
    t0 = time.monotonic()
    assert reader.call("get_into", held, ptr("buf"), size) == size
    assert reader.check("buf", 0, size, held)

    prefix, n = unique("evict-lease") + "-", 32
    writer.alloc("buf", size)
    assert writer.call("register_buffer", ptr("buf"), size) == OK
    for i in range(n):
        key = f"{prefix}{i}"
        writer.fill("buf", 0, size, key)
        for _ in range(100):
            rc = writer.call("put_from", key, ptr("buf"), size, cfg(replica_num=1))
            if rc != NO_AVAILABLE_HANDLE:
                break
            time.sleep(0.05)
        assert rc == OK, f"put {i}: {rc}"
    elapsed = time.monotonic() - t0
    assert elapsed < 9, f"the puts took {elapsed:.1f} s: the lease may have run out, the test proves nothing"
    # Still there and whole, although older than everything that was evicted around it.
    assert reader.call("is_exist", held) == 1
    present = reader.call("batch_is_exist", [f"{prefix}{i}" for i in range(n)])
    assert present[0] == 0 and sum(present) <= 15, present
    reader.memset("buf", 0, size, GUARD)
    assert reader.call("get_into", held, ptr("buf"), size) == size
    assert reader.check("buf", 0, size, held)
    close_all(writer, reader)


# --- the master killed and restarted ------------------------------------------------------

def test_master_killed_and_restarted(impl, own_master, clients):
    m = own_master()
    writer, reader = clients("writer"), clients("reader")
    for c in (writer, reader):
        assert c.setup(m) == OK
    key = unique("restart")
    assert writer.call("put", key, bytes_of(key, 1000)) == OK
    m.kill()

    # While it is down: errors, within a bound. Upstream: is_exist -900 (RPC_FAIL) at once,
    # get b"" at once, put -900 after ~4.3 s.
    for c, method, args in ((reader, "is_exist", [key]), (reader, "get", [key]),
                            (writer, "put", [key + "-down", bytes_of(key, 1000)])):
        reply = c.try_call(method, *args, timeout=20)
        assert reply["secs"] < 15, f"{method} with the master down took {reply['secs']:.1f} s"
        assert refused(reply, method), f"{method} with the master down: {reply}"
    if impl.name == "upstream":
        assert reader.call("is_exist", key) == -900

    # Back on the same port. Upstream: the clients reconnect (~1-5 s: three failed pings,
    # then a reconnect) and mount their segments again; the first puts before that get
    # -200; the objects of before are gone (the master kept them in memory only).
    m.start()
    after = key + "-after"
    wait_until(lambda: writer.call("put", after, bytes_of(after, 1000), timeout=15) == OK, 30,
               "a put succeeding after the master's restart")
    assert reader.call("is_exist", after) == 1
    assert reader.call("get", after) == described(after, 1000)
    before = reader.call("is_exist", key)
    if impl.name == "upstream":
        assert before == 0
    else:
        assert before in (0, 1)
        if before == 1:
            assert reader.call("get", key) == described(key, 1000)
    close_all(writer, reader)


# --- eviction -----------------------------------------------------------------------------

def test_eviction_at_three_times_capacity(impl, own_master, clients):
    m = own_master()
    writer, reader = clients("writer"), clients("reader")
    assert writer.setup(m, segment=16 * MIB) == OK
    assert reader.setup(m, segment=0) == OK  # the pool is the writer's 16 MiB
    rss_before = m.rss_kib()
    prefix, n, size = unique("evict") + "-", 48, 1 * MIB
    writer.alloc("buf", size)
    assert writer.call("register_buffer", ptr("buf"), size) == OK
    for i in range(n):
        key = f"{prefix}{i}"
        writer.fill("buf", 0, size, key)
        # vLLM backs off on -200 NO_AVAILABLE_HANDLE (upstream: now and then, for one try,
        # while its eviction catches up).
        for _ in range(100):
            rc = writer.call("put_from", key, ptr("buf"), size, cfg(replica_num=1))
            if rc != NO_AVAILABLE_HANDLE:
                break
            time.sleep(0.05)
        assert rc == OK, f"put {i}: {rc}"

    # What the store kept, asked without touching recency (a get marks an object used): the
    # pool is full, above its high watermark, so a sweep may evict the least recently used
    # object while the gets below run, and after a few gets that is one of the newest.
    keys = [f"{prefix}{i}" for i in range(n)]
    kept = [i for i, e in enumerate(reader.call("batch_is_exist", keys)) if e]
    # Upstream keeps the newest 16 (its whole pool).
    assert set(range(n - 8, n)) <= set(kept), kept
    assert not set(range(8)) & set(kept), kept
    assert len(kept) <= 16, kept
    reader.alloc("buf", size)
    assert reader.call("register_buffer", ptr("buf"), size) == OK
    for i in range(n):
        reader.memset("buf", 0, size, GUARD)
        got = reader.call("get_into", keys[i], ptr("buf"), size)
        if got >= 0:
            assert i in kept, (keys[i], got, kept)
            assert got == size and reader.check("buf", 0, size, keys[i]), (keys[i], got)
        else:
            # Evicted before or since the look above; never a half-written object.
            assert got == OBJECT_NOT_FOUND, (keys[i], got)
    growth = m.rss_kib() - rss_before
    assert growth < 64 * 1024, f"master RSS grew {growth} KiB"
    close_all(writer, reader)


# --- garbage on the RPC port ---------------------------------------------------------------

def test_garbage_on_rpc_port(impl, own_master, clients):
    m = own_master()
    rss_before = m.rss_kib()
    conns = []

    def connect() -> socket.socket:
        s = socket.create_connection((HOST, m.rpc_port), timeout=5)
        conns.append(s)
        return s

    try:
        connect().sendall(os.urandom(64 * KIB))
        connect().sendall(b"\0" * 1000)
        # Length-prefixed blobs that claim far more than they carry: coro_rpc's header
        # (magic 0x21, version, serialize type, msg type, seq, function id, body length,
        # attachment length), and u32/u64 length prefixes both ways round.
        connect().sendall(struct.pack("<BBBBIIII", 0x21, 1, 0, 0, 1, 0x12345678, 0xFFFFFFF0, 0xFFFFFFF0) + b"x" * 1000)
        connect().sendall(struct.pack(">I", 0xFFFFFFF0) + b"y" * 1000)
        connect().sendall(struct.pack("<I", 0xFFFFFFF0) + b"y" * 1000)
        connect().sendall(struct.pack("<Q", 1 << 62) + b"z" * 1000)
        connect().sendall(struct.pack(">Q", 1 << 62) + b"z" * 1000)
        # ... and one that stays open half-sent while a real client works.
        connect().sendall(struct.pack("<I", 1 << 20) + b"h" * 100)
        time.sleep(0.3)
        assert m.alive(), f"master died: {m.log_tail()}"

        writer, reader = clients("writer"), clients("reader")
        for c in (writer, reader):
            assert c.setup(m, timeout=20) == OK
        key = unique("garbage")
        assert writer.call("put", key, bytes_of(key, 64 * KIB)) == OK
        assert reader.call("get", key) == described(key, 64 * KIB)
        assert m.alive()
        growth = m.rss_kib() - rss_before
        assert growth < 64 * 1024, f"master RSS grew {growth} KiB"
        close_all(writer, reader)
    finally:
        for s in conns:
            s.close()


# --- a client and a master of different implementations -------------------------------------

def cross_setup(client: StoreClient, master: Master) -> tuple:
    """The positional ``setup`` against ``master``: (the reply, seconds it took)."""
    t0 = time.monotonic()
    reply = client.try_call("setup", HOST, "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", master.address,
                            timeout=120)
    return reply, time.monotonic() - t0


def assert_master_serves(impl_name: str, master: Master) -> None:
    """A client of the master's own implementation still puts and gets through it."""
    own = StoreClient(resolve_impl(impl_name), "own")
    try:
        assert own.setup(master, timeout=30) == OK
        key = unique("cross-after")
        assert own.call("put", key, bytes_of(key, 4096)) == OK
        assert own.call("get", key) == described(key, 4096)
        close_all(own)
    finally:
        own.cleanup()


@pytest.mark.parametrize("client_impl,master_impl", [("ours", "upstream"), ("upstream", "ours")])
def test_client_at_the_other_implementations_master(client_impl, master_impl):
    """A client meeting the other implementation's master (coro_rpc against our gRPC) fails
    at ``setup`` and neither process crashes; the master goes on serving its own clients.
    Ours, at upstream's master, fails within seconds saying the master is not ours, and can
    set up again. Upstream's, at ours, meets an HTTP/2 server that closes the connection
    and gives up after its 20 tries (0.3.13.post1: -1 after 2.1 s, logged "RPC call failed:
    End of file")."""
    m = Master(resolve_impl(master_impl))
    c = StoreClient(resolve_impl(client_impl), "cross")
    try:
        reply, took = cross_setup(c, m)
        assert took < 15, f"setup took {took:.1f} s"
        assert reply.get("ok") and reply["value"] < 0, reply
        assert c.proc.poll() is None and m.alive(), m.log_tail()
        if client_impl == "ours":
            said = c.stderr_tail()
            assert "not compatible" in said or "mooncake-rs" in said, said
            ours = Master(resolve_impl("ours"))
            try:
                assert c.call("setup", HOST, "P2PHANDSHAKE", 16 * MIB, 16 * MIB, "tcp", "", ours.address) == OK
                assert c.call("close") == OK
            finally:
                ours.close()
        assert_master_serves(master_impl, m)
    finally:
        c.cleanup()
        m.close()
