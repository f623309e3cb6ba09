#!/usr/bin/env python3
"""Issue 12, session 8: where the CPU goes when device memory moves over TCP.

One case (host or device memory, write or read, 64 x 4 MiB batches, as
tests/gpu/gpu_transfer.py measures it): after the warm-up, CPU seconds of both
processes (from /proc) over the measured window, and optionally a system-wide
`perf record` of that window. Prints one JSON line.

    python3 issue12-s8-gpu-profile.py MEMORY OP SECONDS [PERF_OUT]
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "gpu"))
os.environ.setdefault("MC_FORCE_TCP", "1")
import gpu_transfer as g  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK  # utime, stime


def main():
    memory, op, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    perf_out = sys.argv[4] if len(sys.argv) > 4 else None
    e = g.new_engine()
    size = g.BLOCK * g.BATCH
    tgt = g.Target(memory, size, seed=1)
    seg, remote = tgt.info["session"], tgt.info["addr"]
    dev = g.GPU if memory == "cuda" else "cpu"
    local = g.pattern(size, 2, dev)
    e.register_memory(local.data_ptr(), size, "*")
    bufs = [local.data_ptr() + i * g.BLOCK for i in range(g.BATCH)]
    peers = [remote + i * g.BLOCK for i in range(g.BATCH)]
    call = e.batch_transfer_sync_write if op == "write" else e.batch_transfer_sync_read
    for _ in range(3):
        assert call(seg, bufs, peers, [g.BLOCK] * g.BATCH) == 0
    perf = None
    if perf_out:
        perf = subprocess.Popen(os.environ["PERF"].split() + ["record", "-a", "-g", "-e", "cpu-clock",
                                "-F", "499", "-o", perf_out, "--", "sleep", str(secs)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.2)
    c0 = (cpu_s(os.getpid()), cpu_s(tgt.p.pid))
    batches, start = 0, time.perf_counter()
    while time.perf_counter() - start < secs:
        assert call(seg, bufs, peers, [g.BLOCK] * g.BATCH) == 0, g.TransferEngine.last_error()
        batches += 1
    wall = time.perf_counter() - start
    c1 = (cpu_s(os.getpid()), cpu_s(tgt.p.pid))
    if perf:
        perf.wait()
    gb = batches * size / 1e9
    print(json.dumps({"memory": memory, "op": op, "gbps": gb / wall,
                      "initiator_cpu_s_per_gb": (c1[0] - c0[0]) / gb,
                      "target_cpu_s_per_gb": (c1[1] - c0[1]) / gb,
                      "cpus_busy": (c1[0] - c0[0] + c1[1] - c0[1]) / wall}), flush=True)
    e.unregister_memory(local.data_ptr())
    tgt.close()


if __name__ == "__main__":
    main()
