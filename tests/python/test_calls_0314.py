"""Upstream 0.3.14's newer calls: the ``*_arrays`` and ``*_pages`` batch forms, scatter
tickets, ``nic_hint``, the ``*_on_cuda`` calls and the classes this engine refuses.

Each call moves pattern bytes and the receiving side checks them: loopback (this engine
is its own target), ours to ours (a target process with our wheel) and mixed (a target
process with upstream's wheel, ``UPSTREAM_PYTHON``; its 0.3.13 has none of these calls,
so upstream serves as the target only). The CUDA ordering runs where ``MC_TEST_CUDA=1``
and PyTorch sees a GPU; elsewhere its refusal is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import mooncake.engine as me
from helpers import Buffer, Peer, pattern, this_python
from mooncake.engine import ScatterTransferCompletionStatus as Status
from mooncake.engine import TransferEngine

KIB = 1024
SIZE = 1 << 20

# Upstream 0.3.14's engine.pyi, the names this module did not have before.
NEW_METHODS = """
batch_transfer_sync_write_arrays batch_transfer_sync_read_arrays batch_transfer_async_write_arrays
batch_transfer_async_read_arrays batch_transfer_sync_write_pages batch_transfer_sync_read_pages
submit_scatter_write submit_scatter_read scatter_transfer_sync_write_with_ticket
scatter_transfer_sync_read_with_ticket transfer_write_on_cuda transfer_read_on_cuda
batch_transfer_write_on_cuda batch_transfer_read_on_cuda
""".split()
NEW_NAMES = """
SUPPORT_MULTI_PROTOCOL ScatterTransferCompletionStatus ScatterTransferTicket SharedSegment
ReceivedData ReceivedTensor RpcInterface CoroRPCInterface create_rpc_client create_rpc_server
""".split()
NIC_HINT_METHODS = """
transfer_sync_write transfer_sync_read transfer_sync batch_transfer_sync_write batch_transfer_sync_read
batch_transfer_sync batch_transfer_async_write batch_transfer_async_read batch_transfer_async
transfer_submit_write
""".split()


class LoopbackTarget:
    """This engine's own second buffer as the target, checked by reading it here."""

    def __init__(self, eng: TransferEngine, sid: str, seed: int):
        self.buf = Buffer(SIZE, fill=pattern(seed, 0, SIZE))
        assert eng.register_memory(self.buf.addr, SIZE) == 0
        self.eng, self.session_id, self.buffer, self.seed = eng, sid, self.buf.addr, seed

    def check(self, offset: int, length: int, seed: int) -> str:
        got = self.buf.read(offset, length)
        return "ok" if got == pattern(seed, offset, length) else "mismatch"

    def stop(self) -> None:
        assert self.eng.unregister_memory(self.buf.addr) == 0


@pytest.fixture(scope="module", params=["loopback", "ours", "upstream"])
def target(request, engine):
    """A pattern(9)-filled target of each kind; fresh per module and kind."""
    if request.param == "loopback":
        t = LoopbackTarget(*engine, seed=9)
    else:
        python = this_python() if request.param == "ours" else request.getfixturevalue("upstream_python")
        t = Peer(python, SIZE, seed=9, env={"MC_FORCE_TCP": "1"})
    yield t
    t.stop()


def test_surface_has_0314_names():
    for name in NEW_METHODS:
        assert callable(getattr(TransferEngine, name)), name
    for name in NEW_NAMES:
        assert hasattr(me, name), name
        assert name in me.__all__, name
    assert me.SUPPORT_MULTI_PROTOCOL is True
    assert me.CoroRPCInterface is me.RpcInterface
    assert [s.name for s in (Status.COMPLETED, Status.FAILED_DRAINED, Status.COMPLETION_UNKNOWN)] == [
        "COMPLETED",
        "FAILED_DRAINED",
        "COMPLETION_UNKNOWN",
    ]
    # Upstream 0.3.14's values (read from its cuda13 wheel's engine.so on a CUDA host).
    assert [int(s) for s in (Status.COMPLETED, Status.FAILED_DRAINED, Status.COMPLETION_UNKNOWN)] == [0, -1, -2]
    assert [s.value for s in (Status.COMPLETED, Status.FAILED_DRAINED, Status.COMPLETION_UNKNOWN)] == [0, -1, -2]


