#!/usr/bin/env bash
# Prepared in session 16 (2026-12-02) for the next device call of issue 12 (nvidia-h200,
# 16 CPUs); not run yet. Build the bench with docs/bench/issue12-s17-probe.patch and carry it
# as .gpucarry-s17/probe (stripped, xz): which connections, given reno, slow the serving
# shape (session 16: reno on lanes, direct and server connections still cost 6-11% with
# 4 peers), and where a caller's batch spends its time (the PROBE lines in the initiators'
# stderr, kept in cmp-logs.tgz). Every variant runs the same binary; upstream 0.3.14 in the
# same rounds. Carry .devcarry/ and .gpucarry-s17/.
#
#   bash docs/bench/issue12-device-calls-s17a.sh
set -uo pipefail
H=$PWD/.gpucarry-s17; xz -dk "$H/probe.xz"
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
B=$H/probe
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="sys=$B@MC_TCP_SAME_HOST_CC=system all=$B@MC_TCP_SAME_HOST_CC=reno lane=$B@MC_TCP_SAME_HOST_CC=reno,MC_PROBE_CC_ROLES=lane server=$B@MC_TCP_SAME_HOST_CC=reno,MC_PROBE_CC_ROLES=server" \
    CASES="serving-4peers serving-1peer write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64" \
    ROUNDS=2 DURATION=2 timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
grep -H PROBE "$O"/cmp/logs/*serving* 2>/dev/null | sed 's|.*/logs/||' | cut -c1-300
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
