"""``mooncake-doctor`` / ``python -m mooncake.doctor``: checks this host for the
transfer engine and says, for each finding, what it saw and what to fix.

The checks run in Rust (``transfer_engine_doctor``); this module only adds what Python
knows and Rust cannot see: the interpreter, glibc, the installed wheel's tags, and the
installed distributions that ship a ``mooncake`` package. Run with ``--help``.
"""

import json
import os
import platform
import sys
from importlib import metadata

__all__ = ["facts", "main"]


def _glibc():
    try:
        v = os.confstr("CS_GNU_LIBC_VERSION")  # "glibc 2.35"
    except (ValueError, OSError, AttributeError):
        v = None
    if v and v.startswith("glibc "):
        return v.split(" ", 1)[1]
    lib, ver = platform.libc_ver()
    return ver if lib == "glibc" and ver else None


def _ships_mooncake(dist):
    files = dist.files or []
    return any(str(f).replace("\\", "/").startswith("mooncake/") for f in files)


def _ships_native(dist):
    """Whether ``dist`` is this wheel: it ships ``mooncake/_native``."""
    return any(str(f).replace("\\", "/").startswith("mooncake/_native") for f in (dist.files or []))


def _mooncake_distributions():
    """Installed distributions with files under ``mooncake/`` (ours, upstream's, ...)."""
    found = []
    seen = set()
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        if "mooncake" not in name.lower() or name.lower() in seen:
            continue
        if not _ships_mooncake(dist):
            continue
        seen.add(name.lower())
        found.append(dist)
    return found


def _wheel_of(dist):
    text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]
    return {"name": dist.metadata["Name"], "version": dist.version, "tags": tags}


def facts():
    """What Python knows, as the Rust doctor reads it (see doctor/src/python.rs)."""
    dists = _mooncake_distributions()
    ours = [d for d in dists if _ships_native(d)]
    return {
        "python_version": platform.python_version(),
        "implementation": sys.implementation.name,
        "interpreter_tag": "cp%d%d" % sys.version_info[:2],
        "machine": platform.machine(),
        "system": platform.system(),
        "glibc": _glibc(),
        "executable": sys.executable,
        "wheel": _wheel_of(ours[0]) if ours else None,
        "distributions": [
            {
                "name": d.metadata["Name"],
                "version": d.version,
                "location": str(d.locate_file("")),
                "this_engine": _ships_native(d),
            }
            for d in dists
        ],
    }


def main(argv=None):
    """Runs the doctor with ``argv`` (default ``sys.argv``); returns its exit status."""
    import signal

    from mooncake import _native

    argv = list(sys.argv if argv is None else argv)
    argv[0] = "mooncake-doctor"
    # The checks run with the GIL released; let Ctrl-C end the process directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return _native.run_doctor(argv, json.dumps(facts()))


if __name__ == "__main__":
    sys.exit(main())
