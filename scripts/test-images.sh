#!/usr/bin/env bash
# End-to-end test of the image recipes (images/vllm-musa, images/sglang-musa), on loopback.
#
#   scripts/test-images.sh
#
# 1. prepare (the only part that may use the network, and only the first time; cached under
#    $IMAGES_TEST_CACHE, default target/images-test/cache): the container tools from Debian
#    (podman, buildah, skopeo, docker-registry, debootstrap; installed with apt-get when
#    missing and root), our wheel (scripts/build-wheel.sh, or $WHEEL), Debian 12 packages for
#    a small base (debootstrap --make-tarball), sglang-router 0.3.2 and the router's
#    dependencies (images/test-base/requirements.txt) by hash;
# 2. everything else runs in a private network namespace with only 127.0.0.1 (`unshare
#    --net`; IMAGES_TEST_NETNS=0 runs it on the host's loopback instead), so the builds provably
#    fetch nothing:
#    - a local docker-registry on 127.0.0.1;
#    - a small base image made offline from those Debian packages (python3, pip) plus the
#      router's dependencies that SGLang's base provides (from their pinned wheels), holding a
#      stand-in upstream `mooncake-transfer-engine` 0.3.12 that the recipes must remove; pushed
#      to the registry and used by digest;
#    - both recipes built with `podman build --isolation=chroot` (the smoke test runs inside the
#      build), pushed, inspected with skopeo (labels, digest, one added layer), pulled back by
#      digest and run (two engines move 1 MiB over TCP inside the image);
#    - a second build of each, compared by image ID and pushed digest (a difference is shown
#      and fails the test); the base is committed with a fixed timestamp, so with the same
#      wheel, commit and cached base the digests also repeat across runs (recorded in
#      $IMAGES_TEST_CACHE/last-digests and reported);
#    - negative tests: a wheel whose SHA256 is not WHEEL_SHA256 (a wrong pin, and a tampered
#      wheel) fails the build with a clear message; a BASE_IMAGE without @sha256: is refused
#      by the recipe, and by the pre-flight check before anything is pulled or built.
#    - `cargo xtask images` and `cargo xtask pin-base` on a clone whose release.toml points at
#      the loopback registry: a base without a digest is refused before anything is built (by
#      `images` and by `release`); pin-base resolves the tags and writes the digests (one line
#      each, the builder image's too); a real `release <tag> --dry-run` makes the release directory; `images <tag>`
#      builds, pushes and records both digests (publication.json, RELEASES.md; the manifest and
#      sha256.sum unchanged), checked
#      with skopeo; a second run, with buildah instead of podman, finds the same digests and
#      pushes nothing; another image under the tag stops the run until --force replaces it.
#    The registry is stopped and every image and container made here is removed on exit.
#
# Environment: WHEEL (a wheel to use instead of building one), IMAGES_TEST_CACHE,
# IMAGES_TEST_NETNS (1), IMAGES_TEST_PORT (15000), IMAGES_TEST_KEEP=1 (keep the run directory),
# IMAGES_TEST_FRESH_BASE=1 (remake the base's root file system even if cached).
# Non-interactive; exits non-zero on any failure; prints a timing table at the end.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${IMAGES_TEST_CACHE:-$REPO/target/images-test/cache}"
PORT="${IMAGES_TEST_PORT:-15000}"
REG="127.0.0.1:$PORT"
PREFIX="localhost/mc-images-test"
SUITE="bookworm"
MIRROR="http://deb.debian.org/debian"
DEBS=(python3 python3-pip)
# What an SGLang base provides for the router (fastapi, uvicorn, aiohttp, orjson, setproctitle
# and their dependencies), hash-locked for Debian 12's Python 3.11. Debian's own python3-fastapi
# cannot stand in: its metadata pins a starlette Debian does not ship, and pip checks that.
BASE_REQS="$REPO/images/test-base/requirements.txt"
BASE_PLATFORM=(--python-version 3.11 --implementation cp --abi cp311 --abi abi3 --abi none
               --platform manylinux_2_36_x86_64 --platform manylinux_2_34_x86_64
               --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)
ROUTER_REQS="$REPO/images/sglang-musa/requirements-router.txt"
RECIPES=(vllm-musa sglang-musa)

export IMAGES_TEST_T0="${IMAGES_TEST_T0:-$(date +%s.%N)}"
log() { printf 'test-images: %s\n' "$*" >&2; }
die() { printf 'test-images: FAILED: %b\n' "$*" >&2; exit 1; }
now() { date +%s.%N; }
TIMINGS=()
STEP_T=""
STEP_NAME=""
step() {
    local t; t="$(now)"
    [ -z "$STEP_NAME" ] || TIMINGS+=("$(printf '%-56s %6.1f s' "$STEP_NAME" "$(echo "$t - $STEP_T" | bc)")")
    STEP_NAME="$*"; STEP_T="$t"
    [ -z "$*" ] || printf '\n=== %s (%s)\n' "$*" "$(date +%T)" >&2
}
sha256() { sha256sum "$1" | cut -d' ' -f1; }

# --- phase 1: prepare (network allowed, cached) ------------------------------------------

