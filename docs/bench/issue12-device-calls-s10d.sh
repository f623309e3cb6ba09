#!/usr/bin/env bash
# Session 10 (2026-12-01), fourth device call of issue 12, nvidia-h200 (16 CPUs):
#  1. the host link's copy bandwidth (torch, pinned host memory <-> H200, 1 GiB, each way
#     and both at once): the ceiling of GPU memory over TCP, which stages through it;
#  2. upstream 0.3.14 (`MC_FORCE_TCP=1`) against `new` (the defaults of 919a8f6) and `fair`
#     (new, and a lane gathers at most an even share of its batch), 64 KiB and 4 MiB
#     batches and the serving shape, 2 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s10d.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
timeout 60 python3 - <<'PY' | tee "$O/pcie.txt"
import torch, time
n = 1 << 30
h = torch.empty(n, dtype=torch.uint8).pin_memory()
h2 = torch.empty(n, dtype=torch.uint8).pin_memory()
d = torch.empty(n, dtype=torch.uint8, device="cuda")
d2 = torch.empty(n, dtype=torch.uint8, device="cuda")
s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
def gbps(f, reps=5):
    f(); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return reps * n / (time.perf_counter() - t) / 1e9
print("h2d GB/s", round(gbps(lambda: d.copy_(h, non_blocking=True)), 2))
print("d2h GB/s", round(gbps(lambda: h.copy_(d, non_blocking=True)), 2))
def both():
    with torch.cuda.stream(s1):
        d.copy_(h, non_blocking=True)
    with torch.cuda.stream(s2):
        h2.copy_(d2, non_blocking=True)
print("both ways, each GB/s", round(gbps(both), 2))
PY
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s10/fair \
    CASES="write-64KiBx64 read-64KiBx64 write-4MiBx64 read-4MiBx64 serving-1peer serving-4peers" \
    OURS="new=$H/new fair=$H/fair" ROUNDS=2 DURATION=2 \
    timeout 330 bash scripts/bench-compare.sh --gpu-host 2>/tmp/fair.err
cp /tmp/s10/fair/results.jsonl "$O/fair.jsonl"; tail -n 2 /tmp/fair.err
date -u
