#!/usr/bin/env bash
# Session 16 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs): where the
# 16 CPUs go in the serving shape (reno on our connections). Per-thread CPU by kind of
# thread (issue12-s16-thread-cpu.py) with 1 and 4 peers, and a cpu-clock profile (999 Hz,
# 3 s, no call graphs) with 4. `ccsym`: the probe build of s16c, symbols kept.
# Carry .gpucarry-s16/ (ccsym.xz, perf.txz).
#
#   bash docs/bench/issue12-device-calls-s16d.sh
set -uo pipefail
H=$PWD/.gpucarry-s16; xz -dk "$H/ccsym.xz"
O="${OUT:-/tmp/s16-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
B=$H/ccsym
export MC_PROBE_TCP_CC=reno
tpids=(); segs=()
for i in 1 2 3 4; do
    "$B" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
        </dev/null >/tmp/t$i.log 2>&1 &
    tpids+=($!)
    for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
    segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
done
run() { # peers duration
    "$B" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 \
        --segment_id="$(IFS=,; echo "${segs[*]:0:$1}")" --operation=write --block_size=32768 \
        --batch_size=32 --threads=10 --buffer_size=1073741824 --duration="$2" --json \
        </dev/null 2>/dev/null | grep '^{' | python3 -c 'import json,sys; d=json.load(sys.stdin); print({k: round(d[k], 2) for k in ("gb_per_s","latency_p50_us","latency_p99_us","cpu_us_per_request","sleeps_per_request","preemptions_per_request")})'
}
for n in 1 4 4; do
    run $n 5 >/tmp/s.out & ip=$!; sleep 1.5
    echo "== $n peers, per-thread CPU over 2 s (initiator $ip' children, targets ${tpids[*]})"
    python3 docs/bench/issue12-s16-thread-cpu.py 2 $(pgrep -f -- '--mode=initiator') "${tpids[@]}"
    wait $ip; echo "result: $(cat /tmp/s.out)"
done
run 4 5 >/tmp/s.out & ip=$!; sleep 1.5
$PERF record -a -e cpu-clock -F 999 -o /tmp/p.data -- sleep 3 >/dev/null 2>&1
wait $ip; echo "profiled: $(cat /tmp/s.out)"
kill "${tpids[@]}" 2>/dev/null; wait "${tpids[@]}" 2>/dev/null
date -u
timeout 120 $PERF report -i /tmp/p.data --stdio --no-children --sort comm,dso,sym --percent-limit 0.1 \
    2>/dev/null | grep -v '^#' | grep -v '^$' >"$O/profile-serving4.txt"
head -50 "$O/profile-serving4.txt"
date -u
