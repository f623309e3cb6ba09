#!/usr/bin/env bash
# Loopback benchmark: the socket limit (single-stream iperf3), the published upstream engine
# (Python harness tests/interop/upstream_peer.py, and the wheel's own C++
# transfer_engine_bench), and ours (target/release/transfer_engine_bench), all over TCP on
# 127.0.0.1 with the P2P handshake.
#
#   scripts/bench-compare.sh                 # results table on stdout
#   scripts/bench-compare.sh --gpu-host      # the issue-12 comparison on the GPU host, one call
#
# Environment:
#   OURS_BENCH      our bench binary (default: $REPO/target/release/transfer_engine_bench);
#                   its part is skipped with a note when the file is missing
#   UPSTREAM_PY     the upstream venv's python (default: what scripts/setup-upstream.sh prints)
#   DURATION        seconds per throughput case (default 5); latency cases use the same
#   THREADS         submission threads for the bench binaries and the harness (default 1)
#   BUFFER_SIZE     bench buffer bytes (default 1073741824); must be >= THREADS*64*4MiB
#   IPERF_PORT      iperf3 port (default 5201)
#   OUT_DIR         results and logs (default: $REPO/target/bench-compare)
#   HOST            the name every engine is given and peers reach it by (default 127.0.0.1;
#                   a host name, such as localhost, measures what name lookups cost)
#   SKIP_IPERF=1, SKIP_UPSTREAM_PY=1, SKIP_UPSTREAM_BENCH=1, SKIP_OURS=1, SKIP_CROSS=1
#
# Results: one JSON object per line in $OUT_DIR/results.jsonl, keys impl, case, gbps,
# req_per_s, p50_us, p99_us (absent where they do not apply); a markdown table on stdout.
# GB/s is 1e9 bytes per second. Logs of every process are in $OUT_DIR/logs/.
#
# --gpu-host: everything on the `device` tool's H200 host in one call (it has Python 3.12, no
# Rust, no network). Upstream: mooncake-transfer-engine-cuda13 0.3.14 through the Python
# harness (tests/interop/upstream_peer.py, or $PEER_PY); ours: transfer_engine_bench builds.
# Carry (paths from the repository root, where the command runs):
#   .devcarry/        made here by ../shared/tools/carry-upstream-for-gpu-host.sh (~50 MiB)
#   .gpucarry-NAME/   our stripped release transfer_engine_bench build(s) and, when the device
#                     runs another checkout's tree, this script and upstream_peer.py
# Environment of this mode:
#   OURS       space-separated NAME=BIN[@VAR=VALUE[,VAR=VALUE...]] (default
#              ours=$OURS_BENCH): each runs as target and initiator with those variables
#   CPUS       taskset CPU list for every process (default 0-15: the 16-core figures)
#   ROUNDS     rounds over all implementations, order rotated each round (default 1)
#   DURATION   seconds per case (default 2 in this mode); CASES: which cases (default all:
#              write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB
#              lat-read-4KiB serving-1peer serving-4peers); serving-read-1peer and
#              serving-read-4peers (the serving shapes as reads) run when named
#   OUT_DIR    default $OUT when set (the device tool's output folder)
#   SKIP_UPSTREAM_PY=1  ours only (variants of ours against each other)
#   BENCH_REPO the checkout holding .devcarry/ (default: this script's); set it when this
#              script itself was carried in a folder of another checkout
# Serving cases: 10 threads, each a synchronous batch of 32 writes of 32 KiB at a time, to
# one target or spread over four (batch n of thread t to target (t+n) mod 4); gbps is the
# aggregate, batch_p50_us / batch_p99_us per batch. Latency cases: one 4 KiB request at a
# time, p50_us / p99_us per request. Ours adds cpu_us_per_request and sleeps_per_request
# (the initiator process's CPU time and voluntary context switches over its requests).
#
# Cases (same for every implementation):
#   write-4MiBx64, read-4MiBx64     block 4 MiB, batch 64
#   write-64KiBx64, read-64KiBx64   block 64 KiB, batch 64
#   lat-write-4KiB, lat-read-4KiB   harness: single 4 KiB transfer_sync_* one at a time (p50/p99);
#                                   bench binaries: block 4 KiB, batch 1, 1 thread (req/s only,
#                                   so mean latency = 1/req_per_s)
set -euo pipefail

