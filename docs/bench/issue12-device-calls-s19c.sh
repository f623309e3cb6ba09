#!/usr/bin/env bash
# Session 19 (2026-12-02), third device call of issue 12, nvidia-h200 (16 CPUs). In the
# serving shape a caller's batch spends ~190 us sending and ~165 us more waiting for its
# statuses, while the peer thread needs ~220 us of CPU per batch: the peer's copy mostly
# follows the send instead of running beside it. Is that the scheduler putting the woken
# peer thread on the sender's CPU (the guest's idle-CPU search is short at ~78% busy)? Here
# the same release bench (main with the all-busy rule, .gpucarry-s19/bench.xz) with every
# process on all 16 CPUs (`all`) against the initiator on CPUs 0-7 and the 4 targets on
# 8-15 (`split`: a target thread can never share the sender's CPU), 3 rounds, order
# rotated, fresh processes per run; this time writes (call 2 ran reads by mistake).
# First the issue's table for the same build.
#
#   bash docs/bench/issue12-device-calls-s19c.sh
set -uo pipefail
H=$PWD/.gpucarry-s19; xz -dkf "$H/bench.xz"
O="${OUT:-/tmp/s19-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
B=$H/bench
# The issue's table: main with the all-busy rule against upstream 0.3.14 (MC_FORCE_TCP=1),
# every case, 3 rounds, order rotated, as session 18's call 4. Carry .devcarry/ too.
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/cmp" OURS="ours=$B" \
    ROUNDS=3 DURATION=2 timeout 420 bash scripts/bench-compare.sh --gpu-host 2>"$O/compare.err"
grep -h '"error"' "$O/cmp/results.jsonl"; tail -n 2 "$O/compare.err"
cp "$O/cmp/results.jsonl" "$O/results.jsonl"
(cd "$O/cmp" && tar czf "$O/cmp-logs.tgz" logs 2>/dev/null && rm -rf logs)
date -u
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
        --segment_id="$(IFS=,; echo "${segs[*]:0:$4}")" --workload=serving --operation=write \
        --buffer_size=1073741824 --duration=3 --json </dev/null 2>/dev/null | grep '^{' \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'round': $5, 'setting': '$1', 'peers': $4, **{k: round(d[k], 2) for k in ('gb_per_s','latency_p50_us','latency_p99_us','cpu_us_per_request','sleeps_per_request')}}))" \
        | tee -a "$O/split.jsonl"
    stop_targets
}
settings=("all 0-15 0-15" "split 0-7 8-15")
for r in 0 1 2; do
    for peers in 4 1; do
        if (( r % 2 )); then order=(1 0); else order=(0 1); fi
        for k in "${order[@]}"; do
            read -r name icpus tcpus <<<"${settings[$k]}"
            run "$name" "$icpus" "$tcpus" "$peers" "$r"
        done
    done
done
date -u
date -u
