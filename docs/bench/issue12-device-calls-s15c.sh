#!/usr/bin/env bash
# Session 15 (2026-12-01), fifth device call of issue 12, nvidia-h200 (16 CPUs): why do 64 KiB
# x 64 reads move less than the same writes (12.0-12.3 against 15.5-16.8 GB/s in call 2)?
# System-wide perf profiles (cpu-clock, 999 Hz, 3 s) of each, main (814143f) with its
# symbols, one target, one initiator thread, by thread and by symbol within each kind of
# thread; the figures of the profiled runs and of runs without perf. Carry .gpucarry-s15p/
# (perf.txz: Debian 12's perf and its libraries; main-sym: the bench, debug info stripped).
#
#   bash docs/bench/issue12-device-calls-s15c.sh
set -uo pipefail
H=$PWD/.gpucarry-s15p
O="${OUT:-/tmp/s15-out}"; mkdir -p "$O"
exec > >(tee "$O/run.log") 2>&1
date -u; nproc
tar xJf "$H/perf.txz" -C /tmp
PERF="env LD_LIBRARY_PATH=/tmp/perf/lib /tmp/perf/perf"
B=$H/main-sym
"$B" --mode=target --protocol=tcp --local_server_name=127.0.0.1 --buffer_size=1073741824 \
    </dev/null >/tmp/t.log 2>&1 &
for _ in $(seq 100); do grep -q segment_id= /tmp/t.log && break; sleep 0.1; done
seg="$(grep -oE 'segment_id=[0-9.]+:[0-9]+' /tmp/t.log | head -1 | cut -d= -f2)"
run() { # op duration
    "$B" --mode=initiator --protocol=tcp --local_server_name=127.0.0.1 --segment_id="$seg" \
        --operation="$1" --block_size=65536 --batch_size=64 --threads=1 \
        --buffer_size=1073741824 --duration="$2" --json </dev/null 2>/dev/null | grep '^{'
}
for op in read write read write; do echo "plain $op: $(run $op 2)"; done
for op in read write; do
    run $op 5 >/tmp/$op.out &
    ip=$!
    sleep 1.5
    $PERF record -a -e cpu-clock -F 999 -o /tmp/p-$op.data -- sleep 3 >/dev/null 2>&1
    wait $ip
    echo "profiled $op: $(cat /tmp/$op.out)"
    {
        echo "== $op, by thread"
        $PERF report -i /tmp/p-$op.data --stdio --no-children --sort comm --percent-limit 0.5 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
        echo "== $op, by symbol"
        $PERF report -i /tmp/p-$op.data --stdio --no-children --sort dso,sym --percent-limit 0.3 2>/dev/null | grep -v '^#' | grep -v '^$' | head -60
        for c in bench te-lane te-recv te-tcp-conn; do
            echo "-- $op, comm prefix $c"
            $PERF report -i /tmp/p-$op.data --stdio --no-children --sort comm,sym --percent-limit 0.1 2>/dev/null \
                | grep -v '^#' | grep -E "^ +[0-9.]+% +$c" | head -40
        done
    } >"$O/profile-$op.txt" 2>&1
done
kill $(jobs -p) 2>/dev/null; wait 2>/dev/null
head -12 "$O/profile-read.txt"; head -12 "$O/profile-write.txt"
date -u
