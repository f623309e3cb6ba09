//! Phase `publish PyPI`: ask the index what it holds for this project, upload what is missing,
//! skip what is identical, stop on a different file under the same name.
//!
//! Two well-kept tools do the talking. The index is read through the Simple API in its PEP 691
//! JSON form (PyPI and devpi-server both serve it, so the tests run this code against devpi on
//! loopback) with `reqwest`; uploads are `uv publish --check-url` (uv from the hash-locked
//! build-tools venv), which does the upload protocol, its retries and trusted publishing (the
//! OIDC exchange) itself. Every file is compared before any is uploaded: a conflict stops the
//! phase with nothing uploaded; a file already there with our bytes is skipped, so a run that
//! was interrupted resumes where it stopped. Credentials: `PYPI_API_TOKEN` (password of
//! `PYPI_USERNAME`, default `__token__`), else trusted publishing when GitHub Actions offers an
//! ID token. Tokens reach uv in its environment, never on a command line, and are never printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, format_err, Context};
use serde::Deserialize;
use xshell::{cmd, Shell};

use crate::checksums::{sha256_file, Manifest};
use crate::env;
use crate::publication::{Place, PlacedFile, Published};
use crate::release::file_name;
use crate::retry::Policy;
use crate::version::normalize_name;
use crate::Workspace;

/// An index: where to upload, where to ask.
#[derive(Debug, Clone)]
pub struct Index {
    /// Legacy upload endpoint, e.g. `https://upload.pypi.org/legacy/`.
    pub upload_url: String,
    /// Simple API root, e.g. `https://pypi.org/simple/`.
    pub simple_url: String,
}

impl Index {
    /// The project's Simple API page.
    pub fn project_url(&self, project: &str) -> String {
        format!(
            "{}/{}/",
            self.simple_url.trim_end_matches('/'),
            normalize_name(project)
        )
    }
}

/// How uv authenticates the upload. `Debug` hides the password.
#[derive(Clone)]
pub enum Credentials {
    /// HTTP Basic: an API token (user `__token__`) or a user's password.
    Password { username: String, password: String },
    /// PyPI trusted publishing: uv trades the GitHub Actions ID token for a short-lived token.
    TrustedPublishing,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Password { username, .. } => write!(
                f,
                "Credentials::Password {{ username: {username:?}, password: <hidden> }}"
            ),
            Credentials::TrustedPublishing => write!(f, "Credentials::TrustedPublishing"),
        }
    }
}

/// `PYPI_API_TOKEN` when set, else trusted publishing when GitHub Actions offers an ID token.
pub fn credentials() -> anyhow::Result<Credentials> {
    if let Some(password) = env::var(env::PYPI_API_TOKEN) {
        return Ok(Credentials::Password {
            username: env::var(env::PYPI_USERNAME).unwrap_or_else(|| "__token__".to_owned()),
            password,
        });
    }
    if env::var(env::ACTIONS_ID_TOKEN_REQUEST_URL).is_some()
        && env::var(env::ACTIONS_ID_TOKEN_REQUEST_TOKEN).is_some()
    {
        return Ok(Credentials::TrustedPublishing);
    }
    bail!(
        "no PyPI credentials: run in GitHub Actions with `permissions: id-token: write` and a \
         trusted publisher configured for this project (trusted publishing), or set {} to an \
         API token scoped to the project. Use --dry-run to stop before publishing.",
        env::PYPI_API_TOKEN
    )
}

/// The index of `release.toml [pypi]`, or the one named by `PYPI_REPOSITORY_URL` /
/// `PYPI_INDEX_URL`.
pub fn index(ws: &Workspace) -> Index {
    Index {
        upload_url: env::var(env::PYPI_REPOSITORY_URL)
            .unwrap_or_else(|| ws.config.pypi.repository_url.clone()),
        simple_url: env::var(env::PYPI_INDEX_URL)
            .unwrap_or_else(|| ws.config.pypi.index_url.clone()),
    }
}

/// Whether a release file goes to the index, by its name: the wheel and the sdist do; the
/// debug info, the SBOM, the sums and the manifest are GitHub assets only.
pub fn goes_to_index(name: &str) -> bool {
    name.ends_with(".whl") || name.ends_with(".tar.gz")
}

/// The files of a release that go to the index: the wheel and the sdist.
pub fn index_files(dist: &Path, manifest: &Manifest) -> Vec<PathBuf> {
    manifest
        .artifacts
        .values()
        .filter(|a| a.kind == "python-wheel" || a.kind == "source-tarball")
        .map(|a| dist.join(&a.name))
        .collect()
}

