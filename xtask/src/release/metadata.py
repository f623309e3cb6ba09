# Upload form fields of a wheel (METADATA) or an sdist (PKG-INFO), as twine sends them.
# Run as `python -I -c <this> FILE`; prints a JSON list of [field, value] pairs.
import email.parser
import json
import sys
import tarfile
import zipfile

path = sys.argv[1]
if path.endswith(".whl"):
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        raw = z.read(name)
    filetype = "bdist_wheel"
    pyversion = path[:-4].split("-")[-3]
else:
    with tarfile.open(path) as t:
        member = next(m for m in t.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"))
        raw = t.extractfile(member).read()
    filetype = "sdist"
    pyversion = "source"

msg = email.parser.BytesParser().parsebytes(raw)
MULTI = {
    "Classifier": "classifiers",
    "Requires-Dist": "requires_dist",
    "Provides-Dist": "provides_dist",
    "Obsoletes-Dist": "obsoletes_dist",
    "Requires-External": "requires_external",
    "Project-URL": "project_urls",
    "Provides-Extra": "provides_extra",
    "Platform": "platform",
    "Supported-Platform": "supported_platform",
    "License-File": "license_file",
    "Dynamic": "dynamic",
}
fields = [["filetype", filetype], ["pyversion", pyversion]]
for key in msg.keys():
    if key in MULTI:
        continue
    if key == "Description":
        continue
    fields.append([key.lower().replace("-", "_"), msg[key]])
for key, field in MULTI.items():
    for value in msg.get_all(key) or []:
        fields.append([field, value])
body = msg.get_payload()
description = msg["Description"] or body
if description:
    fields.append(["description", description])
seen = set()
unique = []
for f, v in fields:
    if f not in MULTI.values():
        if f in seen:
            continue
        seen.add(f)
    unique.append([f, v])
print(json.dumps(unique))
