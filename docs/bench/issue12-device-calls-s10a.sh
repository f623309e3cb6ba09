#!/usr/bin/env bash
# Session 10 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs): the host's
# NUMA layout, then what the lanes and the stripe size do to 4 MiB writes and reads
# (`base` = c9f58ce with MC_TCP_LANES_PER_PEER 4 / 8 (default) / 12 / 16, MC_TCP_STRIPE_SIZE
# 1 MiB) and to the serving shape (lane budget, caller connections, lanes), against upstream
# 0.3.14 (`MC_FORCE_TCP=1`), 2 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s10a.sh
set -uo pipefail
H=$PWD/.gpucarry-s10
O="${OUT:-/tmp/s10-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
{ lscpu; grep -H . /sys/devices/system/node/node*/cpulist; grep Cpus_allowed_list /proc/self/status
  cat /sys/fs/cgroup/cpu.max 2>/dev/null; numactl -H 2>/dev/null; } >"$O/topology.txt" 2>&1
grep -Ei 'numa|^cpu\(s\)|model name|socket' "$O/topology.txt"
B=$H/base
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s10/big CASES="write-4MiBx64 read-4MiBx64" \
    OURS="l8=$B l4=$B@MC_TCP_LANES_PER_PEER=4 l12=$B@MC_TCP_LANES_PER_PEER=12 l16=$B@MC_TCP_LANES_PER_PEER=16 s1m=$B@MC_TCP_STRIPE_SIZE=1048576 l12s1m=$B@MC_TCP_LANES_PER_PEER=12,MC_TCP_STRIPE_SIZE=1048576" \
    ROUNDS=2 DURATION=2 timeout 260 bash scripts/bench-compare.sh --gpu-host 2>/tmp/big.err
cp /tmp/s10/big/results.jsonl "$O/big.jsonl"; tail -n 3 /tmp/big.err
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s10/serv CASES="serving-1peer serving-4peers" \
    OURS="def=$B b32=$B@MC_TCP_LANE_BUDGET=32 cc32=$B@MC_TCP_CALLER_CONNS=32 l12=$B@MC_TCP_LANES_PER_PEER=12 cc0=$B@MC_TCP_CALLER_CONNS=0" \
    ROUNDS=2 DURATION=2 timeout 220 bash scripts/bench-compare.sh --gpu-host 2>/tmp/serv.err
cp /tmp/s10/serv/results.jsonl "$O/serv.jsonl"; tail -n 3 /tmp/serv.err
date -u
