#!/usr/bin/env python3
"""Session 17 probe (issue 12): do reads into GPU memory lose to host reads by their stripe
(2 MiB for device memory, 1 MiB for host memory)? Needs the wheel of
docs/bench/issue12-s17c-probe.patch, which takes the stripes from MC_PROBE_DEVICE_STRIPE /
MC_PROBE_HOST_STRIPE at each batch. One initiator, one target per memory kind (kept), reads
of 4 MiB x 64; the cases of a round run in a rotated order; one JSON line per figure. Bytes
of the GPU-to-GPU reads verified at the end (with the last case's settings). Call 3 ran
the stripes' cases, when each line named its stripe as "stripe_mib" instead of "env".

    python3 issue12-s17-stripes.py [--duration 2] [--rounds 3] [--cases stripes|reads-out|in-flight]
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
MIB = 1 << 20


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
    cases = [("host", "cpu", "cpu", {"MC_PROBE_HOST_STRIPE": MIB}),
             ("host", "cpu", "cpu", {"MC_PROBE_HOST_STRIPE": 2 * MIB}),
             ("into-gpu", "cuda", "cpu", {"MC_PROBE_DEVICE_STRIPE": 2 * MIB}),
             ("into-gpu", "cuda", "cpu", {"MC_PROBE_DEVICE_STRIPE": MIB}),
             ("gpu-gpu", "cuda", "cuda", {"MC_PROBE_DEVICE_STRIPE": 2 * MIB}),
             ("gpu-gpu", "cuda", "cuda", {"MC_PROBE_DEVICE_STRIPE": MIB})]
    if a.cases == "reads-out":
        # Call 4: reads into device memory with 2 (main) or 4 out per lane
        # (docs/bench/issue12-s14-device-reads-out.patch, read at each batch).
        out = "MC_PROBE_DEVICE_READS_OUT"
        cases = [("host", "cpu", "cpu", {}),
                 ("gpu-gpu", "cuda", "cuda", {out: 2}),
                 ("gpu-gpu", "cuda", "cuda", {out: 4}),
                 ("into-gpu", "cuda", "cpu", {out: 2}),
                 ("into-gpu", "cuda", "cpu", {out: 4}),
                 ("gpu-gpu", "cuda", "cuda", {out: 4, "MC_PROBE_DEVICE_STRIPE": MIB})]
    if a.cases == "in-flight":
        # Call 5: less in flight per lane (4 out moved less in call 4): host reads in
        # 512 KiB stripes; reads into device memory one request out per lane.
        out = "MC_PROBE_DEVICE_READS_OUT"
        cases = [("host", "cpu", "cpu", {}),
                 ("host", "cpu", "cpu", {"MC_PROBE_HOST_STRIPE": MIB // 2}),
                 ("gpu-gpu", "cuda", "cuda", {out: 2}),
                 ("gpu-gpu", "cuda", "cuda", {out: 1}),
                 ("into-gpu", "cuda", "cpu", {out: 2}),
                 ("into-gpu", "cuda", "cpu", {out: 1}),
                 ("gpu-gpu", "cuda", "cuda", {out: 1, "MC_PROBE_DEVICE_STRIPE": MIB})]
    knobs = {k for c in cases for k in c[3]}
    for r in range(a.rounds):
        k = r % len(cases)
        for name, here, there, env in cases[k:] + cases[:k]:
            for var in knobs:
                os.environ.pop(var, None)
            os.environ.update({var: str(v) for var, v in env.items()})
            t, local = side[there][0], side[here][1]
            seg, remote = t.info["session"], t.info["addr"]
            bufs = [local.data_ptr() + i * BLOCK for i in range(BATCH)]
            peers = [remote + i * BLOCK for i in range(BATCH)]
            time.sleep(0.2)
            for _ in range(2):
                assert e.batch_transfer_sync_read(seg, bufs, peers, [BLOCK] * BATCH) == 0
            n, start, ticks = 0, time.perf_counter(), g.cpu_ticks()
            while time.perf_counter() - start < a.duration:
                rc = e.batch_transfer_sync_read(seg, bufs, peers, [BLOCK] * BATCH)
                assert rc == 0, g.TransferEngine.last_error()
                n += 1
            secs = time.perf_counter() - start
            busy, total = (b - a for a, b in zip(ticks, g.cpu_ticks()))
            print(json.dumps({"round": r, "case": name, "env": env,
                              "gbps": round(n * BATCH * BLOCK / secs / 1e9, 2),
                              "cpu_busy": round(busy / max(total, 1), 3)}), flush=True)
    for var in knobs:
        os.environ.pop(var, None)
    os.environ.update({var: str(v) for var, v in cases[-1][3].items()})
    t, local = side["cuda"]
    back = torch.zeros(size, dtype=torch.uint8, device=g.GPU)
    assert e.register_memory(back.data_ptr(), size, "*") == 0
    seg, remote = t.info["session"], t.info["addr"]
    rc = e.batch_transfer_sync_read(seg, [back.data_ptr() + i * BLOCK for i in range(BATCH)],
                                    [remote + i * BLOCK for i in range(BATCH)], [BLOCK] * BATCH)
    g.sync()
    g.check(rc == 0 and torch.equal(back, g.pattern(size, 1, g.GPU)),
            f"GPU <- GPU reads with {cases[-1][3]}, bytes verified")
    for t, _ in side.values():
        t.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", choices=["stripes", "reads-out", "in-flight"], default="stripes")
    main(ap.parse_args())