REPO="${BENCH_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
OURS_BENCH="${OURS_BENCH:-$REPO/target/release/transfer_engine_bench}"
GPU_HOST=0
if [ "${1:-}" = "--gpu-host" ]; then
    GPU_HOST=1
    DURATION="${DURATION:-2}"
    OUT_DIR="${OUT_DIR:-${OUT:-$REPO/target/bench-compare}}"
    BUFFER_SIZE="${BUFFER_SIZE:-536870912}"
fi
DURATION="${DURATION:-5}"
THREADS="${THREADS:-1}"
BUFFER_SIZE="${BUFFER_SIZE:-1073741824}"
IPERF_PORT="${IPERF_PORT:-5201}"
OUT_DIR="${OUT_DIR:-$REPO/target/bench-compare}"
HOST="${HOST:-127.0.0.1}"
PEER_PY="${PEER_PY:-$REPO/tests/interop/upstream_peer.py}"

export MC_FORCE_TCP=1

mkdir -p "$OUT_DIR/logs"
RESULTS="$OUT_DIR/results.jsonl"
: >"$RESULTS"
LOGS="$OUT_DIR/logs"

log() { printf 'bench-compare: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- cleanup: every background process we start is tracked by pid ----------------------
BG_PIDS=()
IPERF_PIDFILE="$OUT_DIR/iperf3.pid"
cleanup() {
    local pid
    for pid in "${BG_PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${BG_PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ -s "$IPERF_PIDFILE" ]; then
        kill -TERM "$(cat "$IPERF_PIDFILE")" 2>/dev/null || true
        rm -f "$IPERF_PIDFILE"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

stop_bg() {  # stop_bg PID: stop one background process we started
    local pid="$1" keep=() p
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for p in "${BG_PIDS[@]}"; do [ "$p" = "$pid" ] || keep+=("$p"); done
    BG_PIDS=("${keep[@]}")
}

# wait_for_match FILE REGEX TIMEOUT_S PID: print the first match of the extended REGEX
# (grep -o) in FILE once it appears; fail if PID dies or the timeout passes.
wait_for_match() {
    local file="$1" re="$2" timeout="$3" pid="$4" i m
    for ((i = 0; i < timeout * 10; i++)); do
        m="$(grep -Eo "$re" "$file" 2>/dev/null | head -n1 || true)"
        if [ -n "$m" ]; then printf '%s\n' "$m"; return 0; fi
        kill -0 "$pid" 2>/dev/null || { log "process $pid exited before printing /$re/ (see $file)"; return 1; }
        sleep 0.1
    done
    log "timed out after ${timeout}s waiting for /$re/ in $file"
    return 1
}

record() {  # record JSON_OBJECT: append one result line
    printf '%s\n' "$1" >>"$RESULTS"
    log "result: $1"
}

# --- 1. iperf3: single TCP stream on loopback --------------------------------------------
run_iperf() {
    command -v iperf3 >/dev/null || { log "iperf3 missing (scripts/setup-upstream.sh installs it); skipped"; return 0; }
    rm -f "$IPERF_PIDFILE"
    iperf3 -s -1 -p "$IPERF_PORT" -B "$HOST" -D -I "$IPERF_PIDFILE" --logfile "$LOGS/iperf3-server.log"
    local i
    for ((i = 0; i < 50; i++)); do
        [ -s "$IPERF_PIDFILE" ] && ss -ltn "( sport = :$IPERF_PORT )" 2>/dev/null | grep -q LISTEN && break
        sleep 0.1
    done
    iperf3 -c "$HOST" -p "$IPERF_PORT" -t "$DURATION" -J >"$LOGS/iperf3-client.json"
    python3 - "$LOGS/iperf3-client.json" >>"$RESULTS" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))["end"]
print(json.dumps({"impl": "iperf3", "case": "single-stream",
                  "gbps": round(e["sum_received"]["bits_per_second"] / 8e9, 3),
                  "retransmits": e["sum_sent"].get("retransmits")}))
EOF
    log "result: $(tail -n1 "$RESULTS")"
    # -1: the server exits after one test; the pidfile goes with it.
    for ((i = 0; i < 20; i++)); do [ -s "$IPERF_PIDFILE" ] || break; sleep 0.1; done
}

