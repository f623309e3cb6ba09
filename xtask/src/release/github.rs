//! Publishing to GitHub Releases, in two steps around PyPI (the order is in `xtask/README.md`):
//!
//! [`draft`] (`cargo xtask publish github <dist-dir>`):
//! 1. the tag on GitHub must name the commit we built (GitHub would otherwise create or keep a
//!    tag elsewhere; a pushed tag is never moved);
//! 2. find the release for the tag (drafts included, so list rather than `get_by_tag`), or
//!    create it as a draft;
//! 3. for each file: an asset with the same name and digest is skipped; one with another digest
//!    stops the release (never clobbered); a `starter` asset left by a failed upload is deleted;
//!    a missing one is uploaded;
//! 4. every file is checked again against the release's assets by digest.
//!
//! [`undraft`] (`cargo xtask publish undraft <dist-dir>`): the assets checked once more, then
//! the release out of draft. Both are safe to re-run.
//!
//! Every call is retried under [`Policy::NETWORK`] (`retry.rs`) on 5xx, 429 and rate limits,
//! and on transport errors.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, format_err, Context};
use http_body_util::BodyExt;
use octocrab::models::repos::{Asset, Object, Release};
use octocrab::params::repos::Reference;
use octocrab::Octocrab;

use crate::checksums::{sha256_file, Manifest};
use crate::env;
use crate::phase::fmt_duration;
use crate::publication::{Place, PlacedFile, Published, PUBLICATION};
use crate::retry::Policy;
use crate::Workspace;

/// Where and how to talk to GitHub.
#[derive(Debug, Clone)]
pub struct Target {
    pub api_url: String,
    pub owner: String,
    pub repo: String,
    pub retry: Policy,
}

impl Target {
    pub fn from_env(ws: &Workspace) -> Target {
        let (owner, repo) = ws.config.github_owner_repo();
        Target {
            api_url: env::var(env::GITHUB_API_URL)
                .unwrap_or_else(|| "https://api.github.com".to_owned()),
            owner: owner.to_owned(),
            repo: repo.to_owned(),
            retry: Policy::NETWORK,
        }
    }
}

pub fn token(ws: &Workspace) -> anyhow::Result<String> {
    env::var(env::GITHUB_TOKEN).ok_or_else(|| {
        format_err!(
            "{} is not set: publishing needs a token that may write releases of {} (a fine-grained \
             token with `Contents: write`, or `permissions: contents: write` in GitHub Actions). \
             Use --dry-run to stop before publishing.",
            env::GITHUB_TOKEN,
            ws.config.github.repository
        )
    })
}

/// Step 1 of publishing (see `xtask/README.md`): the draft release of the tag with every
/// upload file of `dist`, verified by digest.
pub fn draft(
    ws: &Workspace,
    tag: &str,
    commit: &str,
    dist: &Path,
    manifest: &Manifest,
) -> anyhow::Result<Published> {
    let files: Vec<_> = manifest.upload_files.iter().map(|f| dist.join(f)).collect();
    draft_files(&Target::from_env(ws), &token(ws)?, tag, commit, &files)
}

/// Step 3 of publishing: the release of the tag out of draft, once its assets are checked
/// again against `dist`.
pub fn undraft(
    ws: &Workspace,
    tag: &str,
    dist: &Path,
    manifest: &Manifest,
) -> anyhow::Result<Place> {
    let files: Vec<_> = manifest.upload_files.iter().map(|f| dist.join(f)).collect();
    undraft_files(&Target::from_env(ws), &token(ws)?, tag, &files)
}

/// Drafts the release of `tag` (which must be `commit` on GitHub) with `files` as its assets.
pub fn draft_files(
    target: &Target,
    token: &str,
    tag: &str,
    commit: &str,
    files: &[impl AsRef<Path>],
) -> anyhow::Result<Published> {
    let (rt, publisher) = Publisher::connect(target, Some(token))?;
    rt.block_on(publisher.draft(tag, commit, files))
}

/// Takes the release of `tag` out of draft once its assets are `files`, by digest.
pub fn undraft_files(
    target: &Target,
    token: &str,
    tag: &str,
    files: &[impl AsRef<Path>],
) -> anyhow::Result<Place> {
    let (rt, publisher) = Publisher::connect(target, Some(token))?;
    rt.block_on(publisher.undraft(tag, files))
}

/// What became of the publication record on the release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordOutcome {
    Attached,
    Identical,
    /// The release is published and immutable: GitHub takes no asset any more.
    Immutable,
}

