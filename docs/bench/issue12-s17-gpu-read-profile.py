#!/usr/bin/env python3
"""Session 17 probe (issue 12): where reads into GPU memory spend the time that host reads
do not. One initiator, one target per memory kind (kept), 4 MiB x 64 batches; each phase
runs --duration seconds, and a system-wide `perf record` (cpu-clock, 999 Hz) covers its
middle 3 s when --perf names perf's command. Prints one JSON line per phase; the profiles
are left in --out as p-<phase>.data.

    python3 issue12-s17-gpu-read-profile.py [--duration 5] [--perf "perf"] [--out DIR]
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu"))
import gpu_transfer as g  # noqa: E402

BLOCK, BATCH = g.BLOCK, g.BATCH


def main(a):
    size = BLOCK * BATCH
    e = g.new_engine()
    side = {}
    for mem in ("cpu", "cuda"):
        t = g.Target(mem, size, seed=1)
        dev = g.GPU if mem == "cuda" else "cpu"
        local = g.pattern(size, 2, dev)
        g.sync()
        assert e.register_memory(local.data_ptr(), size, "*") == 0
        side[mem] = (t, local)
    phases = [("host", "cpu", "cpu"), ("into-gpu", "cuda", "cpu"), ("gpu-gpu", "cuda", "cuda"),
              ("host2", "cpu", "cpu")]
    for name, here, there in phases:
        t = side[there][0]
        local = side[here][1]
        seg, remote = t.info["session"], t.info["addr"]
        bufs = [local.data_ptr() + i * BLOCK for i in range(BATCH)]
        peers = [remote + i * BLOCK for i in range(BATCH)]
        time.sleep(0.3)
        for _ in range(2):
            assert e.batch_transfer_sync_read(seg, bufs, peers, [BLOCK] * BATCH) == 0
        perf, n, start, ticks = None, 0, time.perf_counter(), g.cpu_ticks()
        while time.perf_counter() - start < a.duration:
            if a.perf and perf is None and time.perf_counter() - start > 1.0:
                cmd = shlex.split(a.perf) + ["record", "-a", "-e", "cpu-clock", "-F", "999",
                                             "-o", os.path.join(a.out, f"p-{name}.data"),
                                             "--", "sleep", "3"]
                perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rc = e.batch_transfer_sync_read(seg, bufs, peers, [BLOCK] * BATCH)
            assert rc == 0, g.TransferEngine.last_error()
            n += 1
        secs = time.perf_counter() - start
        busy, total = (b - a for a, b in zip(ticks, g.cpu_ticks()))
        if perf:
            perf.wait()
        print(json.dumps({"phase": name, "local": here, "target": there,
                          "gbps": round(n * BATCH * BLOCK / secs / 1e9, 2),
                          "cpu_busy": round(busy / max(total, 1), 3)}), flush=True)
    for t, _ in side.values():
        t.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--perf", default="")
    ap.add_argument("--out", default="/tmp")
    main(ap.parse_args())
