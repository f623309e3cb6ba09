#!/usr/bin/env bash
# Session 25 (2026-12-03), second device call of issue 12, nvidia-h200 (16 CPUs): are the
# slow rounds of 64 KiB reads (10.2 GB/s against 15.0-16.6 in call 1, 2.6-3.9x upstream in
# sessions 18-19) bbr's pacing of a connection? Fresh target and initiator per run, one
# initiator thread, 2 s per run; settings by MC_TCP_SAME_HOST_CC per process:
#   sys  both the system's (bbr here): main's default on 16 CPUs
#   srv  the target (whose accepted connections send reads' data) reno, the initiator's
#   all  both reno
# Rotated per repetition. `ss -tin` of the loopback connections 1 s into each run (pacing
# rate, cwnd, rtt per connection). Carry .gpucarry-s25/ (N.xz, 3b96716's release bench).
#
#   bash docs/bench/issue12-device-calls-s25b.sh
set -uo pipefail
H=$PWD/.gpucarry-s25; xz -dkf "$H/N.xz"; N=$H/N
O="${OUT:-/tmp/s25-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; sysctl net.ipv4.tcp_congestion_control net.core.default_qdisc 2>&1
BUF=$((256 << 20))
one() {  # one SETTING OP BLOCK BATCH REP
    local s=$1 tcc icc T P SEG
    case $s in sys) tcc=system icc=system ;; srv) tcc=reno icc=system ;; all) tcc=reno icc=reno ;; esac
    T=$(mktemp)
    MC_TCP_SAME_HOST_CC=$tcc "$N" --mode=target --local_server_name=127.0.0.1 --buffer_size=$BUF >"$T" 2>&1 </dev/null &
    P=$!
    for _ in $(seq 100); do grep -q segment_id= "$T" && break; sleep 0.1; done
    SEG=$(grep -o 'segment_id=[^ ]*' "$T" | head -n1 | cut -d= -f2)
    local SP
    (sleep 1; echo "== $s $2 $3 $4 rep $5"; ss -tin state established '( sport >= :10000 )' 2>&1 | grep -A1 '127.0.0.1' | grep -o 'bbr\|reno\|cubic\|pacing_rate [^ ]*\|delivery_rate [^ ]*\|cwnd:[0-9]*\|rtt:[^ ]*\|app_limited' | tr '\n' ' '; echo) >>"$O/ss.txt" &
    SP=$!
    MC_TCP_SAME_HOST_CC=$icc "$N" --mode=initiator --local_server_name=127.0.0.1 --segment_id="$SEG" \
        --operation="$2" --block_size="$3" --batch_size="$4" --buffer_size=$BUF --duration=2 \
        --threads=1 --json </dev/null 2>/dev/null | grep '^{' |
        python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['setting']='$s'; r['rep']=$5; print(json.dumps(r))" |
        tee -a "$O/fresh.jsonl" | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(r['setting'], r['operation'], r['block_size'], round(r['gb_per_s'],2), round(r['latency_p50_us']), round(r['latency_p99_us']), round(r['cpu_us_per_request'],1), round(r['sleeps_per_request'],3))"
    wait "$SP"
    kill $P; wait $P 2>/dev/null; rm -f "$T"
}
for rep in $(seq "${READ_REPS:-12}"); do
    case $((rep % 3)) in 1) order="sys srv all" ;; 2) order="srv all sys" ;; 0) order="all sys srv" ;; esac
    for s in $order; do one $s read 65536 64 $rep; done
done
for rep in $(seq "${OTHER_REPS:-4}"); do
    case $((rep % 3)) in 1) order="sys srv all" ;; 2) order="srv all sys" ;; 0) order="all sys srv" ;; esac
    for s in $order; do one $s write 65536 64 $rep; one $s read 4194304 64 $rep; done
done
date -u
