#!/usr/bin/env python3
"""Same-host GPU to GPU over IPC (`nvlink_intra`) with our wheel, on two CUDA GPUs (or two processes on one).

Two engine processes: a target on cuda:0 and this initiator on cuda:1 (cuda:0 on a one-GPU host), protocol "tcp"
(the engine takes device-to-device requests to a same-host peer over IPC on its own).
Checks bytes both ways for registered and unregistered tensors, tensors from PyTorch's
caching allocator (offsets inside a larger allocation, read from the descriptor), the same
with the target's tensors from expandable segments (`PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True`: the virtual-memory API, shared as POSIX descriptors), a target
killed mid-batch; then measures our IPC path, our TCP path (MC_DISABLE_IPC=1) and a raw
`tensor.copy_` loop between the same GPUs for 64 KiB, 1 MiB and 64 MiB blocks.

    python3 gpu_ipc.py main [--duration S]
"""
import argparse
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import torch

from mooncake.engine import TransferEngine

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_transfer import check, new_engine, pattern, sha  # noqa: E402  (same folder)

MiB = 1 << 20
BENCH = 256 * MiB
SMALL = 300 << 10
BLOCKS = (64 << 10, MiB, 4 * MiB, 64 * MiB)  # caching-allocator tensors: several share one 2 MiB block
# The initiator's GPU: cuda:1 where there are two; on a one-GPU host both processes share
# cuda:0 (IPC between processes on one device: the same handles, no peer link).
INIT = 1 if torch.cuda.device_count() > 1 else 0
INIT_DEV = f"cuda:{INIT}"


def fetch_descriptor(session):
    """Handshake type 1 (Metadata): the peer's segment descriptor."""
    host, port = session.rsplit(":", 1)
    body = b"{}\n"
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack("<Q", 1 + len(body)) + b"\x01" + body)
        s.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            chunk = s.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[9:8 + n].decode())


# --- target ------------------------------------------------------------------------------

def target(args):
    torch.cuda.set_device(args.device)
    dev = f"cuda:{args.device}"
    e = new_engine()
    plain = pattern(args.size, 3, dev)
    big = pattern(64 * MiB, 4, dev)
    view = big[MiB + 123: MiB + 123 + 5 * MiB]  # inside a larger allocation
    smalls = [pattern(SMALL, 10 + k, dev) for k in range(4)]
    bench = pattern(args.bench, 5, dev)
    torch.cuda.synchronize()
    tensors = {"plain": plain, "view": view, "bench": bench}
    for k, t in enumerate(smalls):
        tensors[f"small{k}"] = t
    for name, t in tensors.items():
        rc = e.register_memory(t.data_ptr(), t.numel(), "*")
        assert rc == 0, f"register {name}: {rc}"
    info = {"session": f"127.0.0.1:{e.get_rpc_port()}", "pid": os.getpid(),
            "big": [big.data_ptr(), big.numel()]}
    info.update({k: [t.data_ptr(), t.numel()] for k, t in tensors.items()})
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "sha":
            addr, n = int(cmd[1]), int(cmd[2])
            # Find the tensor holding the range (big covers view).
            for t in [big, plain, bench] + smalls:
                if t.data_ptr() <= addr and addr + n <= t.data_ptr() + t.numel():
                    off = addr - t.data_ptr()
                    torch.cuda.synchronize()
                    print(sha(t[off:off + n]), flush=True)
                    break
            else:
                print("none", flush=True)
        elif cmd and cmd[0] == "unregister":
            t0 = time.perf_counter()
            rc = e.unregister_memory(int(cmd[1]))
            print(f"{rc} {time.perf_counter() - t0:.4f}", flush=True)
        elif cmd and cmd[0] == "quit":
            break


EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


