"""Install the transfer-engine wheel into a serving image, by SHA256, and smoke-test it.

Runs inside `podman build` / `docker build` (images/*/Dockerfile) with the base image's
Python, from the build context (bind-mounted, so nothing of the context stays in the image):

    python3 install-wheels.py --context DIR --base-image NAME@sha256:HEX --base-digest sha256:HEX \
        --distribution NAME --version VERSION --wheel FILE --wheel-sha256 HEX \
        [--requirements FILE ...] [--expect DIST==VERSION ...] [--import MODULE ...]

1. refuses a base image that is not pinned by digest (BASE_IMAGE must end in @BASE_DIGEST);
2. refuses a wheel whose SHA256 is not WHEEL_SHA256, or whose name is not the distribution
   at VERSION;
3. uninstalls every installed `mooncake-transfer-engine*` distribution (all variants share
   the `mooncake` import package, so two would overwrite each other's files);
4. installs the wheel with pip --require-hashes --no-index --only-binary=:all: from a
   generated requirements line (`NAME==VERSION --hash=sha256:WHEEL_SHA256`), plus the given
   hash-pinned requirement files (for SGLang: sglang-router), from the build context only;
5. smoke test, in a fresh interpreter: `from mooncake.engine import TransferEngine`, the
   installed version is VERSION, exactly one mooncake-transfer-engine* distribution, no
   vendor runtime (libmusa, libmusart, libibverbs, libcudart, libmlx5) among the installed
   files or in the DT_NEEDED list of any installed ELF object, each --expect holds (that
   distribution at that version, its top-level module importable) and each --import imports.

Every refusal is one line starting with `error:` that says what to do. Python >= 3.8 (the
MUSA images ship 3.10). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

CONFLICTS = "mooncake-transfer-engine"
VENDOR_LIBRARIES = ("libmusa", "libmusart", "libibverbs", "libcudart", "libmlx5")


def fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def say(msg: str) -> None:
    print(f"install-wheels: {msg}", flush=True)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --- 1, 2: what we are asked to build from --------------------------------------------------


def check_base(image: str, digest: str) -> None:
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest or ""):
        fail(f"BASE_DIGEST={digest!r} is not sha256:<64 hex>: pass the base image's manifest digest")
    if "@sha256:" not in image:
        fail(f"BASE_IMAGE={image!r} is not pinned by digest: pass NAME@sha256:<digest> "
             "(resolve the tag once, record the digest in release.toml, build from that)")
    if not image.endswith("@" + digest):
        fail(f"BASE_IMAGE={image!r} does not end in @BASE_DIGEST ({digest}): pass the same digest twice")


def check_wheel(context: str, wheel: str, sha256: str, distribution: str, version: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{64}", sha256 or ""):
        fail(f"WHEEL_SHA256={sha256!r} is not 64 lowercase hex digits")
    if not version:
        fail("VERSION is empty: pass the release's PEP 440 version")
    if not wheel or "/" in wheel or not wheel.endswith(".whl"):
        fail(f"WHEEL={wheel!r} must be the wheel's file name in the build context")
    parts = wheel[:-4].split("-")
    if len(parts) < 5 or normalize(parts[0]) != normalize(distribution) or parts[1] != version:
        fail(f"WHEEL={wheel} is not a wheel of {distribution} {version}")
    path = os.path.join(context, wheel)
    if not os.path.isfile(path):
        fail(f"{wheel} is not in the build context: copy the release's wheel next to the Dockerfile")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != sha256:
        fail(f"{wheel} has sha256 {h.hexdigest()}, but WHEEL_SHA256 pins {sha256}: "
             "refusing to install a wheel that is not the released one")
    say(f"{wheel}: sha256 {sha256} as pinned")
    return path


# --- 3, 4: pip --------------------------------------------------------------------------


def pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    say("$ " + " ".join(cmd))
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail(f"pip {args[0]} failed (exit {r.returncode}); its messages are above")


def installed_conflicts() -> list:
    from importlib import metadata

    names = set()
    for d in metadata.distributions():
        name = d.metadata["Name"] or ""
        if normalize(name).startswith(CONFLICTS):
            names.add(name)
    return sorted(names)


def remove_conflicts() -> None:
    names = installed_conflicts()
    if names:
        say("removing " + ", ".join(names))
        pip("uninstall", "-y", *names)
    else:
        say("no mooncake-transfer-engine* distribution installed")
    left = installed_conflicts()
    if left:
        fail("still installed after pip uninstall: " + ", ".join(left))


def install(context: str, distribution: str, version: str, sha256: str, requirements: list) -> None:
    lines = [f"{distribution}=={version} --hash=sha256:{sha256}\n"]
    for r in requirements:
        with open(os.path.join(context, r)) as f:
            lines.append(f.read())
    with tempfile.TemporaryDirectory() as tmp:
        req = os.path.join(tmp, "requirements.txt")
        with open(req, "w") as f:
            f.writelines(lines)
        say("requirements:\n" + "".join(lines).rstrip())
        pip("install", "--no-index", "--find-links", context, "--require-hashes",
            "--only-binary=:all:", "--no-cache-dir", "--no-compile", "-r", req)


# --- 5: smoke test (runs in a fresh interpreter) ------------------------------------------


def elf_needed(path: str) -> list:
    """DT_NEEDED entries of an ELF64 little-endian object ([] for anything else)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    needed = []
    for sh in sections:
        if sh[1] != 6:  # SHT_DYNAMIC
            continue
        strtab = sections[sh[6]]
        stroff = strtab[4]
        for off in range(sh[4], sh[4] + sh[5], 16):
            tag, val = struct.unpack_from("<qQ", data, off)
            if tag == 0:
                break
            if tag == 1:  # DT_NEEDED
                end = data.index(b"\0", stroff + val)
                needed.append(data[stroff + val:end].decode())
    return needed