# --- 2. upstream, Python harness (upstream_peer.py) on both sides ---------------------------
run_upstream_py() {
    local py="$1" out="$LOGS/upstream-py-target.out" pid sid buf line
    "$py" "$PEER_PY" bench-target --size "$BUFFER_SIZE" --wait signal </dev/null \
        >"$out" 2>"$LOGS/upstream-py-target.err" &
    pid=$!; BG_PIDS+=("$pid")
    line="$(wait_for_match "$out" '^\{.*\}$' 60 "$pid")"
    sid="$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')"
    buf="$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["buffer"])')"
    log "upstream-py target at $sid"

    local spec op bs tag
    for spec in "write 4194304 4MiB" "read 4194304 4MiB" "write 65536 64KiB" "read 65536 64KiB"; do
        read -r op bs tag <<<"$spec"
        harness_case "$py" "$op-${tag}x64" "$sid" "$buf" --op "$op" --block-size "$bs" --batch-size 64 --threads "$THREADS"
    done
    for op in write read; do
        harness_case "$py" "lat-$op-4KiB" "$sid" "$buf" --op "$op" --latency --block-size 4096
    done
    stop_bg "$pid"
}

harness_case() {  # harness_case PY CASE SID BUF ARGS...: one upstream_peer.py bench-initiator run
    local py="$1" cname="$2" sid="$3" buf="$4"; shift 4
    local line
    if line="$("$py" "$PEER_PY" bench-initiator --peer "$sid" --peer-buffer "$buf" --peer-size "$BUFFER_SIZE" \
            --duration "$DURATION" "$@" 2>>"$LOGS/upstream-py-initiator.err" | tail -n1)"; then :; fi
    [ -n "$line" ] || line='{"ok": false, "error": "no output"}'
    record "$(python3 -c '
import json, sys
d = json.loads(sys.argv[2])
r = {"impl": "upstream-py", "case": sys.argv[1]}
for k in ("gbps", "req_per_s", "p50_us", "p99_us", "ops_per_s", "error"):
    if k in d: r[k] = d[k]
if "ops_per_s" in r: r["req_per_s"] = r.pop("ops_per_s")
print(json.dumps(r))' "$cname" "$line")"
}

# --- 3. bench binaries (upstream's C++ transfer_engine_bench, and ours) ----------------------
# Both take upstream's gflags: --mode=target|initiator --operation=read|write --protocol=tcp
# --metadata_server=P2PHANDSHAKE --segment_id=HOST:PORT --block_size --batch_size
# --buffer_size --duration --threads.
#
# How the target's segment id is found (the regex matches either):
#   upstream: glog line "Transfer Engine RPC using P2P handshake, listening on HOST:PORT"
#   ours:     a line containing "segment_id=HOST:PORT"
SEGMENT_RE='(listening on|segment_id=) ?[A-Za-z0-9.-]+:[0-9]+'

# Extra flags per binary. Upstream needs --local_server_name=127.0.0.1 in P2P mode (its default
# is the machine's hostname, which then becomes the host part of the segment id).
UPSTREAM_BENCH_FLAGS="${UPSTREAM_BENCH_FLAGS:---local_server_name=$HOST}"
# >>> OURS: flags our binary needs beyond the common set (default: same as upstream).
OURS_BENCH_FLAGS="${OURS_BENCH_FLAGS:---local_server_name=$HOST}"

flags_for() {  # flags_for BIN: print the extra flags of that binary, one per line
    local extra
    if [ "$1" = "$OURS_BENCH" ]; then extra="$OURS_BENCH_FLAGS"; else extra="$UPSTREAM_BENCH_FLAGS"; fi
    # shellcheck disable=SC2086  # split the flags on whitespace, on purpose
    [ -z "$extra" ] || printf '%s\n' $extra
}

