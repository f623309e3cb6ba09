//! Phase `publish PyPI`: ask the index what it holds for this project, upload what is missing,
//! skip what is identical, stop on a different file under the same name.
//!
//! The index is asked through the Simple API (PEP 691 JSON where served, PEP 503 HTML links
//! with `#sha256=` otherwise), which PyPI and devpi both answer, so tests run the production
//! code against devpi-server on loopback. Every file is compared before any is uploaded: a
//! conflict stops the phase with nothing half-uploaded. Uploads use the legacy API
//! (`:action=file_upload`, multipart) with the file's own metadata. Credentials: trusted
//! publishing (OIDC) when GitHub Actions offers an ID token, else `PYPI_API_TOKEN`. Tokens are
//! never printed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, format_err, Context};
use base64::Engine;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use xshell::{cmd, Shell};

use crate::checksums::{sha256_file, Manifest};
use crate::env;
use crate::ledger::{Place, Published};
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

/// HTTP Basic credentials for uploads. `Debug` hides the password.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Credentials {{ username: {:?}, password: <hidden> }}",
            self.username
        )
    }
}

/// One file to publish, with the metadata fields the upload form carries.
#[derive(Debug, Clone)]
pub struct Upload {
    pub path: PathBuf,
    /// `(field, value)` in form order; repeated fields (classifiers, requires_dist) repeat.
    pub fields: Vec<(String, String)>,
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

/// Step 2 of publishing (see `xtask/README.md`): upload what the index lacks.
pub fn publish(
    sh: &Shell,
    ws: &Workspace,
    dist: &Path,
    manifest: &Manifest,
    tools_venv: &Path,
) -> anyhow::Result<Published> {
    let index = index(ws);
    let uploads = index_files(dist, manifest)
        .iter()
        .map(|path| read_upload(sh, tools_venv, path))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = runtime()?;
    let credentials = rt.block_on(credentials(&index))?;
    rt.block_on(publish_files(
        &index,
        &credentials,
        &ws.config.distribution,
        &uploads,
    ))
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
    runtime()?.block_on(async {
        let http = Http::new()?;
        compare_with(&http, index, project, files).await
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
    Ok(Place {
        name: "PyPI".to_owned(),
        url: c.project_url,
    })
}

async fn compare_with(
    http: &Http,
    index: &Index,
    project: &str,
    files: &[PathBuf],
) -> anyhow::Result<Comparison> {
    let project_url = index.project_url(project);
    let existing = http.simple_files(&project_url).await?;
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

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Compares every file with the index, then uploads the missing ones.
pub async fn publish_files(
    index: &Index,
    credentials: &Credentials,
    project: &str,
    uploads: &[Upload],
) -> anyhow::Result<Published> {
    let http = Http::new()?;
    let paths: Vec<PathBuf> = uploads.iter().map(|u| u.path.clone()).collect();
    let Comparison {
        project_url,
        mut identical,
        missing,
        ..
    } = compare_with(&http, index, project, &paths).await?;
    for name in &identical {
        eprintln!("    {name}: already on the index, identical");
    }
    let mut uploaded = Vec::new();
    for u in uploads.iter().filter(|u| missing.contains(&u.path)) {
        let name = file_name(&u.path);
        let (sha, _) = sha256_file(&u.path)?;
        let bytes = std::fs::read(&u.path)?;
        eprint!("    {name}: uploading {} bytes… ", bytes.len());
        match http
            .upload(index, credentials, u, &name, &sha, bytes)
            .await?
        {
            UploadOutcome::Uploaded => {
                eprintln!("done");
                uploaded.push(name);
            }
            UploadOutcome::AlreadyExists(reason) => {
                // Raced with another upload, or an index that answers 400 for duplicates: ask.
                eprintln!("the index says: {reason}");
                let now = http.simple_files(&project_url).await?;
                match now.get(&name).and_then(|f| f.sha256.as_ref()) {
                    Some(theirs) if *theirs == sha => identical.push(name),
                    other => bail!(
                        "{name}: the index refused it ({reason}) and holds {}: not ours",
                        other.map_or("no comparable file".to_owned(), |s| format!("sha256 {s}"))
                    ),
                }
            }
        }
    }
    Ok(Published {
        place: Place {
            name: "PyPI".to_owned(),
            url: project_url,
        },
        uploaded,
        identical,
    })
}

/// Trusted publishing when GitHub Actions offers an ID token, else `PYPI_API_TOKEN`.
pub async fn credentials(index: &Index) -> anyhow::Result<Credentials> {
    if let (Some(url), Some(token)) = (
        env::var(env::ACTIONS_ID_TOKEN_REQUEST_URL),
        env::var(env::ACTIONS_ID_TOKEN_REQUEST_TOKEN),
    ) {
        let minted = trusted_publishing(index, &url, &token).await?;
        return Ok(Credentials {
            username: "__token__".to_owned(),
            password: minted,
        });
    }
    match env::var(env::PYPI_API_TOKEN) {
        Some(password) => Ok(Credentials {
            username: env::var(env::PYPI_USERNAME).unwrap_or_else(|| "__token__".to_owned()),
            password,
        }),
        None => bail!(
            "no PyPI credentials: run in GitHub Actions with `permissions: id-token: write` and a \
             trusted publisher configured for this project (trusted publishing), or set {} to an \
             API token scoped to the project. Use --dry-run to stop before publishing.",
            env::PYPI_API_TOKEN
        ),
    }
}

/// The OIDC exchange: audience from the index, ID token from GitHub, API token from the index.
pub async fn trusted_publishing(
    index: &Index,
    id_token_url: &str,
    id_token_request_token: &str,
) -> anyhow::Result<String> {
    let http = Http::new()?;
    let host = origin(&index.upload_url)?;
    let (status, body) = http
        .request("GET", &format!("{host}/_/oidc/audience"), &[], Vec::new())
        .await?;
    if status == 404 {
        bail!(
            "{host} does not offer trusted publishing (no /_/oidc/audience): set {} instead",
            env::PYPI_API_TOKEN
        );
    }
    #[derive(Deserialize)]
    struct Audience {
        audience: String,
    }
    let audience: Audience = json_ok("trusted publishing: audience", status, &body)?;
    let sep = if id_token_url.contains('?') { '&' } else { '?' };
    let url = format!("{id_token_url}{sep}audience={}", audience.audience);
    let auth = format!("bearer {id_token_request_token}");
    let (status, body) = http
        .request("GET", &url, &[("authorization", &auth)], Vec::new())
        .await?;
    #[derive(Deserialize)]
    struct IdToken {
        value: String,
    }
    let jwt: IdToken = json_ok("trusted publishing: GitHub ID token", status, &body)?;
    let req = serde_json::json!({ "token": jwt.value })
        .to_string()
        .into_bytes();
    let (status, body) = http
        .request(
            "POST",
            &format!("{host}/_/oidc/mint-token"),
            &[("content-type", "application/json")],
            req,
        )
        .await?;
    #[derive(Deserialize)]
    struct Minted {
        token: String,
    }
    if status != 200 {
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let errors: Vec<String> = v["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                format!(
                    "{}: {}",
                    e["code"].as_str().unwrap_or("?"),
                    e["description"].as_str().unwrap_or("?")
                )
            })
            .collect();
        bail!(
            "trusted publishing: {host} refused the GitHub ID token (HTTP {status}): {}. Check the \
             project's trusted publisher (owner, repository, workflow file, environment).",
            errors.join("; ")
        );
    }
    let minted: Minted = json_ok("trusted publishing: mint token", status, &body)?;
    Ok(minted.token)
}

fn json_ok<T: serde::de::DeserializeOwned>(
    what: &str,
    status: u16,
    body: &[u8],
) -> anyhow::Result<T> {
    if status != 200 {
        bail!("{what}: HTTP {status}");
    }
    serde_json::from_slice(body).with_context(|| format!("{what}: unexpected answer"))
}

fn origin(url: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format_err!("{url:?} is not a URL"))?;
    Ok(format!(
        "{scheme}://{}",
        rest.split('/').next().unwrap_or_default()
    ))
}

// --- the file's metadata --------------------------------------------------------------------

/// Reads a wheel's `METADATA` or an sdist's `PKG-INFO` into upload form fields (what twine
/// sends), with the interpreter of the build-tools venv.
pub fn read_upload(sh: &Shell, tools_venv: &Path, path: &Path) -> anyhow::Result<Upload> {
    const READ: &str = include_str!("metadata.py");
    let python = tools_venv.join("bin").join("python");
    let out = cmd!(sh, "{python} -I -c {READ} {path}")
        .quiet()
        .read()
        .with_context(|| format!("cannot read the metadata of {}", path.display()))?;
    let fields: Vec<(String, String)> = serde_json::from_str(&out)?;
    Ok(Upload {
        path: path.to_path_buf(),
        fields,
    })
}

// --- HTTP -----------------------------------------------------------------------------------

enum UploadOutcome {
    Uploaded,
    AlreadyExists(String),
}

type Body = Full<bytes::Bytes>;

struct Http {
    client: Client<
        hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
        Body,
    >,
}

impl Http {
    fn new() -> anyhow::Result<Http> {
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_native_roots()
            .context("cannot load the system's root certificates")?
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Http {
            client: Client::builder(TokioExecutor::new()).build(https),
        })
    }