def is_vendor_library(name: str) -> bool:
    """libcudart.so.12, libmusart-1a2b.so.5: yes; libmusa_helpers.so, libc.so.6: no."""
    return any(name.startswith(v) and name[len(v):].startswith((".so", "-"))
               for v in VENDOR_LIBRARIES)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def smoke_store() -> str:
    """`mooncake.store` imports and `mooncake_master` serves (its /health answers)."""
    import shutil
    import subprocess
    import time
    import urllib.request

    from mooncake.store import MooncakeDistributedStore, ReplicateConfig  # noqa: F401

    master = shutil.which("mooncake_master")
    if not master:
        fail("mooncake_master is not on PATH: the wheel's console script is missing")
    metrics = free_port()
    proc = subprocess.Popen([master, f"--rpc_port={free_port()}", "--rpc_address=127.0.0.1",
                             "--metrics_host=127.0.0.1", f"--metrics_port={metrics}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                fail(f"mooncake_master exited with {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/health", timeout=2) as r:
                    if r.status == 200:
                        return "mooncake.store imported; mooncake_master answered /health"
            except OSError:
                time.sleep(0.2)
        fail("mooncake_master did not answer /health within 15 s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    return ""


def smoke(distribution: str, version: str, expect: list, imports: list) -> dict:
    import importlib
    from importlib import metadata

    from mooncake.engine import TransferEngine  # noqa: F401  (the contract of the image)

    import mooncake

    report = {"distribution": distribution, "version": metadata.version(distribution),
              "python": sys.version.split()[0], "package": os.path.dirname(mooncake.__file__)}
    if report["version"] != version:
        fail(f"installed {distribution} is {report['version']}, VERSION is {version}")
    variants = installed_conflicts()
    if variants != [metadata.metadata(distribution)["Name"]]:
        fail(f"expected only {distribution} among mooncake-transfer-engine*, found {variants}")
    TransferEngine()
    report["store"] = smoke_store()

    # Every installed file of the distribution, and everything under the package directory.
    dist = metadata.distribution(distribution)
    files = {os.path.realpath(str(p.locate())) for p in dist.files or []}
    for root, _, names in os.walk(report["package"]):
        files.update(os.path.realpath(os.path.join(root, n)) for n in names)
    bundled = sorted(f for f in files if is_vendor_library(os.path.basename(f)))
    if bundled:
        fail("vendor runtime bundled in the image's wheel: " + ", ".join(bundled))
    linked = {}
    for f in sorted(files):
        if os.path.isfile(f):
            needed = elf_needed(f)
            if needed:
                linked[os.path.relpath(f, os.path.dirname(report["package"]))] = needed
    for f, needed in linked.items():
        bad = [n for n in needed if is_vendor_library(n)]
        if bad:
            fail(f"{f} links {', '.join(bad)} (DT_NEEDED): vendor runtimes must be loaded at run time")
    report["elf_needed"] = linked

    for e in expect:
        name, _, want = e.partition("==")
        got = metadata.version(name)
        if got != want:
            fail(f"installed {name} is {got}, expected {want}")
        top = (metadata.distribution(name).read_text("top_level.txt") or "").split()
        module = top[0] if top else normalize(name).replace("-", "_")
        importlib.import_module(module)
        report.setdefault("expect", {})[name] = got
    for m in imports:
        importlib.import_module(m)
    report["imported"] = imports
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--context", required=True)
    p.add_argument("--base-image", default="")
    p.add_argument("--base-digest", default="")
    p.add_argument("--distribution", required=True)
    p.add_argument("--version", default="")
    p.add_argument("--wheel", default="")
    p.add_argument("--wheel-sha256", default="")
    p.add_argument("--requirements", action="append", default=[])
    p.add_argument("--expect", action="append", default=[])
    p.add_argument("--import", dest="imports", action="append", default=[])
    p.add_argument("--smoke-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.smoke_only:
        report = smoke(a.distribution, a.version, a.expect, a.imports)
        print("smoke test passed: " + json.dumps(report, sort_keys=True), flush=True)
        return

    check_base(a.base_image, a.base_digest)
    check_wheel(a.context, a.wheel, a.wheel_sha256, a.distribution, a.version)
    # Images are the environment: installing into the system interpreter is the point
    # (Debian-style bases mark it externally managed; Ubuntu 22.04's pip ignores this).
    os.environ["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    remove_conflicts()
    install(a.context, a.distribution, a.version, a.wheel_sha256, a.requirements)

    # A fresh interpreter, outside the context, sees what the image will see.
    cmd = [sys.executable, "-I", "-B", os.path.abspath(__file__), "--smoke-only",
           "--context", a.context, "--distribution", a.distribution, "--version", a.version]
    for e in a.expect:
        cmd += ["--expect", e]
    for m in a.imports:
        cmd += ["--import", m]
    r = subprocess.run(cmd, cwd="/")
    if r.returncode != 0:
        sys.exit(r.returncode)


if __name__ == "__main__":
    main()
