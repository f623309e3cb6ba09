#!/usr/bin/env bash
# Session 17 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs).
# 1. The serving shape's batch waits 150-160 µs for its statuses after its send (call 1):
#    does the data server looking awake for the next request after a large one (the probe
#    docs/bench/issue12-s17b-probe.patch on cb1b458, carried as .gpucarry-s17/spin) shorten
#    it? base / spin 50 µs / spin 100 µs with 4 spinning threads a process, 3 rounds.
# 2. Reads into GPU memory against host reads: main's wheel (cb1b458, .gpucarry-s17/site,
#    symbols kept) under a system-wide perf profile per phase
#    (docs/bench/issue12-s17-gpu-read-profile.py), then tests/gpu/gpu_transfer.py main.
# Carry .gpucarry-s17/ (spin.xz, site/, perf.txz: Debian 12's perf).
#
#   bash docs/bench/issue12-device-calls-s17b.sh
set -uo pipefail
H=$PWD/.gpucarry-s17; xz -dk "$H/spin.xz"
O="${OUT:-/tmp/s17-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
S=$H/spin
SKIP_UPSTREAM_PY=1 BENCH_REPO=$PWD OUT_DIR="$O/cmp" \
    OURS="base=$S spin50=$S@MC_PROBE_SERVER_SPIN_US=50 spin100=$S@MC_PROBE_SERVER_SPIN_US=100,MC_PROBE_SPIN_SLOTS=4" \
    CASES="serving-4peers serving-1peer write-64KiBx64 write-4MiBx64" \
    ROUNDS=3 DURATION=2 timeout 260 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
date -u
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
mkdir -p /tmp/prof
timeout 120 python3 docs/bench/issue12-s17-gpu-read-profile.py --duration 5 --perf "$PERF" \
    --out /tmp/prof 2>&1 | grep -E '^\{|Error|error' | tee "$O/gpu-profile.jsonl"
for ph in host into-gpu gpu-gpu; do
    f=/tmp/prof/p-$ph.data; [ -f "$f" ] || continue
    {
        echo "== $ph, by thread kind and dso"
        $PERF report -i "$f" --stdio --no-children --sort comm,dso --percent-limit 0.4 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45
        echo "== $ph, by symbol"
        $PERF report -i "$f" --stdio --no-children --sort dso,sym --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep -v '^$' | head -50
    } >> "$O/gpu-profile.txt"
done
date -u
timeout 150 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 | grep -E '^\{|^FAIL|^PASS' | tee "$O/gpu-transfer.log"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