start_bench_target() {  # start_bench_target NAME BIN -> sets TARGET_PID, TARGET_SEGMENT
    local name="$1" bin="$2" out="$LOGS/$1-target.log" m extra
    mapfile -t extra < <(flags_for "$bin")
    "$bin" --mode=target --protocol=tcp --metadata_server=P2PHANDSHAKE \
        --buffer_size="$BUFFER_SIZE" "${extra[@]}" </dev/null >"$out" 2>&1 &
    TARGET_PID=$!; BG_PIDS+=("$TARGET_PID")
    m="$(wait_for_match "$out" "$SEGMENT_RE" 60 "$TARGET_PID")"
    TARGET_SEGMENT="$(printf '%s' "$m" | grep -Eo '[A-Za-z0-9.-]+:[0-9]+$')"
    log "$name target at $TARGET_SEGMENT (pid $TARGET_PID)"
}

# bench_initiator IMPL CASE BIN SEGMENT OP BLOCK BATCH THREADS: one timed run, one result line.
bench_initiator() {
    local impl="$1" cname="$2" bin="$3" seg="$4" op="$5" block="$6" batch="$7" threads="$8"
    local out="$LOGS/$impl-$cname.log" rc=0 extra
    mapfile -t extra < <(flags_for "$bin")
    "$bin" --mode=initiator --operation="$op" --protocol=tcp --metadata_server=P2PHANDSHAKE \
        --segment_id="$seg" --block_size="$block" --batch_size="$batch" \
        --buffer_size="$BUFFER_SIZE" --duration="$DURATION" --threads="$threads" \
        "${extra[@]}" </dev/null >"$out" 2>&1 || rc=$?
    record "$(parse_bench_output "$impl" "$cname" "$out" "$rc" "$block" "$batch")"
}

# Upstream prints "Test completed: duration D, batch count N, throughput X GB/s"; ours prints
# the same prefix and may add ", batch latency p50 P us p99 Q us" (recorded as batch_p50_us /
# batch_p99_us, and as p50_us / p99_us when the batch size is 1).
# >>> OURS: if our binary's result line changes, parse it here.
parse_bench_output() {
    python3 - "$@" <<'EOF'
import json, re, sys
impl, case, path, rc, block, batch = sys.argv[1:7]
text = open(path, errors="replace").read()
r = {"impl": impl, "case": case}
m = re.search(r"Test completed: duration ([0-9.]+), batch count ([0-9]+), throughput ([0-9.]+)", text)
if m and rc == "0":
    dur, n = float(m.group(1)), int(m.group(2))
    reqs = n * int(batch)
    r["gbps"] = round(reqs * int(block) / 1e9 / dur, 3)
    r["req_per_s"] = round(reqs / dur, 1)
    lat = re.search(r"batch latency p50 ([0-9.]+) us p99 ([0-9.]+) us", text)
    if lat:
        r["batch_p50_us"], r["batch_p99_us"] = float(lat.group(1)), float(lat.group(2))
        if int(batch) == 1:
            r["p50_us"], r["p99_us"] = r["batch_p50_us"], r["batch_p99_us"]
else:
    r["error"] = f"exit {rc}, no 'Test completed' line (see {path})"
print(json.dumps(r))
EOF
}

# run_bench_suite IMPL TARGET_SEGMENT INITIATOR_BIN: every case against one running target.
run_bench_suite() {
    local impl="$1" seg="$2" bin="$3" spec op bs tag
    for spec in "write 4194304 4MiB" "read 4194304 4MiB" "write 65536 64KiB" "read 65536 64KiB"; do
        read -r op bs tag <<<"$spec"
        bench_initiator "$impl" "$op-${tag}x64" "$bin" "$seg" "$op" "$bs" 64 "$THREADS"
    done
    for op in write read; do
        bench_initiator "$impl" "lat-$op-4KiB" "$bin" "$seg" "$op" 4096 1 1
    done
}

upstream_bench_bin() {  # the C++ bench shipped inside the upstream wheel
    (cd / && "$1" -c 'import mooncake, os; print(os.path.join(os.path.dirname(mooncake.__file__), "transfer_engine_bench"))')
}

# --- GPU-host mode (--gpu-host) ---------------------------------------------------------------
GH_CASES="${CASES:-write-4MiBx64 read-4MiBx64 write-64KiBx64 read-64KiBx64 lat-write-4KiB lat-read-4KiB serving-1peer serving-4peers}"

