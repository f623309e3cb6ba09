"""The module's surface: names, types, return conventions that need no peer, argument
checking, last_error(), initialize twice."""

from __future__ import annotations

import ctypes
import importlib.metadata
import json
import threading

import pytest

import mooncake
import mooncake.engine as me
from helpers import Buffer, initialized_engine
from mooncake.engine import InnerTransferEngine, TransferEngine, TransferNotify, TransferOpcode

UPSTREAM_METHODS = """
initialize initialize_ext get_rpc_port register_memory unregister_memory batch_register_memory
batch_unregister_memory transfer_sync_write transfer_sync_read transfer_sync batch_transfer_sync_write
batch_transfer_sync_read batch_transfer_sync batch_transfer_async_write batch_transfer_async_read
batch_transfer_async get_batch_transfer_status transfer_submit_write transfer_check_status
allocate_managed_buffer free_managed_buffer write_bytes_to_buffer read_bytes_from_buffer
get_first_buffer_address get_local_topology get_notifies send_probe get_engine warmup_efa_segment
get_engine_ptr
""".split()


def test_module_items():
    # nvlink_intra is served (same-host GPU IPC) wherever a GPU runtime has devices.
    assert me.SUPPORT_MUSA is True and me.SUPPORT_CUDA is True and me.SUPPORT_INTRA_NVLINK is True
    for flag in ("SUPPORT_EFA", "SUPPORT_HIP", "SUPPORT_MNNVL"):
        assert getattr(me, flag) is False
    assert me.__version__ == mooncake.__version__
    assert importlib.metadata.version("mooncake-transfer-engine-musa") == me.__version__
    assert TransferEngine.__module__ == "mooncake.engine"
    for name in UPSTREAM_METHODS:
        assert callable(getattr(TransferEngine, name)), name


def test_transfer_opcode():
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert TransferOpcode.Read == 0 and TransferOpcode.Write == 1
    assert me.Read == TransferOpcode.Read and me.Write == TransferOpcode.Write
    assert TransferEngine.TransferOpcode is TransferOpcode
    assert TransferOpcode.Write.name == "Write" and TransferOpcode.Write.value == 1
    assert [0, 1][TransferOpcode.Write] == 1  # __index__
    assert len({TransferOpcode.Read, TransferOpcode.Write, TransferOpcode.Read}) == 2


def test_transfer_notify():
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify("a", "b")
    n.msg = "c"
    assert (n.name, n.msg) == ("a", "c")
    assert TransferNotify(name="x", msg="y") == TransferNotify("x", "y")
    assert "x" in repr(TransferNotify("x", "y"))


def test_before_initialize():
    e = TransferEngine()
    assert e.get_rpc_port() == -1
    assert "not initialized" in TransferEngine.last_error()
    assert e.register_memory(0x1000, 10) == -1
    assert e.transfer_sync_write("127.0.0.1:1", 1, 1, 1) == -1
    assert e.batch_transfer_async_write("127.0.0.1:1", [1], [1], [1]) == 0
    assert e.allocate_managed_buffer(4096) == 0
    assert e.get_notifies() == []
    assert e.get_engine() is None and e.get_engine_ptr() == 0
    assert e.warmup_efa_segment("anything") == 0


def test_initialize_positional_and_keyword_and_metadata_errors():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "http://127.0.0.1:1/metadata", "tcp", "") == -1
    assert "http://127.0.0.1:1/metadata" in TransferEngine.last_error()
    assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "xgmi", "", "p2p") == -1
    # A failed initialize leaves the object usable.
    assert e.initialize(local_hostname="127.0.0.1", metadata_server="P2PHANDSHAKE", protocol="rdma", device_name="mlx5_0") == 0
    assert 15000 <= e.get_rpc_port() <= 17000
    f = TransferEngine()
    assert f.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "", "p2p") == 0


def test_initialize_twice_replaces_the_engine_and_keeps_registrations():
    a, a_sid = initialized_engine()
    b, b_sid = initialized_engine()
    buf = Buffer(1 << 16, fill=b"first")
    assert b.register_memory(buf.addr, buf.size) == 0
    managed = b.allocate_managed_buffer(10_000)
    assert b.write_bytes_to_buffer(managed, b"managed", 7) == 0
    old_port = b.get_rpc_port()
    assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    new_sid = f"127.0.0.1:{b.get_rpc_port()}"
    assert b.get_rpc_port() != old_port
    dst = Buffer(4096)
    assert a.register_memory(dst.addr, dst.size) == 0
    # The region registered before the second initialize is served by the new engine.
    assert a.transfer_sync_read(new_sid, dst.addr, buf.addr, 5) == 0
    assert dst.read(0, 5) == b"first"
    assert a.transfer_sync_read(new_sid, dst.addr, managed, 7) == 0
    assert dst.read(0, 7) == b"managed"
    # The old engine is gone.
    assert a.send_probe(b_sid) != 0
    assert b.free_managed_buffer(managed, 10_000) == 0


def test_registration_codes():
    e, _ = initialized_engine()
    buf = Buffer(1 << 16)
    assert e.register_memory(buf.addr, buf.size) == 0
    assert e.register_memory(buf.addr + 16, 16) == -7  # ERR_ADDRESS_OVERLAPPED
    assert "overlaps" in TransferEngine.last_error()
    assert e.register_memory(buf.addr, 0) < 0
    assert e.unregister_memory(buf.addr) == 0
    assert e.unregister_memory(buf.addr) == -3  # ERR_ADDRESS_NOT_REGISTERED
    assert e.batch_register_memory([buf.addr, buf.addr + 4096], [4096, 4096]) == 0
    assert e.batch_unregister_memory([buf.addr, buf.addr + 4096]) == 0
    # All or nothing: the second overlaps the first, so neither stays.
    assert e.batch_register_memory([buf.addr, buf.addr + 100], [4096, 4096], "cpu:0") == -7
    assert e.register_memory(buf.addr, 4096) == 0
    assert e.batch_register_memory([buf.addr], [1, 2]) == -1
    assert e.batch_unregister_memory([buf.addr]) == 0


