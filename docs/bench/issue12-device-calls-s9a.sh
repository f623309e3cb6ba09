#!/usr/bin/env bash
# Session 9 (2026-12-01), first device call of issue 12, nvidia-h200 (16 CPUs).
# 1. The loopback TCP ceiling for the serving shape: N iperf3 (3.12, Debian 12) client
#    processes, each to its own server process, 32 KiB writes, all on CPUs 0-15; the sum of
#    what the servers received, and the CPU each side reported.
# 2. Serving with 1 and 4 peers: upstream 0.3.14 against `cur` (f69036d) with defaults and
#    with the spin, lane budget varied; 2 rounds, order rotated.
#
#   bash docs/bench/issue12-device-calls-s9a.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc; uname -r
export LD_LIBRARY_PATH=$H/lib
ceiling() { # $1 streams, $2 write size
    local n=$1 len=$2 d=/tmp/iperf-$1-$2; rm -rf "$d"; mkdir -p "$d"
    for i in $(seq 1 "$n"); do "$H/iperf3" -s -1 -p $((5300 + i)) -B 127.0.0.1 >/dev/null 2>&1 & done
    sleep 0.5
    for i in $(seq 1 "$n"); do
        "$H/iperf3" -c 127.0.0.1 -p $((5300 + i)) -t 4 -l "$len" -J >"$d/c$i.json" 2>&1 &
    done
    wait
    python3 - "$d" "$n" "$len" <<'PY'
import json, sys, glob
d, n, ln = sys.argv[1:]
tot = 0.0; hc = []; rc = []
for f in glob.glob(d + "/c*.json"):
    j = json.load(open(f)); e = j["end"]
    tot += e["sum_received"]["bits_per_second"] / 8e9
    hc.append(e["cpu_utilization_percent"]["host_total"]); rc.append(e["cpu_utilization_percent"]["remote_total"])
print(json.dumps({"impl": "iperf3", "case": f"ceiling-{n}streams-{ln}", "gbps": round(tot, 3),
                  "client_cpu_pct_sum": round(sum(hc), 1), "server_cpu_pct_sum": round(sum(rc), 1)}))
PY
}
for n in 4 10 16 32; do ceiling "$n" 32K; done | tee "$O/ceiling.jsonl"
ceiling 16 128K | tee -a "$O/ceiling.jsonl"
BENCH_REPO=$PWD PEER_PY=tests/interop/upstream_peer.py OUT_DIR=/tmp/s9/cmp \
    OURS="cur=$H/cur cur-nospin=$H/cur@MC_TCP_SPIN_US=0 cur-b8=$H/cur@MC_TCP_LANE_BUDGET=8 cur-b32=$H/cur@MC_TCP_LANE_BUDGET=32" \
    CASES="serving-1peer serving-4peers" ROUNDS=2 DURATION=2 timeout 420 bash scripts/bench-compare.sh --gpu-host 2>/tmp/cmp.err
cp /tmp/s9/cmp/results.jsonl "$O/cmp.jsonl"
tail -n 3 /tmp/cmp.err
date -u
