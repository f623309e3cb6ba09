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
# Every locked crate, the wheel's `python` feature included: the SBOM test reads the
# wheel's dependency tree offline before the wheel is built.
cargo fetch --locked
# A clean build from scratch: incremental caches would only cost disk (gigabytes) here.
export CARGO_INCREMENTAL=0
UPSTREAM_PYTHON="$(scripts/setup-upstream.sh | tail -n1)"
export UPSTREAM_PYTHON

step "format and lints"
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "Rust tests"
# Release builds (the reproducibility test's two clones, the images test's clone) share one
# target directory: each after the first compiles only the workspace's crates.
export XTASK_CARGO_TARGET_DIR="$REPO/target/release-build"
export XTASK_REPRO_KEEP_DIST="$REPO/target/repro-dist"
rm -rf "$XTASK_REPRO_KEEP_DIST"
cargo test --workspace --locked

step "Python wheel"
# The wheel the reproducibility test released (stripped, as users get it), built once; the
# interop and image steps below install the same wheel.
shopt -s nullglob
released=("$XTASK_REPRO_KEEP_DIST"/*.whl)
shopt -u nullglob
[ "${#released[@]}" -eq 1 ] || { echo "test.sh: expected one released wheel in $XTASK_REPRO_KEEP_DIST, got ${#released[@]}" >&2; exit 1; }
WHEEL="${released[0]}"
export WHEEL
scripts/test-python.sh

step "the sdist built by pip with no protoc reachable"
sdists=("$XTASK_REPRO_KEEP_DIST"/*.tar.gz)
[ "${#sdists[@]}" -eq 1 ] && [ -f "${sdists[0]}" ] || { echo "test.sh: expected one released sdist in $XTASK_REPRO_KEEP_DIST" >&2; exit 1; }
scripts/test-sdist.sh "${sdists[0]}"

step "the standalone binaries through their installers (the dry run's cargo-dist archives)"
scripts/test-binaries.sh "$XTASK_REPRO_KEEP_DIST"

step "interop with the oldest upstream we support (tests/interop/requirements-upstream-oldest.txt)"
OLDEST_PYTHON="$(UPSTREAM_REQS="$REPO/tests/interop/requirements-upstream-oldest.txt" \
    UPSTREAM_VENV="$REPO/.venv-upstream-oldest" SKIP_APT=1 scripts/setup-upstream.sh | tail -n1)"
UPSTREAM_PYTHON="$OLDEST_PYTHON" cargo test --locked -p e2e \
    --test upstream_interop --test upstream_soft_nic --test rdma_interop_soft_nic
UPSTREAM_PYTHON="$OLDEST_PYTHON" scripts/test-python.sh test_interop.py test_interop_stores.py

step "workflows (check-jsonschema, zizmor, drift, publish steps against a gh stand-in)"
scripts/test-workflows.sh

step "images (podman build of both recipes, local registry, skopeo, rebuild digest)"
scripts/test-images.sh
step "all tests passed"
