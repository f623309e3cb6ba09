#!/usr/bin/env python3
"""GPU memory over TCP with our wheel, on a real CUDA GPU (run by run_on_device.sh).

Two processes: a target that registers a torch.cuda tensor (or a CPU tensor) and an
initiator that moves data to and from it with `mooncake.engine.TransferEngine`.
Checks bytes GPU to GPU both ways, then measures throughput of device memory against
host memory (same machine, same run) and prints one JSON line per figure and a table.

    python3 gpu_transfer.py main [--size BYTES] [--duration S] [--rounds N]

With --rounds N each operation's host and device phases run N times, in turn, the first of
each round alternating (host first in even rounds): one phase run once each moved 0.87-1.07
of the other between runs on the H200 host, so the verdict is the median of the rounds'
ratios.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from mooncake.engine import TransferEngine

BLOCK = 4 << 20
BATCH = 64


GPU = os.environ.get("GPU_DEVICE_TYPE", "cuda")  # "musa" with torch_musa


def sync():
    getattr(torch, GPU).synchronize()


def pattern(n, seed, device):
    i = torch.arange(n, device=device, dtype=torch.int64)
    return ((i * 131 + seed * 7 + (i >> 8) + (i >> 16)) & 0xFF).to(torch.uint8)


def sha(t):
    return hashlib.sha256(t.cpu().numpy().tobytes()).hexdigest()


def new_engine():
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    assert rc == 0, f"initialize returned {rc}"
    return e


def target(args):
    dev = GPU if args.memory == "cuda" else "cpu"
    t = pattern(args.size, args.seed, dev)
    if dev != "cpu":
        sync()
    e = new_engine()
    rc = e.register_memory(t.data_ptr(), t.numel(), "*")
    assert rc == 0, f"register_memory returned {rc}: {TransferEngine.last_error()}"
    print(json.dumps({"session": f"127.0.0.1:{e.get_rpc_port()}", "addr": t.data_ptr(),
                      "size": t.numel(), "topology": json.loads(e.get_local_topology())}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "sha":
            print(sha(t), flush=True)
        elif cmd and cmd[0] == "quit":
            break


class Target:
    def __init__(self, memory, size, seed):
        self.p = subprocess.Popen([sys.executable, __file__, "target", "--memory", memory,
                                   "--size", str(size), "--seed", str(seed)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = json.loads(self.p.stdout.readline())

    def sha(self):
        self.p.stdin.write("sha\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        self.p.wait(timeout=30)


def cpu_ticks():
    """(busy, total) jiffies of all CPUs so far, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return sum(ticks) - idle, sum(ticks)


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        sys.exit(1)


def verify(e, size):
    """GPU to GPU both ways, bytes verified."""
    tgt = Target("cuda", size, seed=3)
    seg, remote = tgt.info["session"], tgt.info["addr"]
    check(any(k.startswith(GPU + ":") for k in tgt.info["topology"]), f"topology lists the GPU: {list(tgt.info['topology'])}")
    local = torch.zeros(size, dtype=torch.uint8, device=GPU)
    rc = e.register_memory(local.data_ptr(), size, "*")
    check(rc == 0, "register a torch.cuda tensor")
    # Read the target's GPU pattern into our GPU tensor.
    rc = e.transfer_sync_read(seg, local.data_ptr(), remote, size)
    sync()
    check(rc == 0 and torch.equal(local, pattern(size, 3, GPU)), "GPU <- GPU read, bytes verified")
    # Write a new pattern from our GPU into the target's GPU, as a batch of blocks.
    local.copy_(pattern(size, 9, GPU))
    sync()
    n = size // BLOCK
    rc = e.batch_transfer_sync_write(seg, [local.data_ptr() + i * BLOCK for i in range(n)],
                                     [remote + i * BLOCK for i in range(n)], [BLOCK] * n)
    tail = size - n * BLOCK
    if tail:
        rc |= e.transfer_sync_write(seg, local.data_ptr() + n * BLOCK, remote + n * BLOCK, tail)
    check(rc == 0 and tgt.sha() == sha(local), "GPU -> GPU batch write, target bytes verified")
    # And a read back into a cleared, unregistered GPU tensor.
    back = torch.zeros(size, dtype=torch.uint8, device=GPU)
    rc = e.transfer_sync_read(seg, back.data_ptr(), remote, size)
    sync()
    check(rc == 0 and torch.equal(back, local), "GPU <- GPU read into an unregistered tensor")
    e.unregister_memory(local.data_ptr())
    tgt.close()


