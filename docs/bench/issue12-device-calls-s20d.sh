#!/usr/bin/env bash
# Session 20 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs): where reads
# of GPU memory over TCP spend their CPU now (session 18 made sends out of the device yield
# while their copies run; session 17's profile predates it). e8950c8's wheel
# (.gpucarry-s20/site-f, stripped: our own frames show as the .so), one initiator, targets
# kept, 4 MiB x 64 reads, phases host / into-gpu / gpu-gpu / host2, a system-wide perf
# profile (cpu-clock, 999 Hz) over each phase's middle 3 s
# (docs/bench/issue12-s17-gpu-read-profile.py). Carry .gpucarry-s20/ (site-f/, perf.txz:
# Debian 12's perf 6.1 with the libraries it needs).
#
#   bash docs/bench/issue12-device-calls-s20d.sh
set -uo pipefail
H=$PWD/.gpucarry-s20
O="${OUT:-/tmp/s20-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site-f
mkdir -p /tmp/prof
timeout 120 python3 docs/bench/issue12-s17-gpu-read-profile.py --duration 5 --perf "$PERF" \
    --out /tmp/prof 2>&1 | grep -E '^\{|Error|error' | tee "$O/gpu-profile.jsonl"
for ph in host into-gpu gpu-gpu; do
    f=/tmp/prof/p-$ph.data; [ -f "$f" ] || continue
    {
        echo "== $ph, by thread kind and dso"
        $PERF report -i "$f" --stdio --no-children --sort comm,dso --percent-limit 0.4 2>/dev/null | grep -v '^#' | grep -v '^$' | head -45
        echo "== $ph, by symbol"
        $PERF report -i "$f" --stdio --no-children --sort comm,dso,sym --percent-limit 0.25 2>/dev/null | grep -v '^#' | grep -v '^$' | head -70
    } >> "$O/gpu-profile.txt"
done
date -u
