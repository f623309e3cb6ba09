#!/usr/bin/env python3
"""Session 14 probe (issue 12): why do GPU reads from a freshly started target (as
tests/gpu/gpu_transfer.py starts one per figure) come out lower than from a kept one? Times
every batch of 64 x 4 MiB from the first one on, for host and device memory, writes and
reads, each against a new target process, then again against the same target: a start-up
cost shows as slow early batches.

    python3 issue12-s14-warmup.py [--duration 2.0] [--rounds 1]
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu"))
import gpu_transfer as g  # noqa: E402

BLOCK, BATCH = g.BLOCK, g.BATCH


def timed(e, call, seg, bufs, peers, duration):
    times, start = [], time.perf_counter()
    while time.perf_counter() - start < duration:
        t0 = time.perf_counter()
        assert call(seg, bufs, peers, [BLOCK] * BATCH) == 0, g.TransferEngine.last_error()
        times.append(time.perf_counter() - t0)
    return times


def summary(times):
    size = BLOCK * BATCH
    at, late = 0.0, []
    for t in times:
        at += t
        if at > 0.5:
            late.append(t)
    return {"batches": len(times), "first_ms": [round(t * 1e3, 1) for t in times[:12]],
            "gbps_all": round(len(times) * size / sum(times) / 1e9, 2),
            "gbps_after_0.5s": round(len(late) * size / max(sum(late), 1e-9) / 1e9, 2),
            "median_ms": round(statistics.median(times) * 1e3, 2),
            "max_ms": round(max(times) * 1e3, 1)}


def main(a):
    size = BLOCK * BATCH
    e = g.new_engine()
    for r in range(a.rounds):
        for op in ("write", "read"):
            for mem in ("cpu", "cuda"):
                tgt = g.Target(mem, size, seed=1)
                seg, remote = tgt.info["session"], tgt.info["addr"]
                dev = g.GPU if mem == "cuda" else "cpu"
                local = g.pattern(size, 2, dev)
                g.sync()
                e.register_memory(local.data_ptr(), size, "*")
                bufs = [local.data_ptr() + i * BLOCK for i in range(BATCH)]
                peers = [remote + i * BLOCK for i in range(BATCH)]
                call = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
                for phase in ("fresh", "kept"):
                    s = summary(timed(e, call, seg, bufs, peers, a.duration))
                    print(json.dumps({"round": r, "op": op, "memory": mem, "phase": phase, **s}),
                          flush=True)
                    time.sleep(0.2)
                e.unregister_memory(local.data_ptr())
                tgt.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=1)
    os.environ.setdefault("MC_FORCE_TCP", "1")
    main(ap.parse_args())