def throughput(e, memory, op, duration, target_memory=None):
    """GB/s of batches of BATCH x BLOCK between `memory` here and `target_memory` (the
    same kind when None) in the target process."""
    size = BLOCK * BATCH
    tgt = Target(target_memory or memory, size, seed=1)
    seg, remote = tgt.info["session"], tgt.info["addr"]
    dev = GPU if memory == "cuda" else "cpu"
    local = pattern(size, 2, dev)
    e.register_memory(local.data_ptr(), size, "*")
    bufs = [local.data_ptr() + i * BLOCK for i in range(BATCH)]
    peers = [remote + i * BLOCK for i in range(BATCH)]
    call = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
    for _ in range(2):
        assert call(seg, bufs, peers, [BLOCK] * BATCH) == 0
    batches, start, ticks = 0, time.perf_counter(), cpu_ticks()
    while time.perf_counter() - start < duration:
        rc = call(seg, bufs, peers, [BLOCK] * BATCH)
        assert rc == 0, TransferEngine.last_error()
        batches += 1
    secs = time.perf_counter() - start
    busy, total = (b - a for a, b in zip(ticks, cpu_ticks()))
    e.unregister_memory(local.data_ptr())
    tgt.close()
    # How busy the host's CPUs were meanwhile (both processes and everything else):
    # tells a transfer held back by CPU time from one held back by waiting.
    print(json.dumps({"op": op, "local": memory, "target": target_memory or memory,
                      "cpu_busy": round(busy / max(total, 1), 3)}), flush=True)
    return batches * BATCH * BLOCK / secs / 1e9


def main(args):
    check(getattr(torch, GPU).is_available(), f"torch sees a {GPU} GPU ({torch.__version__})")
    e = new_engine()
    verify(e, args.size)
    rows = []
    for op in ("write", "read"):
        ratios, hosts, gpus = [], [], []
        for r in range(args.rounds):
            order = ("cpu", "cuda") if r % 2 == 0 else ("cuda", "cpu")
            got = {memory: throughput(e, memory, op, args.duration) for memory in order}
            hosts.append(got["cpu"])
            gpus.append(got["cuda"])
            ratios.append(got["cuda"] / got["cpu"])
            print(json.dumps({"op": op, "round": r, "first": order[0], "block": BLOCK, "batch": BATCH,
                              "host_gbps": got["cpu"], "device_gbps": got["cuda"],
                              "ratio": ratios[-1]}), flush=True)
        rows.append((op, statistics.median(hosts), statistics.median(gpus), statistics.median(ratios)))
        print(json.dumps({"op": op, "rounds": args.rounds, "median_ratio": rows[-1][3],
                          "ratios": [round(x, 3) for x in ratios]}), flush=True)
    print(f"\n{'op':6} {'host GB/s':>10} {'device GB/s':>12} {'device/host':>12}  (medians of {args.rounds} round(s))")
    for op, host, gpu, ratio in rows:
        print(f"{op:6} {host:10.2f} {gpu:12.2f} {ratio:12.2f}")
    if args.mixed:
        # Device memory on one side only: the staging cost of each side, and whether two
        # processes sharing one GPU is what holds device-to-device back.
        for op in ("write", "read"):
            for here, there in (("cuda", "cpu"), ("cpu", "cuda")):
                gbps = throughput(e, here, op, args.duration, there)
                print(json.dumps({"op": op, "block": BLOCK, "batch": BATCH, "local": here,
                                  "target": there, "gbps": gbps}), flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["main", "target"])
    ap.add_argument("--memory", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--size", type=int, default=(64 << 20) + 4097)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1, help="host and device phases per operation, in turn")
    ap.add_argument("--mixed", action="store_true",
                    help="also device memory here and host memory there, and the reverse")
    a = ap.parse_args()
    os.environ.setdefault("MC_FORCE_TCP", "1")
    # Device to device between two engines of one host goes over GPU IPC whatever the
    # protocol (docs/gpu.md); this measures device memory over TCP.
    os.environ.setdefault("MC_DISABLE_IPC", "1")
    target(a) if a.role == "target" else main(a)