def test_arrays_move_verified_bytes(engine, local_buffer, target):
    eng, _ = engine
    sid, a, r = target.session_id, local_buffer.addr, target.buffer
    k, bs = 8, 4 * KIB + 3
    # Reversed blocks: local j -> remote k-1-j.
    for j in range(k):
        local_buffer.write(j * bs, pattern(21, (k - 1 - j) * bs, bs))
    locs = np.array([a + j * bs for j in range(k)], dtype=np.uint64)
    remotes = np.array([r + (k - 1 - j) * bs for j in range(k)], dtype=np.int64)
    lens = np.full(k, bs, dtype=np.int64)
    assert eng.batch_transfer_sync_write_arrays(sid, locs, remotes, lens) == 0, TransferEngine.last_error()
    assert target.check(0, k * bs, 21) == "ok"
    want = local_buffer.read(0, k * bs)
    local_buffer.clear()
    assert eng.batch_transfer_sync_read_arrays(sid, locs, remotes, lens, nic_hint="") == 0
    assert local_buffer.read(0, k * bs) == want
    # Async forms: a batch id, finished by get_batch_transfer_status.
    local_buffer.write(0, pattern(22, 64 * KIB, 64 * KIB))
    one = np.array([a], dtype=np.uint64)
    bid = eng.batch_transfer_async_write_arrays(sid, one, np.array([r + 64 * KIB], dtype=np.uint64), np.array([64 * KIB], dtype=np.uint64))
    assert bid != 0 and eng.get_batch_transfer_status([bid]) == 0
    assert target.check(64 * KIB, 64 * KIB, 22) == "ok"
    local_buffer.clear()
    bid = eng.batch_transfer_async_read_arrays(sid, one, np.array([r + 64 * KIB], dtype=np.uint64), np.array([64 * KIB], dtype=np.uint64))
    assert bid != 0 and eng.get_batch_transfer_status([bid]) == 0
    assert local_buffer.read(0, 64 * KIB) == pattern(22, 64 * KIB, 64 * KIB)


def test_arrays_refuse_wrong_shapes_with_the_reason(engine, local_buffer):
    eng, sid = engine
    a = np.array([local_buffer.addr], dtype=np.uint64)
    with pytest.raises(TypeError, match="8-byte integers"):
        eng.batch_transfer_sync_write_arrays(sid, np.array([1], dtype=np.int32), a, a)
    with pytest.raises(TypeError, match="buffer protocol"):
        eng.batch_transfer_sync_write_arrays(sid, [local_buffer.addr], a, a)
    with pytest.raises(ValueError, match="lengths\\[0\\] is negative"):
        eng.batch_transfer_sync_write_arrays(sid, a, a, np.array([-1], dtype=np.int64))
    with pytest.raises(ValueError, match="C-contiguous"):
        eng.batch_transfer_sync_write_arrays(sid, np.zeros(4, dtype=np.uint64)[::2], a, a)
    assert eng.batch_transfer_sync_write_arrays(sid, a, a, np.array([], dtype=np.uint64)) == -1
    assert "differ in length" in TransferEngine.last_error()