/// Attaches the publication record to the release of `tag`, replacing an earlier one.
pub fn put_record(
    target: &Target,
    token: &str,
    tag: &str,
    bytes: Vec<u8>,
) -> anyhow::Result<RecordOutcome> {
    let (rt, publisher) = Publisher::connect(target, Some(token))?;
    rt.block_on(publisher.put_record(tag, bytes))
}

/// Downloads every uploaded asset of the release of `tag` from its public download URL, with a
/// progress line a file (`token`: for a private repository). No release: nothing.
pub fn download_assets(
    target: &Target,
    token: Option<&str>,
    tag: &str,
) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let (rt, publisher) = Publisher::connect(target, token)?;
    rt.block_on(publisher.download(tag))
}

struct Publisher<'a> {
    crab: Octocrab,
    target: &'a Target,
}

/// What became of one file.
enum AssetOutcome {
    Uploaded,
    Identical,
}

impl<'a> Publisher<'a> {
    fn connect(
        target: &'a Target,
        token: Option<&str>,
    ) -> anyhow::Result<(tokio::runtime::Runtime, Self)> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // octocrab's client needs the runtime entered while it is built.
        let crab = {
            let _entered = rt.enter();
            let mut builder = Octocrab::builder();
            if let Some(token) = token {
                builder = builder.personal_token(token.to_owned());
            }
            builder
                .base_uri(target.api_url.as_str())
                .with_context(|| {
                    format!(
                        "{} = {:?} is not a URL",
                        env::GITHUB_API_URL,
                        target.api_url
                    )
                })?
                .set_connect_timeout(Some(Duration::from_secs(30)))
                .set_read_timeout(Some(Duration::from_secs(300)))
                .build()?
        };
        Ok((rt, Publisher { crab, target }))
    }

    async fn draft(
        &self,
        tag: &str,
        commit: &str,
        files: &[impl AsRef<Path>],
    ) -> anyhow::Result<Published> {
        self.check_tag(tag, commit).await?;
        let release = self.find_or_create_draft(tag, commit).await?;
        let mut uploaded = Vec::new();
        let mut identical = Vec::new();
        for file in files {
            let path = file.as_ref();
            let name = asset_name(path)?;
            match self.put_asset(&release, tag, name, path).await? {
                AssetOutcome::Uploaded => uploaded.push(name.to_owned()),
                AssetOutcome::Identical => identical.push(name.to_owned()),
            }
        }
        self.verify_assets(release.id.into_inner(), tag, files)
            .await?;
        Ok(Published {
            place: Place {
                name: "GitHub Releases".to_owned(),
                url: release.html_url.to_string(),
                files: BTreeMap::new(),
            },
            uploaded,
            identical,
        })
    }

    async fn undraft(&self, tag: &str, files: &[impl AsRef<Path>]) -> anyhow::Result<Place> {
        let Some(mut release) = self.find_release(tag).await? else {
            bail!(
                "there is no release {tag} on GitHub ({}/{}) to publish: run `cargo xtask publish \
                 github <dist-dir>` first",
                self.target.owner,
                self.target.repo
            );
        };
        self.verify_assets(release.id.into_inner(), tag, files)
            .await?;
        if release.draft {
            let id = release.id.into_inner();
            let (o, r) = (&self.target.owner, &self.target.repo);
            release = self
                .retry("publish release", || async {
                    self.crab
                        .repos(o, r)
                        .releases()
                        .update(id)
                        .draft(false)
                        .send()
                        .await
                })
                .await?;
            eprintln!("    published release {tag}");
        } else {
            eprintln!("    release {tag} is already published");
        }
        // The download URLs of a draft are not the public ones: read them once it is public.
        let assets = self.assets(release.id.into_inner()).await?;
        let mut placed = BTreeMap::new();
        for file in files {
            let name = asset_name(file.as_ref())?;
            if let Some(a) = assets.iter().find(|a| a.name == name) {
                let sha = a.digest.as_deref().and_then(|d| d.strip_prefix("sha256:"));
                placed.insert(
                    name.to_owned(),
                    PlacedFile {
                        url: a.browser_download_url.to_string(),
                        sha256: sha.unwrap_or_default().to_owned(),
                    },
                );
            }
        }
        Ok(Place {
            name: "GitHub Releases".to_owned(),
            url: release.html_url.to_string(),
            files: placed,
        })
    }

    /// `publication.json` onto the release: identical -> nothing; other bytes -> replaced (the
    /// one asset that grows after the release is public); missing -> uploaded.
    async fn put_record(&self, tag: &str, bytes: Vec<u8>) -> anyhow::Result<RecordOutcome> {
        let Some(release) = self.find_release(tag).await? else {
            bail!(
                "there is no release {tag} on GitHub ({}/{}) to attach {PUBLICATION} to: run \
                 `cargo xtask publish undraft <dist-dir>` first",
                self.target.owner,
                self.target.repo
            );
        };
        let id = release.id.into_inner();
        let sha = crate::checksums::sha256_bytes(&bytes);
        let old = self
            .assets(id)
            .await?
            .into_iter()
            .find(|a| a.name == PUBLICATION);
        if let Some(a) = &old {
            if a.state == "uploaded"
                && a.digest.as_deref().and_then(|d| d.strip_prefix("sha256:")) == Some(&sha)
            {
                eprintln!("    {PUBLICATION}: already on the release, identical");
                return Ok(RecordOutcome::Identical);
            }
        }
        if !release.draft && release.immutable == Some(true) {
            return Ok(RecordOutcome::Immutable);
        }
        if let Some(a) = old {
            let asset_id = a.id.into_inner();
            let (o, r) = (&self.target.owner, &self.target.repo);
            eprintln!("    {PUBLICATION}: replacing the earlier record");
            self.retry("delete the earlier record", || async {
                self.crab
                    .repos(o, r)
                    .release_assets()
                    .delete(asset_id)
                    .await
            })
            .await?;
        }
        let asset = self.upload(id, PUBLICATION, bytes.into()).await?;
        match asset
            .digest
            .as_deref()
            .and_then(|d| d.strip_prefix("sha256:"))
        {
            Some(d) if d != sha => bail!(
                "GitHub stored {PUBLICATION} with sha256 {d}, we sent {sha}: the upload was \
                 corrupted"
            ),
            _ => Ok(RecordOutcome::Attached),
        }
    }

    async fn download(&self, tag: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
        let mut out = BTreeMap::new();
        let Some(release) = self.find_release(tag).await? else {
            eprintln!(
                "    [GitHub] no release {tag} on {}/{}",
                self.target.owner, self.target.repo
            );
            return Ok(out);
        };
        for a in self.assets(release.id.into_inner()).await? {
            if a.state != "uploaded" {
                continue;
            }
            let started = Instant::now();
            let url = a.browser_download_url.to_string();
            let (status, body) = self
                .retry("download asset", || async {
                    let resp = self.crab._get(url.as_str()).await?;
                    let status = resp.status().as_u16();
                    let body = resp.into_body().collect().await?.to_bytes();
                    Ok((status, body))
                })
                .await?;
            if status != 200 {
                eprintln!("    [GitHub] {}: HTTP {status} from {url}", a.name);
                continue;
            }
            eprintln!(
                "    [GitHub] {}: {} bytes in {}",
                a.name,
                body.len(),
                fmt_duration(started.elapsed())
            );
            out.insert(a.name.clone(), body.to_vec());
        }
        Ok(out)
    }

    async fn find_or_create_draft(&self, tag: &str, commit: &str) -> anyhow::Result<Release> {
        if let Some(r) = self.find_release(tag).await? {
            eprintln!(
                "    release {tag} exists (id {}, {})",
                r.id,
                if r.draft { "draft" } else { "published" }
            );
            return Ok(r);
        }
        eprintln!("    creating draft release {tag}");
        let (o, r) = (&self.target.owner, &self.target.repo);
        self.retry("create release", || async {
            self.crab
                .repos(o, r)
                .releases()
                .create(tag)
                .target_commitish(commit)
                .name(tag)
                .body(&format!(
                    "Release {tag}. SHA256 sums: `sha256.sum`; build record: `dist-manifest.json`."
                ))
                .draft(true)
                .send()
                .await
        })
        .await
    }

    /// One file onto the release: identical -> skip; other digest -> stop; incomplete upload ->
    /// delete and upload; missing -> upload.
    async fn put_asset(
        &self,
        release: &Release,
        tag: &str,
        name: &str,
        path: &Path,
    ) -> anyhow::Result<AssetOutcome> {
        let (sha, _) = sha256_file(path)?;
        let assets = self.assets(release.id.into_inner()).await?;
        match assets.iter().find(|a| a.name == name) {
            Some(a) if a.state == "uploaded" => {
                compare_asset(tag, a, &sha)?;
                eprintln!("    {name}: already on the release, identical");
                return Ok(AssetOutcome::Identical);
            }
            Some(_) => {
                self.remove_incomplete(release.id.into_inner(), name)
                    .await?
            }
            None => {}
        }
        if !release.draft && release.immutable == Some(true) {
            bail!(
                "release {tag} is published and immutable but lacks {name}: assets can no \
                 longer be added. Cut a .postN release."
            );
        }
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let asset = self
            .upload(release.id.into_inner(), name, bytes.into())
            .await?;
        match asset
            .digest
            .as_deref()
            .and_then(|d| d.strip_prefix("sha256:"))
        {
            Some(d) if d != sha => bail!(
                "GitHub stored {name} with sha256 {d}, we sent {sha}: the upload was corrupted"
            ),
            _ => Ok(AssetOutcome::Uploaded),
        }
    }

    /// Every file is on the release, uploaded, with our digest.
    async fn verify_assets(
        &self,
        release_id: u64,
        tag: &str,
        files: &[impl AsRef<Path>],
    ) -> anyhow::Result<()> {
        let assets = self.assets(release_id).await?;
        for file in files {
            let path = file.as_ref();
            let name = asset_name(path)?;
            let (sha, _) = sha256_file(path)?;
            match assets
                .iter()
                .find(|a| a.name == name && a.state == "uploaded")
            {
                Some(a) => compare_asset(tag, a, &sha)?,
                None => bail!(
                    "release {tag} lacks {name}: run `cargo xtask publish github <dist-dir>` \
                     to upload it"
                ),
            }
        }
        eprintln!(
            "    release {tag}: {} assets verified by digest",
            files.len()
        );
        Ok(())
    }

    /// The tag exists on GitHub and names our commit (through an annotated tag object too).
    async fn check_tag(&self, tag: &str, commit: &str) -> anyhow::Result<()> {
        let (o, r) = (&self.target.owner, &self.target.repo);
        let repos = self.crab.repos(o, r);
        let reference = Reference::Tag(tag.to_owned());
        let found = match self
            .retry_raw("get tag", || repos.get_ref(&reference))
            .await
        {
            Ok(found) => found,
            Err(e) if status(&e) == Some(404) => bail!(
                "tag {tag} is not on GitHub ({o}/{r}): push it first (`git push origin {tag}`); \
                 the release is never created from a tag GitHub would make itself"
            ),
            Err(e) => return Err(describe(e, "get tag")),
        };
        let sha = match found.object {
            Object::Commit { sha, .. } => sha,
            Object::Tag { sha, .. } => {
                let t = self
                    .retry("get tag object", || repos.get_tag(sha.clone()))
                    .await?;
                t.object
                    .map(|o| o.sha)
                    .ok_or_else(|| format_err!("tag object of {tag} names nothing"))?
            }
            other => bail!("tag {tag} on GitHub names {other:?}, not a commit"),
        };
        if sha != commit {
            bail!(
                "tag {tag} on GitHub is commit {sha}, but we built {commit}: the local tag and \
                 GitHub's differ. Fetch the tag (`git fetch --tags --force`) and build from it."
            );
        }
        Ok(())
    }

    async fn find_release(&self, tag: &str) -> anyhow::Result<Option<Release>> {
        let (o, r) = (&self.target.owner, &self.target.repo);
        for page in 1u32.. {
            let releases = self
                .retry("list releases", || async {
                    self.crab
                        .repos(o, r)
                        .releases()
                        .list()
                        .per_page(100)
                        .page(page)
                        .send()
                        .await
                })
                .await?;
            let n = releases.items.len();
            if let Some(found) = releases.items.into_iter().find(|rel| rel.tag_name == tag) {
                return Ok(Some(found));
            }
            if n < 100 {
                break;
            }
        }
        Ok(None)
    }

    async fn assets(&self, release_id: u64) -> anyhow::Result<Vec<Asset>> {
        let (o, r) = (&self.target.owner, &self.target.repo);
        let mut all = Vec::new();
        for page in 1u32.. {
            let items = self
                .retry("list assets", || async {
                    self.crab
                        .repos(o, r)
                        .releases()
                        .assets(release_id)
                        .per_page(100)
                        .page(page)
                        .send()
                        .await
                })
                .await?
                .items;
            let n = items.len();
            all.extend(items);
            if n < 100 {
                break;
            }
        }
        Ok(all)
    }

    /// Uploads one file; a failed attempt that left a `starter` asset is cleaned up before the
    /// next one.
    async fn upload(
        &self,
        release_id: u64,
        name: &str,
        bytes: bytes::Bytes,
    ) -> anyhow::Result<Asset> {
        let size = bytes.len();
        let (o, r) = (&self.target.owner, &self.target.repo);
        let what = format!("upload {name}");
        let attempt = |attempt: u32| {
            let bytes = bytes.clone();
            async move {
                if attempt > 1 {
                    self.remove_incomplete(release_id, name).await?;
                }
                eprint!("    {name}: uploading {size} bytes (attempt {attempt})… ");
                let started = Instant::now();
                let sent = self
                    .crab
                    .repos(o, r)
                    .releases()
                    .upload_asset(release_id, name, bytes)
                    .send()
                    .await;
                let asset = sent.map_err(|e| {
                    eprintln!("failed: {}", short(&e));
                    anyhow::Error::new(e)
                })?;
                let t = started.elapsed();
                let rate = size as f64 / t.as_secs_f64().max(1e-6) / 1e6;
                eprintln!("done in {} ({rate:.1} MB/s)", fmt_duration(t));
                Ok(asset)
            }
        };
        let transient_octocrab = |e: &anyhow::Error| {
            e.downcast_ref::<octocrab::Error>()
                .filter(|e| transient(e))
                .map(short)
        };
        self.target
            .retry
            .run(&what, attempt, transient_octocrab)
            .await
            .map_err(|e| match e.downcast::<octocrab::Error>() {
                Ok(e) => describe(e, &what),
                Err(e) => e,
            })
    }

    /// Deletes the `starter` asset a failed upload of `name` left behind, if any.
    async fn remove_incomplete(&self, release_id: u64, name: &str) -> anyhow::Result<()> {
        let (o, r) = (&self.target.owner, &self.target.repo);
        for a in self.assets(release_id).await? {
            if a.name == name && a.state != "uploaded" {
                eprintln!(
                    "    {name}: removing an incomplete upload (state {})",
                    a.state
                );
                let id = a.id.into_inner();
                self.retry("delete incomplete asset", || async {
                    self.crab.repos(o, r).release_assets().delete(id).await
                })
                .await?;
            }
        }
        Ok(())
    }

    async fn retry<T, F, Fut>(&self, what: &str, f: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = octocrab::Result<T>>,
    {
        self.retry_raw(what, f).await.map_err(|e| describe(e, what))
    }

    async fn retry_raw<T, F, Fut>(&self, what: &str, mut f: F) -> octocrab::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = octocrab::Result<T>>,
    {
        let transient_octocrab = |e: &octocrab::Error| transient(e).then(|| short(e));
        self.target
            .retry
            .run(what, |_| f(), transient_octocrab)
            .await
    }
}

