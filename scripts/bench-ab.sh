#!/usr/bin/env bash
# Paired A/B of two builds of our transfer_engine_bench on loopback, same run: for each case
# and round, both builds, each against its own target, A first in odd rounds and B first in
# even ones (so neither always runs second: ABBA...). Prints one JSON line per run and a
# table of medians and B/A ratios (GB/s, p50, p99).
#
#   scripts/bench-ab.sh A_BIN B_BIN [ROUNDS]
#
# Environment: DURATION (seconds per run, default 3), HOST (default 127.0.0.1), KEEP (a path
# to keep the JSON lines at), CASES (comma-separated "op block batch" triples; default: 4 MiB
# and 64 KiB batches of 64 and single 4 KiB requests, both ways).
set -euo pipefail
A="${1:?usage: bench-ab.sh A_BIN B_BIN [ROUNDS]}"
B="${2:?usage: bench-ab.sh A_BIN B_BIN [ROUNDS]}"
ROUNDS="${3:-3}"
DURATION="${DURATION:-3}"
HOST="${HOST:-127.0.0.1}"
BUFFER_SIZE=$((256 << 20))
OUT="$(mktemp -d)"
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$OUT"' EXIT

# Not in a $(...) subshell: the targets' pids must reach PIDS, which the trap kills.
start_target() {  # start_target BIN NAME -> sets SEG
    "$1" --mode=target --local_server_name="$HOST" --buffer_size="$BUFFER_SIZE" \
        >"$OUT/$2.target" 2>&1 </dev/null &
    PIDS+=($!)
    for _ in $(seq 600); do
        if grep -q 'segment_id=' "$OUT/$2.target"; then
            SEG="$(grep -o 'segment_id=[^ ]*' "$OUT/$2.target" | head -n1 | cut -d= -f2)"
            return
        fi
        sleep 0.1
    done
    echo "bench-ab: target $1 did not start" >&2
    exit 1
}

start_target "$A" a
SEG_A="$SEG"
start_target "$B" b
SEG_B="$SEG"

run() {  # run WHICH BIN SEG OP BLOCK BATCH
    "$2" --mode=initiator --local_server_name="$HOST" --segment_id="$3" --operation="$4" \
        --block_size="$5" --batch_size="$6" --buffer_size="$BUFFER_SIZE" \
        --duration="$DURATION" --threads=1 --json </dev/null 2>/dev/null |
        grep '^{' | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); r['which']='$1'; r['case']='$4-$5x$6'; print(json.dumps(r))"
}

IFS=',' read -r -a SPECS <<<"${CASES:-write 4194304 64,read 4194304 64,write 65536 64,read 65536 64,write 4096 1,read 4096 1}"
for spec in "${SPECS[@]}"; do
    read -r op block batch <<<"$spec"
    for round in $(seq "$ROUNDS"); do
        if [ $((round % 2)) = 1 ]; then
            run A "$A" "$SEG_A" "$op" "$block" "$batch" | tee -a "$OUT/all.jsonl"
            run B "$B" "$SEG_B" "$op" "$block" "$batch" | tee -a "$OUT/all.jsonl"
        else
            run B "$B" "$SEG_B" "$op" "$block" "$batch" | tee -a "$OUT/all.jsonl"
            run A "$A" "$SEG_A" "$op" "$block" "$batch" | tee -a "$OUT/all.jsonl"
        fi
    done
done

[ -z "${KEEP:-}" ] || cp "$OUT/all.jsonl" "$KEEP"
python3 - "$OUT/all.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
cases = []
for r in rows:
    if r["case"] not in cases:
        cases.append(r["case"])
print("| case | A GB/s (median) | B GB/s (median) | B/A | A p50/p99 us | B p50/p99 us | B/A p50 | B/A p99 |")
print("|---|---|---|---|---|---|---|---|")
for c in cases:
    a = [r for r in rows if r["case"] == c and r["which"] == "A"]
    b = [r for r in rows if r["case"] == c and r["which"] == "B"]
    ga = statistics.median(r["gb_per_s"] for r in a)
    gb = statistics.median(r["gb_per_s"] for r in b)
    med = lambda rs, k: statistics.median(r[k] for r in rs)
    lat = lambda rs: "%.1f / %.1f" % (med(rs, "latency_p50_us"), med(rs, "latency_p99_us"))
    p50 = med(b, "latency_p50_us") / med(a, "latency_p50_us")
    p99 = med(b, "latency_p99_us") / med(a, "latency_p99_us")
    print(f"| {c} | {ga:.3f} | {gb:.3f} | {gb/ga:.3f} | {lat(a)} | {lat(b)} | {p50:.3f} | {p99:.3f} |")
EOF
