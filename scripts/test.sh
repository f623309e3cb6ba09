#!/usr/bin/env bash
# Every test: formatting, lints, Rust unit and integration tests (two
# processes on loopback, interop with the published upstream wheel), and the
# Python wheel's test suite. Runs unattended; servers and peers it starts
# listen on 127.0.0.1 only and are stopped on exit.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
step() { printf '\n=== %s (%s)\n' "$*" "$(date +%T)"; }

step "dependencies"
scripts/install-deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
UPSTREAM_PYTHON="$(scripts/setup-upstream.sh | tail -n1)"
export UPSTREAM_PYTHON

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Rust tests"
cargo test --workspace --locked

step "Python wheel"
scripts/test-python.sh

step "workflows (check-jsonschema, zizmor, drift, publish steps against a gh stand-in)"
scripts/test-workflows.sh

step "images (podman build of both recipes, local registry, skopeo, rebuild digest)"
scripts/test-images.sh
step "all tests passed"
