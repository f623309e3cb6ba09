"""Our wheel against the published upstream wheel, each in its own venv and process, both
directions. Needs UPSTREAM_PYTHON (scripts/setup-upstream.sh makes the venv); without it
each test fails and says how to set it (conftest.upstream_python)."""

from __future__ import annotations

import time

import pytest

from helpers import Buffer, Peer, pattern, run_peer_initiator, sha256, this_python
from mooncake.engine import TransferEngine, TransferNotify, TransferOpcode

MIB = 1 << 20
UPSTREAM_ENV = {"MC_FORCE_TCP": "1"}


@pytest.fixture(scope="module")
def upstream_peer(upstream_python):
    p = Peer(upstream_python, 8 * MIB, seed=5, env=UPSTREAM_ENV)
    yield p
    p.stop()


def test_our_initiator_against_upstream_target(engine, upstream_peer, local_buffer):
    eng, _ = engine
    peer = upstream_peer
    sid = peer.session_id
    a = local_buffer.addr
    assert eng.get_first_buffer_address(sid) == peer.buffer
    # Its original pattern, read by us.
    assert eng.transfer_sync_read(sid, a, peer.buffer, 2 * MIB) == 0
    assert local_buffer.read(0, 2 * MIB) == pattern(5, 0, 2 * MIB)
    # Sync write, checked by upstream.
    local_buffer.write(0, pattern(61, 0, MIB))
    assert eng.transfer_sync_write(sid, a, peer.buffer, MIB) == 0
    assert peer.check(0, MIB, 61) == "ok"
    # transfer_sync with opcodes.
    local_buffer.write(0, pattern(62, MIB, MIB))
    assert eng.transfer_sync(sid, a, peer.buffer + MIB, MIB, TransferOpcode.Write) == 0
    assert peer.check(MIB, MIB, 62) == "ok"
    # Batch, reversed blocks.
    k, bs = 16, 65536 + 7
    for j in range(k):
        local_buffer.write(j * bs, pattern(63, (k - 1 - j) * bs, bs))
    locs = [a + j * bs for j in range(k)]
    remotes = [peer.buffer + (k - 1 - j) * bs for j in range(k)]
    assert eng.batch_transfer_sync_write(sid, locs, remotes, [bs] * k) == 0
    assert peer.check(0, k * bs, 63) == "ok"
    want = local_buffer.read(0, k * bs)
    local_buffer.clear()
    assert eng.batch_transfer_sync_read(sid, locs, remotes, [bs] * k) == 0
    assert local_buffer.read(0, k * bs) == want
    assert eng.batch_transfer_sync(sid, locs, remotes, [bs] * k, TransferOpcode.Read) == 0
    # Async.
    local_buffer.write(0, pattern(64, 4 * MIB, 2 * MIB))
    ids = [
        eng.batch_transfer_async_write(sid, [a], [peer.buffer + 4 * MIB], [MIB]),
        eng.batch_transfer_async(sid, [a + MIB], [peer.buffer + 5 * MIB], [MIB], TransferOpcode.Write),
    ]
    assert 0 not in ids and eng.get_batch_transfer_status(ids) == 0
    assert peer.check(4 * MIB, 2 * MIB, 64) == "ok"
    local_buffer.clear()
    bid = eng.batch_transfer_async_read(sid, [a], [peer.buffer + 4 * MIB], [2 * MIB])
    assert bid and eng.get_batch_transfer_status([bid]) == 0
    assert local_buffer.read(0, 2 * MIB) == pattern(64, 4 * MIB, 2 * MIB)
    bid = eng.transfer_submit_write(sid, a, peer.buffer + 6 * MIB, 4096)
    deadline = time.monotonic() + 20
    status = 0
    while status == 0 and time.monotonic() < deadline:
        status = eng.transfer_check_status(bid)
    assert status == 1
    # Out of bounds is refused by upstream's server; probe works both ways.
    assert eng.transfer_sync_write(sid, a, peer.buffer + 8 * MIB - 8, 64) == -1
    assert eng.send_probe(sid) == 0
    # The whole final state, as upstream sees it.
    assert eng.transfer_sync_read(sid, a, peer.buffer, 8 * MIB) == 0
    assert peer.sha256(0, 8 * MIB) == sha256(local_buffer.read(0, 8 * MIB))


def test_notify_to_upstream_is_accepted(engine, upstream_peer, local_buffer):
    eng, _ = engine
    rc = eng.transfer_sync(upstream_peer.session_id, local_buffer.addr, upstream_peer.buffer, 4096,
                           TransferOpcode.Read, TransferNotify("ours", "hello upstream"))
    assert rc == 0, TransferEngine.last_error()


@pytest.mark.parametrize("target_kind", ["in-process", "our-process"])
def test_upstream_initiator_against_our_target(target_kind, upstream_python):
    n = 8 * MIB
    if target_kind == "in-process":
        from helpers import initialized_engine

        eng, sid = initialized_engine()
        buf = Buffer(n, fill=pattern(71, 0, n))
        assert eng.register_memory(buf.addr, n) == 0
        addr, dump = buf.addr, lambda: sha256(buf.read(0, n))
        peer = None
    else:
        peer = Peer(this_python(), n, seed=71)
        sid, addr, dump = peer.session_id, peer.buffer, lambda: peer.sha256(0, n)
    try:
        res = run_peer_initiator(upstream_python, sid, addr, n, 72, "--expect-peer-seed", "71", "--check-reject", "--blocks", "16")
        assert res["_rc"] == 0 and res["ok"], res
        assert res["final_peer_sha256"] == dump()
        for name, r in res["reject"].items():
            assert r["rc"] != 0, name
    finally:
        if peer:
            peer.stop()
