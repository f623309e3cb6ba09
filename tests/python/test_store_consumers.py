"""Mooncake Store as its three consumers call it: vLLM's ``MooncakeStoreConnector``, SGLang's
HiCache ``mooncake`` backend and LMCache's ``mooncakestore`` connector
(shared/reference/store.md, consumers.md §1.5, §2, §4). Each test runs a master and two
client processes of one implementation (``impl``: upstream's wheel or ours, see
store_helpers): a prefill-like writer and a decode-like reader, each with its own memory;
bytes are checked by the reader against a key-seeded pattern.

The values asserted are upstream 0.3.13.post1's, observed with its master and client on
loopback over TCP; "ours" must return the same.

    UPSTREAM_PYTHON=.venv-upstream/bin/python pytest test_store_consumers.py -k upstream
    PY_VENV=.venv-test pytest test_store_consumers.py -k ours
"""

from __future__ import annotations

import re
import time

import pytest

pytest.register_assert_rewrite("store_helpers")
from store_helpers import (  # noqa: E402  (after register_assert_rewrite)
    EMPTY, HOST, KIB, LEASE_S, MIB, OBJECT_NOT_FOUND, OK, bytes_of, cfg, close_all, described, ptr, unique,
)

# The fixtures impl, master, own_master and clients.
pytest_plugins = ("store_helpers",)

HOSTNAME_RE = re.compile(r"^127\.0\.0\.1:\d+$")


def metadata_of(master, kind: str) -> str:
    return "P2PHANDSHAKE" if kind == "p2p" else master.metadata_url


# --- vLLM: MooncakeStoreConnector ----------------------------------------------------------

LAYERS, BLOCKS, BLOCK = 2, 8, 64 * KIB
REGION = LAYERS * BLOCKS * BLOCK  # one K (or V) region: [layer][block]


def kv_addrs(block: int) -> list:
    """The buffers of one chunk in vLLM's order (per layer: K, then V); K and V are separate
    registered regions, as with MUSA's K/V-first layout."""
    out = []
    for layer in range(LAYERS):
        off = (layer * BLOCKS + block) * BLOCK
        out += [ptr("K", off), ptr("V", off)]
    return out


def kv_parts(block: int):
    """(region, offset, part name) of each buffer of ``kv_addrs(block)``."""
    for layer in range(LAYERS):
        off = (layer * BLOCKS + block) * BLOCK
        yield "K", off, f"K{layer}"
        yield "V", off, f"V{layer}"


def vllm_worker(clients, master, role: str, metadata: str):
    """What the connector's worker does at start: the positional setup, then one
    register_buffer per KV region."""
    c = clients(role)
    # setup(local_hostname, metadata_server, global_segment_size, local_buffer_size,
    #       protocol, device_name, master_server_address)
    assert c.call("setup", HOST, metadata, 32 * MIB, 16 * MIB, "tcp", "", master.address) == OK
    assert HOSTNAME_RE.match(c.hostname()), c.hostname()
    for region in ("K", "V"):
        c.alloc(region, REGION)
        c.memset(region, 0, REGION, 0xEE)
        assert c.call("register_buffer", ptr(region), REGION) == OK
    return c


@pytest.mark.parametrize("metadata", ["p2p", "http"])
def test_vllm_store_connector(impl, master, clients, metadata):
    md = metadata_of(master, metadata)
    prefill = vllm_worker(clients, master, "prefill", md)
    decode = vllm_worker(clients, master, "decode", md)
    prefix = unique("vllm")
    n = 6
    keys = [f"{prefix}@tp0@{i:016x}" for i in range(n)]
    chunk = 2 * LAYERS * BLOCK

    # Prefill: the KV of chunk i is in block i of every layer's K and V.
    for i, key in enumerate(keys):
        for region, off, part in kv_parts(i):
            prefill.fill(region, off, BLOCK, f"{key}/{part}")
    assert prefill.call("batch_is_exist", keys) == [0] * n
    sizes = [[BLOCK] * (2 * LAYERS)] * n
    assert prefill.call("batch_put_from_multi_buffers", keys, [kv_addrs(i) for i in range(n)], sizes,
                        cfg()) == [OK] * n
    # The connector looks first and stores only what is missing: all present now.
    assert prefill.call("batch_is_exist", keys) == [1] * n
    assert prefill.call("get_size", keys[0]) == chunk

    # Decode: looks, then scatters each chunk into its own blocks (reversed placement), one
    # key missing in the middle of the batch.
    assert decode.call("batch_is_exist", keys) == [1] * n
    missing = f"{prefix}@tp0@missing"
    want = keys[:3] + [missing] + keys[3:5]
    blocks = [7 - j for j in range(len(want))]
    got = decode.call("batch_get_into_multi_buffers", want, [kv_addrs(b) for b in blocks],
                      [[BLOCK] * (2 * LAYERS)] * len(want))
    assert got == [chunk] * 3 + [OBJECT_NOT_FOUND] + [chunk] * 2
    for key, block in zip(want, blocks):
        for region, off, part in kv_parts(block):
            if key == missing:  # untouched
                assert decode.region_bytes(region, off, BLOCK)["all_byte"] == 0xEE, (key, part)
            else:
                assert decode.check(region, off, BLOCK, f"{key}/{part}"), (key, part)
    desc = decode.call("batch_get_replica_desc", keys)
    assert sorted(desc) == sorted(keys) and all(v == {"replicas": 1} for v in desc.values()), desc

    close_all(decode, prefill)


