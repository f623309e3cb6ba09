#!/usr/bin/env bash
# Session 18 (2026-12-02), fifth device call of issue 12, nvidia-h200 (16 CPUs): in the
# serving shape a caller's batch waits 148-182 µs for its statuses after its send (session
# 17) while a fifth of the CPUs idle (session 16): are the threads that take batches in
# runnable and waiting for a CPU then, or asleep? Per thread kind, CPU and runnable-waiting
# time from /proc schedstat (docs/bench/issue12-s16-thread-cpu.py), 1 and 4 peers, main's
# release bench (d8e19e2, .gpucarry-s18/bench.xz). Then tests/gpu/gpu_transfer.py main three
# times with the landed wheel's code (.gpucarry-s18/site: call 3's probe wheel, whose default
# is the landed behaviour).
#
#   bash docs/bench/issue12-device-calls-s18e.sh
set -uo pipefail
H=$PWD/.gpucarry-s18; xz -dkf "$H/bench.xz"
O="${OUT:-/tmp/s18-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
B=$H/bench
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
    echo "== $n peers, per-thread CPU over 2 s (targets ${tpids[*]})"
    python3 docs/bench/issue12-s16-thread-cpu.py 2 $(pgrep -f -- '--mode=initiator') "${tpids[@]}"
    wait $ip; echo "result: $(cat /tmp/s.out)"
done
kill "${tpids[@]}" 2>/dev/null; wait "${tpids[@]}" 2>/dev/null
date -u
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
for run in 1 2 3; do
    timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | sed "s/^/run $run: /" | tee -a "$O/gpu-transfer.log"
done
date -u
