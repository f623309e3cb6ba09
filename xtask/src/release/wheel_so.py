# The wheel's extension modules, out and back in: `extract WHEEL DIR` writes each `*.so`
# member under DIR and prints their names as JSON; `replace WHEEL MEMBER FILE` rewrites WHEEL
# with MEMBER's bytes taken from FILE and its RECORD line updated (sha256, size). Every other
# member keeps its bytes, and every member its order, time stamp, mode and compression, so the
# same input gives the same wheel. Run as `python -I -c <this> ...` (stdlib only).
import base64
import hashlib
import json
import os
import sys
import zipfile

cmd, wheel = sys.argv[1], sys.argv[2]
if cmd == "extract":
    out = sys.argv[3]
    names = []
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.filename.endswith(".so") or ".so." in info.filename.rsplit("/", 1)[-1]:
                path = os.path.join(out, info.filename)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(z.read(info))
                names.append(info.filename)
    print(json.dumps(names))
elif cmd == "replace":
    member, new_file = sys.argv[3], sys.argv[4]
    with open(new_file, "rb") as f:
        data = f.read()
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record_line = f"{member},sha256={digest},{len(data)}"
    tmp = wheel + ".tmp"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w") as dst:
        record = next(i.filename for i in src.infolist() if i.filename.endswith(".dist-info/RECORD"))
        replaced = False
        for info in src.infolist():
            body = src.read(info)
            if info.filename == member:
                body = data
                replaced = True
            elif info.filename == record:
                lines = body.decode().splitlines()
                hits = [i for i, l in enumerate(lines) if l.rsplit(",", 2)[0] == member]
                if len(hits) != 1:
                    sys.exit(f"{record} has {len(hits)} lines for {member}")
                lines[hits[0]] = record_line
                body = ("\n".join(lines) + "\n").encode()
            clone = zipfile.ZipInfo(info.filename, info.date_time)
            clone.compress_type = info.compress_type
            clone.external_attr = info.external_attr
            clone.create_system = info.create_system
            dst.writestr(clone, body)
        if not replaced:
            sys.exit(f"{wheel} has no member {member}")
    os.replace(tmp, wheel)
else:
    sys.exit(f"unknown command {cmd}")
