#!/usr/bin/env python3
"""A stand-in for `gh api`, enough for release-musa.yaml's GitHub Release step.

Keeps one repository's tags, releases and assets in the JSON file $FAKE_GH_STATE, answers
the REST calls the step makes with GitHub's shapes and status rules (422 on a duplicate asset
name, 404 on an unknown tag), and filters with the real `jq` as `gh --jq` does. Every call is
appended to the state's "calls" list so tests can check what was (not) done.
"""

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
from urllib.parse import parse_qs, urlsplit


def main() -> int:
    args = sys.argv[1:]
    assert args and args[0] == "api", args
    args = args[1:]
    method, fields, jq, body_file, accept, path = "GET", {}, None, None, "", None
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-X", "--method"):
            method = args[i + 1]; i += 2
        elif a in ("-f", "-F", "--raw-field", "--field"):
            k, _, v = args[i + 1].partition("=")
            if a in ("-F", "--field") and v in ("true", "false"):
                v = v == "true"
            fields[k] = v; i += 2
        elif a == "--jq":
            jq = args[i + 1]; i += 2
        elif a == "--input":
            body_file = args[i + 1]; i += 2
        elif a in ("-H", "--header"):
            if args[i + 1].lower().startswith("accept:"):
                accept = args[i + 1].split(":", 1)[1].strip()
            i += 2
        elif a == "--paginate":
            i += 1
        else:
            path = a; i += 1
    state_file = os.environ["FAKE_GH_STATE"]
    with open(state_file) as f:
        state = json.load(f)
    state.setdefault("calls", []).append([method, path])
    status, out = handle(state, method, path, fields, body_file, accept)
    with open(state_file, "w") as f:
        json.dump(state, f, indent=1)
    if status >= 400:
        print(f"gh: {out.get('message')} (HTTP {status})", file=sys.stderr)
        return 1
    if isinstance(out, bytes):
        sys.stdout.buffer.write(out)
        return 0
    text = json.dumps(out)
    if jq is not None:
        return subprocess.run(["jq", "-r", jq], input=text, text=True).returncode
    print(text)
    return 0


def public(release: dict) -> dict:
    r = {k: v for k, v in release.items() if k != "assets"}
    r["html_url"] = f"https://github.com/o/r/releases/tag/{release['tag_name']}"
    return r


def asset_view(a: dict) -> dict:
    return {k: v for k, v in a.items() if k != "content"}


def handle(state, method, path, fields, body_file, accept):
    url = urlsplit(path)
    p = url.path.lstrip("/")
    if m := re.fullmatch(r"repos/[^/]+/[^/]+/git/ref/tags/(.+)", p):
        tag = state["tags"].get(m.group(1))
        return (200, {"object": tag}) if tag else (404, {"message": "Not Found"})
    if m := re.fullmatch(r"repos/[^/]+/[^/]+/git/tags/(\w+)", p):
        return 200, {"object": {"type": "commit", "sha": state["tag_objects"][m.group(1)]}}
    if re.fullmatch(r"repos/[^/]+/[^/]+/releases", p):
        if method == "GET":
            return 200, [public(r) for r in state["releases"]]
        rid = 1000 + len(state["releases"])
        r = {"id": rid, "tag_name": fields["tag_name"], "name": fields.get("name"),
             "body": fields.get("body"), "draft": bool(fields.get("draft")), "assets": []}
        state["releases"].append(r)
        return 201, public(r)
    if m := re.fullmatch(r"repos/[^/]+/[^/]+/releases/(\d+)/assets", p):
        r = next(r for r in state["releases"] if r["id"] == int(m.group(1)))
        if method == "GET":
            return 200, [asset_view(a) for a in r["assets"]]
        name = parse_qs(url.query)["name"][0]
        if any(a["name"] == name for a in r["assets"]):
            return 422, {"message": "Validation Failed: already_exists"}
        data = open(body_file, "rb").read()
        a = {"id": 5000 + sum(len(x["assets"]) for x in state["releases"]) + len(state["calls"]),
             "name": name, "state": "uploaded", "size": len(data),
             "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
             "content": base64.b64encode(data).decode()}
        r["assets"].append(a)
        return 201, asset_view(a)
    if m := re.fullmatch(r"repos/[^/]+/[^/]+/releases/assets/(\d+)", p):
        aid = int(m.group(1))
        for r in state["releases"]:
            for a in r["assets"]:
                if a["id"] == aid:
                    if method == "DELETE":
                        r["assets"].remove(a)
                        return 204, {}
                    if accept == "application/octet-stream":
                        return 200, base64.b64decode(a["content"])
                    return 200, asset_view(a)
        return 404, {"message": "Not Found"}
    if m := re.fullmatch(r"repos/[^/]+/[^/]+/releases/(\d+)", p):
        r = next(r for r in state["releases"] if r["id"] == int(m.group(1)))
        if method == "PATCH":
            r.update({k: v for k, v in fields.items()})
        return 200, public(r)
    return 404, {"message": f"no route for {method} {path}"}


if __name__ == "__main__":
    sys.exit(main())