def test_last_error_is_per_thread_and_cleared_by_success():
    e, sid = initialized_engine()
    assert e.send_probe("127.0.0.1:1") != 0
    reason = TransferEngine.last_error()
    assert reason.startswith("send_probe:") and "127.0.0.1:1" in reason
    assert e.last_error() == reason  # also reachable from an instance
    seen = []
    t = threading.Thread(target=lambda: seen.append(TransferEngine.last_error()))
    t.start()
    t.join()
    assert seen == [None]
    assert e.send_probe(sid) == 0
    assert TransferEngine.last_error() is None


def test_local_topology_and_engine_handles():
    e, sid = initialized_engine()
    topo = json.loads(e.get_local_topology())
    assert "cpu:0" in topo and topo["cpu:0"] == [[], []]
    assert json.loads(e.get_local_topology("")) == topo
    assert json.loads(e.get_local_topology(device_name=None)) == topo
    inner = e.get_engine()
    assert isinstance(inner, InnerTransferEngine) and inner.session_id == sid
    assert e.get_engine_ptr() != 0
    assert e.get_first_buffer_address(sid) == 0  # nothing registered yet
    buf = Buffer(4096)
    assert e.register_memory(buf.addr, 4096) == 0
    assert e.get_first_buffer_address(sid) == buf.addr
    assert e.get_first_buffer_address(segment_name=sid) == buf.addr


def test_bytes_helpers():
    e = TransferEngine()
    buf = ctypes.create_string_buffer(16)
    addr = ctypes.addressof(buf)
    assert e.write_bytes_to_buffer(addr, b"hello", 5) == 0
    assert e.write_bytes_to_buffer(addr + 5, bytearray(b"!!"), 2) == 0
    assert e.read_bytes_from_buffer(addr, 7) == b"hello!!"
    assert e.write_bytes_to_buffer(addr, b"abc", 2) == 0  # copies the first `length` bytes
    assert buf.raw[:3] == b"abl"
    assert e.write_bytes_to_buffer(addr, b"abc", 10) == -1
    assert e.read_bytes_from_buffer(addr, 0) == b""
    with pytest.raises(ValueError):
        e.read_bytes_from_buffer(0, 8)


WRONG_TYPES = [
    ("initialize", (1, "P2PHANDSHAKE", "tcp", "")),
    ("initialize", ("127.0.0.1", None, "tcp", "")),
    ("transfer_sync_write", (123, 1, 1, 1)),
    ("transfer_sync_write", ("peer:1", "addr", 1, 1)),
    ("transfer_sync_write", ("peer:1", 1, 1.5, 1)),
    ("transfer_sync_read", ("peer:1", 1, 1, None)),
    ("transfer_sync", ("peer:1", 1, 1, 1, "Write")),
    ("transfer_sync", ("peer:1", 1, 1, 1, 1.0)),
    ("transfer_sync", ("peer:1", 1, 1, 1, TransferOpcode.Write, "notify")),
    ("batch_transfer_sync_write", ("peer:1", "1,2", [1], [1])),
    ("batch_transfer_sync_write", ("peer:1", [1], ["x"], [1])),
    ("batch_transfer_sync_read", ("peer:1", 1, [1], [1])),
    ("batch_transfer_async_write", ("peer:1", [1], [1], [None])),
    ("batch_transfer_async", ("peer:1", [1], [1], [1], None)),
    ("get_batch_transfer_status", ("12",)),
    ("get_batch_transfer_status", (12,)),
    ("transfer_check_status", ("12",)),
    ("register_memory", ("0x1000", 10)),
    ("register_memory", (4096, 10, 5)),
    ("unregister_memory", (None,)),
    ("batch_register_memory", ([1], 10)),
    ("allocate_managed_buffer", ("1",)),
    ("free_managed_buffer", (1, "1")),
    ("write_bytes_to_buffer", (1, "text", 4)),
    ("write_bytes_to_buffer", (1, [1, 2], 2)),
    ("read_bytes_from_buffer", ("1", 1)),
    ("get_first_buffer_address", (1,)),
    ("send_probe", (1,)),
    ("get_local_topology", (1,)),
]


@pytest.mark.parametrize("method,args", WRONG_TYPES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(WRONG_TYPES)])
def test_wrong_argument_types_raise_type_error(method, args):
    e = TransferEngine()
    with pytest.raises(TypeError):
        getattr(e, method)(*args)


def test_wrong_arity_and_unknown_keywords_raise_type_error():
    e = TransferEngine()
    with pytest.raises(TypeError):
        e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp")
    with pytest.raises(TypeError):
        e.transfer_sync_write(target="x", buffer=1, peer_buffer_address=1, length=1)
    with pytest.raises(TypeError):
        TransferNotify(1, 2)


def test_out_of_range_values_raise_not_crash():
    e = TransferEngine()
    with pytest.raises(OverflowError):
        e.transfer_sync_write("peer:1", -1, 1, 1)
    with pytest.raises(OverflowError):
        e.register_memory(1 << 64, 1)
    with pytest.raises(ValueError):
        e.transfer_sync("peer:1", 1, 1, 1, 2)  # not an opcode