# --- SGLang: HiCache storage backend "mooncake" ---------------------------------------------

PAGE = 32 * KIB


def sglang_warmup(c, prefix: str) -> None:
    """MooncakeStore.warmup(): put, is_exist, get of one key."""
    key = f"{prefix}-warmup"
    value = bytes_of(key, 4 * KIB)
    assert c.call("put", key, value) == OK
    assert c.call("is_exist", key) == 1
    assert c.call("get", key) == described(key, 4 * KIB)


def test_sglang_hicache(impl, master, clients):
    prefix = unique("sgl")
    # SGLang initialises its one TransferEngine per process with P2PHANDSHAKE (consumers.md
    # §2.2) and hands it to the store. (With an HTTP metadata store, upstream's engines are
    # named by the bare hostname: a second engine "127.0.0.1" on this host fails, -1.)
    md = "P2PHANDSHAKE"
    # Writer: shares the TransferEngine it initialised (engine=te.get_engine()), keyword form.
    # Upstream 0.3.13.post1's keywords are local_hostname, metadata_server,
    # global_segment_size, local_buffer_size, protocol, rdma_devices (not device_name),
    # master_server_addr, engine; the Python TransferEngine itself is refused (TypeError-like
    # RuntimeError "Unable to cast"), get_engine()'s inner object is accepted.
    writer = clients("prefill")
    eng = writer.do("engine", args=[HOST, md, "tcp", ""])
    assert eng["rc"] == OK and eng["rpc_port"] > 0
    assert writer.call("setup", local_hostname=HOST, metadata_server=md, global_segment_size=32 * MIB,
                       local_buffer_size=16 * MIB, protocol="tcp", rdma_devices="",
                       master_server_addr=master.address, engine={"engine": True}) == OK
    assert HOSTNAME_RE.match(writer.hostname()), writer.hostname()
    # Reader: the positional form with the engine as the eighth argument.
    reader = clients("decode")
    eng = reader.do("engine", args=[HOST, md, "tcp", ""])
    assert eng["rc"] == OK
    assert reader.call("setup", HOST, md, 32 * MIB, 16 * MIB, "tcp", "", master.address, {"engine": True}) == OK
    sglang_warmup(writer, f"{prefix}-w")
    sglang_warmup(reader, f"{prefix}-r")

    # The host KV pool, registered once; MHA pages are stored as a K and a V object. One
    # spare slot at the end.
    pages = 6
    slots = 2 * pages
    pool = (slots + 1) * PAGE
    for c in (writer, reader):
        c.alloc("pool", pool)
        c.memset("pool", 0, pool, 0xEE)
        assert c.call("register_buffer", ptr("pool"), pool) == OK
    keys = [f"{prefix}-{h:08x}_0_{kv}" for h in range(pages) for kv in ("k", "v")]
    for j, key in enumerate(keys):
        writer.fill("pool", j * PAGE, PAGE, key)
    ptrs = [ptr("pool", j * PAGE) for j in range(slots)]
    assert writer.call("batch_is_exist", keys) == [0] * slots
    assert writer.call("batch_put_from", keys, ptrs, [PAGE] * slots) == [OK] * slots
    assert reader.call("batch_is_exist", keys) == [1] * slots
    # The reader loads them into other slots of its pool (reversed), and a missing key into
    # the spare slot, which stays as it was.
    want = list(reversed(keys)) + [f"{prefix}-missing_0_k"]
    got = reader.call("batch_get_into", want, ptrs + [ptr("pool", slots * PAGE)], [PAGE] * (slots + 1))
    assert got == [PAGE] * slots + [OBJECT_NOT_FOUND]
    for j, key in enumerate(want[:-1]):
        assert reader.check("pool", j * PAGE, PAGE, key), key
    assert reader.region_bytes("pool", slots * PAGE, PAGE)["all_byte"] == 0xEE

    # clear(): remove_all() removes everything that is not leased; what was just read is
    # leased (LEASE_S on this master) and goes once the lease is over.
    first = reader.call("remove_all")
    assert isinstance(first, int) and first >= 0
    time.sleep(LEASE_S + 0.3)
    assert reader.call("remove_all") >= 0
    assert writer.call("batch_is_exist", keys) == [0] * slots
    assert reader.call("get", keys[0]) == EMPTY
    assert reader.call("get_into", keys[0], ptr("pool"), PAGE) == OBJECT_NOT_FOUND

    close_all(reader, writer)


