#!/usr/bin/env python3
"""Mooncake Store benchmark: ours against upstream's store in the same run.

For each implementation (a Python with its ``mooncake`` wheel, and the ``mooncake_master``
beside it) it starts a master, a holder client that lends its segment, and a worker
client with no segment of its own, so every put and get crosses the transfer engine
(TCP on loopback). Rounds alternate between implementations. Printed per round and as
medians: put and get GB/s and batch p50/p99 (``batch_put_from`` / ``batch_get_into`` from
registered memory) for each shape, and ``batch_is_exist`` of 1,000 keys per second.

With ``--raw``, each round also runs our engine alone on the same placement (a worker
writing into and reading from a holder's registered buffer of the segment's size, puts on
fresh space each batch and gets on the last batch, one batch per call, through
``TransferEngine.batch_transfer_sync_write``/``_read``): the ceiling the store adds its
metadata calls to. Put is set against the raw write, get against the raw read.

    bench/store/store_bench.py --ours .venv-test/bin/python \\
        --upstream .venv-upstream/bin/python [--rounds 3] [--seconds 3] [--raw]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

SHAPES = [("32KiB x 32", 32 << 10, 32), ("4MiB x 8", 4 << 20, 8)]

# Both client scripts start with this: the figures of one timed loop.
FIGURES = r'''
import ctypes, json, sys, time
def figures(lat, moved, el):
    lat = sorted(lat)
    return {"GBps": moved / el / 1e9, "p50_us": lat[len(lat) // 2] * 1e6,
            "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6, "batches": len(lat)}
'''

WORKER = FIGURES + r'''
from mooncake.store import MooncakeDistributedStore, ReplicateConfig
master, holder_seg, seconds, shapes = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), json.loads(sys.argv[4])
role = sys.argv[5]
s = MooncakeDistributedStore()
rc = s.setup("127.0.0.1", "P2PHANDSHAKE", holder_seg, 64 << 20, "tcp", "", master)
assert rc == 0, rc
if role == "holder":
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.read()
    sys.exit(0)
out = {}
for name, size, n in shapes:
    buf = ctypes.create_string_buffer(size * n)
    ptr = ctypes.addressof(buf)
    assert s.register_buffer(ptr, size * n) == 0
    ptrs = [ptr + i * size for i in range(n)]
    sizes = [size] * n
    res = {}
    for op in ("put", "get"):
        lat, moved, r, t0 = [], 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            # Gets read the last batch put (still in the segment, whatever was evicted).
            keys = [f"{name}-{r if op == 'put' else put_rounds - 1}-{i}" for i in range(n)]
            a = time.perf_counter()
            codes = s.batch_put_from(keys, ptrs, sizes) if op == "put" else s.batch_get_into(keys, ptrs, sizes)
            lat.append(time.perf_counter() - a)
            ok = [c for c in codes if (c == 0 if op == "put" else c == size)]
            moved += len(ok) * size
            r += 1
        el = time.perf_counter() - t0
        if op == "put":
            put_rounds = r
        res[op] = figures(lat, moved, el)
    s.remove_all(True)
    s.unregister_buffer(ptr)
    out[name] = res
keys = [f"exist-{i}" for i in range(1000)]
n, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    s.batch_is_exist(keys)
    n += 1
out["batch_is_exist keys/s"] = n * 1000 / (time.perf_counter() - t0)
print(json.dumps(out), flush=True)
s.close()
'''

RAW = FIGURES + r'''
from mooncake.engine import TransferEngine
seconds, shapes, role, segment = float(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
span = max(size * n for _, size, n in shapes)
if role == "holder":
    span = segment
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = ctypes.create_string_buffer(span)
ptr = ctypes.addressof(buf)
assert e.register_memory(ptr, span) == 0
if role == "holder":
    print(json.dumps({"peer": f"127.0.0.1:{e.get_rpc_port()}", "addr": ptr}), flush=True)
    sys.stdin.read()
    sys.exit(0)
peer, remote = sys.argv[5], int(sys.argv[6])
out = {}
for name, size, n in shapes:
    mine = [ptr + i * size for i in range(n)]
    sizes = [size] * n
    res = {}
    for op, call in (("put", e.batch_transfer_sync_write), ("get", e.batch_transfer_sync_read)):
        lat, moved, r, t0 = [], 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            # The store's placement: each put lands on fresh space of the segment, each get
            # reads the last batch put, so the raw write walks the segment and the raw read
            # stays on one batch (a write to a region that fits in the cache would be faster
            # than any store's put).
            first = r * n if op == "put" else 0
            theirs = [remote + ((first + i) * size) % (segment - segment % size) for i in range(n)]
            a = time.perf_counter()
            assert call(peer, mine, theirs, sizes) == 0
            lat.append(time.perf_counter() - a)
            moved += size * n
            r += 1
        el = time.perf_counter() - t0
        res[op] = figures(lat, moved, el)
    out[name] = res
print(json.dumps(out), flush=True)
'''


def holder_then_worker(python: str, script: str, holder_args: list, worker_args) -> dict:
    """Runs ``script`` as a holder (until the worker ends) and as a worker given the
    holder's first line (``worker_args(ready)``); returns the worker's figures."""
    holder = subprocess.Popen([python, "-c", script, *holder_args], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = json.loads(holder.stdout.readline())
        worker = subprocess.run([python, "-c", script, *worker_args(ready)],
                                capture_output=True, text=True, timeout=600)
        if worker.returncode != 0:
            raise RuntimeError(worker.stderr[-2000:])
        return json.loads(worker.stdout.strip().splitlines()[-1])
    finally:
        holder.kill()
        holder.wait()


def run_raw(python: str, seconds: float, segment: int) -> dict:
    args = [str(seconds), json.dumps(SHAPES)]
    return holder_then_worker(python, RAW, [*args, "holder", str(segment)],
                              lambda where: [*args, "worker", str(segment), where["peer"], str(where["addr"])])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_round(python: str, seconds: float, segment: int) -> dict:
    master_bin = os.path.join(os.path.dirname(python), "mooncake_master")
    rpc, metrics = free_port(), free_port()
    master = subprocess.Popen([master_bin, f"--rpc_port={rpc}", f"--metrics_port={metrics}",
                               "--rpc_address=127.0.0.1", "--metrics_host=127.0.0.1",
                               "--default_kv_lease_ttl=100"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or master.poll() is not None:
                    raise RuntimeError(f"{master_bin} did not start")
                time.sleep(0.1)
        addr, shapes = f"127.0.0.1:{rpc}", json.dumps(SHAPES)
        return holder_then_worker(python, WORKER, [addr, str(segment), str(seconds), shapes, "holder"],
                                  lambda _: [addr, "0", str(seconds), shapes, "worker"])
    finally:
        master.kill()
        master.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ours", required=True, help="python of the venv with our wheel")
    ap.add_argument("--upstream", required=True, help="python of the venv with upstream's wheel")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--segment-mib", type=int, default=1024)
    ap.add_argument("--raw", action="store_true", help="also run our engine alone on the same placement")
    a = ap.parse_args()
    results: dict[str, list[dict]] = {"ours": [], "upstream": [], "raw": []}
    for r in range(a.rounds):
        order = ["ours", "upstream"] if r % 2 == 0 else ["upstream", "ours"]
        if a.raw:
            order.insert(1, "raw")
        for impl in order:
            if impl == "raw":
                res = run_raw(a.ours, a.seconds, a.segment_mib << 20)
            else:
                res = run_round(getattr(a, impl), a.seconds, a.segment_mib << 20)
            results[impl].append(res)
            print(json.dumps({"round": r, "impl": impl, **res}), flush=True)
    print("\nmedians over rounds (ours / upstream = ratio)")
    for name, _, _ in SHAPES:
        for op in ("put", "get"):
            for f in ("GBps", "p50_us", "p99_us"):
                o = statistics.median(x[name][op][f] for x in results["ours"])
                u = statistics.median(x[name][op][f] for x in results["upstream"])
                print(f"{name:11} {op} {f:7} {o:10.2f} / {u:10.2f} = {o / u if u else float('nan'):.2f}x")
    o = statistics.median(x["batch_is_exist keys/s"] for x in results["ours"])
    u = statistics.median(x["batch_is_exist keys/s"] for x in results["upstream"])
    print(f"batch_is_exist keys/s {o:12.0f} / {u:12.0f} = {o / u:.2f}x")
    if results["raw"]:
        print("\nours through the store against our engine alone (medians; raw put = write, get = read)")
        for name, _, _ in SHAPES:
            for op in ("put", "get"):
                o = statistics.median(x[name][op]["GBps"] for x in results["ours"])
                w = statistics.median(x[name][op]["GBps"] for x in results["raw"])
                print(f"{name:11} {op} GBps    {o:10.2f} / {w:10.2f} = {o / w:.2f} of raw")


if __name__ == "__main__":
    sys.exit(main())