def test_pages_move_verified_bytes(engine, local_buffer, target):
    eng, _ = engine
    sid, a, r = target.session_id, local_buffer.addr, target.buffer
    # Two fields (a "K" and a "V" region on each side), four pages, page size 4 KiB.
    page, npages = 4 * KIB, 4
    fields = np.array(
        [[a, page, r, page, page], [a + 256 * KIB, page, r + 256 * KIB, page, page]], dtype=np.int64
    )
    src_pages = np.array([0, 1, 2, 3], dtype=np.int64)
    dst_pages = np.array([7, 5, 3, 1], dtype=np.int64)
    for base in (0, 256 * KIB):
        for i, d in zip(src_pages, dst_pages):
            local_buffer.write(base + int(i) * page, pattern(23, base + int(d) * page, page))
    assert eng.batch_transfer_sync_write_pages(sid, src_pages, dst_pages, fields, max_batch_size=3) == 0
    for base in (0, 256 * KIB):
        for d in dst_pages:
            assert target.check(base + int(d) * page, page, 23) == "ok"
    # Read: src is the remote side; pages 7,5,3,1 come back into local pages 0..3.
    local_buffer.clear()
    rfields = np.array([[r, page, a, page, page]], dtype=np.uint64)
    assert eng.batch_transfer_sync_read_pages(sid, dst_pages, src_pages, rfields) == 0
    for i, d in zip(src_pages, dst_pages):
        assert local_buffer.read(int(i) * page, page) == pattern(23, int(d) * page, page)
    assert local_buffer.read(npages * page, page) == bytes(page)
    with pytest.raises(ValueError, match=r"\[N, 5\]"):
        eng.batch_transfer_sync_write_pages(sid, src_pages, dst_pages, np.zeros((1, 4), dtype=np.int64))


def scatter_args(sid, a, r, offsets, remote_offsets, lengths, cap=SIZE):
    return (sid, [a], [cap], [r], [cap], [offsets], [remote_offsets], [lengths])


def test_scatter_tickets_move_verified_bytes(engine, local_buffer, target):
    eng, _ = engine
    sid, a, r = target.session_id, local_buffer.addr, target.buffer
    local_buffer.write(0, pattern(24, 128 * KIB, 8 * KIB))
    local_buffer.write(8 * KIB, pattern(24, 300 * KIB, 2 * KIB))
    args = scatter_args(sid, a, r, [0, 8 * KIB], [128 * KIB, 300 * KIB], [8 * KIB, 2 * KIB])
    ticket = eng.scatter_transfer_sync_write_with_ticket(*args)
    assert ticket.drained and ticket.status == Status.COMPLETED, TransferEngine.last_error()
    assert target.check(128 * KIB, 8 * KIB, 24) == "ok" and target.check(300 * KIB, 2 * KIB, 24) == "ok"
    local_buffer.clear()
    ticket = eng.submit_scatter_read(*args)
    assert ticket.drain(10_000) == Status.COMPLETED and ticket.drained
    assert ticket.drain(0) == Status.COMPLETED  # final once drained
    assert local_buffer.read(0, 8 * KIB) == pattern(24, 128 * KIB, 8 * KIB)
    local_buffer.clear()
    assert eng.scatter_transfer_sync_read_with_ticket(*args).status == Status.COMPLETED
    assert local_buffer.read(8 * KIB, 2 * KIB) == pattern(24, 300 * KIB, 2 * KIB)
    local_buffer.write(0, pattern(25, 512 * KIB, KIB))
    ticket = eng.submit_scatter_write(*scatter_args(sid, a, r, [0], [512 * KIB], [KIB]))
    assert ticket.drain(10_000) == Status.COMPLETED
    assert target.check(512 * KIB, KIB, 25) == "ok"


def test_scatter_refusals_and_failures(engine, local_buffer, peer):
    eng, _ = engine
    a, r = local_buffer.addr, peer.buffer
    with pytest.raises(ValueError, match="remote offset 60 \\+ length 8 exceeds its capacity 64"):
        eng.submit_scatter_write(*scatter_args(peer.session_id, a, r, [0], [60], [8], cap=64))
    with pytest.raises(ValueError, match="one entry per region"):
        eng.submit_scatter_write(peer.session_id, [a], [], [r], [8], [[0]], [[0]], [[8]])
    # Past the peer's registered memory: the peer refuses, the ticket says so once drained.
    ticket = eng.scatter_transfer_sync_write_with_ticket(*scatter_args(peer.session_id, a, r + (64 << 20), [0], [0], [KIB]))
    assert ticket.status == Status.FAILED_DRAINED and ticket.drained
    assert TransferEngine.last_error()
    with pytest.raises(RuntimeError, match="not initialized"):
        TransferEngine().submit_scatter_write(*scatter_args(peer.session_id, a, r, [0], [0], [KIB]))


