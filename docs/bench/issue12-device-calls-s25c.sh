#!/usr/bin/env bash
# Session 25 (2026-12-03), third device call of issue 12, nvidia-h200 (16 CPUs): do the slow
# runs of 64 KiB reads (call 2: more CPU per request, any congestion control) lack huge
# pages? The host's THP settings, then 16 runs of 64 KiB x 64 reads, main's defaults, a fresh
# target and initiator per run (2 s, one initiator thread), each process's AnonHugePages
# (its 256 MiB buffer) read 1 s in. Carry .gpucarry-s25/ (N.xz, 3b96716's release bench).
#
#   bash docs/bench/issue12-device-calls-s25c.sh
set -uo pipefail
H=$PWD/.gpucarry-s25; xz -dkf "$H/N.xz"; N=$H/N
O="${OUT:-/tmp/s25-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
for f in enabled defrag khugepaged/defrag; do echo "thp $f: $(cat /sys/kernel/mm/transparent_hugepage/$f)"; done
grep -E 'MemFree|AnonHugePages|HugePages_Total' /proc/meminfo
BUF=$((256 << 20))
huge() { awk '/AnonHugePages/ {print $2}' "/proc/$1/smaps_rollup" 2>/dev/null; }
for rep in $(seq "${REPS:-16}"); do
    T=$(mktemp)
    "$N" --mode=target --local_server_name=127.0.0.1 --buffer_size=$BUF >"$T" 2>&1 </dev/null &
    P=$!
    for _ in $(seq 100); do grep -q segment_id= "$T" && break; sleep 0.1; done
    SEG=$(grep -o 'segment_id=[^ ]*' "$T" | head -n1 | cut -d= -f2)
    "$N" --mode=initiator --local_server_name=127.0.0.1 --segment_id="$SEG" --operation=read \
        --block_size=65536 --batch_size=64 --buffer_size=$BUF --duration=2 --threads=1 --json \
        </dev/null >"$T.i" 2>/dev/null &
    I=$!
    sleep 1
    TH=$(huge $P); IH=$(huge $I)
    wait $I
    grep '^{' "$T.i" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['rep']=$rep; r['target_anon_huge_kb']=int('${TH:-0}' or 0); r['initiator_anon_huge_kb']=int('${IH:-0}' or 0); print(json.dumps(r))" |
        tee -a "$O/thp.jsonl" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print('rep', r['rep'], round(r['gb_per_s'],2), 'GB/s p99', round(r['latency_p99_us']), 'cpu/req', round(r['cpu_us_per_request'],1), 'huge kB target', r['target_anon_huge_kb'], 'initiator', r['initiator_anon_huge_kb'])"
    kill $P; wait $P 2>/dev/null; rm -f "$T" "$T.i"
done
date -u
