#!/usr/bin/env python3
"""The `*_on_cuda` calls on a real GPU, for whichever `mooncake` is on PYTHONPATH (ours, or
upstream's 0.3.14 CUDA wheel as the reference), one engine writing to and reading from its
own segment over TCP, as upstream's own `test_transfer_on_cuda.py` does (which asks for RDMA
and skips without it; this host has none, so the protocol here is "tcp").

Checks, per call, memory kind and size: the source is filled on the default stream after a
GPU sleep, the transfer is ordered on a side stream that waits for the default one, and the
destination must hold the fill once the side stream's work is done; without the ordering it
holds the previous fill. Then times the calls: from the call until the stream's work after
it has finished, and how long the call itself took to return (upstream queues a host
function and returns at once; ours waits for the stream and moves the bytes before
returning). One JSON line per result.

    PYTHONPATH=<wheel> python3 tests/gpu/on_cuda.py --impl ours [--kinds cuda,pinned] [--iters N]
"""
import argparse
import json
import statistics
import sys
import time

import torch

from mooncake.engine import TransferEngine

MiB = 1 << 20
SLEEP_CYCLES = 50_000_000  # tens of ms of GPU time: a transfer that does not wait reads stale bytes


def engine():
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    assert rc == 0, f"initialize returned {rc}"
    return e, f"127.0.0.1:{e.get_rpc_port()}"


def tensors(kind, n):
    if kind == "cuda":
        return (torch.zeros(n, dtype=torch.uint8, device="cuda:0"),
                torch.zeros(n, dtype=torch.uint8, device="cuda:0"))
    return (torch.zeros(n, dtype=torch.uint8, pin_memory=True),
            torch.zeros(n, dtype=torch.uint8, pin_memory=True))


def call(e, target, op, local, remote, n, stream):
    """One `*_on_cuda` call: `local` is the initiator's tensor, `remote` the segment's."""
    if op.startswith("batch"):
        parts = 4
        step = n // parts
        args = ([local.data_ptr() + i * step for i in range(parts)],
                [remote.data_ptr() + i * step for i in range(parts)], [step] * parts)
    else:
        args = (local.data_ptr(), remote.data_ptr(), n)
    getattr(e, f"{op}_on_cuda")(target, *args, stream.cuda_stream)


def fill(t, value, kind):
    """Fills `t` on the default stream behind a GPU sleep."""
    torch.cuda._sleep(SLEEP_CYCLES)
    if kind == "cuda":
        t.fill_(value)
    else:  # host memory: the default stream's copy into it is what the call must wait for
        t.copy_(torch.full((t.numel(),), value, dtype=torch.uint8, device="cuda:0"), non_blocking=True)


def check(e, target, op, kind, n, side, iters):
    """Upstream's loop: fill on the default stream, order the call after it on `side`,
    wait for `side` on the default stream, compare. Returns the failures."""
    src, dst = tensors(kind, n)
    for t in (src, dst):
        assert e.register_memory(t.data_ptr(), n) == 0, TransferEngine.last_error()
    local, remote = (src, dst) if "write" in op else (dst, src)
    bad = []
    for i in range(iters):
        value = (i * 37 + 11) % 251
        torch.cuda.synchronize()
        dst.zero_()
        torch.cuda.synchronize()
        fill(src, value, kind)  # a write sends `src`, a read fetches it: `dst` must end equal
        side.wait_event(torch.cuda.current_stream().record_event())
        call(e, target, op, local, remote, n, side)
        torch.cuda.current_stream().wait_event(side.record_event())
        torch.cuda.synchronize()
        if not bool(torch.all(dst == value)):
            bad.append(i)
    for t in (src, dst):
        e.unregister_memory(t.data_ptr())
    return bad


def timing(e, target, op, kind, n, side, seconds):
    src, dst = tensors(kind, n)
    for t in (src, dst):
        assert e.register_memory(t.data_ptr(), n) == 0, TransferEngine.last_error()
    local, remote = (src, dst) if "write" in op else (dst, src)
    done, returned = [], []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(done) < 5:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(e, target, op, local, remote, n, side)
        t1 = time.perf_counter()
        side.synchronize()
        t2 = time.perf_counter()
        returned.append(t1 - t0)
        done.append(t2 - t0)
    for t in (src, dst):
        e.unregister_memory(t.data_ptr())
    med = statistics.median(done)
    return {"calls": len(done), "gbps": round(n / med / 1e9, 3),
            "done_p50_us": round(med * 1e6, 1),
            "done_p99_us": round(sorted(done)[int(len(done) * 0.99) - 1] * 1e6, 1),
            "return_p50_us": round(statistics.median(returned) * 1e6, 1)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", required=True, help="label of the wheel on PYTHONPATH")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--sizes", default="1,64", help="MiB, comma-separated")
    ap.add_argument("--kinds", default="cuda,pinned", help="memory kinds, comma-separated")
    args = ap.parse_args()
    e, target = engine()
    side = torch.cuda.Stream()
    failed = 0
    for kind in args.kinds.split(","):
        for size in (int(s) * MiB for s in args.sizes.split(",")):
            for op in ("transfer_write", "transfer_read", "batch_transfer_write", "batch_transfer_read"):
                row = {"impl": args.impl, "call": f"{op}_on_cuda", "memory": kind, "bytes": size}
                try:
                    bad = check(e, target, op, kind, size, side, args.iters)
                    row["checked"] = args.iters
                    row["wrong"] = bad
                    failed += len(bad)
                    row.update(timing(e, target, op, kind, size, side, args.seconds))
                except Exception as x:  # noqa: BLE001  (the row says what failed; the run goes on)
                    row["error"] = f"{type(x).__name__}: {x}"
                    failed += 1
                print(json.dumps(row), flush=True)
    print(json.dumps({"impl": args.impl, "failed": failed}), flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