    /// One request, retried under [`Policy::NETWORK`] on 5xx, 429 and transport errors.
    /// Redirects are not followed (an index that redirects an upload is misconfigured).
    async fn request(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(url)
            .header("user-agent", "mooncake-xtask");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // Built once, to refuse a malformed request before sending anything.
        let template = req
            .body(Full::new(bytes::Bytes::from(body)))
            .with_context(|| format!("bad request to {url}"))?;
        let what = format!("{method} {url}");
        let policy = Policy::NETWORK;
        let attempt = |_| {
            let mut req = http::Request::new(template.body().clone());
            *req.method_mut() = template.method().clone();
            *req.uri_mut() = template.uri().clone();
            *req.headers_mut() = template.headers().clone();
            async move {
                let sent = tokio::time::timeout(Duration::from_secs(600), self.client.request(req));
                let resp = match sent.await {
                    Ok(Ok(resp)) => resp,
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => return Err("no answer in 600 s".to_owned()),
                };
                let status = resp.status().as_u16();
                match resp.into_body().collect().await {
                    Ok(b) if status >= 500 || status == 429 => {
                        Err(format!("HTTP {status}: {}", snippet(&b.to_bytes())))
                    }
                    Ok(b) => Ok((status, b.to_bytes().to_vec())),
                    Err(e) => Err(format!("reading the answer failed: {e}")),
                }
            }
        };
        policy
            .run(&what, attempt, |why: &String| Some(why.clone()))
            .await
            .map_err(|why| {
                format_err!("{what}: {why} (gave up after {} attempts)", policy.attempts)
            })
    }