prepare() {
    step "tools"
    local need=() t
    for t in podman buildah skopeo docker-registry debootstrap unshare ip bc jq curl; do
        command -v "$t" >/dev/null || need+=("$t")
    done
    if [ "${#need[@]}" -gt 0 ]; then
        [ "$(id -u)" -eq 0 ] || die "missing ${need[*]}: apt-get install podman buildah skopeo docker-registry debootstrap bc"
        log "installing Debian packages for: ${need[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 \
            podman buildah skopeo docker-registry debootstrap util-linux iproute2 bc jq curl </dev/null >&2
    fi
    log "$(podman --version), $(buildah --version | cut -d' ' -f1-3), $(skopeo --version), docker-registry $(docker-registry --version 2>&1 | awk '{print $3}')"
    mkdir -p "$CACHE"

    step "wheel"
    if [ -z "${WHEEL:-}" ]; then
        WHEEL="$("$REPO/scripts/build-wheel.sh" | tail -n1)"
    fi
    [ -f "$WHEEL" ] || die "no wheel at $WHEEL"
    export WHEEL
    log "wheel $(basename "$WHEEL") sha256 $(sha256 "$WHEEL")"

    step "Debian packages for the base (cached)"
    local key; key="$(printf '%s ' "$SUITE" "${DEBS[@]}" | sha256sum | cut -c1-16)"
    export DEBS_TARBALL="$CACHE/$SUITE-debs-$key.tgz"
    if [ ! -f "$DEBS_TARBALL" ]; then
        local tmp; tmp="$(mktemp -d)"
        log "debootstrap --make-tarball (downloads once)"
        debootstrap --variant=minbase --include="$(IFS=,; echo "${DEBS[*]}")" \
            --make-tarball="$DEBS_TARBALL.part" "$SUITE" "$tmp/root" "$MIRROR" >"$CACHE/debootstrap-download.log" 2>&1 \
            || { rm -rf "$tmp"; die "debootstrap download failed, see $CACHE/debootstrap-download.log"; }
        rm -rf "$tmp"
        mv "$DEBS_TARBALL.part" "$DEBS_TARBALL"
    fi

    step "wheels by hash: sglang-router, base deps (cached)"
    export WHEELS_CACHE="$CACHE/wheels"
    mkdir -p "$WHEELS_CACHE"
    # pip download checks each file against the pinned hash, also when it is already there.
    pip_dl() {
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --require-hashes -d "$WHEELS_CACHE" "$@" >&2
    }
    pip_dl --no-index --find-links "$WHEELS_CACHE" --platform manylinux2014_x86_64 --python-version 3.10 \
        -r "$ROUTER_REQS" 2>/dev/null \
        || pip_dl --platform manylinux2014_x86_64 --python-version 3.10 -r "$ROUTER_REQS"
    pip_dl --no-index --find-links "$WHEELS_CACHE" "${BASE_PLATFORM[@]}" -r "$BASE_REQS" 2>/dev/null \
        || pip_dl "${BASE_PLATFORM[@]}" -r "$BASE_REQS"

    step "xtask and its release build tools, for the offline release (cached)"
    # The clone's `release --dry-run` runs offline: its locked build tools come from here,
    # its crates from the cargo cache this build fills.
    python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: --require-hashes \
        -d "$WHEELS_CACHE" -r "$REPO/xtask/requirements-build.txt" >&2
    # The same invocation as scripts/test.sh's, so in the suite this is a no-op (a plain
    # `cargo build -p xtask` resolves features differently and rebuilds the dependencies).
    (cd "$REPO" && cargo test --quiet --workspace --locked --no-run >&2)
    (cd "$REPO" && cargo fetch --locked >&2)
    export XTASK_BIN="${CARGO_TARGET_DIR:-$REPO/target}/debug/xtask"
    [ -x "$XTASK_BIN" ] || die "no xtask binary at $XTASK_BIN"
    step ""
}

# --- phase 2: offline, loopback only ------------------------------------------------------

RUN_DIR=""
REG_PID=""
MADE_IMAGES=()
cleanup() {
    local rc=$?
    set +e
    for c in $(buildah containers --quiet --filter name=mc-images-test 2>/dev/null); do buildah rm "$c" >/dev/null; done
    for i in "${MADE_IMAGES[@]}"; do podman rmi --force "$i" >/dev/null 2>&1; done
    if [ -n "$REG_PID" ]; then kill "$REG_PID" 2>/dev/null; wait "$REG_PID" 2>/dev/null; fi
    if [ -n "$RUN_DIR" ] && [ "${IMAGES_TEST_KEEP:-0}" != 1 ]; then rm -rf "$RUN_DIR"; fi
    [ "$rc" -eq 0 ] || log "FAILED (exit $rc)${RUN_DIR:+; logs in $RUN_DIR (IMAGES_TEST_KEEP=1 keeps them)}"
    exit "$rc"
}

