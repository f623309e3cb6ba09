#!/usr/bin/env bash
# One command on a fresh Debian 12 machine: install what is needed, build,
# and run the main job (scripts/demo.sh: a loopback transfer between two
# engines, throughput printed).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --locked -p transfer-engine-bench
scripts/demo.sh