    /// File name -> sha256 (when the index gives one) of everything the index has for a project.
    async fn simple_files(
        &self,
        project_url: &str,
    ) -> anyhow::Result<BTreeMap<String, SimpleFile>> {
        let accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1";
        let (status, body) = self
            .request("GET", project_url, &[("accept", accept)], Vec::new())
            .await?;
        match status {
            200 => parse_simple(project_url, &body),
            404 => Ok(BTreeMap::new()),
            _ => bail!(
                "cannot ask the index what it holds: GET {project_url}: HTTP {status}: {}",
                snippet(&body)
            ),
        }
    }

    async fn upload(
        &self,
        index: &Index,
        credentials: &Credentials,
        u: &Upload,
        name: &str,
        sha: &str,
        bytes: Vec<u8>,
    ) -> anyhow::Result<UploadOutcome> {
        let boundary = format!("xtask-{}", &sha[..32]);
        let mut fields = vec![
            (":action".to_owned(), "file_upload".to_owned()),
            ("protocol_version".to_owned(), "1".to_owned()),
        ];
        fields.extend(u.fields.iter().cloned());
        fields.push(("sha256_digest".to_owned(), sha.to_owned()));
        let body = multipart(&boundary, &fields, name, &bytes);
        let auth = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD
                .encode(format!("{}:{}", credentials.username, credentials.password))
        );
        let ct = format!("multipart/form-data; boundary={boundary}");
        let (status, answer) = self
            .request(
                "POST",
                &index.upload_url,
                &[("content-type", &ct), ("authorization", &auth)],
                body,
            )
            .await?;
        let text = snippet(&answer);
        match status {
            200 | 201 => Ok(UploadOutcome::Uploaded),
            409 => Ok(UploadOutcome::AlreadyExists(format!("HTTP 409 {text}"))),
            400 if text.to_ascii_lowercase().contains("already exist") => {
                Ok(UploadOutcome::AlreadyExists(format!("HTTP 400 {text}")))
            }
            401 | 403 => bail!(
                "{}: upload of {name} refused (HTTP {status}): the credentials are invalid or may not \
                 upload to this project. {text}",
                index.upload_url
            ),
            _ => bail!("{}: upload of {name} failed: HTTP {status} {text}", index.upload_url),
        }
    }
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    text.chars().take(300).collect()
}

/// The body of a `multipart/form-data` upload.
pub fn multipart(
    boundary: &str,
    fields: &[(String, String)],
    file_name: &str,
    content: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 4096);
    for (k, v) in fields {
        out.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n")
                .as_bytes(),
        );
    }
    out.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"content\"; filename=\"{file_name}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    out.extend_from_slice(content);
    out.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    out
}

/// One file of a Simple API project page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimpleFile {
    /// Where to download it, resolved against the page.
    pub url: String,
    pub sha256: Option<String>,
}