start_registry() {
    step "docker-registry on $REG"
    mkdir -p "$RUN_DIR/registry"
    cat >"$RUN_DIR/registry.yml" <<EOF
version: 0.1
log: { level: warn, accesslog: { disabled: false } }
storage:
  filesystem: { rootdirectory: $RUN_DIR/registry }
http: { addr: "$REG" }
EOF
    docker-registry serve "$RUN_DIR/registry.yml" >"$RUN_DIR/registry.log" 2>&1 &
    REG_PID=$!
    local i
    for i in $(seq 50); do
        curl -fsS "http://$REG/v2/" >/dev/null 2>&1 && return 0
        kill -0 "$REG_PID" 2>/dev/null || die "docker-registry exited: $(cat "$RUN_DIR/registry.log")"
        sleep 0.1
    done
    die "docker-registry did not answer on $REG"
}

# A stand-in for upstream's CUDA wheel (mooncake-transfer-engine 0.3.12), installed in the
# base the way pip would: the recipes must uninstall it.
write_conflicting_distribution() {
    local site="$1/usr/local/lib/python3.11/dist-packages"
    local info="$site/mooncake_transfer_engine-0.3.12.dist-info"
    mkdir -p "$site/mooncake" "$info"
    printf '# stand-in for upstream mooncake-transfer-engine 0.3.12 (CUDA build)\n' >"$site/mooncake/__init__.py"
    printf 'raise ImportError("libcudart.so.12: cannot open shared object file (upstream stand-in)")\n' >"$site/mooncake/engine.py"
    printf 'Metadata-Version: 2.1\nName: mooncake-transfer-engine\nVersion: 0.3.12\n' >"$info/METADATA"
    printf 'pip\n' >"$info/INSTALLER"
    printf 'Wheel-Version: 1.0\nGenerator: test-images.sh\nRoot-Is-Purelib: true\nTag: py3-none-any\n' >"$info/WHEEL"
    printf '%s,,\n' mooncake/__init__.py mooncake/engine.py \
        mooncake_transfer_engine-0.3.12.dist-info/{METADATA,INSTALLER,WHEEL,RECORD} >"$info/RECORD"
}

make_base() {
    local key tar
    key="$( { basename "$DEBS_TARBALL"; cat "$BASE_REQS"; declare -f write_conflicting_distribution; } | sha256sum | cut -c1-16)"
    tar="$CACHE/base-rootfs-$key.tar"
    if [ -f "$tar" ] && [ "${IMAGES_TEST_FRESH_BASE:-0}" != 1 ]; then
        step "base image (rootfs cached from an earlier run)"
    else
        step "base image from Debian packages (offline)"
        local root="$RUN_DIR/rootfs"
        debootstrap --variant=minbase --include="$(IFS=,; echo "${DEBS[*]}")" \
            --unpack-tarball="$DEBS_TARBALL" "$SUITE" "$root" "$MIRROR" >"$RUN_DIR/debootstrap.log" 2>&1 \
            || die "debootstrap failed, see $RUN_DIR/debootstrap.log"
        rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-index --find-links "$WHEELS_CACHE" \
            --only-binary=:all: "${BASE_PLATFORM[@]}" --require-hashes -r "$BASE_REQS" \
            --target "$root/usr/local/lib/python3.11/dist-packages" >&2
        write_conflicting_distribution "$root"
        tar -C "$root" --numeric-owner -cf "$tar.part" .
        mv "$tar.part" "$tar"
        rm -rf "$root"
    fi
    # buildah commit --timestamp (unlike podman import) makes the base byte-reproducible from
    # the same root file system, so the final images' digests repeat across runs too.
    local base="$PREFIX/base:$SUITE" ctr
    ctr="$(buildah from --quiet --name mc-images-test-base scratch)"
    buildah add --quiet "$ctr" "$tar" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd python3 "$ctr"
    buildah commit --quiet --rm --timestamp 1700000000 "$ctr" "$base" >/dev/null
    MADE_IMAGES+=("$base")
    # zstd, while the builders write gzip: like a vendor's base, compressed otherwise than the
    # builders would, so a base layer compressed again on the way shows as another digest.
    podman push --quiet --tls-verify=false --compression-format zstd "$base" "docker://$REG/test/base:$SUITE" >&2
    BASE_DIGEST="$(skopeo inspect --tls-verify=false --format '{{.Digest}}' "docker://$REG/test/base:$SUITE")"
    BASE_IMAGE="$REG/test/base@$BASE_DIGEST"
    BASE_LAYERS="$(skopeo inspect --tls-verify=false --format '{{len .Layers}}' "docker://$BASE_IMAGE")"
    BASE_BLOBS="$(skopeo inspect --tls-verify=false --raw "docker://$BASE_IMAGE" | jq -c '[.layers[].digest]')"
    skopeo inspect --tls-verify=false --raw "docker://$BASE_IMAGE" | jq -e '.layers | all(.mediaType | endswith("zstd"))' >/dev/null \
        || die "the test base was not pushed with zstd layers"
    MADE_IMAGES+=("$BASE_IMAGE")
    log "base $BASE_IMAGE ($BASE_LAYERS layer(s), $(podman image inspect --format '{{.Size}}' "$base" | numfmt --to=iec))"
}

