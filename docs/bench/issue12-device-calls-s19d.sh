#!/usr/bin/env bash
# Session 19 (2026-12-02), fourth device call of issue 12, nvidia-h200 (16 CPUs). Call 2
# (by mistake) measured the serving shape as reads: 10 threads, synchronous batches of 32
# reads of 32 KiB, moved 6-10 GB/s from one peer and 13.5-16.8 from four, against 22-29 for
# writes, with ten times the sleeps per request: a caller's batch of reads went out on its
# caller connection but its replies were that connection's receiver's, a second thread's
# wake-up per batch and the caller's after it. `reads` (branch commit 1f7d8bc): the caller
# reads the replies itself as they come; `main` (39a19cd). Same release bench flags, fresh
# processes per run, 4 rounds, order rotated; serving reads from 1 and 4 peers and serving
# writes to 4 peers (the write path's condition was reshaped).
#
#   bash docs/bench/issue12-device-calls-s19d.sh
set -uo pipefail
H=$PWD/.gpucarry-s19; xz -dkf "$H/bench.xz"; xz -dkf "$H/bench-r.xz"
O="${OUT:-/tmp/s19-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u
start_targets() { # bench
    tpids=(); segs=()
    for i in 1 2 3 4; do
        "$1" --mode=target --protocol=tcp --local_server_name=127.0.0.1 \
            --buffer_size=1073741824 </dev/null >/tmp/t$i.log 2>&1 &
        tpids+=($!)
        for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
        segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
    done
}
stop_targets() { kill "${tpids[@]}" 2>/dev/null; wait "${tpids[@]}" 2>/dev/null; }
run() { # name bench op peers round
    start_targets "$2"
    "$2" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 \
        --segment_id="$(IFS=,; echo "${segs[*]:0:$4}")" --workload=serving --operation="$3" \
        --buffer_size=1073741824 --duration=3 --json </dev/null 2>/dev/null | grep '^{' \
        | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps({'round': $5, 'build': '$1', 'op': '$3', 'peers': $4, **{k: round(d[k], 2) for k in ('gb_per_s','latency_p50_us','latency_p99_us','cpu_us_per_request','sleeps_per_request')}}))" \
        | tee -a "$O/reads.jsonl"
    stop_targets
}
builds=("main $H/bench" "reads $H/bench-r")
for r in 0 1 2 3; do
    for shape in "read 1" "read 4" "write 4"; do
        read -r op peers <<<"$shape"
        if (( r % 2 )); then order=(1 0); else order=(0 1); fi
        for k in "${order[@]}"; do
            read -r name bin <<<"${builds[$k]}"
            run "$name" "$bin" "$op" "$peers" "$r"
        done
    done
done
date -u