def test_nic_hint_is_accepted_everywhere(engine, local_buffer, peer):
    eng, _ = engine
    local_buffer.write(0, pattern(26, 0, 4 * KIB))
    assert eng.transfer_sync_write(peer.session_id, local_buffer.addr, peer.buffer, 4 * KIB, "", "mlx5_0") == 0
    assert peer.check(0, 4 * KIB, 26) == "ok"
    for name in NIC_HINT_METHODS:
        assert "nic_hint" in getattr(TransferEngine, name).__text_signature__, name


def test_on_cuda_refuses_without_a_runtime(peer):
    """With GPU runtimes off (MC_GPU_RUNTIME=none), nothing moves and the reason is raised."""
    code = (
        "from helpers import initialized_engine\n"
        "eng, sid = initialized_engine()\n"
        "for call, arg in (('transfer_write_on_cuda', 0), ('batch_transfer_read_on_cuda', [0])):\n"
        "    try:\n"
        f"        getattr(eng, call)({peer.session_id!r}, arg, arg, arg if call[0] == 'b' else 1, 0)\n"
        "    except RuntimeError as e:\n"
        "        print(e)\n"
    )
    path = os.pathsep.join(p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "MC_GPU_RUNTIME": "none", "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    lines = out.stdout.splitlines()
    assert len(lines) == 2, (out.stdout, out.stderr)
    assert "transfer_write_on_cuda needs a CUDA runtime to order the transfer" in lines[0]
    assert "MC_GPU_RUNTIME=none" in lines[0]
    assert lines[1].startswith("batch_transfer_read_on_cuda needs a CUDA runtime")


@pytest.mark.skipif(os.environ.get("MC_TEST_CUDA") != "1", reason="needs a GPU: MC_TEST_CUDA=1 with PyTorch+CUDA")
def test_on_cuda_orders_after_the_stream(engine, peer):
    """A kernel fills a pinned tensor on a side stream; the write queued after it on that
    stream must carry the kernel's bytes (without ordering it would carry zeros)."""
    import torch

    eng, _ = engine
    n = 1 << 20
    host = torch.zeros(n, dtype=torch.uint8, pin_memory=True)
    assert eng.register_memory(host.data_ptr(), n) == 0
    src = torch.from_numpy(np.frombuffer(pattern(27, 0, n), dtype=np.uint8).copy()).cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the copy
        host.copy_(src, non_blocking=True)
    eng.transfer_write_on_cuda(peer.session_id, host.data_ptr(), peer.buffer, n, stream.cuda_stream)
    assert peer.check(0, n, 27) == "ok"
    host.zero_()
    eng.batch_transfer_read_on_cuda(peer.session_id, [host.data_ptr()], [peer.buffer], [n], stream.cuda_stream)
    assert bytes(host.numpy()) == pattern(27, 0, n)
    assert eng.unregister_memory(host.data_ptr()) == 0


def test_shared_segment_and_rpc_refuse_with_the_reason():
    assert me.SharedSegment.supported() is False
    assert me.SharedSegment.supported(mmap=False, host_register=True) is False
    with pytest.raises(RuntimeError, match="no process-shared segment allocator"):
        me.SharedSegment.create("seg", 4096, 2, 0)
    for make in (me.RpcInterface, me.CoroRPCInterface, me.create_rpc_client, me.create_rpc_server):
        with pytest.raises(RuntimeError, match="coro_rpc"):
            make()