# The build context: the recipe's files, the shared install script, our wheel, and (SGLang)
# the router wheel. What `cargo xtask images` assembles too.
stage_context() {
    local recipe="$1" ctx="$2" wheel="$3"
    rm -rf "$ctx"; mkdir -p "$ctx"
    cp "$REPO/images/$recipe"/* "$REPO/images/common/install-wheels.py" "$ctx"/
    cp "$wheel" "$ctx"/
    if [ "$recipe" = sglang-musa ]; then cp "$WHEELS_CACHE"/sglang_router-0.3.2-*manylinux*x86_64*.whl "$ctx"/; fi
}

# Pre-flight, as `cargo xtask images` does before anything is pulled or built.
require_digest() {
    [[ "$1" =~ @sha256:[0-9a-f]{64}$ ]] || { echo "refusing: base image '$1' is not pinned by digest (NAME@sha256:<64 hex>)" >&2; return 1; }
}

# build RECIPE TAG WHEEL WHEEL_SHA256 BASE_IMAGE BASE_DIGEST LOG: podman build, output in LOG.
build() {
    local recipe="$1" tag="$2" wheel="$3" sha="$4" base="$5" digest="$6" out="$7"
    local ctx="$RUN_DIR/ctx-$recipe-$(basename "$tag" | tr ':' '-')"
    if [ "${PREFLIGHT:-1}" = 1 ]; then require_digest "$base" 2>>"$out" || return 1; fi
    stage_context "$recipe" "$ctx" "$wheel"
    local base_args=()
    [ -z "$base" ] || base_args=(--build-arg BASE_IMAGE="$base")
    podman build --isolation=chroot --layers=false --force-rm --tls-verify=false \
        --timestamp "$SOURCE_DATE_EPOCH" -f "$ctx/Dockerfile" \
        "${base_args[@]}" --build-arg BASE_DIGEST="$digest" \
        --build-arg VERSION="$VERSION" --build-arg REVISION="$REVISION" \
        --build-arg WHEEL="$(basename "$wheel")" --build-arg WHEEL_SHA256="$sha" \
        -t "$tag" "$ctx" >>"$out" 2>&1
}

label() { jq -r --arg k "$2" '.Labels[$k] // "MISSING"' <<<"$1"; }

check_image() {
    local recipe="$1" tag="$PREFIX/$1:build1"
    step "$recipe: build (smoke test inside)"
    build "$recipe" "$tag" "$WHEEL" "$WHEEL_SHA256" "$BASE_IMAGE" "$BASE_DIGEST" "$RUN_DIR/$recipe-build1.log" \
        || die "$recipe build failed:\n$(tail -30 "$RUN_DIR/$recipe-build1.log")"
    MADE_IMAGES+=("$tag")
    grep -h '^smoke test passed' "$RUN_DIR/$recipe-build1.log" | cut -c1-240 >&2
    grep -q "removing mooncake-transfer-engine" "$RUN_DIR/$recipe-build1.log" \
        || die "$recipe: the stand-in upstream distribution was not removed"

    step "$recipe: push, skopeo inspect"
    local ref="docker://$REG/test/$recipe:$VERSION"
    podman push --quiet --tls-verify=false --digestfile "$RUN_DIR/$recipe.digest1" "$tag" "$ref" >&2
    local digest; digest="$(cat "$RUN_DIR/$recipe.digest1")"
    local info; info="$(skopeo inspect --tls-verify=false "$ref")"
    [ "$(jq -r .Digest <<<"$info")" = "$digest" ] || die "$recipe: registry digest $(jq -r .Digest <<<"$info") != pushed $digest"
    local k want
    for k in org.opencontainers.image.source=https://github.com/mooncake-musa/transfer-engine-rs \
             "org.opencontainers.image.revision=$REVISION" "org.opencontainers.image.version=$VERSION" \
             "org.opencontainers.image.base.digest=$BASE_DIGEST" "org.opencontainers.image.base.name=$BASE_IMAGE" \
             "io.github.mooncake-musa.wheel.sha256=$WHEEL_SHA256" \
             "io.github.mooncake-musa.wheel.name=$(basename "$WHEEL")"; do
        want="${k#*=}"; k="${k%%=*}"
        [ "$(label "$info" "$k")" = "$want" ] || die "$recipe: label $k is '$(label "$info" "$k")', want '$want'"
    done
    if [ "$recipe" = sglang-musa ]; then
        [ "$(label "$info" io.github.mooncake-musa.sglang-router.version)" = 0.3.2 ] || die "$recipe: router label"
    fi
    local layers; layers="$(jq '.Layers | length' <<<"$info")"
    [ "$layers" -eq $((BASE_LAYERS + 1)) ] || die "$recipe: $layers layers, want the base's $BASE_LAYERS + 1"
    log "$recipe $REG/test/$recipe@$digest: labels ok, $layers layers (base + 1)"
    DIGEST1[$recipe]="$digest"

    step "$recipe: pull by digest, move bytes over TCP inside"
    local ctr
    ctr="$(buildah from --quiet --tls-verify=false --name "mc-images-test-$recipe" "docker://$REG/test/$recipe@$digest")"
    MADE_IMAGES+=("$REG/test/$recipe@$digest")
    buildah run --isolation chroot -v "$RUN_DIR/tcp-check.py:/tmp/tcp-check.py:ro" "$ctr" -- \
        python3 -I -B /tmp/tcp-check.py >"$RUN_DIR/$recipe-run.log" 2>&1 \
        || die "$recipe: TCP check in the image failed:\n$(cat "$RUN_DIR/$recipe-run.log")"
    grep -v ' INFO ' "$RUN_DIR/$recipe-run.log" >&2 || true
    buildah rm "$ctr" >/dev/null

    step "$recipe: rebuild, compare"
    local tag2="$PREFIX/$recipe:build2"
    build "$recipe" "$tag2" "$WHEEL" "$WHEEL_SHA256" "$BASE_IMAGE" "$BASE_DIGEST" "$RUN_DIR/$recipe-build2.log" \
        || die "$recipe rebuild failed:\n$(tail -30 "$RUN_DIR/$recipe-build2.log")"
    MADE_IMAGES+=("$tag2")
    podman push --quiet --tls-verify=false --digestfile "$RUN_DIR/$recipe.digest2" "$tag2" "docker://$REG/test/$recipe:$VERSION-rebuild" >&2
    local id1 id2 d2
    id1="$(podman image inspect --format '{{.Id}}' "$tag")"; id2="$(podman image inspect --format '{{.Id}}' "$tag2")"
    d2="$(cat "$RUN_DIR/$recipe.digest2")"
    if [ "$id1" != "$id2" ] || [ "$digest" != "$d2" ]; then
        log "$recipe: the rebuild differs: image $id1 vs $id2, pushed $digest vs $d2"
        diff <(skopeo inspect --config "containers-storage:$tag" | jq -S .) \
             <(skopeo inspect --config "containers-storage:$tag2" | jq -S .) >&2 || true
        die "$recipe: not reproducible (see the config diff above)"
    fi
    log "$recipe: rebuild gives the same image ($id1) and the same pushed digest ($digest)"
}

expect_refusal() {
    local name="$1" pattern="$2" tag="$3"; shift 3
    local out="$RUN_DIR/negative-$name.log"
    if "$@" "$out"; then die "negative test '$name': the build succeeded"; fi
    grep -Eq "$pattern" "$out" || die "negative test '$name': no message matching /$pattern/ in:\n$(tail -20 "$out")"
    if podman image exists "$tag"; then MADE_IMAGES+=("$tag"); die "negative test '$name': an image $tag was made"; fi
    log "refused as expected ($name): $(grep -Eo "$pattern.*" "$out" | head -n1 | cut -c1-200)"
}

negative_tests() {
    step "negative tests"
    local wrong bad_wheel="$RUN_DIR/tampered/$(basename "$WHEEL")"
    wrong="$(printf 'not the wheel' | sha256sum | cut -d' ' -f1)"
    expect_refusal wrong-sha256 "has sha256 $WHEEL_SHA256, but WHEEL_SHA256 pins $wrong" "$PREFIX/neg:sha" \
        build vllm-musa "$PREFIX/neg:sha" "$WHEEL" "$wrong" "$BASE_IMAGE" "$BASE_DIGEST"
    mkdir -p "$(dirname "$bad_wheel")"; cp "$WHEEL" "$bad_wheel"; printf 'x' >>"$bad_wheel"
    expect_refusal tampered-wheel "but WHEEL_SHA256 pins $WHEEL_SHA256: refusing" "$PREFIX/neg:tampered" \
        build sglang-musa "$PREFIX/neg:tampered" "$bad_wheel" "$WHEEL_SHA256" "$BASE_IMAGE" "$BASE_DIGEST"
    # The recipe itself refuses a tag-only or missing base (pre-flight bypassed on purpose).
    PREFLIGHT=0 expect_refusal base-by-tag "BASE_IMAGE=$REG/test/base:$SUITE is not pinned by digest" "$PREFIX/neg:tag" \
        build vllm-musa "$PREFIX/neg:tag" "$WHEEL" "$WHEEL_SHA256" "$REG/test/base:$SUITE" "$BASE_DIGEST"
    MADE_IMAGES+=("$REG/test/base:$SUITE")
    PREFLIGHT=0 expect_refusal base-missing "FROM base-image-must-be-given-as-name@sha256:digest|invalid reference format" "$PREFIX/neg:nobase" \
        build sglang-musa "$PREFIX/neg:nobase" "$WHEEL" "$WHEEL_SHA256" "" "$BASE_DIGEST"
    # Before anything is pulled or built: what release.toml without a digest gets.
    local before; before="$(podman images --quiet | sort)"
    expect_refusal preflight-no-digest "refusing: base image .* is not pinned by digest" "$PREFIX/neg:pre" \
        build vllm-musa "$PREFIX/neg:pre" "$WHEEL" "$WHEEL_SHA256" "$REG/test/base:$SUITE" ""
    [ "$before" = "$(podman images --quiet | sort)" ] || die "the pre-flight refusal still pulled or built something"
}

# --- cargo xtask images / pin-base on a clone that points at the loopback registry --------

xt() { (cd "$XCLONE" && XTASK_ROOT="$XCLONE" "$XTASK_BIN" "$@"); }
xgit() { git -C "$XCLONE" -c user.name=test -c user.email=test@test.invalid "$@"; }
expect_fail() {
    local name="$1" pattern="$2"; shift 2
    local out="$RUN_DIR/xtask-$name.log"
    if "$@" >"$out" 2>&1; then die "xtask $name: succeeded, but must fail:\n$(tail -20 "$out")"; fi
    grep -Eq "$pattern" "$out" || die "xtask $name: no message matching /$pattern/ in:\n$(tail -20 "$out")"
    log "refused as expected ($name): $(grep -Eo "$pattern.*" "$out" | head -n1 | cut -c1-220)"
}
registry_digest() { skopeo inspect --tls-verify=false --raw "docker://$1" | sha256sum | sed 's/^/sha256:/; s/ .*//'; }

xtask_images_test() {
    step "xtask: a clone whose release.toml points at $REG, bases by tag only"
    XCLONE="$RUN_DIR/xclone"
    git clone --quiet --no-hardlinks "$REPO" "$XCLONE"
    local tag="v$VERSION" base_tag="$REG/test/base:$SUITE" out="$RUN_DIR/xtask-out.log"
    python3 - "$XCLONE/release.toml" "$REG" "$base_tag" <<'PY'
import re, sys
path, reg, base = sys.argv[1:]
text = open(path).read()
text = re.sub(r'(?m)^registry = ".*"$', f'registry = "{reg}/release"', text, count=1)
text, n = re.subn(r'(?m)^base = "[^"]*"', f'base = "{base}"', text)
assert n == 2, n
text, n = re.subn(r'(?m)^builder_image = "[^"]*"', f'builder_image = "{base}"', text)
assert n == 1, n
open(path, "w").write(text)
PY
    xgit commit --quiet -am "test: images on the loopback registry"
    xgit tag -f "$tag" >/dev/null
    local images_before; images_before="$(podman images --quiet | sort)"
    expect_fail images-unpinned "the base of vllm-musa .* is not pinned by digest; refusing to build" xt images "$tag"
    expect_fail release-unpinned "not pinned by digest" xt release "$tag"
    [ ! -e "$XCLONE/target/xtask/images" ] && [ ! -e "$XCLONE/target/dist" ] \
        || die "xtask built something before refusing the unpinned bases"
    [ "$images_before" = "$(podman images --quiet | sort)" ] || die "the refusal pulled or built an image"

    step "xtask pin-base: tags -> digests through the registry"
    xt pin-base --builder-image >"$out" 2>&1 || die "pin-base failed:\n$(cat "$out")"
    grep -h 'pinned' "$out" >&2
    local pinned="$base_tag@$BASE_DIGEST"
    [ "$(grep -c "^base = \"$pinned\"" "$XCLONE/release.toml")" -eq 2 ] \
        && [ "$(grep -c "^builder_image = \"$pinned\"" "$XCLONE/release.toml")" -eq 1 ] \
        || die "pin-base did not write $pinned three times:\n$(grep -E '^(base|builder_image)' "$XCLONE/release.toml")"
    [ "$(xgit diff --numstat)" = "$(printf '3\t3\trelease.toml')" ] \
        || die "pin-base changed more than the two bases and the builder image:\n$(xgit diff)"
    xt pin-base vllm-musa >"$out" 2>&1 && grep -q "unchanged" "$out" || die "a second pin-base is not a no-op:\n$(cat "$out")"
    xgit commit --quiet -am "test: pin the bases"
    xgit tag -f "$tag" >/dev/null

    step "xtask release $tag --dry-run (offline; the release directory)"
    (export CARGO_NET_OFFLINE=true PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt release "$tag" --dry-run) \
        >"$RUN_DIR/xtask-release.log" 2>&1 || die "release --dry-run failed:\n$(tail -40 "$RUN_DIR/xtask-release.log")"
    local dist="$XCLONE/target/dist/$tag"
    WHEEL_SHA256_X="$(jq -r '.artifacts[] | select(.kind == "python-wheel") | .checksums.sha256' "$dist/dist-manifest.json")"
    local frozen; frozen="$(sha256sum "$dist/dist-manifest.json" "$dist/sha256.sum")"

    step "xtask images $tag: build, push, record"
    (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt images "$tag" --builder podman) >"$out" 2>&1 \
        || die "xtask images failed:\n$(tail -40 "$out")"
    grep -E '^(images:|==>|<==)' "$out" | cut -c1-200 >&2
    local r d
    for r in "${RECIPES[@]}"; do
        grep -q "images: $r: $REG/release/$r@sha256:[0-9a-f]*: pushed$" "$out" || die "$r: not reported as pushed"
        d="$(jq -r --arg r "$r" '.images[$r].digest' "$dist/publication.json")"
        [ "$d" = "$(registry_digest "$REG/release/$r:$VERSION")" ] || die "$r: publication.json says $d, the registry $(registry_digest "$REG/release/$r:$VERSION")"
        [ "$(jq -r --arg r "$r" '.images[$r].base' "$dist/publication.json")" = "$pinned" ] || die "$r: base not recorded"
        skopeo inspect --tls-verify=false "docker://$REG/release/$r@$d" | jq -e --arg w "$WHEEL_SHA256_X" --arg b "$BASE_DIGEST" \
            '.Labels["io.github.mooncake-musa.wheel.sha256"] == $w and .Labels["org.opencontainers.image.base.digest"] == $b' >/dev/null \
            || die "$r: labels of the pushed image are wrong"
        grep -q "| \`$REG/release/$r:$VERSION\` | \`$d\` | \`$pinned\` |" "$XCLONE/RELEASES.md" || die "$r: not in RELEASES.md"
        XDIGEST[$r]="$d"
    done
    xt verify "$tag" >/dev/null 2>&1 || die "the release directory no longer verifies after recording the images"
    [ "$(sha256sum "$dist/dist-manifest.json" "$dist/sha256.sum")" = "$frozen" ] \
        || die "recording the images changed the manifest or sha256.sum (frozen at the checksums phase)"
    log "xtask images: both pushed and recorded (publication.json, RELEASES.md)"
    for r in "${RECIPES[@]}"; do expect_base_layers "$r" "${XDIGEST[$r]}"; done

    step "xtask images $tag again, with buildah: same digests, nothing pushed"
    cp "$XCLONE/RELEASES.md" "$RUN_DIR/releases-1.md"
    (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt images "$tag" --builder buildah) >"$out" 2>&1 \
        || die "the second xtask images failed:\n$(tail -40 "$out")"
    for r in "${RECIPES[@]}"; do
        grep -q "images: $r: $REG/release/$r@${XDIGEST[$r]}: already there (same digest), nothing pushed" "$out" \
            || die "$r: the rebuild was not found identical:\n$(grep '^images:' "$out")"
    done
    cmp -s "$XCLONE/RELEASES.md" "$RUN_DIR/releases-1.md" || die "RELEASES.md changed on an identical re-run"

    step "xtask images $tag with another image under the tag: stop, then --force"
    skopeo copy --quiet --src-tls-verify=false --dest-tls-verify=false \
        "docker://$BASE_IMAGE" "docker://$REG/release/vllm-musa:$VERSION" >&2
    local other; other="$(registry_digest "$REG/release/vllm-musa:$VERSION")"
    (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; expect_fail images-other-digest \
        "already holds $other, but this build of vllm-musa is ${XDIGEST[vllm-musa]}: not overwriting" xt images "$tag")
    [ "$(registry_digest "$REG/release/vllm-musa:$VERSION")" = "$other" ] || die "the refusal still changed the tag"
    (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt images "$tag" --force) >"$out" 2>&1 \
        || die "xtask images --force failed:\n$(tail -40 "$out")"
    grep -q "images: vllm-musa: .*pushed, replacing $other (--force)" "$out" || die "--force did not replace:\n$(grep '^images:' "$out")"
    [ "$(registry_digest "$REG/release/vllm-musa:$VERSION")" = "${XDIGEST[vllm-musa]}" ] || die "--force did not restore the build"
    log "xtask images: identical re-run pushes nothing; another digest stops the run; --force replaces it"

    step "the next commit under $tag: its images upload only their own layers"
    # A new commit (new revision label, new timestamps): new own layers and config, the same
    # base. The release directory is rebuilt from it (cargo finds nothing to compile).
    xgit commit --quiet --allow-empty -am "test: the next commit"
    xgit tag -f "$tag" >/dev/null
    rm -rf "$dist"
    (export CARGO_NET_OFFLINE=true PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt release "$tag" --dry-run) \
        >"$RUN_DIR/xtask-release-2.log" 2>&1 || die "the second release --dry-run failed:\n$(tail -40 "$RUN_DIR/xtask-release-2.log")"
    local seen; seen="$(wc -l <"$RUN_DIR/registry.log")"
    (export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WHEELS_CACHE"; xt images "$tag" --force) >"$out" 2>&1 \
        || die "xtask images of the next commit failed:\n$(tail -40 "$out")"
    local uploaded; uploaded="$(tail -n +"$((seen + 1))" "$RUN_DIR/registry.log" \
        | grep -oE '"PUT /v2/[^ ]*/blobs/uploads/[^ ]*' | grep -oE 'digest=sha256(%3A|:)[0-9a-f]{64}' \
        | sed -E 's/^digest=sha256(%3A|:)/sha256:/' | sort -u)"
    [ -n "$uploaded" ] || die "no blob upload in the registry's log for the next commit:\n$(tail -n +"$((seen + 1))" "$RUN_DIR/registry.log" | head -20)"
    local own="" bytes=0 base_bytes d m
    for r in "${RECIPES[@]}"; do
        d="$(jq -r --arg r "$r" '.images[$r].digest' "$dist/publication.json")"
        [ "$d" != "${XDIGEST[$r]}" ] || die "$r: the next commit built the same image ${XDIGEST[$r]}"
        expect_base_layers "$r" "$d"
        m="$(skopeo inspect --tls-verify=false --raw "docker://$REG/release/$r@$d")"
        own+="$(jq -r --argjson n "$BASE_LAYERS" '(.layers[$n:] + [.config])[] | "\(.digest) \(.size)"' <<<"$m")"$'\n'
        base_bytes="$(jq --argjson n "$BASE_LAYERS" '[.layers[:$n][].size] | add' <<<"$m")"
    done
    for d in $uploaded; do
        grep -q "^$d " <<<"$own" || die "the next commit uploaded $d, which is not one of its images' own layers or configs (a base layer: $(jq -r --arg d "$d" 'index($d) != null' <<<"$BASE_BLOBS"))"
        bytes=$((bytes + $(grep -m1 "^$d " <<<"$own" | cut -d' ' -f2)))
    done
    log "next commit: uploaded $(wc -w <<<"$uploaded") blob(s), $bytes bytes, all the images' own layers or configs; the base's $BASE_LAYERS layer(s) ($base_bytes bytes) were not uploaded again"
}

# expect_base_layers RECIPE DIGEST: the pushed image's first layers are the base's blobs.
expect_base_layers() {
    local got
    got="$(skopeo inspect --tls-verify=false --raw "docker://$REG/release/$1@$2" | jq -c --argjson n "$BASE_LAYERS" '[.layers[:$n][].digest]')"
    [ "$got" = "$BASE_BLOBS" ] || die "$1@$2: its first layers are $got, not the base's $BASE_BLOBS"
    log "$1@$2: its first $BASE_LAYERS layer(s) are the base's, by digest"
}

offline_phase() {
    if [ "${IMAGES_TEST_NETNS:-1}" = 1 ]; then
        ip link set lo up
        if curl -s -m 3 -o /dev/null "$MIRROR/"; then die "the network namespace reaches $MIRROR"; fi
        log "private network namespace: only loopback"
    fi
    RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/test-images.XXXXXX")"
    trap cleanup EXIT
    export SOURCE_DATE_EPOCH REVISION VERSION WHEEL_SHA256
    SOURCE_DATE_EPOCH="$(git -C "$REPO" log -1 --format=%ct HEAD)"
    REVISION="$(git -C "$REPO" rev-parse HEAD)"
    VERSION="$(basename "$WHEEL" | cut -d- -f2)"
    WHEEL_SHA256="$(sha256 "$WHEEL")"
    cat >"$RUN_DIR/tcp-check.py" <<'EOF'
import ctypes
import importlib.metadata as m
from mooncake.engine import TransferEngine

names = sorted(d.metadata["Name"] for d in m.distributions()
               if d.metadata["Name"].lower().startswith("mooncake-transfer-engine"))
assert names == ["mooncake-transfer-engine-musa"], names
a, b = TransferEngine(), TransferEngine()
assert a.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
assert b.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
n = 1 << 20
src = ctypes.create_string_buffer(bytes(range(256)) * (n // 256), n)
dst = ctypes.create_string_buffer(n)
assert a.register_memory(ctypes.addressof(src), n) == 0
assert b.register_memory(ctypes.addressof(dst), n) == 0
rc = a.transfer_sync_write("127.0.0.1:%d" % b.get_rpc_port(), ctypes.addressof(src), ctypes.addressof(dst), n)
assert rc == 0 and dst.raw == src.raw, rc
print("in the image: %s %s moved %d bytes over TCP between two engines"
      % (names[0], m.version(names[0]), n))
EOF
    declare -gA DIGEST1=() XDIGEST=()
    start_registry
    make_base
    local r
    for r in "${RECIPES[@]}"; do check_image "$r"; done
    negative_tests
    xtask_images_test
    step ""
    printf '\n%-56s %8s\n' "step" "time" >&2
    printf '%s\n' "${TIMINGS[@]}" >&2
    printf '%-56s %6.1f s\n' "total (incl. prepare)" "$(echo "$(now) - $IMAGES_TEST_T0" | bc)" >&2
    # Across runs: the same inputs (wheel, commit, cached base) should give the same digests.
    local inputs="$WHEEL_SHA256 $REVISION $BASE_DIGEST" record="$CACHE/last-digests" prev note
    for r in "${RECIPES[@]}"; do
        prev=""
        [ ! -f "$record" ] || prev="$(awk -v k="$inputs $r" '$1" "$2" "$3" "$4 == k {print $5}' "$record" | tail -n1)"
        if [ -z "$prev" ]; then note="first run with these inputs"
        elif [ "$prev" = "${DIGEST1[$r]}" ]; then note="same digest as the previous run with these inputs"
        else note="DIFFERS from the previous run with these inputs ($prev)"; fi
        log "$r: $REG/test/$r@${DIGEST1[$r]} (rebuild identical; $note)"
        echo "$inputs $r ${DIGEST1[$r]}" >>"$record"
    done
    log "all image tests passed"
}

if [ "${1:-}" = --offline-phase ]; then
    mapfile -t TIMINGS <<<"${IMAGES_TEST_PREP_TIMINGS:-}"
    [ -n "${TIMINGS[0]}" ] || TIMINGS=()
    offline_phase
    exit 0
fi

cd "$REPO"
prepare
IMAGES_TEST_PREP_TIMINGS="$(printf '%s\n' "${TIMINGS[@]}")"
export IMAGES_TEST_PREP_TIMINGS DEBS_TARBALL WHEELS_CACHE WHEEL XTASK_BIN
if [ "${IMAGES_TEST_NETNS:-1}" = 1 ]; then
    exec unshare --net -- "$0" --offline-phase </dev/null
else
    exec "$0" --offline-phase </dev/null
fi
