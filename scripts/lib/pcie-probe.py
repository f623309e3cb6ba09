#!/usr/bin/env python3
"""How fast the GPU host's link moves bytes between GPU memory and pinned host memory,
with no engine: the ceiling for GPU memory over TCP, which stages every byte through
pinned chunks (one copy out of the GPU at the sender, one into it at the receiver).

    python3 scripts/lib/pcie-probe.py [--duration S]      # or: scripts/bench-device.sh link

Prints one JSON line per case:
  - one process, one direction (device to host, host to device), 2 MiB chunks on 1, 4 and
    8 streams (the engine copies 2 MiB chunks, one stream per chunk, one stager per lane),
    and 64 MiB copies on one stream;
  - two processes at once, one copying out of the GPU and one into it: the shape of a
    GPU-to-GPU write or read over TCP between two processes on one GPU;
  - one process, both directions at once.
"""
import argparse
import json
import subprocess
import sys
import time

import torch

MIB = 1 << 20


def copy_loop(direction, chunk, streams, duration, start_at=None):
    """GB/s of `chunk`-byte copies in `direction` ("d2h", "h2d" or "both") spread over
    `streams` streams for `duration` seconds."""
    slots = 32
    dev = torch.empty(slots * chunk, dtype=torch.uint8, device="cuda")
    host = [torch.empty(chunk, dtype=torch.uint8, pin_memory=True) for _ in range(streams)]
    ss = [torch.cuda.Stream() for _ in range(streams)]
    dirs = ["d2h", "h2d"] if direction == "both" else [direction]

    def issue(i, k):
        off = (i % slots) * chunk
        d = dirs[k % len(dirs)]
        with torch.cuda.stream(ss[k]):
            if d == "d2h":
                host[k].copy_(dev[off:off + chunk], non_blocking=True)
            else:
                dev[off:off + chunk].copy_(host[k], non_blocking=True)

    for k in range(streams):
        issue(k, k)
    torch.cuda.synchronize()
    if start_at is not None:
        while time.time() < start_at:
            time.sleep(0.001)
    moved, i, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < duration:
        for k in range(streams):
            issue(i, k)
            i += 1
        moved += chunk * streams
        if i % (8 * streams) == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    secs = time.perf_counter() - start
    return moved / secs / 1e9


def child(args):
    gbps = copy_loop(args.direction, args.chunk, args.streams, args.duration, args.start_at)
    print(json.dumps({"case": "two-process", "direction": args.direction, "chunk": args.chunk,
                      "streams": args.streams, "gbps": round(gbps, 2)}), flush=True)


def main(args):
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    for direction in ("d2h", "h2d", "both"):
        for chunk, streams in ((2 * MIB, 1), (2 * MIB, 4), (2 * MIB, 8), (64 * MIB, 1)):
            if direction == "both" and streams == 1:
                continue
            gbps = copy_loop(direction, chunk, streams, args.duration)
            print(json.dumps({"case": "one-process", "direction": direction, "chunk": chunk,
                              "streams": streams, "gbps": round(gbps, 2)}), flush=True)
    for streams in (4, 8):
        start_at = time.time() + 10
        procs = [subprocess.Popen([sys.executable, __file__, "child", "--direction", d,
                                   "--chunk", str(2 * MIB), "--streams", str(streams),
                                   "--duration", str(args.duration), "--start-at", str(start_at)])
                 for d in ("d2h", "h2d")]
        for p in procs:
            p.wait(timeout=60)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="main", choices=["main", "child"])
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--direction", default="d2h")
    ap.add_argument("--chunk", type=int, default=2 * MIB)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--start-at", type=float, default=None)
    a = ap.parse_args()
    (child if a.mode == "child" else main)(a)
