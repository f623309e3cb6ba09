#!/usr/bin/env bash
# The benchmarks of docs/benchmarks.md that run on a lent GPU host (the `device` tool), one
# script for all of them, the benchmark and its rounds as parameters. Two steps:
#
#   scripts/bench-device.sh prepare [PART...]        # here: build what the GPU host lacks
#   scripts/bench-device.sh BENCH[,BENCH...] [N]     # there, from the repository root
#
#   run(command="bash scripts/bench-device.sh table,gpu 3",
#       carry=[".devcarry", "target/bench-carry"], kind="nvidia-h200")
#
# The GPU host has Python 3.12, PyTorch and CUDA 13, but no Rust, no compiler and no network:
# `prepare` puts our builds in $CARRY (default target/bench-carry, git-ignored; keep it and
# .devcarry/ under the 64 MiB a run carries). PARTs (default: bench wheel copy-ceiling):
#   bench          the release transfer_engine_bench, stripped, as bench.xz
#   no-metrics     the same built with --features no-metrics, as bench-no-metrics.xz
#   wheel          the wheel (scripts/build-wheel.sh) unzipped into wheel/, its .so stripped
#   copy-ceiling   scripts/lib/copy-ceiling.c built static
#   iperf          this host's iperf3 and the libraries the GPU host lacks, into iperf/
#   store-upstream upstream's store for the `store` benchmark: mooncake-transfer-engine-non-cuda
#                  0.3.13.post1 (cp312) trimmed to `mooncake.store` and `mooncake_master`,
#                  stripped, with the Debian libraries it needs, as store-upstream.tar.xz
# Upstream (mooncake-transfer-engine-cuda13 0.3.14) is .devcarry/, made by
# ../shared/tools/carry-upstream-for-gpu-host.sh.
#
# BENCH (N: rounds unless said; results and logs under $OUT, default /tmp/bench-device):
#   table          ours against upstream (MC_FORCE_TCP=1) through scripts/bench-compare.sh
#                  --gpu-host: 4 MiB and 64 KiB batches of 64, 4 KiB latency, the serving
#                  shapes; N rounds (3), order rotated. CASES, DURATION (2), HOST (127.0.0.1),
#                  CPUS (0-15) and OURS (default ours=$CARRY/bench) as bench-compare.sh takes
#                  them; SKIP_UPSTREAM_PY=1 compares builds of ours only.
#   link           the host's link to the GPU with no engine (scripts/lib/pcie-probe.py)
#   gpu            link, then GPU memory over TCP against host memory, 4 MiB x 64, two
#                  processes on one GPU (tests/gpu/gpu_transfer.py main, MC_DISABLE_IPC=1);
#                  N rounds (3) of DURATION (3) s; MIXED=1 adds the rows with GPU memory on
#                  one side
#   copy-ceiling   the serving shape's two copies per payload byte with no sockets, 1-20
#                  threads, N seconds each (3)
#   iperf          loopback iperf3, STREAMS (default "4 10 16 32") client/server pairs of
#                  LEN-byte writes (32K), N seconds (4)
#   fresh          a fresh target and initiator per run, N runs per setting (12), one
#                  initiator thread, 2 s: CASE ("read 65536 64"), SETTINGS (space-separated
#                  NAME[@VAR=VALUE,...]; a VAR written T:VAR is the target's only, I:VAR the
#                  initiator's; default "default"), order rotated; records each process's
#                  AnonHugePages 1 s in
#   metrics-ab     metrics off (bench-no-metrics) against on (bench), 4 KiB latency, N rounds
#                  (10) of DURATION (2) s, pinned to CPUS (0-15): scripts/metrics-ab.sh
#   store          Mooncake Store, ours (wheel) against upstream's (store-upstream), host memory
#                  over TCP: bench/store/store_bench.py --raw, N rounds (3) of DURATION (3) s
#   on-cuda        the `*_on_cuda` calls (tests/gpu/on_cuda.py): ordering checked and timed on
#                  cuda:0, GPU and pinned host memory, 1 and 64 MiB, ours ($CARRY/wheel) and,
#                  with .devcarry/, upstream 0.3.14 in the same run; N rounds (2), order rotated
#   ipc            same-host GPU IPC against native copy loops and TCP, kind nvidia-h200-x2
#                  (tests/gpu/run_ipc_on_device.sh --threads, the wheel from $CARRY); with
#                  .devcarry/, the nvlink_intra interop with upstream too
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
CARRY="${CARRY:-$REPO/target/bench-carry}"
log() { printf 'bench-device: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

# --- here: prepare ------------------------------------------------------------------------
prepare() {
    set -e
    local parts=("$@")
    [ ${#parts[@]} -gt 0 ] || parts=(bench wheel copy-ceiling)
    mkdir -p "$CARRY"
    local tgt="${CARGO_TARGET_DIR:-$REPO/target}"
    for p in "${parts[@]}"; do
        case $p in
        bench)
            cargo build --release -p transfer-engine-bench
            strip -o "$CARRY/bench" "$tgt/release/transfer_engine_bench"
            xz -f "$CARRY/bench" ;;
        no-metrics)
            cargo build --release -p transfer-engine-bench --features no-metrics
            strip -o "$CARRY/bench-no-metrics" "$tgt/release/transfer_engine_bench"
            xz -f "$CARRY/bench-no-metrics"
            cargo build --release -p transfer-engine-bench ;;   # leave the normal build in place
        wheel)
            local whl
            whl="$(scripts/build-wheel.sh | tail -n1)"
            rm -rf "$CARRY/wheel" && mkdir -p "$CARRY/wheel"
            python3 -m zipfile -e "$whl" "$CARRY/wheel"
            find "$CARRY/wheel" -name '*.so' -exec strip {} + ;;
        copy-ceiling)
            "${CC:-cc}" -O2 -pthread -static -o "$CARRY/copy-ceiling" scripts/lib/copy-ceiling.c ;;
        iperf)
            local bin
            bin="$(command -v iperf3)" || die "no iperf3 here (apt-get install iperf3)"
            rm -rf "$CARRY/iperf" && mkdir -p "$CARRY/iperf"
            cp "$bin" "$CARRY/iperf/"
            ldd "$bin" | awk '/libiperf|libsctp/ {print $3}' | xargs -r cp -L -t "$CARRY/iperf/" ;;
        store-upstream)
            local t
            t=$(mktemp -d)
            python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
                --implementation cp --platform manylinux_2_28_x86_64 -d "$t" \
                mooncake-transfer-engine-non-cuda==0.3.13.post1
            mkdir -p "$t/w" "$t/up/mooncake" "$t/up/libs"
            (cd "$t/w" && python3 -m zipfile -e "$t"/*.whl .)
            cp "$t"/w/mooncake/*.py "$t"/w/mooncake/{store.so,libasio.so,libetcd_wrapper.so,mooncake_master} "$t/up/mooncake/"
            cp -r "$t"/w/mooncake_transfer_engine_non_cuda.libs "$t/up/"
            chmod +x "$t/up/mooncake/mooncake_master"
            strip "$t"/up/mooncake/*.so "$t/up/mooncake/mooncake_master" "$t"/up/mooncake_transfer_engine_non_cuda.libs/*
            (cd "$t" && for d in libnuma1 libnghttp2-14 librtmp1 libssh2-1 libpsl5 libldap-2.5-0 libunistring2 \
                libsasl2-2 libibverbs1 libnl-3-200 libnl-route-3-200; do apt-get download "$d" >/dev/null 2>&1 || die "apt-get download $d"; done
             for d in ./*.deb; do dpkg -x "$d" x; done)
            cp -a "$t"/x/usr/lib/x86_64-linux-gnu/*.so* "$t/up/libs/"
            cp -a "$t"/x/lib/x86_64-linux-gnu/*.so* "$t/up/libs/" 2>/dev/null || true
            cp -aL /usr/lib/x86_64-linux-gnu/libcurl.so.4 "$t/up/libs/"   # libcurl4: this host's
            tar -C "$t" -cJf "$CARRY/store-upstream.tar.xz" up
            rm -rf "$t" ;;
        *) die "unknown part '$p' (bench no-metrics wheel copy-ceiling iperf store-upstream)" ;;
        esac
    done
    du -sh --apparent-size "$CARRY" .devcarry 2>/dev/null >&2 || true
}

# --- there: the benchmarks ----------------------------------------------------------------
O="${OUT:-/tmp/bench-device}"
unpack() {  # unpack NAME: $CARRY/NAME from NAME.xz (a plain NAME alone is used as it is)
    if [ -f "$CARRY/$1.xz" ]; then xz -dkf "$CARRY/$1.xz" || die "cannot unpack $CARRY/$1.xz"
    elif [ ! -x "$CARRY/$1" ]; then die "no $CARRY/$1(.xz): scripts/bench-device.sh prepare"; fi
}

b_table() {
    local n=${1:-3}
    unpack bench
    BENCH_REPO=$REPO PEER_PY=tests/interop/upstream_peer.py OUT_DIR="$O/table" \
        OURS="${OURS:-ours=$CARRY/bench}" ROUNDS="$n" DURATION="${DURATION:-2}" \
        timeout 500 bash scripts/bench-compare.sh --gpu-host 2>"$O/table.err"
    grep -h '"error"' "$O/table/results.jsonl"; tail -n 2 "$O/table.err"
    cp "$O/table/results.jsonl" "$O/table.jsonl"
}

b_link() {
    timeout 150 python3 scripts/lib/pcie-probe.py --duration 2 2>&1 | tee "$O/link.jsonl"
}

b_gpu() {
    local n=${1:-3}
    [ -d "$CARRY/wheel" ] || die "no $CARRY/wheel: scripts/bench-device.sh prepare wheel"
    b_link
    MC_LOG_LEVEL=warn PYTHONPATH=$CARRY/wheel timeout 400 python3 tests/gpu/gpu_transfer.py main \
        --rounds "$n" --duration "${DURATION:-3}" ${MIXED:+--mixed} 2>&1 | tee "$O/gpu-transfer.log"
}

b_copy_ceiling() {
    [ -x "$CARRY/copy-ceiling" ] || die "no $CARRY/copy-ceiling: scripts/bench-device.sh prepare copy-ceiling"
    lscpu | grep -E "Model name|^CPU\(s\)|L2|L3|NUMA node\(s\)"
    timeout 300 "$CARRY/copy-ceiling" "${1:-3}" | tee "$O/copy-ceiling.jsonl"
}

b_iperf() {
    local secs=${1:-4} len=${LEN:-32K} n d i pids
    [ -x "$CARRY/iperf/iperf3" ] || die "no $CARRY/iperf/iperf3: scripts/bench-device.sh prepare iperf"
    for n in ${STREAMS:-4 10 16 32}; do
        d=$(mktemp -d) pids=()
        for i in $(seq "$n"); do
            LD_LIBRARY_PATH=$CARRY/iperf "$CARRY/iperf/iperf3" -s -1 -p $((5300 + i)) -B 127.0.0.1 >/dev/null 2>&1 &
            pids+=($!)
        done
        sleep 0.5
        for i in $(seq "$n"); do
            LD_LIBRARY_PATH=$CARRY/iperf "$CARRY/iperf/iperf3" -c 127.0.0.1 -p $((5300 + i)) \
                -t "$secs" -l "$len" -J >"$d/c$i.json" 2>&1 &
            pids+=($!)
        done
        wait "${pids[@]}"   # named: a bare wait would also wait for this script's own tee
        python3 - "$d" "$n" "$len" <<'PY' | tee -a "$O/iperf.jsonl"
import glob, json, sys
d, n, ln = sys.argv[1:]
tot, hc, rc = 0.0, [], []
for f in glob.glob(d + "/c*.json"):
    e = json.load(open(f))["end"]
    tot += e["sum_received"]["bits_per_second"] / 8e9
    hc.append(e["cpu_utilization_percent"]["host_total"])
    rc.append(e["cpu_utilization_percent"]["remote_total"])
print(json.dumps({"impl": "iperf3", "case": f"ceiling-{n}streams-{ln}", "gbps": round(tot, 3),
                  "client_cpu_pct_sum": round(sum(hc), 1), "server_cpu_pct_sum": round(sum(rc), 1)}))
PY
        rm -rf "$d"
    done
}

fresh_one() {  # fresh_one SETTING REP OP BLOCK BATCH
    local name=${1%%@*} vars="" te=() ie=() v T P SEG I TH IH
    [[ $1 == *@* ]] && vars=${1#*@}
    IFS=, read -ra vs <<<"$vars"
    for v in "${vs[@]}"; do
        case $v in T:*) te+=("${v#T:}") ;; I:*) ie+=("${v#I:}") ;; *) te+=("$v"); ie+=("$v") ;; esac
    done
    T=$(mktemp)
    env "${te[@]}" "$CARRY/bench" --mode=target --local_server_name=127.0.0.1 --buffer_size=$((256 << 20)) \
        >"$T" 2>&1 </dev/null &
    P=$!
    for _ in $(seq 100); do grep -q segment_id= "$T" && break; sleep 0.1; done
    SEG=$(grep -o 'segment_id=[^ ]*' "$T" | head -n1 | cut -d= -f2)
    env "${ie[@]}" "$CARRY/bench" --mode=initiator --local_server_name=127.0.0.1 --segment_id="$SEG" \
        --operation="$3" --block_size="$4" --batch_size="$5" --buffer_size=$((256 << 20)) \
        --duration=2 --threads=1 --json </dev/null >"$T.i" 2>/dev/null &
    I=$!
    sleep 1
    TH=$(awk '/AnonHugePages/ {print $2}' "/proc/$P/smaps_rollup" 2>/dev/null)
    IH=$(awk '/AnonHugePages/ {print $2}' "/proc/$I/smaps_rollup" 2>/dev/null)
    wait "$I"
    grep '^{' "$T.i" | SETTING=$name REP=$2 TH=${TH:-0} IH=${IH:-0} python3 -c '
import json, os, sys
r = json.loads(sys.stdin.read())
r.update(setting=os.environ["SETTING"], rep=int(os.environ["REP"]),
         target_anon_huge_kb=int(os.environ["TH"]), initiator_anon_huge_kb=int(os.environ["IH"]))
print(json.dumps(r))' | tee -a "$O/fresh.jsonl" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print(r["setting"], r["rep"], r["operation"], r["block_size"], "x", r["batch_size"], round(r["gb_per_s"], 2), "GB/s",
      "p99", round(r["latency_p99_us"]), "cpu/req", round(r["cpu_us_per_request"], 1),
      "huge kB", r["target_anon_huge_kb"], r["initiator_anon_huge_kb"])'
    kill "$P"; wait "$P" 2>/dev/null; rm -f "$T" "$T.i"
}

b_fresh() {
    local n=${1:-12} op block batch rep k s
    unpack bench
    read -r op block batch <<<"${CASE:-read 65536 64}"
    read -ra settings <<<"${SETTINGS:-default}"
    sysctl net.ipv4.tcp_congestion_control net.core.default_qdisc 2>&1
    echo "thp: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)"
    for rep in $(seq "$n"); do
        for k in $(seq 0 $((${#settings[@]} - 1))); do   # order rotated per repetition
            s=${settings[$(((k + rep - 1) % ${#settings[@]}))]}
            fresh_one "$s" "$rep" "$op" "$block" "$batch"
        done
    done
}

b_metrics_ab() {
    unpack bench; unpack bench-no-metrics
    OFF_BIN=$CARRY/bench-no-metrics ON_BIN=$CARRY/bench DURATION="${DURATION:-2}" KEEP="$O/metrics-ab.jsonl" \
        timeout 550 bash scripts/metrics-ab.sh "${1:-10}"
}

b_store() {  # wrappers give each store a `python` and a `mooncake_master` side by side
    local w=/tmp/bench-store u
    [ -d "$CARRY/wheel" ] || die "no $CARRY/wheel: scripts/bench-device.sh prepare wheel"
    [ -f "$CARRY/store-upstream.tar.xz" ] || die "no $CARRY/store-upstream.tar.xz: scripts/bench-device.sh prepare store-upstream"
    rm -rf "$w" && mkdir -p "$w/ours" "$w/upstream"
    tar -C "$w" -xJf "$CARRY/store-upstream.tar.xz"
    u=$w/up
    printf '#!/bin/sh\nPYTHONPATH=%s exec python3 "$@"\n' "$CARRY/wheel" >"$w/ours/python"
    printf '#!/bin/sh\nPYTHONPATH=%s exec python3 -c "import sys; sys.argv[0] = %s; from mooncake._cli import mooncake_master; mooncake_master()" "$@"\n' \
        "$CARRY/wheel" "'mooncake_master'" >"$w/ours/mooncake_master"
    printf '#!/bin/sh\nPYTHONPATH=%s LD_LIBRARY_PATH=%s exec python3 "$@"\n' "$u" "$u/libs" >"$w/upstream/python"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$u/libs" "$u/mooncake/mooncake_master" >"$w/upstream/mooncake_master"
    chmod +x "$w"/ours/* "$w"/upstream/*
    timeout 550 python3 bench/store/store_bench.py --ours "$w/ours/python" --upstream "$w/upstream/python" \
        --rounds "${1:-3}" --seconds "${DURATION:-3}" --raw 2>&1 | tee "$O/store.log"
}

b_on_cuda() {  # each implementation and memory kind in its own process: a hang costs one row
    local n=${1:-2} r i k rc impls env
    [ -d "$CARRY/wheel" ] || die "no $CARRY/wheel: scripts/bench-device.sh prepare wheel"
    impls=(ours); [ -d .devcarry/up ] && impls+=(upstream)
    for r in $(seq "$n"); do
        [ $((r % 2)) -eq 0 ] && impls=("${impls[@]:1}" "${impls[0]}")
        for i in "${impls[@]}"; do
            for k in pinned cuda; do
                if [ "$i" = ours ]; then env=(PYTHONPATH="$CARRY/wheel")
                else env=(LD_LIBRARY_PATH="$REPO/.devcarry/libs:/usr/local/cuda-13.0/targets/x86_64-linux/lib"
                          PYTHONPATH="$REPO/.devcarry/up" MC_FORCE_TCP=1); fi
                env "${env[@]}" timeout "${ON_CUDA_TIMEOUT:-90}" python3 tests/gpu/on_cuda.py --impl "$i" \
                    --kinds "$k" 2>"$O/on-cuda-$i-$k-$r.err" | sed "s/^{/{\"round\": $r, /" >>"$O/on-cuda.jsonl"
                rc=${PIPESTATUS[0]}
                [ "$rc" = 124 ] && echo "{\"round\": $r, \"impl\": \"$i\", \"memory\": \"$k\", \"error\": \"timed out after ${ON_CUDA_TIMEOUT:-90} s\"}" >>"$O/on-cuda.jsonl"
                echo "on-cuda $i $k round $r exit $rc"
            done
        done
    done
    python3 - "$O/on-cuda.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "call" in r or "error" in r:
        print(r["round"], r["impl"], r.get("call", "-"), r.get("memory"), r.get("bytes", 0) >> 20, "MiB",
              "wrong", r.get("wrong"), r.get("gbps"), "GB/s", "p50", r.get("done_p50_us"), "returned",
              r.get("return_p50_us"), r.get("error", ""))
PY
}

b_ipc() {
    local h
    [ -d "$CARRY/wheel" ] || die "no $CARRY/wheel: scripts/bench-device.sh prepare wheel"
    h=$(mktemp -d)
    cp tests/gpu/gpu_ipc.py tests/gpu/gpu_transfer.py tests/gpu/ipc_interop.py tests/gpu/run_ipc_on_device.sh "$h/"
    ln -s "$CARRY/wheel" "$h/site"
    if [ -d .devcarry/up ]; then ln -s "$REPO/.devcarry/up" "$h/up"; ln -s "$REPO/.devcarry/libs" "$h/libs"; fi
    MC_LOG_LEVEL=info OUT=$O bash "$h/run_ipc_on_device.sh" --threads
}

[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 64; }
if [ "$1" = prepare ]; then shift; prepare "$@"; exit; fi
IFS=, read -ra BENCHES <<<"$1"
N="${2:-}"
mkdir -p "$O"
exec > >(tee -a "$O/run.log") 2>&1
date -u; nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null
git -C "$REPO" rev-parse --short HEAD 2>/dev/null
for b in "${BENCHES[@]}"; do
    log "$b ${N:-(default rounds)} $(date -u +%T)"
    case $b in
    table | link | gpu | iperf | fresh | store | ipc) "b_$b" $N ;;
    copy-ceiling) b_copy_ceiling $N ;;
    on-cuda) b_on_cuda $N ;;
    metrics-ab) b_metrics_ab $N ;;
    *) die "unknown benchmark '$b' (table link gpu copy-ceiling iperf fresh metrics-ab store on-cuda ipc)" ;;
    esac
done
date -u