class Target:
    def __init__(self, device, size, bench=BENCH, env=None):
        self.p = subprocess.Popen([sys.executable, __file__, "target", "--device", str(device),
                                   "--size", str(size), "--bench", str(bench)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, **(env or {})})
        self.info = json.loads(self.p.stdout.readline())
        self.session = self.info["session"]

    def addr(self, name):
        return self.info[name][0]

    def sha(self, addr, n):
        self.p.stdin.write(f"sha {addr} {n}\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def unregister(self, addr):
        """(return code, seconds) of the target's unregister_memory."""
        self.p.stdin.write(f"unregister {addr}\n")
        self.p.stdin.flush()
        rc, took = self.p.stdout.readline().split()
        return int(rc), float(took)

    def close(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
        except BrokenPipeError:
            pass
        self.p.wait(timeout=30)


# --- checks ------------------------------------------------------------------------------

def verify(e, size, vmm=False):
    """Every check; `vmm`: the target's tensors come from expandable segments."""
    tgt = Target(0, size, env=EXPANDABLE if vmm else None)
    seg = tgt.session
    desc = fetch_descriptor(seg)
    bufs = {b["addr"]: b for b in desc["buffers"]}
    plain = bufs[tgt.addr("plain")]
    if vmm:
        print("--- the same, target tensors from expandable segments (virtual-memory API)", flush=True)
        check(len(plain.get("ipc_vmm", "")) == 128 and "shm_name" not in plain
              and plain["name"] == "cuda:0" and desc.get("ipc_fd_socket", "").startswith("@"),
              f"descriptor: ipc_vmm key, no shm_name, location {plain['name']}, ipc_fd_socket {desc.get('ipc_fd_socket')}")
    else:
        check(len(plain.get("shm_name", "")) == 128 and plain["name"] == "cuda:0",
              f"descriptor: shm_name (128 hex chars) and location {plain['name']} on device buffers")
    check("host_id" in desc, f"descriptor carries host_id {desc.get('host_id')}")
    view = bufs[tgt.addr("view")]
    check((view.get("shm_offset") or 0) >= MiB + 123,
          f"a view inside a 64 MiB tensor advertises its offset ({view.get('shm_offset')})")
    smalls = [bufs[tgt.addr(f"small{k}")] for k in range(4)]
    print("small tensors: offsets", [s.get("shm_offset") for s in smalls],
          "distinct handles", len({s.get("shm_name") or s.get("ipc_vmm") for s in smalls}), flush=True)
    check(any(s.get("shm_offset", 0) > 0 for s in smalls),
          "caching-allocator tensors lie at offsets inside a shared allocation")

    torch.cuda.set_device(INIT)
    local = torch.zeros(size, dtype=torch.uint8, device=INIT_DEV)
    check(e.register_memory(local.data_ptr(), size, "*") == 0, f"register a {INIT_DEV} tensor")
    t0 = time.perf_counter()
    rc = e.transfer_sync_read(seg, local.data_ptr(), tgt.addr("plain"), size)
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    check(rc == 0 and torch.equal(local, pattern(size, 3, INIT_DEV)),
          f"{INIT_DEV} <- cuda:0 read, bytes verified ({size / took / 1e9:.1f} GB/s with the first open)")
    t0 = time.perf_counter()
    rc = e.transfer_sync_read(seg, local.data_ptr(), tgt.addr("plain"), size)
    took = time.perf_counter() - t0
    check(rc == 0 and size / took > 30e9,
          f"the second read runs at IPC speed, not TCP's ({size / took / 1e9:.1f} GB/s)")
    local.copy_(pattern(size, 9, INIT_DEV))
    torch.cuda.synchronize()
    blk = 4 * MiB
    n = size // blk
    rc = e.batch_transfer_sync_write(seg, [local.data_ptr() + i * blk for i in range(n)],
                                     [tgt.addr("plain") + i * blk for i in range(n)], [blk] * n)
    tail = size - n * blk
    if tail:
        rc |= e.transfer_sync_write(seg, local.data_ptr() + n * blk, tgt.addr("plain") + n * blk, tail)
    check(rc == 0 and tgt.sha(tgt.addr("plain"), size) == sha(local), f"{INIT_DEV} -> cuda:0 batch write, target bytes verified")
    back = torch.zeros(size, dtype=torch.uint8, device=INIT_DEV)  # not registered
    rc = e.transfer_sync_read(seg, back.data_ptr(), tgt.addr("plain"), size)
    torch.cuda.synchronize()
    check(rc == 0 and torch.equal(back, local), "read into an unregistered tensor, bytes verified")
    # The view: write into it, neighbours in the same allocation untouched.
    vaddr, vlen = tgt.info["view"]
    big_addr, big_len = tgt.info["big"]
    before = pattern(big_len, 4, INIT_DEV)
    src = pattern(vlen, 77, INIT_DEV)
    torch.cuda.synchronize()
    rc = e.transfer_sync_write(seg, src.data_ptr(), vaddr, vlen)
    expect = before.clone()
    expect[MiB + 123: MiB + 123 + 5 * MiB] = src
    check(rc == 0 and tgt.sha(big_addr, big_len) == sha(expect),
          "write into a view at offset 1 MiB+123 of a 64 MiB tensor: view written, rest untouched")
    rbuf = torch.zeros(vlen, dtype=torch.uint8, device=INIT_DEV)
    rc = e.transfer_sync_read(seg, rbuf.data_ptr(), vaddr, vlen)
    torch.cuda.synchronize()
    check(rc == 0 and torch.equal(rbuf, src), "read the view back")
    # The small caching-allocator tensors, each read and written.
    ok = True
    for k in range(4):
        a, m = tgt.info[f"small{k}"]
        got = torch.zeros(m, dtype=torch.uint8, device=INIT_DEV)
        ok &= e.transfer_sync_read(seg, got.data_ptr(), a, m) == 0
        torch.cuda.synchronize()
        ok &= torch.equal(got, pattern(m, 10 + k, INIT_DEV))
        w = pattern(m, 50 + k, INIT_DEV)
        torch.cuda.synchronize()
        ok &= e.transfer_sync_write(seg, w.data_ptr(), a, m) == 0
        ok &= tgt.sha(a, m) == sha(w)
    check(ok, "four 300 KiB caching-allocator tensors sharing allocations: read and written, bytes verified")
    e.unregister_memory(local.data_ptr())
    # Unregistered local tensor now (after unregister): still moves (pointer attributes).
    rc = e.transfer_sync_read(seg, local.data_ptr(), tgt.addr("plain"), size)
    check(rc == 0, "after unregistering the local tensor, transfers from it still work (unregistered path)")
    # Revocation: we hold an IPC mapping of `plain`; the target unregisters it. Its
    # unregister returns once we let go; our next write (same cached descriptor) fails and
    # the target's bytes stay as they were when unregister returned.
    pa = tgt.addr("plain")
    rc = e.transfer_sync_write(seg, local.data_ptr(), pa, size)
    check(rc == 0, "write over IPC before the target unregisters")
    rc, took = tgt.unregister(pa)
    before = tgt.sha(pa, size)
    other = pattern(size, 31, INIT_DEV)
    torch.cuda.synchronize()
    rc2 = e.transfer_sync_write(seg, other.data_ptr(), pa, size)
    check(rc == 0 and rc2 != 0 and tgt.sha(pa, size) == before,
          f"target unregister ({took * 1e3:.1f} ms) revokes our IPC mapping: next write fails ({rc2}), bytes unchanged")
    tgt.close()


def killed_mid_batch(e):
    tgt = Target(0, MiB, bench=1024 * MiB)
    seg = tgt.session
    torch.cuda.set_device(INIT)
    src = pattern(1024 * MiB, 8, INIT_DEV)
    torch.cuda.synchronize()
    blk = 4 * MiB
    a = tgt.addr("bench")
    # Warm the mapping, then 16 batches of 1 GiB (about 50 ms of copies) and a kill right
    # after the submits.
    assert e.transfer_sync_write(seg, src.data_ptr(), a, blk) == 0
    bids = [e.batch_transfer_async_write(seg, [src.data_ptr() + i * blk for i in range(256)],
                                         [a + i * blk for i in range(256)], [blk] * 256)
            for _ in range(16)]
    os.kill(tgt.p.pid, signal.SIGKILL)
    t0 = time.time()
    rcs = [e.get_batch_transfer_status([b]) for b in bids]
    print(f"16 x 1 GiB batches submitted before the kill: statuses {rcs} after {time.time() - t0:.3f} s", flush=True)
    tgt.p.wait()
    t0 = time.time()
    rc = e.transfer_sync_write(seg, src.data_ptr(), a, blk)
    took = time.time() - t0
    check(rc != 0 and took < 60, f"a transfer to the killed target fails ({rc}, {took:.2f} s) instead of writing into its orphaned memory")
    # The engine still serves another target.
    t2 = Target(0, 4 * MiB, bench=MiB)
    got = torch.zeros(4 * MiB, dtype=torch.uint8, device=INIT_DEV)
    rc = e.transfer_sync_read(t2.session, got.data_ptr(), t2.addr("plain"), 4 * MiB)
    torch.cuda.synchronize()
    check(rc == 0 and torch.equal(got, pattern(4 * MiB, 3, INIT_DEV)), "the engine keeps working with a new target")
    t2.close()


# --- benchmark ---------------------------------------------------------------------------

def measure(fn, nbytes, duration):
    fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        fn()
        n += 1
    return n * nbytes / (time.perf_counter() - start) / 1e9


def bench_engine(e, tgt, block, duration, scatter=False):
    torch.cuda.set_device(INIT)
    src = pattern(BENCH, 6, INIT_DEV)
    torch.cuda.synchronize()
    assert e.register_memory(src.data_ptr(), BENCH, "*") == 0
    n = BENCH // block
    locs = [src.data_ptr() + i * block for i in range(n)]
    order = list(range(n))
    if scatter:  # remote blocks in a fixed shuffled order: no two requests adjacent
        import random
        random.Random(7).shuffle(order)
    rems = [tgt.addr("bench") + order[i] * block for i in range(n)]
    out = {}
    for op, call in (("write", e.batch_transfer_sync_write), ("read", e.batch_transfer_sync_read)):
        def go():
            rc = call(tgt.session, locs, rems, [block] * n)
            assert rc == 0, TransferEngine.last_error()
        out[op] = measure(go, BENCH, duration)
    # Where a batch's time goes: the submit (Python to the engine's copy queues) against
    # the whole batch, median of 5 writes.
    subs, alls = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        bid = e.batch_transfer_async_write(tgt.session, locs, rems, [block] * n)
        t1 = time.perf_counter()
        assert e.get_batch_transfer_status([bid]) == 0
        t2 = time.perf_counter()
        subs.append(t1 - t0)
        alls.append(t2 - t0)
    out["submit_ms"] = round(sorted(subs)[2] * 1e3, 3)
    out["batch_ms"] = round(sorted(alls)[2] * 1e3, 3)
    # The target holds our blocks where the requests put them, and the last read brought
    # them back in order.
    torch.cuda.synchronize()
    expect = torch.empty_like(src)
    for i in range(n):
        expect[order[i] * block:(order[i] + 1) * block] = src[i * block:(i + 1) * block]
    ok = tgt.sha(tgt.addr("bench"), BENCH) == sha(expect) and torch.equal(src, pattern(BENCH, 6, INIT_DEV))
    e.unregister_memory(src.data_ptr())
    return out, ok


def bench_raw(block, duration):
    a = pattern(BENCH, 6, INIT_DEV)
    b = torch.zeros(BENCH, dtype=torch.uint8, device="cuda:0")
    n = BENCH // block
    out = {}
    for op, (src, dst) in (("write", (a, b)), ("read", (b, a))):
        sv = [src[i * block:(i + 1) * block] for i in range(n)]
        dv = [dst[i * block:(i + 1) * block] for i in range(n)]

        def go():
            for s, d in zip(sv, dv):
                d.copy_(s, non_blocking=True)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(INIT)
        out[op] = measure(go, BENCH, duration)
    return out


def cudart():
    """The CUDA runtime PyTorch loaded (or one on the library path)."""
    import ctypes
    import glob
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    root = os.path.dirname(os.path.dirname(torch.__file__))
    names += glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*"))
    names += glob.glob(os.path.join(root, "nvidia", "cuda_runtime", "lib", "libcudart.so*"))
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    raise RuntimeError("no libcudart found")


def bench_native(block, duration, streams=1, peer_call=True):
    """The native reference: cudaMemcpyPeerAsync (or cudaMemcpyAsync, UVA) of each block,
    queued round-robin on `streams` streams of the initiator's device with no sync per copy,
    one sync per stream per pass (ctypes: about 1 us of Python per call, below the link
    time from 1 MiB up)."""
    import ctypes
    rt = cudart()
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    peer = rt.cudaMemcpyPeerAsync
    peer.argtypes = [vp, ctypes.c_int, vp, ctypes.c_int, sz, vp]
    plain = rt.cudaMemcpyAsync
    plain.argtypes = [vp, vp, sz, ctypes.c_int, vp]
    sync = rt.cudaStreamSynchronize
    sync.argtypes = [vp]
    torch.cuda.set_device(INIT)
    a = pattern(BENCH, 6, INIT_DEV)
    b = torch.zeros(BENCH, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(INIT)
    ss = [torch.cuda.Stream(device=1).cuda_stream for _ in range(streams)]
    n = BENCH // block
    out = {}
    for op, (src, sdev, dst, ddev) in (("write", (a, 1, b, 0)), ("read", (b, 0, a, 1))):
        jobs = [(dst.data_ptr() + i * block, src.data_ptr() + i * block, ss[i % streams]) for i in range(n)]
        bad = []

        def go():
            if peer_call:
                for d, s_, st in jobs:
                    if peer(d, ddev, s_, sdev, block, st):
                        bad.append(1)
            else:
                for d, s_, st in jobs:
                    if plain(d, s_, block, 4, st):  # cudaMemcpyDefault
                        bad.append(1)
            for st in ss:
                if sync(st):
                    bad.append(1)
        out[op] = measure(go, BENCH, duration)
        if bad:
            raise RuntimeError(f"native copies failed ({len(bad)} calls)")
    torch.cuda.synchronize(INIT)
    ok = torch.equal(a, b.to(INIT_DEV))
    return out, ok


def bench(args):
    """One path (ipc or tcp, chosen by the environment this process started with)."""
    e = new_engine()
    tgt = Target(0, MiB)
    rows = []
    for block in BLOCKS:
        r, ok = bench_engine(e, tgt, block, args.duration, args.scatter)
        rows.append({"path": args.path, "block": block, **r, "bytes_ok": ok})
        print(json.dumps(rows[-1]), flush=True)
    tgt.close()


def main(args):
    check(torch.cuda.device_count() >= 1, f"a GPU ({torch.cuda.device_count()}, torch {torch.__version__})")
    if INIT:
        print("peer access 1->0:", torch.cuda.can_device_access_peer(1, 0), flush=True)
    else:
        print("one GPU: target and initiator both on cuda:0", flush=True)
    e = new_engine()
    verify(e, args.size)
    verify(e, args.size, vmm=True)
    killed_mid_batch(e)
    del e
    results = []
    # ipc-nobatch-scatter: one cudaMemcpyAsync per scattered block (MC_IPC_BATCH_COPY=0),
    # against ipc-scatter's one cudaMemcpyBatchAsync per copy thread's group.
    paths = [("ipc", {}), ("ipc-scatter", {}), ("ipc-nobatch-scatter", {"MC_IPC_BATCH_COPY": "0"}),
             ("tcp", {"MC_DISABLE_IPC": "1"}),
             ("ipc-exp", EXPANDABLE), ("ipc-exp-scatter", EXPANDABLE)]
    if args.threads:
        paths += [(f"ipc-{t}t-scatter", {"MC_IPC_COPY_THREADS": str(t)}) for t in (1, 2, 8)]
    if args.sweep:
        paths += [(f"ipc-{mb}M-{t}t", {"MC_IPC_SLICE_SIZE": str(mb * MiB), "MC_IPC_COPY_THREADS": str(t)})
                  for mb, t in ((64, 4), (64, 1), (16, 2), (1024, 4))]
    for path, env in paths:
        extra = ["--scatter"] if path.endswith("-scatter") else []
        p = subprocess.run([sys.executable, __file__, "bench", "--path", path, "--duration", str(args.duration)] + extra,
                           env={**os.environ, **env}, capture_output=True, text=True, timeout=400)
        sys.stderr.write(p.stderr[-3000:])
        for line in p.stdout.splitlines():
            if line.startswith("{"):
                results.append(json.loads(line))
                print(line, flush=True)
        check(p.returncode == 0, f"{path} benchmark ran")
    for block in BLOCKS + (BENCH,):
        r = bench_raw(block, args.duration)
        results.append({"path": "raw", "block": block, **r, "bytes_ok": True})
        print(json.dumps(results[-1]), flush=True)
    for block in BLOCKS:
        for name, streams, peer_call in (("native-peer-1s", 1, True), ("native-async-4s", 4, False)):
            r, ok = bench_native(block, args.duration, streams, peer_call)
            results.append({"path": name, "block": block, **r, "bytes_ok": ok})
            print(json.dumps(results[-1]), flush=True)
    bulk = {r_["path"]: r_ for r_ in results if r_["block"] == BENCH}["raw"]
    print(f"\nraw bulk (one {BENCH >> 20} MiB copy_): write {bulk['write']:.1f} GB/s, read {bulk['read']:.1f} GB/s")
    names = [p_ for p_, _ in paths] + ["native-peer-1s", "native-async-4s"]
    print(f"{'block':>8} {'op':6} {'raw':>7} " + " ".join(f"{n:>15}" for n in names)
          + f" {'ipc/raw':>8} {'ipc/bulk':>9} {'ipc/native':>10} {'scat/native':>11} {'nobatch/nat':>11}")
    for block in BLOCKS:
        for op in ("write", "read"):
            v = {r["path"]: r[op] for r in results if r["block"] == block}
            nat = max(v.get("native-peer-1s", 0), v.get("native-async-4s", 0)) or float("nan")
            print(f"{block >> 10:>7}K {op:6} {v['raw']:7.1f} " + " ".join(f"{v.get(n, 0):15.1f}" for n in names)
                  + f" {v['ipc'] / v['raw']:8.2f} {v['ipc'] / bulk[op]:9.2f} {v['ipc'] / nat:10.2f}"
                  + f" {v.get('ipc-scatter', 0) / nat:11.2f} {v.get('ipc-nobatch-scatter', 0) / nat:11.2f}")
    check(all(r["bytes_ok"] for r in results), "benchmark bytes verified on the target after each path")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["main", "target", "bench"])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--size", type=int, default=(64 << 20) + 4097)
    ap.add_argument("--bench", type=int, default=BENCH)
    ap.add_argument("--path", default="ipc")
    ap.add_argument("--duration", type=float, default=1.5)
    ap.add_argument("--sweep", action="store_true", help="also IPC with other slice sizes / copy threads")
    ap.add_argument("--scatter", action="store_true", help="bench: remote blocks in shuffled order")
    ap.add_argument("--threads", action="store_true", help="also shuffled blocks with 1, 2 and 8 copy threads")
    a = ap.parse_args()
    {"main": main, "target": target, "bench": bench}[a.role](a)
