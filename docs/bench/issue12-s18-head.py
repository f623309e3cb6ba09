#!/usr/bin/env python3
"""Session 18 probe (issue 12): does a send out of device memory move faster when its
first chunk's head (MC_PROBE_FIRST_PIECE bytes, 0 for none) goes to the socket while the
rest of the chunk is still being copied out? Needs the wheel of
docs/bench/issue12-s18-probe.patch, which reads the head's size at each send. Reads out of
the target's GPU: the target sends, so one GPU target per head size (the variable set
when it starts), all kept; writes out of our GPU: we send, so the variable is set here per
case. One initiator; host-to-host reads and writes as the reference; the cases of a round
run in a rotated order; one JSON line per figure; bytes of GPU-to-GPU reads and writes
verified at the end against every target.

    python3 issue12-s18-head.py [--duration 2] [--rounds 6] [--heads 0,131072,262144,524288]
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
VAR = "MC_PROBE_FIRST_PIECE"


def main(a):
    size = BLOCK * BATCH
    heads = [int(h) for h in a.heads.split(",")]
    e = g.new_engine()
    local = {}
    for mem in ("cpu", "cuda"):
        buf = g.pattern(size, 2, g.GPU if mem == "cuda" else "cpu")
        g.sync()
        assert e.register_memory(buf.data_ptr(), size, "*") == 0
        local[mem] = buf
    targets = {"cpu": g.Target("cpu", size, seed=1)}
    for h in heads:
        os.environ[VAR] = str(h)
        targets[h] = g.Target("cuda", size, seed=1)
    os.environ.pop(VAR, None)
    # (name, op, our memory, target, head here)
    cases = [("host-read", "read", "cpu", "cpu", None)]
    cases += [("gpu-gpu-read", "read", "cuda", h, None) for h in heads]
    cases += [("host-write", "write", "cpu", "cpu", None)]
    cases += [("gpu-gpu-write", "write", "cuda", heads[-1], h) for h in (heads[0], a.write_head)]
    for r in range(a.rounds):
        k = r % len(cases)
        for name, op, here, there, head in cases[k:] + cases[:k]:
            os.environ.pop(VAR, None)
            if head is not None:
                os.environ[VAR] = str(head)
            t = targets[there]
            seg, remote = t.info["session"], t.info["addr"]
            bufs = [local[here].data_ptr() + i * BLOCK for i in range(BATCH)]
            peers = [remote + i * BLOCK for i in range(BATCH)]
            call = e.batch_transfer_sync_read if op == "read" else e.batch_transfer_sync_write
            time.sleep(0.2)
            for _ in range(2):
                assert call(seg, bufs, peers, [BLOCK] * BATCH) == 0
            n, start, ticks = 0, time.perf_counter(), g.cpu_ticks()
            while time.perf_counter() - start < a.duration:
                rc = call(seg, bufs, peers, [BLOCK] * BATCH)
                assert rc == 0, g.TransferEngine.last_error()
                n += 1
            secs = time.perf_counter() - start
            busy, total = (b - a for a, b in zip(ticks, g.cpu_ticks()))
            print(json.dumps({"round": r, "case": name,
                              "head": head if head is not None else there,
                              "gbps": round(n * BATCH * BLOCK / secs / 1e9, 2),
                              "cpu_busy": round(busy / max(total, 1), 3)}), flush=True)
    os.environ.pop(VAR, None)
    back = torch.zeros(size, dtype=torch.uint8, device=g.GPU)
    assert e.register_memory(back.data_ptr(), size, "*") == 0
    mine = [back.data_ptr() + i * BLOCK for i in range(BATCH)]
    for h in heads:
        t = targets[h]
        seg, remote = t.info["session"], t.info["addr"]
        peers = [remote + i * BLOCK for i in range(BATCH)]
        # The target holds what the last write case left there: write a fresh pattern with
        # this head, read it back with the target's.
        os.environ[VAR] = str(h)
        fresh = g.pattern(size, 5 + len(str(h)), g.GPU)
        g.sync()
        assert e.register_memory(fresh.data_ptr(), size, "*") == 0
        rc = e.batch_transfer_sync_write(seg, [fresh.data_ptr() + i * BLOCK for i in range(BATCH)],
                                         peers, [BLOCK] * BATCH)
        rc2 = e.batch_transfer_sync_read(seg, mine, peers, [BLOCK] * BATCH)
        g.sync()
        g.check(rc == 0 and rc2 == 0 and torch.equal(back, fresh),
                f"GPU -> GPU writes and GPU <- GPU reads with head {h}, bytes verified")
        assert e.unregister_memory(fresh.data_ptr()) == 0
    for t in targets.values():
        t.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--heads", default="0,131072,262144,524288")
    ap.add_argument("--write-head", type=int, default=262144)
    main(ap.parse_args())
