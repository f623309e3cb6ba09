#!/usr/bin/env bash
# Session 22 (2026-12-02), first device call of issue 12, nvidia-h200 (16 CPUs). Carry
# .devcarry/ (upstream 0.3.14) and .gpucarry-s22/ (A.xz: main's release transfer_engine_bench
# at f006517; B.xz: the same with peers' data hosts given by name resolved once per 10 s).
#  1. the table, B against upstream (MC_FORCE_TCP=1), every case, 3 rounds, order
#     rotated, engines named 127.0.0.1 (what the figures use);
#  2. the same engines named `localhost` (HOST=localhost): A, B and upstream, the 4 KiB
#     latency cases and the serving shapes, 3 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s22a.sh
set -uo pipefail
H=$PWD/.gpucarry-s22; xz -dkf "$H/A.xz" "$H/B.xz"
O="${OUT:-/tmp/s22-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; hostname; getent hosts localhost
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/ip" OURS="ours=$H/B" \
    CASES="write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers" \
    ROUNDS=3 DURATION=2 timeout 330 bash scripts/bench-compare.sh --gpu-host 2>"$O/ip.err"
grep -h '"error"' "$O/ip/results.jsonl"; tail -n 2 "$O/ip.err"
cp "$O/ip/results.jsonl" "$O/table.jsonl"
date -u
HOST=localhost BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/named" \
    OURS="main=$H/A names=$H/B" CASES="lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers" \
    ROUNDS=3 DURATION=2 timeout 230 bash scripts/bench-compare.sh --gpu-host 2>"$O/named.err"
grep -h '"error"' "$O/named/results.jsonl"; tail -n 2 "$O/named.err"
cp "$O/named/results.jsonl" "$O/named.jsonl"
for d in ip named; do (cd "$O/$d" && tar czf "$O/$d-logs.tgz" logs 2>/dev/null); rm -rf "$O/$d"; done
date -u