/// A Simple API project page at `page_url`: PEP 691 JSON, or PEP 503 HTML whose links carry
/// `#sha256=`. File name -> file.
pub fn parse_simple(page_url: &str, body: &[u8]) -> anyhow::Result<BTreeMap<String, SimpleFile>> {
    let base = url::Url::parse(page_url).with_context(|| format!("{page_url:?} is not a URL"))?;
    let resolve = |href: &str| {
        base.join(href)
            .map_or_else(|_| href.to_owned(), String::from)
    };
    let text = String::from_utf8_lossy(body);
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
        let files = v["files"]
            .as_array()
            .ok_or_else(|| format_err!("Simple API JSON without `files`"))?;
        return Ok(files
            .iter()
            .filter_map(|f| {
                Some((
                    f["filename"].as_str()?.to_owned(),
                    SimpleFile {
                        url: resolve(f["url"].as_str()?),
                        sha256: f["hashes"]["sha256"].as_str().map(str::to_owned),
                    },
                ))
            })
            .collect());
    }
    let mut out = BTreeMap::new();
    for a in text.split("<a ").skip(1) {
        let Some(href) = a.split("href=\"").nth(1).and_then(|h| h.split('"').next()) else {
            continue;
        };
        let (url, fragment) = href.split_once('#').unwrap_or((href, ""));
        let name = url.rsplit('/').next().unwrap_or(url).to_owned();
        let sha256 = fragment.strip_prefix("sha256=").map(str::to_owned);
        out.insert(
            percent_decode(&name),
            SimpleFile {
                url: resolve(&url.replace("&amp;", "&")),
                sha256,
            },
        );
    }
    Ok(out)
}

/// Downloads `names` of `project` from the index, with a progress line a file; a name the
/// index does not list is left out of the result.
pub fn download(
    index: &Index,
    project: &str,
    names: &[String],
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    runtime()?.block_on(async {
        let http = Http::new()?;
        let project_url = index.project_url(project);
        let listed = http.simple_files(&project_url).await?;
        let mut out = BTreeMap::new();
        for name in names {
            let Some(file) = listed.get(name) else {
                eprintln!("    [index] {name}: not listed on {project_url}");
                continue;
            };
            let started = std::time::Instant::now();
            let (status, body) = http.request("GET", &file.url, &[], Vec::new()).await?;
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
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simple_pages_parse_in_both_formats() {
        let html = br#"<html><body><a href="../../+f/abc/x-0.1.0-py3-none-any.whl#sha256=aaaa">x-0.1.0-py3-none-any.whl</a>
            <a href="https://files/x-0.1.0.tar.gz#sha256=bbbb" data-requires-python="&gt;=3.9">x</a><a href="x%2B1.whl">n</a></body></html>"#;
        let m = parse_simple("http://127.0.0.1:3141/u/i/+simple/x/", html).unwrap();
        let w = &m["x-0.1.0-py3-none-any.whl"];
        assert_eq!(w.sha256.as_deref(), Some("aaaa"));
        assert_eq!(
            w.url,
            "http://127.0.0.1:3141/u/i/+f/abc/x-0.1.0-py3-none-any.whl"
        );
        assert_eq!(m["x-0.1.0.tar.gz"].sha256.as_deref(), Some("bbbb"));
        assert_eq!(m["x-0.1.0.tar.gz"].url, "https://files/x-0.1.0.tar.gz");
        assert_eq!(m["x+1.whl"].sha256, None);
        let json = br#"{"meta": {"api-version": "1.0"}, "name": "x", "files": [{"filename": "x-0.1.0.tar.gz", "url": "u", "hashes": {"sha256": "cccc"}}]}"#;
        let m = parse_simple("https://pypi.org/simple/x/", json).unwrap();
        assert_eq!(m["x-0.1.0.tar.gz"].sha256.as_deref(), Some("cccc"));
        assert_eq!(m["x-0.1.0.tar.gz"].url, "https://pypi.org/simple/x/u");
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
    fn multipart_bodies_carry_fields_and_the_file() {
        let body = multipart(
            "B",
            &[
                ("name".into(), "x".into()),
                ("classifiers".into(), "A".into()),
                ("classifiers".into(), "B".into()),
            ],
            "x.whl",
            b"ZIP",
        );
        let text = String::from_utf8(body).unwrap();
        assert!(
            text.starts_with("--B\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nx\r\n")
        );
        assert_eq!(text.matches("name=\"classifiers\"").count(), 2);
        assert!(text.ends_with(
            "filename=\"x.whl\"\r\nContent-Type: application/octet-stream\r\n\r\nZIP\r\n--B--\r\n"
        ));
    }

    #[test]
    fn credentials_never_show_the_password() {
        let c = Credentials {
            username: "__token__".into(),
            password: "pypi-secret".into(),
        };
        assert!(!format!("{c:?}").contains("pypi-secret"));
    }
}