pin() { taskset -c "${CPUS:-0-15}" "$@"; }

up_py() {  # upstream's python with the carried wheel and libraries
    LD_LIBRARY_PATH="$REPO/.devcarry/libs:/usr/local/cuda-13.0/targets/x86_64-linux/lib" \
        PYTHONPATH="$REPO/.devcarry/up" MC_FORCE_TCP=1 pin python3 "$@"
}

# gh_record IMPL CASE ROUND JSON_LINE: one normalised result line from either harness.
gh_record() {
    record "$(python3 - "$@" <<'EOF'
import json, sys
impl, case, rnd, line = sys.argv[1:5]
r = {"impl": impl, "case": case, "round": int(rnd)}
try:
    d = json.loads(line)
except ValueError:
    # The process's last words, when it left a file of them (the logs stay on the host).
    why = ""
    if len(sys.argv) > 5:
        try:
            lines = [l.strip() for l in open(sys.argv[5], errors="replace") if l.strip()]
            why = lines[-1][:300] if lines else ""
        except OSError:
            pass
    d = {"error": "no result line" + (f": {why}" if why else "")}
ours = "gb_per_s" in d
keys = {"gb_per_s": "gbps", "requests_per_s": "req_per_s", "latency_p50_us": "batch_p50_us",
        "latency_p99_us": "batch_p99_us", "cpu_us_per_request": "cpu_us_per_request",
        "sleeps_per_request": "sleeps_per_request"} if ours else {
        "gbps": "gbps", "req_per_s": "req_per_s", "ops_per_s": "req_per_s",
        "batch_p50_us": "batch_p50_us", "batch_p99_us": "batch_p99_us",
        "p50_us": "p50_us", "p99_us": "p99_us", "error": "error"}
for k, v in keys.items():
    if d.get(k) is not None:
        r[v] = round(d[k], 3) if isinstance(d[k], float) else d[k]
if case.startswith("lat-") and "req_per_s" in r:
    if ours:
        r["p50_us"], r["p99_us"] = r.pop("batch_p50_us", None), r.pop("batch_p99_us", None)
    r["gbps"] = round(r["req_per_s"] * 4096 / 1e9, 4)
print(json.dumps(r))
EOF
)"
}

# gh_case_args CASE: op, block, batch, threads, targets of a case
gh_case_args() {
    case "$1" in
        write-4MiBx64) echo "write 4194304 64 1 1" ;;
        read-4MiBx64) echo "read 4194304 64 1 1" ;;
        write-64KiBx64) echo "write 65536 64 1 1" ;;
        read-64KiBx64) echo "read 65536 64 1 1" ;;
        lat-write-4KiB) echo "write 4096 1 1 1" ;;
        lat-read-4KiB) echo "read 4096 1 1 1" ;;
        serving-1peer) echo "write 32768 32 10 1" ;;
        serving-4peers) echo "write 32768 32 10 4" ;;
        serving-read-1peer) echo "read 32768 32 10 1" ;;
        serving-read-4peers) echo "read 32768 32 10 4" ;;
        *) die "unknown case $1" ;;
    esac
}

gh_stop_all() {
    local pid
    for pid in "${BG_PIDS[@]}"; do stop_bg "$pid"; done
}

gh_upstream() {  # gh_upstream ROUND
    local rnd="$1" i pid line sids=() bufs=() cname op bs batch th n peers buffers
    for i in 1 2 3 4; do
        up_py "$PEER_PY" bench-target --host "$HOST" --size "$BUFFER_SIZE" --wait signal </dev/null \
            >"$LOGS/up-target-$i.out" 2>"$LOGS/up-target-$i.err" &
        pid=$!; BG_PIDS+=("$pid")
        line="$(wait_for_match "$LOGS/up-target-$i.out" '^\{.*\}$' 120 "$pid")"
        sids+=("$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["session_id"])')")
        bufs+=("$(printf '%s' "$line" | python3 -c 'import json,sys; print(json.load(sys.stdin)["buffer"])')")
    done
    for cname in $GH_CASES; do
        read -r op bs batch th n <<<"$(gh_case_args "$cname")"
        local extra=()
        peers="$(IFS=,; echo "${sids[*]:0:$n}")"; buffers="$(IFS=,; echo "${bufs[*]:0:$n}")"
        case "$cname" in lat-*) extra=(--latency) ;; esac
        line="$(up_py "$PEER_PY" bench-initiator --host "$HOST" --peer "$peers" --peer-buffer "$buffers" \
            --peer-size "$BUFFER_SIZE" --duration "$DURATION" --op "$op" --block-size "$bs" \
            --batch-size "$batch" --threads "$th" "${extra[@]}" 2>>"$LOGS/up-initiator.err" | tail -n1 || true)"
        gh_record upstream "$cname" "$rnd" "$line"
    done
    gh_stop_all
}