# --- LMCache: mooncakestore connector ------------------------------------------------------

def test_lmcache_mooncakestore(impl, master, clients):
    prefix = unique("lmc")
    chunk = 256 * KIB
    writer, reader = clients("prefill"), clients("decode")
    for c in (writer, reader):
        assert c.setup(master, segment=16 * MIB) == OK
        c.alloc("buf", 2 * chunk)
        assert c.call("register_buffer", ptr("buf"), 2 * chunk) == OK
    keys = [f"vllm@1@0@{prefix}{i:04x}@bfloat16" for i in range(3)]
    # put: ReplicateConfig with the writer's own segment preferred (LMCache's local alloc).
    for key in keys:
        writer.fill("buf", 0, chunk, key)
        assert writer.call("put_from", key, ptr("buf"), chunk, cfg(replica_num=1, preferred_segment="$hostname")) == OK
    assert writer.call("get_replica_desc", keys[0]) == {"replicas": 1}

    # get: exact-size buffer, then a larger one: get_into returns the bytes read.
    assert reader.call("is_exist", keys[0]) == 1
    assert reader.call("get_into", keys[0], ptr("buf"), chunk) == chunk
    assert reader.check("buf", 0, chunk, keys[0])
    assert reader.call("get_into", keys[1], ptr("buf"), 2 * chunk) == chunk
    assert reader.check("buf", 0, chunk, keys[1])
    assert reader.call("batch_get_into", [keys[2], keys[0]], [ptr("buf"), ptr("buf", chunk)], [chunk, chunk]) == [chunk] * 2
    assert reader.check("buf", 0, chunk, keys[2]) and reader.check("buf", chunk, chunk, keys[0])
    assert reader.call("get_into", f"{prefix}-missing", ptr("buf"), chunk) == OBJECT_NOT_FOUND

    # close(): unregister, then close. The objects were in the writer's segment (preferred):
    # when the writer leaves, they leave with it.
    assert reader.call("unregister_buffer", ptr("buf")) == OK
    reader_host = reader.hostname()
    assert writer.call("unregister_buffer", ptr("buf")) == OK
    writer.close()
    assert reader.call("batch_is_exist", keys) == [0] * len(keys)
    assert HOSTNAME_RE.match(reader_host)
    reader.close()


# --- a client that lends no memory -----------------------------------------------------------

def test_client_without_segment_puts_and_gets(impl, master, clients):
    """``global_segment_size=0``: the client puts into, and gets from, another client's
    segment (every byte crosses the transfer engine)."""
    holder, worker = clients("holder"), clients("worker")
    assert holder.call("setup", HOST, "P2PHANDSHAKE", 16 * MIB, 4 * MIB, "tcp", "", master.address) == OK
    assert worker.call("setup", HOST, "P2PHANDSHAKE", 0, 4 * MIB, "tcp", "", master.address) == OK
    worker.alloc("W", 64 * KIB)
    assert worker.call("register_buffer", ptr("W"), 64 * KIB) == OK
    key = unique("noseg")
    worker.fill("W", 0, 64 * KIB, key)
    assert worker.call("put_from", key, ptr("W"), 64 * KIB) == OK
    worker.fill("W", 0, 64 * KIB, "other")
    assert worker.call("get_into", key, ptr("W"), 64 * KIB) == 64 * KIB
    assert worker.check("W", 0, 64 * KIB, key)
    close_all(holder, worker)
