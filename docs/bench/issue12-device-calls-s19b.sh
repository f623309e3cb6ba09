#!/usr/bin/env bash
# Session 19 (2026-12-02), second device call of issue 12, nvidia-h200 (16 CPUs). In the
# serving shape a caller's batch spends ~190 us sending and ~165 us more waiting for its
# statuses, while the peer thread needs ~220 us of CPU per batch: the peer's copy mostly
# follows the send instead of running beside it. Is that the scheduler putting the woken
# peer thread on the sender's CPU (the guest's idle-CPU search is short at ~78% busy)? Here
# the same release bench (main with the all-busy rule, .gpucarry-s19/bench.xz) with every
# process on all 16 CPUs (`all`) against the initiator on CPUs 0-7 and the 4 targets on
# 8-15 (`split`: a target thread can never share the sender's CPU), 4 rounds, order
# rotated, fresh processes per run. Then tests/gpu/gpu_transfer.py main twice with the
# wheel of the same commit (.gpucarry-s19/site).
# NOTE: `--workload=serving` without `--operation` runs READS (the bench's default operation,
# as upstream's), so this call measured serving-shaped reads, not the writes meant.
#
#   bash docs/bench/issue12-device-calls-s19b.sh
set -uo pipefail
H=$PWD/.gpucarry-s19; xz -dkf "$H/bench.xz"
O="${OUT:-/tmp/s19-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
B=$H/bench
start_targets() { # cpus
    tpids=(); segs=()
    for i in 1 2 3 4; do
        taskset -c "$1" "$B" --mode=target --protocol=tcp --local_server_name=127.0.0.1 \
            --buffer_size=1073741824 </dev/null >/tmp/t$i.log 2>&1 &
        tpids+=($!)
        for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
        segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
    done
}
stop_targets() { kill "${tpids[@]}" 2>/dev/null; wait "${tpids[@]}" 2>/dev/null; }
run() { # setting initiator-cpus target-cpus peers round
    start_targets "$3"
    taskset -c "$2" "$B" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 \
        --segment_id="$(IFS=,; echo "${segs[*]:0:$4}")" --workload=serving \
        --buffer_size=1073741824 --duration=3 --json </dev/null 2>/dev/null | grep '^{' \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'round': $5, 'setting': '$1', 'peers': $4, **{k: round(d[k], 2) for k in ('gb_per_s','latency_p50_us','latency_p99_us','cpu_us_per_request','sleeps_per_request')}}))" \
        | tee -a "$O/split.jsonl"
    stop_targets
}
settings=("all 0-15 0-15" "split 0-7 8-15")
for r in 0 1 2 3; do
    for peers in 4 1; do
        if (( r % 2 )); then order=(1 0); else order=(0 1); fi
        for k in "${order[@]}"; do
            read -r name icpus tcpus <<<"${settings[$k]}"
            run "$name" "$icpus" "$tcpus" "$peers" "$r"
        done
    done
done
date -u
export MC_FORCE_TCP=1 MC_DISABLE_IPC=1 MC_LOG_LEVEL=warn PYTHONPATH=$H/site
for run in 1 2; do
    timeout 100 python3 tests/gpu/gpu_transfer.py main --duration 2 2>&1 \
        | grep -E '^\{|^FAIL|^PASS|Error' | sed "s/^/run $run: /" | tee -a "$O/gpu-transfer.log"
done
date -u