gh_ours() {  # gh_ours NAME BIN ENV_LIST ROUND
    local name="$1" bin="$2" envs="$3" rnd="$4" i pid m segs=() cname op bs batch th n line
    local -a env_args=()
    [ -z "$envs" ] || IFS=, read -r -a env_args <<<"$envs"
    for i in 1 2 3 4; do
        env "${env_args[@]}" taskset -c "${CPUS:-0-15}" "$bin" --mode=target --protocol=tcp \
            --local_server_name="$HOST" --buffer_size="$BUFFER_SIZE" </dev/null \
            >"$LOGS/$name-target-$i.log" 2>&1 &
        pid=$!; BG_PIDS+=("$pid")
        m="$(wait_for_match "$LOGS/$name-target-$i.log" 'segment_id=[A-Za-z0-9.-]+:[0-9]+' 60 "$pid")"
        segs+=("${m#segment_id=}")
    done
    for cname in $GH_CASES; do
        read -r op bs batch th n <<<"$(gh_case_args "$cname")"
        line="$(env "${env_args[@]}" taskset -c "${CPUS:-0-15}" "$bin" --mode=initiator \
            --protocol=tcp --local_server_name="$HOST" --segment_id="$(IFS=,; echo "${segs[*]:0:$n}")" \
            --operation="$op" --block_size="$bs" --batch_size="$batch" --threads="$th" \
            --buffer_size="$BUFFER_SIZE" --duration="$DURATION" --json </dev/null \
            2>"$LOGS/$name-initiator-$cname-$rnd.err" | grep '^{' | tail -n1 || true)"
        gh_record "$name" "$cname" "$rnd" "$line" "$LOGS/$name-initiator-$cname-$rnd.err"
    done
    gh_stop_all
}

