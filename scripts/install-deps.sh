#!/usr/bin/env bash
# Installs what building and testing need on a fresh Debian 12 machine:
# Debian packages (compiler, Python venv, iperf3, binutils for readelf; etcd-server, which the etcd store tests start on loopback; python3-aiohttp, which
# runs upstream's Python HTTP metadata server in the interop tests; libibverbs-dev, the
# rdma-core headers the soft NIC in engine/tests/soft_nic/ is compiled against) and,
# when cargo is missing, the Rust toolchain pinned in rust-toolchain.toml.
# Idempotent and non-interactive.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log() { printf 'install-deps: %s\n' "$*" >&2; }

PKGS=(build-essential pkg-config curl ca-certificates git python3 python3-venv python3-pip binutils xz-utils iperf3
      etcd-server python3-aiohttp libibverbs-dev)
missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
# A pyenv or other non-Debian python3 that can make venvs is as good as python3-venv.
if python3 -c 'import venv, ensurepip' 2>/dev/null; then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | grep -vxE 'python3|python3-venv|python3-pip' || true)
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | grep -v '^$' || true)
if [ "${#missing[@]}" -gt 0 ]; then
    SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)
    export DEBIAN_FRONTEND=noninteractive
    log "installing Debian packages: ${missing[*]}"
    "${SUDO[@]}" apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" </dev/null >&2 || {
        "${SUDO[@]}" apt-get update </dev/null >&2
        "${SUDO[@]}" apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}" </dev/null >&2
    }
fi

if ! command -v cargo >/dev/null 2>&1 && [ ! -x "$HOME/.cargo/bin/cargo" ]; then
    channel="$(sed -n 's/^channel = "\(.*\)"/\1/p' "$REPO/rust-toolchain.toml")"
    log "cargo not found: installing Rust $channel with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
        | sh -s -- -y --profile minimal --default-toolchain "$channel" -c rustfmt -c clippy >&2
fi