fn asset_name(path: &Path) -> anyhow::Result<&str> {
    path.file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format_err!("{} is not a file name an asset can have", path.display()))
}

/// An uploaded asset has our sha256, or the release stops: never clobbered.
fn compare_asset(tag: &str, a: &Asset, sha: &str) -> anyhow::Result<()> {
    let name = &a.name;
    match a.digest.as_deref().and_then(|d| d.strip_prefix("sha256:")) {
        Some(d) if d == sha => Ok(()),
        Some(d) => bail!(
            "release {tag} already has {name} with sha256 {d}, but ours is {sha}: \
             not overwriting. The release holds other bytes under this name; if \
             they are wrong, delete the asset on GitHub by hand and re-run (an \
             immutable release cannot change: cut a .postN release instead)."
        ),
        None => bail!(
            "release {tag} has {name} but GitHub reports no digest for it: \
             compare it by hand with sha256 {sha}, delete it if it differs, re-run"
        ),
    }
}

fn status(e: &octocrab::Error) -> Option<u16> {
    match e {
        octocrab::Error::GitHub { source, .. } => Some(source.status_code.as_u16()),
        _ => None,
    }
}

/// Worth another try: server errors, throttling, and anything that never got an answer.
fn transient(e: &octocrab::Error) -> bool {
    match e {
        octocrab::Error::GitHub { source, .. } => {
            let s = source.status_code.as_u16();
            s >= 500
                || s == 429
                || (s == 403 && source.message.to_ascii_lowercase().contains("rate limit"))
        }
        octocrab::Error::Hyper { .. }
        | octocrab::Error::Service { .. }
        | octocrab::Error::Http { .. } => true,
        _ => false,
    }
}

fn short(e: &octocrab::Error) -> String {
    match e {
        octocrab::Error::GitHub { source, .. } => {
            format!("HTTP {} {}", source.status_code.as_u16(), source.message)
        }
        other => other.to_string(),
    }
}

fn describe(e: octocrab::Error, what: &str) -> anyhow::Error {
    let hint = match status(&e) {
        Some(401) => ": GITHUB_TOKEN was refused (expired or revoked?)",
        Some(403) => {
            ": GITHUB_TOKEN may not write releases of this repository (needs Contents: write)"
        }
        Some(404) => ": not found (wrong repository in release.toml, or the token cannot see it)",
        _ => "",
    };
    format_err!("GitHub: {what} failed: {}{hint}", short(&e))
}
