#!/usr/bin/env python3
"""Python-level benchmark: our wheel against the upstream wheel, same run, same machine.

    .venv-test/bin/python tests/python/bench_wheels.py [--upstream .venv-upstream/bin/python] [--duration 5]

Each wheel runs both sides of its own pair (``tests/interop/upstream_peer.py``
bench-target / bench-initiator, separate processes, TCP on 127.0.0.1):
``batch_transfer_sync_write`` of 64 x 4 MiB (GB/s) and single 4 KiB
``transfer_sync_write`` latency (microseconds). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / "tests" / "interop" / "upstream_peer.py"
ENV = {**os.environ, "MC_FORCE_TCP": "1", "MC_LOG_LEVEL": "warning"}


def run_pair(python: str, initiator_args: list[str], size: int) -> dict:
    target = subprocess.Popen([python, str(PEER), "bench-target", "--size", str(size)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV)
    try:
        hello = json.loads(target.stdout.readline())
        out = subprocess.run([python, str(PEER), "bench-initiator", "--peer", hello["session_id"],
                              "--peer-buffer", str(hello["buffer"]), "--peer-size", str(size), *initiator_args],
                             capture_output=True, text=True, env=ENV, timeout=600)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            raise RuntimeError(out.stderr[-3000:])
        return json.loads(lines[-1])
    finally:
        target.stdin.close()
        target.wait(timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", default=sys.executable)
    ap.add_argument("--upstream", default=str(REPO / ".venv-upstream" / "bin" / "python"))
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    rows = []
    for label, py in (("ours", args.ours), ("upstream", args.upstream)):
        if not os.access(py, os.X_OK):
            print(f"skipping {label}: no {py}", file=sys.stderr)
            continue
        tput = run_pair(py, ["--block-size", str(4 << 20), "--batch-size", "64", "--op", "write",
                             "--duration", str(args.duration)], 256 << 20)
        lat = run_pair(py, ["--latency", "--block-size", "4096", "--op", "write", "--duration", str(args.duration)],
                       1 << 20)
        rows.append((label, tput, lat))
    print("| wheel | batch_transfer_sync_write 64 x 4 MiB | 4 KiB transfer_sync_write p50 / p99 |")
    print("|---|---|---|")
    for label, t, l in rows:
        t_s = f"{t['gbps']:.2f} GB/s" if t.get("ok") else f"failed: {t.get('error')}"
        l_s = f"{l['p50_us']} / {l['p99_us']} µs ({l['ops_per_s']:.0f} ops/s)" if l.get("ok") else f"failed: {l.get('error')}"
        print(f"| {label} | {t_s} | {l_s} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
