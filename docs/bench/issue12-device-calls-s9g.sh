#!/usr/bin/env bash
# Session 9 (2026-12-01), seventh device call of issue 12, nvidia-h200 (16 CPUs): system-wide
# perf profiles (cpu-clock) of the serving workload with 1 and with 4 peers, writes, of
# `s9d` (callers send their batches and read the statuses themselves, sharded pins; symbols kept), to see
# where the 16 CPUs go now, by thread and by symbol within each kind of thread.
#
#   bash docs/bench/issue12-device-calls-s9g.sh
set -uo pipefail
H=$PWD/.gpucarry-s9
O="${OUT:-/tmp/s9-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
B=$H/s9d-sym
for peers in 1 4; do
    segs=()
    for i in $(seq 1 $peers); do
        "$B" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
            </dev/null >/tmp/t$i.log 2>&1 &
    done
    for i in $(seq 1 $peers); do
        for _ in $(seq 100); do grep -q segment_id= /tmp/t$i.log && break; sleep 0.1; done
        segs+=("$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t$i.log | head -1 | cut -d= -f2)")
    done
    seglist="$(IFS=,; echo "${segs[*]}")"
    "$B" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 --segment_id="$seglist" \
        --workload serving --operation=write --buffer_size=1073741824 --duration=5 --json \
        </dev/null >/tmp/init.out 2>/tmp/init.err &
    ip=$!
    sleep 1.5
    $PERF record -a -e cpu-clock -F 999 -o /tmp/p$peers.data -- sleep 3 >/dev/null 2>&1
    wait $ip
    echo "== $peers peers"; grep '^{' /tmp/init.out
    # One report pass (each takes long there): by thread and symbol, cut locally.
    timeout 100 $PERF report -i /tmp/p$peers.data --stdio --no-children --sort comm,dso,sym \
        --percent-limit 0.05 2>/dev/null | grep -v '^#' | grep -v '^$' | head -400 >"$O/profile-$peers.txt"
    kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
done
head -40 "$O/profile-4.txt"
date -u
