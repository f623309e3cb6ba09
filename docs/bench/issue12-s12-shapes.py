#!/usr/bin/env python3
"""Session 12 probe (issue 12): GPU memory against host memory over TCP for one staging
shape (MC_TCP_STAGING_CHUNK_KB / MC_TCP_STAGING_CHUNKS / MC_TCP_STAGING_RAMP, read once per
process, so both processes get the caller's environment). One initiator, one target per
memory kind, kept for the whole run; the figures alternate host/device so that drift hits
both. Bytes verified after the device runs.

    python3 issue12-s12-shapes.py --label NAME [--duration 1.0] [--rounds 2] [--rest 1.1]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu"))
import gpu_transfer as g  # noqa: E402
import torch  # noqa: E402

BLOCK, BATCH = g.BLOCK, g.BATCH


def run(e, call, seg, bufs, peers, duration):
    for _ in range(2):
        assert call(seg, bufs, peers, [BLOCK] * BATCH) == 0
    n, start, ticks = 0, time.perf_counter(), g.cpu_ticks()
    while time.perf_counter() - start < duration:
        assert call(seg, bufs, peers, [BLOCK] * BATCH) == 0, g.TransferEngine.last_error()
        n += 1
    secs = time.perf_counter() - start
    busy, total = (b - a for a, b in zip(ticks, g.cpu_ticks()))
    return n * BATCH * BLOCK / secs / 1e9, round(busy / max(total, 1), 3)


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
    cases = [("write", "cpu", "cpu"), ("write", "cuda", "cuda"), ("read", "cpu", "cpu"),
             ("read", "cuda", "cuda"), ("write", "cuda", "cpu"), ("read", "cuda", "cpu")]
    for r in range(a.rounds):
        for op, here, there in cases:
            t = side[there][0]
            local = side[here][1]
            seg, remote = t.info["session"], t.info["addr"]
            call = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
            bufs = [local.data_ptr() + i * BLOCK for i in range(BATCH)]
            peers = [remote + i * BLOCK for i in range(BATCH)]
            # The link used last rests after a while without work (tcp/budget.rs: 1 s
            # before session 12's change, 50 ms after): until then it halves this one's lanes.
            time.sleep(a.rest)
            gbps, busy = run(e, call, seg, bufs, peers, a.duration)
            print(json.dumps({"label": a.label, "round": r, "op": op, "local": here,
                              "target": there, "gbps": round(gbps, 2), "cpu_busy": busy}),
                  flush=True)
    # Bytes: the device target holds what the device writes left there; read it back.
    t, local = side["cuda"]
    g.check(t.sha() == g.sha(local), f"{a.label}: GPU -> GPU writes, target bytes verified")
    back = torch.zeros(size, dtype=torch.uint8, device=g.GPU)
    assert e.register_memory(back.data_ptr(), size, "*") == 0
    seg, remote = t.info["session"], t.info["addr"]
    rc = e.batch_transfer_sync_read(seg, [back.data_ptr() + i * BLOCK for i in range(BATCH)],
                                    [remote + i * BLOCK for i in range(BATCH)], [BLOCK] * BATCH)
    g.sync()
    g.check(rc == 0 and torch.equal(back, local), f"{a.label}: GPU <- GPU reads, bytes verified")
    for t, _ in side.values():
        t.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True)
    ap.add_argument("--duration", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rest", type=float, default=1.1, help="seconds between cases")
    os.environ.setdefault("MC_FORCE_TCP", "1")
    main(ap.parse_args())