gpu_host_main() {
    local specs=() rnd k spec name rest bin envs
    read -r -a specs <<<"${OURS:-ours=$OURS_BENCH}"
    [ "${SKIP_UPSTREAM_PY:-0}" = 1 ] || specs=(upstream "${specs[@]}")
    log "gpu-host: results $RESULTS; CPUs ${CPUS:-0-15}; ${DURATION}s per case; $(nproc) CPUs here"
    { uname -a; nproc; lscpu 2>/dev/null | grep -Ei 'model name|numa|^cpu\(s\)' || true; } >"$LOGS/host.txt"
    for ((rnd = 1; rnd <= ${ROUNDS:-1}; rnd++)); do
        for ((k = 0; k < ${#specs[@]}; k++)); do
            spec="${specs[$(((k + rnd - 1) % ${#specs[@]}))]}"
            if [ "$spec" = upstream ]; then
                [ -d "$REPO/.devcarry/up" ] || { log "no .devcarry/up: upstream skipped"; continue; }
                gh_upstream "$rnd"
                continue
            fi
            name="${spec%%=*}"; rest="${spec#*=}"; bin="${rest%%@*}"; envs=""
            [ "$rest" = "$bin" ] || envs="${rest#*@}"
            [ -x "$bin" ] || { log "$bin missing: $name skipped"; continue; }
            gh_ours "$name" "$bin" "$envs" "$rnd"
        done
    done
    python3 - "$RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def f(v, nd):
    return "" if v is None else f"{v:.{nd}f}"
print("| impl | case | round | GB/s | req/s | p50 us | p99 us | batch p50 us | batch p99 us | CPU us/req | sleeps/req | note |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['impl']} | {r['case']} | {r.get('round', '')} | {f(r.get('gbps'), 3)} | {f(r.get('req_per_s'), 0)} | "
          f"{f(r.get('p50_us'), 1)} | {f(r.get('p99_us'), 1)} | {f(r.get('batch_p50_us'), 0)} | "
          f"{f(r.get('batch_p99_us'), 0)} | {f(r.get('cpu_us_per_request'), 1)} | {f(r.get('sleeps_per_request'), 2)} | {r.get('error', '')} |")
EOF
}

if [ "$GPU_HOST" = 1 ]; then
    gpu_host_main
    exit 0
fi

# --- main ------------------------------------------------------------------------------------
log "results: $RESULTS, logs: $LOGS (duration ${DURATION}s, threads $THREADS)"

if [ "${SKIP_IPERF:-0}" != 1 ]; then run_iperf; fi

UP_BENCH=""
if [ "${SKIP_UPSTREAM_PY:-0}" != 1 ] || [ "${SKIP_UPSTREAM_BENCH:-0}" != 1 ] || [ "${SKIP_CROSS:-0}" != 1 ]; then
    UPSTREAM_PY="${UPSTREAM_PY:-$("$REPO/scripts/setup-upstream.sh" | tail -n1)}"
    [ -x "$UPSTREAM_PY" ] || die "no upstream python at '$UPSTREAM_PY'"
    UP_BENCH="$(upstream_bench_bin "$UPSTREAM_PY")"
    [ -x "$UP_BENCH" ] || { log "upstream wheel has no transfer_engine_bench"; UP_BENCH=""; }
fi

if [ "${SKIP_UPSTREAM_PY:-0}" != 1 ]; then
    run_upstream_py "$UPSTREAM_PY"
fi

if [ "${SKIP_UPSTREAM_BENCH:-0}" != 1 ] && [ -n "$UP_BENCH" ]; then
    start_bench_target upstream-bench "$UP_BENCH"
    run_bench_suite upstream-bench "$TARGET_SEGMENT" "$UP_BENCH"
    stop_bg "$TARGET_PID"
fi

# >>> OURS ------------------------------------------------------------------------------------
# Our bench binary against itself, then across implementations (wire compatibility under load).
# Assumes ours takes the upstream flags above and its target prints "segment_id=HOST:PORT".
# If ours gains a real latency mode (p50/p99), add its invocation next to the lat-* cases in
# run_bench_suite and parse it in parse_bench_output.
if [ "${SKIP_OURS:-0}" != 1 ]; then
    if [ -x "$OURS_BENCH" ]; then
        # ours -> ours
        start_bench_target ours "$OURS_BENCH"
        run_bench_suite ours "$TARGET_SEGMENT" "$OURS_BENCH"
        if [ "${SKIP_CROSS:-0}" != 1 ] && [ -n "$UP_BENCH" ]; then
            # upstream initiator -> our target
            run_bench_suite upstream-to-ours "$TARGET_SEGMENT" "$UP_BENCH"
        fi
        stop_bg "$TARGET_PID"

        if [ "${SKIP_CROSS:-0}" != 1 ] && [ -n "$UP_BENCH" ]; then
            # our initiator -> upstream target
            start_bench_target upstream-bench "$UP_BENCH"
            run_bench_suite ours-to-upstream "$TARGET_SEGMENT" "$OURS_BENCH"
            stop_bg "$TARGET_PID"
        fi
    else
        log "OURS_BENCH=$OURS_BENCH not found (build it with cargo build --release); our part skipped"
    fi
fi
# <<< OURS ------------------------------------------------------------------------------------

# --- table -----------------------------------------------------------------------------------
python3 - "$RESULTS" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = next((r["gbps"] for r in rows if r["impl"] == "iperf3" and "gbps" in r), None)
def f(v, nd=3):
    return "" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))
print("| impl | case | GB/s | % of iperf3 | req/s | p50 us | p99 us | note |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    g = r.get("gbps")
    pct = f"{100.0 * g / base:.0f}%" if (g is not None and base and r["impl"] != "iperf3") else ""
    print(f"| {r['impl']} | {r['case']} | {f(g)} | {pct} | {f(r.get('req_per_s'), 0)} | "
          f"{f(r.get('p50_us'), 1)} | {f(r.get('p99_us'), 1)} | {r.get('error', '')} |")
EOF