/// `uv` of the build-tools venv (`xtask/requirements-build.txt`).
pub fn uv(tools_venv: &Path) -> PathBuf {
    tools_venv.join("bin").join("uv")
}

/// Step 2 of publishing (see `xtask/README.md`): upload what the index lacks.
pub fn publish(
    sh: &Shell,
    ws: &Workspace,
    dist: &Path,
    manifest: &Manifest,
    tools_venv: &Path,
) -> anyhow::Result<Published> {
    publish_files(
        sh,
        &uv(tools_venv),
        &index(ws),
        &credentials()?,
        &ws.config.distribution,
        &index_files(dist, manifest),
    )
}

/// What the index holds of a release's files, compared by sha256. A file under one of our
/// names with other bytes (or without a sha256) is an error, so a comparison never has
/// conflicts.
#[derive(Debug)]
pub struct Comparison {
    /// The project's page on the index.
    pub project_url: String,
    /// Every file the index lists for the project.
    pub existing: BTreeMap<String, SimpleFile>,
    pub identical: Vec<String>,
    pub missing: Vec<PathBuf>,
}

impl Comparison {
    /// The versions of the project the index holds, oldest first (from its file names).
    pub fn versions(&self) -> Vec<pep440_rs::Version> {
        let mut v: Vec<_> = self
            .existing
            .keys()
            .filter_map(|f| file_version(f))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// The newest version pip would install by default: neither a pre-release, a dev release
    /// nor a local version.
    pub fn newest_release(&self) -> Option<pep440_rs::Version> {
        self.versions()
            .into_iter()
            .filter(|v| v.is_stable() && !v.is_local())
            .max()
    }

    /// What the index holds, for the preflight.
    pub fn describe(&self) -> String {
        let versions = self.versions();
        match (versions.first(), versions.last()) {
            (Some(first), Some(last)) => format!(
                "{} holds {} files of {} versions ({first} .. {last}; newest release: {})",
                self.project_url,
                self.existing.len(),
                versions.len(),
                self.newest_release()
                    .map_or("none".to_owned(), |v| v.to_string())
            ),
            _ => format!("{} holds no files of the project", self.project_url),
        }
    }

    /// Refuses to upload `ours` below the newest release on the index (pip would never choose
    /// it) unless `allow_older`. Nothing to upload: nothing to refuse (a re-run).
    pub fn check_not_older(&self, ours: &str, allow_older: bool) -> anyhow::Result<()> {
        let ours_v: pep440_rs::Version = ours
            .parse()
            .map_err(|e| format_err!("{ours:?} is not a PEP 440 version: {e}"))?;
        match self.newest_release() {
            Some(newest) if ours_v < newest && !self.missing.is_empty() && !allow_older => bail!(
                "version {ours} sorts below {newest}, the newest release on {}: pip would never \
                 choose it. Nothing was uploaded. To publish it anyway (a fix for an older \
                 series), pass --allow-older.",
                self.project_url
            ),
            Some(newest) if ours_v < newest && !self.missing.is_empty() => {
                eprintln!(
                    "    version {ours} sorts below {newest} on the index: publishing it \
                     (--allow-older)"
                );
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The version in a wheel's or an sdist's file name (PEP 427, PEP 625; older sdists with an
/// unnormalised name too), if it is one.
pub fn file_version(file_name: &str) -> Option<pep440_rs::Version> {
    let version = if let Some(stem) = file_name.strip_suffix(".whl") {
        stem.split('-').nth(1)?
    } else {
        let stem = [".tar.gz", ".zip", ".tar.bz2", ".tgz"]
            .iter()
            .find_map(|ext| file_name.strip_suffix(ext))?;
        stem.rsplit_once('-')?.1
    };
    version.parse().ok()
}

/// Asks the index what it holds and compares `files` with it; nothing is uploaded.
pub fn compare(index: &Index, project: &str, files: &[PathBuf]) -> anyhow::Result<Comparison> {
    let project_url = index.project_url(project);
    let existing = SimpleApi::new()?.files(&project_url)?;
    let mut missing = Vec::new();
    let mut conflicts = Vec::new();
    let mut identical = Vec::new();
    for path in files {
        let name = file_name(path);
        let (sha, _) = sha256_file(path)?;
        match existing.get(&name).map(|f| f.sha256.as_ref()) {
            Some(Some(theirs)) if *theirs == sha => identical.push(name),
            Some(Some(theirs)) => conflicts.push(format!(
                "{name}: the index has sha256 {theirs}, ours is {sha}"
            )),
            Some(None) => conflicts.push(format!(
                "{name}: the index has it without a sha256 to compare"
            )),
            None => missing.push(path.clone()),
        }
    }
    if !conflicts.is_empty() {
        bail!(
            "{project_url} already holds other bytes under our file names; nothing was uploaded:\n    {}\n\
             Index files are immutable: if this build is not reproducible, find out why; to \
             ship a fix, cut the next .postN release.",
            conflicts.join("\n    ")
        );
    }
    Ok(Comparison {
        project_url,
        existing,
        identical,
        missing,
    })
}

/// The last check before the GitHub release goes public: the index holds every one of `files`,
/// with our bytes.
pub fn require_identical(index: &Index, project: &str, files: &[PathBuf]) -> anyhow::Result<Place> {
    let c = compare(index, project, files)?;
    if !c.missing.is_empty() {
        bail!(
            "{} lacks {}: the GitHub release stays a draft until the index has the same bytes. \
             Publish to the index first (`cargo xtask publish pypi <dist-dir>`).",
            c.project_url,
            c.missing
                .iter()
                .map(|p| file_name(p))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    eprintln!(
        "    {}: holds {} with our sha256",
        c.project_url,
        c.identical.join(", ")
    );
    // `compare` refused any file without our sha256, so every identical one has it.
    let files = c
        .identical
        .iter()
        .filter_map(|name| {
            let f = c.existing.get(name)?;
            Some((
                name.clone(),
                PlacedFile {
                    url: f.url.clone(),
                    sha256: f.sha256.clone()?,
                },
            ))
        })
        .collect();
    Ok(Place {
        name: "PyPI".to_owned(),
        url: c.project_url,
        files,
    })
}

/// Compares every file with the index, uploads the missing ones with `uv publish`, then asks
/// the index again: every file must be there with our sha256.
pub fn publish_files(
    sh: &Shell,
    uv: &Path,
    index: &Index,
    credentials: &Credentials,
    project: &str,
    files: &[PathBuf],
) -> anyhow::Result<Published> {
    let before = compare(index, project, files)?;
    for name in &before.identical {
        eprintln!("    {name}: already on the index, identical");
    }
    if !before.missing.is_empty() {
        upload(sh, uv, index, credentials, &before.missing)?;
    }
    let after = compare(index, project, files)?;
    if !after.missing.is_empty() {
        bail!(
            "uv publish succeeded, but {} does not list {}: check that {} is the upload \
             endpoint of that index",
            after.project_url,
            after
                .missing
                .iter()
                .map(|p| file_name(p))
                .collect::<Vec<_>>()
                .join(", "),
            index.upload_url
        );
    }
    let uploaded: Vec<String> = before.missing.iter().map(|p| file_name(p)).collect();
    Ok(Published {
        place: Place {
            name: "PyPI".to_owned(),
            url: after.project_url,
            files: BTreeMap::new(),
        },
        uploaded,
        identical: before.identical,
    })
}

/// `uv publish --check-url`: the upload protocol, its retries and trusted publishing are uv's.
/// The password travels in uv's environment (`UV_PUBLISH_PASSWORD`), never on its command line.
fn upload(
    sh: &Shell,
    uv: &Path,
    index: &Index,
    credentials: &Credentials,
    files: &[PathBuf],
) -> anyhow::Result<()> {
    let names: Vec<String> = files.iter().map(|p| file_name(p)).collect();
    eprintln!("    uploading {} (uv publish)", names.join(", "));
    let (publish_url, check_url) = (&index.upload_url, &index.simple_url);
    let mut command = cmd!(
        sh,
        "{uv} --no-config publish --no-progress --publish-url {publish_url} --check-url {check_url}"
    )
    .env_remove("UV_PUBLISH_TOKEN")
    .env_remove("UV_PUBLISH_USERNAME")
    .env_remove("UV_PUBLISH_PASSWORD");
    command = match credentials {
        Credentials::Password { username, password } => command
            .args(["--trusted-publishing", "never", "--username", username])
            .env("UV_PUBLISH_PASSWORD", password),
        Credentials::TrustedPublishing => command.args(["--trusted-publishing", "always"]),
    };
    let out = command
        .args(files)
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| {
            format!(
                "cannot run {}: is the build-tools venv complete?",
                uv.display()
            )
        })?;
    let said = String::from_utf8_lossy(&out.stderr);
    for line in said.lines().filter(|l| !l.trim().is_empty()) {
        eprintln!("    uv: {line}");
    }
    if !out.status.success() {
        let last: Vec<&str> = said.lines().filter(|l| !l.trim().is_empty()).collect();
        bail!(
            "uv publish to {} failed ({}) for {}: {}. Nothing is uploaded twice: a re-run \
             skips what the index already holds with our sha256.",
            index.upload_url,
            out.status,
            names.join(", "),
            last[last.len().saturating_sub(6)..].join(" / ")
        );
    }
    Ok(())
}

// --- the Simple API (PEP 691 JSON) ------------------------------------------------------------

/// One file of a Simple API project page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleFile {
    /// Where to download it, resolved against the page.
    pub url: String,
    pub sha256: Option<String>,
}

#[derive(Deserialize)]
struct ProjectPage {
    files: Vec<PageFile>,
}

#[derive(Deserialize)]
struct PageFile {
    filename: String,
    url: String,
    #[serde(default)]
    hashes: BTreeMap<String, String>,
}

/// A PEP 691 project page at `page_url`: file name -> file, URLs resolved against the page.
pub fn parse_simple(page_url: &str, body: &[u8]) -> anyhow::Result<BTreeMap<String, SimpleFile>> {
    let base = url::Url::parse(page_url).with_context(|| format!("{page_url:?} is not a URL"))?;
    let page: ProjectPage = serde_json::from_slice(body).with_context(|| {
        format!("{page_url}: not a PEP 691 JSON project page (application/vnd.pypi.simple.v1+json)")
    })?;
    page.files
        .into_iter()
        .map(|mut f| {
            let url = base
                .join(&f.url)
                .with_context(|| format!("{page_url}: bad URL {:?} for {}", f.url, f.filename))?;
            let file = SimpleFile {
                url: url.into(),
                sha256: f.hashes.remove("sha256"),
            };
            Ok((f.filename, file))
        })
        .collect()
}

/// The PEP 691 JSON media type; an index that answers anything else is refused by name.
const SIMPLE_JSON: &str = "application/vnd.pypi.simple.v1+json";

/// Reads of the index, each retried under [`Policy::NETWORK`] on 5xx, 429 and transport errors.
struct SimpleApi {
    client: reqwest::Client,
    rt: tokio::runtime::Runtime,
}

impl SimpleApi {
    fn new() -> anyhow::Result<SimpleApi> {
        // reqwest's rustls with the ring provider, as octocrab uses; installed once per process.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent("mooncake-xtask")
            .timeout(Duration::from_secs(600))
            .build()
            .context("cannot set up the HTTP client")?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(SimpleApi { client, rt })
    }

    /// GET `url`: the status and the body.
    fn get(&self, url: &str, accept: Option<&str>) -> anyhow::Result<(u16, Vec<u8>)> {
        let what = format!("GET {url}");
        let policy = Policy::NETWORK;
        let attempt = |_| async {
            let mut req = self.client.get(url);
            if let Some(accept) = accept {
                req = req.header(reqwest::header::ACCEPT, accept);
            }
            let resp = req.send().await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let body = resp.bytes().await.map_err(|e| e.to_string())?;
            if status >= 500 || status == 429 {
                return Err(format!("HTTP {status}: {}", snippet(&body)));
            }
            Ok((status, body.to_vec()))
        };
        self.rt
            .block_on(policy.run(&what, attempt, |why: &String| Some(why.clone())))
            .map_err(|why| {
                format_err!("{what}: {why} (gave up after {} attempts)", policy.attempts)
            })
    }

    /// File name -> file of everything the index has for a project (none: an empty map).
    fn files(&self, project_url: &str) -> anyhow::Result<BTreeMap<String, SimpleFile>> {
        let (status, body) = self.get(project_url, Some(SIMPLE_JSON))?;
        match status {
            200 => parse_simple(project_url, &body),
            404 => Ok(BTreeMap::new()),
            _ => bail!(
                "cannot ask the index what it holds: GET {project_url}: HTTP {status}: {}",
                snippet(&body)
            ),
        }
    }
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    text.chars().take(300).collect()
}

/// Downloads `names` of `project` from the index, with a progress line a file; a name the
/// index does not list is left out of the result.
pub fn download(
    index: &Index,
    project: &str,
    names: &[String],
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let api = SimpleApi::new()?;
    let project_url = index.project_url(project);
    let listed = api.files(&project_url)?;
    let mut out = BTreeMap::new();
    for name in names {
        let Some(file) = listed.get(name) else {
            eprintln!("    [index] {name}: not listed on {project_url}");
            continue;
        };
        let started = std::time::Instant::now();
        let (status, body) = api.get(&file.url, None)?;
        if status != 200 {
            bail!("GET {}: HTTP {status}: {}", file.url, snippet(&body));
        }
        eprintln!(
            "    [index] {name}: {} bytes in {}",
            body.len(),
            crate::phase::fmt_duration(started.elapsed())
        );
        out.insert(name.clone(), body);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pep_691_pages_resolve_urls_and_keep_the_sha256() {
        let json = br#"{"meta": {"api-version": "1.0"}, "name": "x", "files": [
            {"filename": "x-0.1.0.tar.gz", "url": "../../+f/abc/x-0.1.0.tar.gz", "hashes": {"sha256": "cccc"}},
            {"filename": "x-0.1.0-py3-none-any.whl", "url": "https://files/x.whl", "hashes": {}}]}"#;
        let m = parse_simple("http://127.0.0.1:3141/u/i/+simple/x/", json).unwrap();
        assert_eq!(m["x-0.1.0.tar.gz"].sha256.as_deref(), Some("cccc"));
        assert_eq!(
            m["x-0.1.0.tar.gz"].url,
            "http://127.0.0.1:3141/u/i/+f/abc/x-0.1.0.tar.gz"
        );
        assert_eq!(m["x-0.1.0-py3-none-any.whl"].sha256, None);
        assert_eq!(m["x-0.1.0-py3-none-any.whl"].url, "https://files/x.whl");
        // An HTML page (PEP 503) is refused by name rather than scraped.
        let err = parse_simple("https://i/simple/x/", b"<html><a href=\"x\">x</a></html>")
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a PEP 691 JSON project page"), "{err}");
    }

    fn comparison(files: &[&str], missing: bool) -> Comparison {
        Comparison {
            project_url: "https://pypi.org/simple/x/".into(),
            existing: files
                .iter()
                .map(|f| {
                    let file = SimpleFile {
                        url: format!("https://files/{f}"),
                        sha256: None,
                    };
                    ((*f).to_owned(), file)
                })
                .collect(),
            identical: vec![],
            missing: if missing {
                vec![PathBuf::from("x-0.1.0.tar.gz")]
            } else {
                vec![]
            },
        }
    }

    #[test]
    fn versions_come_from_wheel_and_sdist_names() {
        let v = |f: &str| file_version(f).map(|v| v.to_string());
        assert_eq!(
            v("x_y-0.3.12.post1-cp39-abi3-manylinux_2_35_x86_64.whl").as_deref(),
            Some("0.3.12.post1")
        );
        assert_eq!(v("x_y-1.0-1-py3-none-any.whl").as_deref(), Some("1.0"));
        assert_eq!(
            v("mooncake-transfer-engine-musa-0.3.7.tar.gz").as_deref(),
            Some("0.3.7")
        );
        assert_eq!(v("x-2.0rc1.zip").as_deref(), Some("2.0rc1"));
        assert_eq!(v("x-0.1.0.exe"), None);
        assert_eq!(v("x-notaversion.tar.gz"), None);
    }

    #[test]
    fn an_older_version_is_refused_naming_the_newest_release() {
        let c = comparison(
            &[
                "x-0.3.12.tar.gz",
                "x-0.3.12.post1-py3-none-any.whl",
                "x-0.4.0rc1.tar.gz",
                "x-0.2.0.tar.gz",
            ],
            true,
        );
        assert_eq!(c.newest_release().unwrap().to_string(), "0.3.12.post1");
        assert!(
            c.describe().contains(
                "4 files of 4 versions (0.2.0 .. 0.4.0rc1; newest release: 0.3.12.post1)"
            ),
            "{}",
            c.describe()
        );
        let err = c.check_not_older("0.3.12", false).unwrap_err().to_string();
        assert!(err.contains("version 0.3.12 sorts below 0.3.12.post1, the newest release on https://pypi.org/simple/x/"), "{err}");
        assert!(err.contains("--allow-older"), "{err}");
        c.check_not_older("0.3.12", true).unwrap();
        // Newer than every release (the pre-release of 0.4.0 does not count): fine.
        c.check_not_older("0.3.13", false).unwrap();
        // Nothing to upload (a re-run of an old release): nothing to refuse.
        comparison(&["x-0.3.12.post1.tar.gz"], false)
            .check_not_older("0.3.12", false)
            .unwrap();
        assert!(comparison(&[], true).describe().contains("holds no files"));
    }

    #[test]
    fn credentials_never_show_the_password() {
        let c = Credentials::Password {
            username: "__token__".into(),
            password: "pypi-secret".into(),
        };
        assert!(!format!("{c:?}").contains("pypi-secret"));
    }
}
