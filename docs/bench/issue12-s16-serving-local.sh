#!/bin/bash
# Session 16: the serving shape on this host (10 threads, batches of 32 x 32 KiB, 1 or more
# target processes), with the targets' CPU per request from /proc. Environment passes to both.
#   bash docs/bench/issue12-s16-serving-local.sh BENCH_BIN [threads] [seconds] [peers]
B=$1; TH=${2:-10}; D=${3:-3}; NP=${4:-1}
pids=(); segs=()
for i in $(seq $NP); do
$B --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=268435456 </dev/null >/tmp/lt$i.log 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q segment_id= /tmp/lt$i.log && break; sleep 0.1; done
segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/lt$i.log | head -1 | cut -d= -f2)")
done
cpu() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14+$15}' /proc/$p/stat))); done; echo $t; }
c0=$(cpu)
$B --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 --segment_id="$(IFS=,; echo "${segs[*]}")" --operation=write --block_size=32768 --batch_size=32 --threads=$TH --buffer_size=268435456 --duration=$D --json </dev/null 2>/dev/null | grep '^{' > /tmp/li.json
c1=$(cpu)
python3 - $c0 $c1 <<'P'
import json,sys
d=json.load(open('/tmp/li.json')); c0,c1=map(int,sys.argv[1:3])
tck=100
print(f"GB/s {d['gb_per_s']:.2f} init cpu/req {d['cpu_us_per_request']:.2f} us  target cpu/req {(c1-c0)/tck*1e6/d['requests']:.2f} us  p50 {d['latency_p50_us']:.0f} p99 {d['latency_p99_us']:.0f}")
P
kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null
