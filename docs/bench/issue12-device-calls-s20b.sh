#!/usr/bin/env bash
# Session 20 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs).
# 1. A lane reads its group of reads' replies itself whatever is queued behind it: `main`
#    (.gpucarry-s20/bench-p: docs/bench/issue12-s20-probe.patch on c817f41, probes unset),
#    `any` (the same binary with MC_PROBE_SETTLE_ANY=1), `new` (.gpucarry-s20/bench-r: the
#    change as committed), and upstream 0.3.14 (MC_FORCE_TCP=1), 3 rounds, order rotated.
# 2. tests/gpu/gpu_transfer.py --rounds 3 (now with MC_DISABLE_IPC=1 by default: call 1
#    measured same-host GPU IPC, 1.0-1.3 TB/s, as it ran without it).
# Carry .devcarry/ and .gpucarry-s20/.
#
#   bash docs/bench/issue12-device-calls-s20b.sh
set -uo pipefail
H=$PWD/.gpucarry-s20; xz -dkf "$H/bench-r.xz"; xz -dkf "$H/bench-p.xz"
O="${OUT:-/tmp/s20-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" \
    OURS="main=$H/bench-p any=$H/bench-p@MC_PROBE_SETTLE_ANY=1 new=$H/bench-r" \
    CASES="read-64KiBx64 serving-read-4peers serving-4peers write-64KiBx64" \
    ROUNDS=3 DURATION=2 timeout 330 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
export PYTHONPATH=$H/site MC_LOG_LEVEL=warn
timeout 200 python3 tests/gpu/gpu_transfer.py main --rounds 3 --duration 3 | tee "$O/gpu-transfer.log"
date -u
