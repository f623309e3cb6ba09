#!/usr/bin/env bash
# Session 16 (2026-12-02), fifth device call of issue 12, nvidia-h200 (16 CPUs): the issue's
# table for this session's build (`fin`: reno on same-host lane, direct and server
# connections, MC_TCP_SAME_HOST_CC; caller connections keep the system's) against main
# (`cur`, 6a1476a) and upstream 0.3.14, every case, 3 rounds.
# Carry .devcarry/ and .gpucarry-s16/ (cur.xz, fin.xz).
#
#   bash docs/bench/issue12-device-calls-s16f.sh
set -uo pipefail
H=$PWD/.gpucarry-s16; for f in cur fin; do xz -dk "$H/$f.xz"; done
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="cur=$H/cur fin=$H/fin" ROUNDS=3 DURATION=2 \
    timeout 400 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
