#!/usr/bin/env python3
"""Session 18 probes (issue 12): one setting that acts on the side that copies out of (or
into) device memory, compared in one run. A probe wheel reads the setting from the
environment variable --var at each use. Reads out of the target's GPU: the target acts,
so one GPU target per value (the variable set when it starts), all kept; writes out of our
GPU: both sides act, so each write case sets the value here and writes to the target
started with it. One initiator; host-to-host reads and writes as the reference; the cases
of a round run in a rotated order; one JSON line per figure; bytes of GPU-to-GPU reads and
writes verified at the end against every target.

Call 1 (docs/bench/issue12-s18-probe.patch): --var MC_PROBE_FIRST_PIECE --values
0,131072,262144,524288 --write-values 0,262144 (its lines name the value "head").
Call 2 (docs/bench/issue12-s18b-probe.patch): --var MC_PROBE_WAIT --values 0,1,2,3
--write-values 0,1,2. Call 3 (docs/bench/issue12-s18c-probe.patch): --var MC_PROBE_WAIT
--values 0,3,4 --write-values 0,3,4. Session 21 (docs/bench/issue12-s21-probe.patch): --var
MC_PROBE_WAIT with --both (reads set the value in this process too).

    python3 issue12-s18-knob.py --var VAR --values A,B,.. --write-values A,.. [--duration 2] [--rounds 6]
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


def main(a):
    size = BLOCK * BATCH
    VAR = a.var
    values = [int(h) for h in a.values.split(",")]
    e = g.new_engine()
    local = {}
    for mem in ("cpu", "cuda"):
        buf = g.pattern(size, 2, g.GPU if mem == "cuda" else "cpu")
        g.sync()
        assert e.register_memory(buf.data_ptr(), size, "*") == 0
        local[mem] = buf
    targets = {"cpu": g.Target("cpu", size, seed=1)}
    for h in values:
        os.environ[VAR] = str(h)
        targets[h] = g.Target("cuda", size, seed=1)
    os.environ.pop(VAR, None)
    # (name, op, our memory, target, value set here)
    cases = [("host-read", "read", "cpu", "cpu", None)]
    # --both: the value is set here too for reads (session 21: the initiator acts as well).
    cases += [("gpu-gpu-read", "read", "cuda", h, h if a.both else None) for h in values]
    cases += [("host-write", "write", "cpu", "cpu", None)]
    cases += [("gpu-gpu-write", "write", "cuda", int(h), int(h)) for h in a.write_values.split(",")]
    for r in range(a.rounds):
        k = r % len(cases)
        for name, op, here, there, mine in cases[k:] + cases[:k]:
            os.environ.pop(VAR, None)
            if mine is not None:
                os.environ[VAR] = str(mine)
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
                              "value": mine if mine is not None else there,
                              "gbps": round(n * BATCH * BLOCK / secs / 1e9, 2),
                              "cpu_busy": round(busy / max(total, 1), 3)}), flush=True)
    os.environ.pop(VAR, None)
    back = torch.zeros(size, dtype=torch.uint8, device=g.GPU)
    assert e.register_memory(back.data_ptr(), size, "*") == 0
    mine = [back.data_ptr() + i * BLOCK for i in range(BATCH)]
    for h in values:
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
                f"GPU -> GPU writes and GPU <- GPU reads with {VAR}={h}, bytes verified")
        assert e.unregister_memory(fresh.data_ptr()) == 0
    for t in targets.values():
        t.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--var", required=True)
    ap.add_argument("--values", required=True)
    ap.add_argument("--write-values", required=True)
    ap.add_argument("--both", action="store_true")
    main(ap.parse_args())
