#!/usr/bin/env bash
# Session 16 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs).
# On the 2-CPU VM, reno instead of the system's bbr (which paces every connection through
# hrtimers) on our loopback connections moved 64 KiB / 4 MiB batches 1.25-1.67x and halved
# the initiator's CPU per serving request. What does this host use, and what does reno do
# here? `cc` is main (6a1476a) plus a probe that sets TCP_CONGESTION on every data
# connection from MC_PROBE_TCP_CC; `cur` is the same binary without it. Upstream 0.3.14 in
# the same rounds. Carry .devcarry/ and .gpucarry-s16/ (cc.xz).
#
#   bash docs/bench/issue12-device-calls-s16c.sh
set -uo pipefail
H=$PWD/.gpucarry-s16; xz -dk "$H/cc.xz"
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uname -r
sysctl net.ipv4.tcp_congestion_control net.ipv4.tcp_allowed_congestion_control \
    net.ipv4.tcp_available_congestion_control net.core.default_qdisc net.ipv4.tcp_wmem \
    net.ipv4.tcp_rmem
tc qdisc show dev lo 2>/dev/null || true
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="cur=$H/cc reno=$H/cc@MC_PROBE_TCP_CC=reno" ROUNDS=2 DURATION=2 \
    timeout 420 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
