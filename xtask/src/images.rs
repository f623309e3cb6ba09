//! The serving images: `cargo xtask images <tag>` and the `images` phase of `release`.
//!
//! For every `[[images.image]]` of release.toml: refuse a base without a digest (before
//! anything is built), assemble the build context (recipe, `images/common/install-wheels.py`,
//! the release's wheel, wheels named by the recipe's hash-locked requirements), build with
//! podman, buildah or docker buildx into an OCI layout with `SOURCE_DATE_EPOCH` timestamps,
//! check the labels, then compare with what the registry holds under `<registry>/<name>:<version>`:
//! the same digest is nothing to do, another digest stops unless `--force`, none is a push
//! (byte for byte, so the registry's digest is the layout's). The digests go into the release's
//! publication record (`publication.json`, `images`) and `RELEASES.md`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{bail, format_err, Context};
use xshell::{cmd, Shell};

use crate::checksums::{self, Manifest, ManifestImage};
use crate::config::ImageRecipe;
use crate::env;
use crate::ledger;
use crate::phase::Phases;
use crate::publication::{self, Publication};
use crate::source::{self, Source};
use crate::{flags, Workspace};

pub mod builder;
pub mod oci_layout;
pub mod registry;

use crate::image_reference::ImageRef;
use builder::{BuildSpec, Builder};

/// The install step both recipes run, copied into every build context.
const INSTALL_SCRIPT: &str = "images/common/install-wheels.py";

/// Labels every image must carry, checked after the build.
const LABEL_REVISION: &str = "org.opencontainers.image.revision";
const LABEL_VERSION: &str = "org.opencontainers.image.version";
const LABEL_BASE_DIGEST: &str = "org.opencontainers.image.base.digest";
const LABEL_SOURCE: &str = "org.opencontainers.image.source";
const LABEL_WHEEL_SHA256: &str = "io.github.mooncake-musa.wheel.sha256";

/// An image ready to build: its recipe and its pinned base.
#[derive(Debug, Clone)]
pub struct Planned {
    pub recipe: ImageRecipe,
    pub base: ImageRef,
    pub base_digest: String,
}

/// What the images phase will build, and with what: checked before anything is built.
#[derive(Debug, Clone)]
pub struct Plan {
    pub images: Vec<Planned>,
    pub builder: Builder,
}

impl Plan {
    /// [`preflight`], then a builder (`wanted`, else the first found) and skopeo.
    pub fn check(sh: &Shell, ws: &Workspace, wanted: Option<&str>) -> anyhow::Result<Plan> {
        let images = preflight(ws)?;
        let builder = Builder::choose(sh, wanted)?;
        registry::check_skopeo(sh)?;
        Ok(Plan { images, builder })
    }

    pub fn summary(&self) -> String {
        format!(
            "{} image(s), every base pinned by digest, builder {}",
            self.images.len(),
            self.builder.name()
        )
    }
}

/// Everything that can be refused before anything is pulled or built: no image configured,
/// a base without a digest, a recipe or requirements file that is not there.
pub fn preflight(ws: &Workspace) -> anyhow::Result<Vec<Planned>> {
    let images = &ws.config.images;
    if images.images.is_empty() {
        bail!("release.toml [images] names no image ([[images.image]]): nothing to build");
    }
    let mut planned = Vec::new();
    let mut unpinned = Vec::new();
    for recipe in &images.images {
        let base = ImageRef::parse(&recipe.base)?;
        let Some(base_digest) = base.digest.clone() else {
            unpinned.push(format!("{} (base = {:?})", recipe.name, recipe.base));
            continue;
        };
        let dockerfile = ws.root.join(&recipe.recipe).join("Dockerfile");
        if !dockerfile.is_file() {
            bail!(
                "image {}: no recipe at {}",
                recipe.name,
                dockerfile.display()
            );
        }
        if let Some(r) = &recipe.requirements {
            let path = ws.root.join(&recipe.recipe).join(r);
            if !path.is_file() {
                bail!(
                    "image {}: requirements file {} is missing",
                    recipe.name,
                    path.display()
                );
            }
        }
        planned.push(Planned {
            recipe: recipe.clone(),
            base,
            base_digest,
        });
    }
    if !unpinned.is_empty() {
        bail!(
            "release.toml [images]: the base of {} is not pinned by digest; refusing to build. \
             Run `cargo xtask pin-base` where the registry is reachable (it resolves each tag \
             and writes `@sha256:...` into release.toml), review and commit the change.",
            unpinned.join(", ")
        );
    }
    Ok(planned)
}

/// Builds, checks and pushes every image; returns what the manifest records.
pub fn build_and_push(
    sh: &Shell,
    ws: &Workspace,
    source: &Source,
    dist: &Path,
    manifest: &Manifest,
    plan: &Plan,
    force: bool,
) -> anyhow::Result<BTreeMap<String, ManifestImage>> {
    let (wheel, wheel_sha256) = release_wheel(dist, manifest)?;
    // A login from the environment goes to a file of our own, not the user's ~/.config;
    // without one, the builders' and skopeo's usual credentials apply.
    let _auth = login(sh, ws)?;
    eprintln!(
        "images: {} with {}, wheel {} ({wheel_sha256})",
        plan.images.len(),
        plan.builder.name(),
        checksums::file_name(&wheel)?
    );

    let job = ImageJob {
        sh,
        ws,
        source,
        wheel: &wheel,
        wheel_sha256: &wheel_sha256,
        builder: plan.builder,
        force,
    };
    let mut records = BTreeMap::new();
    for image in &plan.images {
        let record = job
            .build_one(image)
            .with_context(|| format!("image {}", image.recipe.name))?;
        records.insert(image.recipe.name.clone(), record);
    }
    Ok(records)
}

/// What every image of one run shares: the release, its wheel and how to build and push.
struct ImageJob<'a> {
    sh: &'a Shell,
    ws: &'a Workspace,
    source: &'a Source,
    wheel: &'a Path,
    wheel_sha256: &'a str,
    builder: Builder,
    force: bool,
}

/// One image on its way: where it is built, and the result so far.
struct Built {
    work: PathBuf,
    layout: PathBuf,
    image: oci_layout::LayoutImage,
    /// The base's platform image, `name@digest`: its blobs must be in the target repository.
    base: String,
}

impl ImageJob<'_> {
    /// Build, check the labels, name the base's layers by the base's digests, push unless the
    /// registry already has this digest, and drop the scratch copy.
    fn build_one(&self, image: &Planned) -> anyhow::Result<ManifestImage> {
        let work = self
            .ws
            .scratch_dir()
            .join("images")
            .join(&image.recipe.name);
        let mut built = self.build(image, work)?;
        self.check_labels(image, &built)?;
        self.adopt_base_layers(image, &mut built)?;
        let target = self
            .ws
            .config
            .images
            .target(&image.recipe, &self.source.version)?;
        let action = self.push(image, &built, &target)?;
        eprintln!(
            "images: {}: {}@{}: {action}",
            image.recipe.name, target.name, built.image.digest
        );
        // A serving image is tens of GB: do not keep a second copy once the registry has it.
        fs::remove_dir_all(&built.work)
            .with_context(|| format!("cannot remove the scratch copy {}", built.work.display()))?;
        Ok(ManifestImage {
            reference: target.to_string(),
            digest: built.image.digest,
            base: image.base.to_string(),
            recipe: image.recipe.recipe.clone(),
            wheel_sha256: self.wheel_sha256.to_owned(),
        })
    }

    fn source_url(&self) -> String {
        format!("https://github.com/{}", self.ws.config.github.repository)
    }

    /// Stages the context and builds into an OCI layout under `work`.
    fn build(&self, image: &Planned, work: PathBuf) -> anyhow::Result<Built> {
        let (source, name) = (self.source, &image.recipe.name);
        let context = work.join("context");
        stage_context(self.sh, self.ws, image, self.wheel, &context)?;
        let base_by_digest = image.base.by_digest().unwrap_or_default();
        let layout = work.join("oci");
        let spec = BuildSpec {
            context: &context,
            build_args: vec![
                ("BASE_IMAGE", base_by_digest.clone()),
                ("BASE_DIGEST", image.base_digest.clone()),
                ("VERSION", source.version.clone()),
                ("REVISION", source.commit.clone()),
                ("WHEEL", checksums::file_name(self.wheel)?),
                ("WHEEL_SHA256", self.wheel_sha256.to_owned()),
                ("DISTRIBUTION", self.ws.config.distribution.clone()),
                ("SOURCE", self.source_url()),
            ],
            timestamp: source.commit_time,
            insecure_base: image.base.is_loopback(),
            local_name: format!("localhost/xtask-{name}:{}", source.version),
            layout: &layout,
            layout_tag: &source.version,
        };
        eprintln!(
            "images: building {name} from {base_by_digest} ({})",
            self.builder.name()
        );
        self.builder.build(self.sh, &spec)?;
        let built = oci_layout::read(&layout, &source.version)?;
        Ok(Built {
            work,
            layout,
            image: built,
            base: base_by_digest,
        })
    }

    fn check_labels(&self, image: &Planned, built: &Built) -> anyhow::Result<()> {
        let source = self.source;
        check_labels(
            &built.image.labels,
            &[
                (LABEL_REVISION, &source.commit),
                (LABEL_VERSION, &source.version),
                (LABEL_BASE_DIGEST, &image.base_digest),
                (LABEL_SOURCE, &self.source_url()),
                (LABEL_WHEEL_SHA256, self.wheel_sha256),
            ],
        )
    }

    /// The builders compress the base's layers again on the way into the layout; point the
    /// manifest at the base's own blobs instead, so pushes and pulls reuse them.
    fn adopt_base_layers(&self, image: &Planned, built: &mut Built) -> anyhow::Result<()> {
        let (_, arch) = self.ws.config.baseline.manylinux()?;
        let base = registry::fetch_image(
            self.sh,
            &image.base.name,
            &image.base_digest,
            oci_arch(&arch),
        )?;
        let tag = &self.source.version;
        let adopted =
            oci_layout::adopt_base_layers(&built.layout, tag, &base.manifest, &base.config)?;
        built.image = oci_layout::read(&built.layout, tag)?;
        built.base = base.reference;
        eprintln!(
            "images: {}: the first {} layer(s) are the base's blobs ({} compressed again by {} \
             and replaced)",
            image.recipe.name,
            adopted.base_layers,
            adopted.replaced,
            self.builder.name()
        );
        Ok(())
    }

    /// Compares with what the target tag holds; pushes (base blobs first) when it holds
    /// nothing, or another digest and `--force`. Returns what was done.
    fn push(&self, image: &Planned, built: &Built, target: &ImageRef) -> anyhow::Result<String> {
        let sh = self.sh;
        let target_tag = target.to_string();
        let digest = &built.image.digest;
        let there = match registry::resolve(sh, &target_tag)? {
            Some(there) if there == *digest => {
                return Ok("already there (same digest), nothing pushed".to_owned())
            }
            Some(there) if !self.force => bail!(
                "{target_tag} already holds {there}, but this build of {} is {digest}: not \
                 overwriting. A release's images must not change under its tag; find out why \
                 the build differs (base, wheel, recipe). Re-run with --force only to replace \
                 the image deliberately.",
                image.recipe.name
            ),
            there => there,
        };
        // The layout holds only the image's own layers: the base's blobs go into the target
        // repository first, copied as they are (a blob the repository has is not uploaded).
        registry::copy_by_digest(sh, &built.base, &target.name)?;
        let pushed = registry::push_layout(
            sh,
            &built.layout,
            &self.source.version,
            built.image.is_index,
            &target_tag,
            &built.work.join("pushed.digest"),
        )?;
        // The tag must now name this build: what skopeo wrote, and what the registry serves.
        let now = registry::resolve(sh, &target_tag)?;
        if pushed != *digest || now.as_deref() != Some(digest.as_str()) {
            bail!(
                "{target_tag}: pushed {pushed}, the registry serves {}, the build is {digest}",
                now.as_deref().unwrap_or("nothing")
            );
        }
        Ok(match there {
            Some(old) => format!("pushed, replacing {old} (--force)"),
            None => "pushed".to_owned(),
        })
    }
}

/// The OCI architecture name of a wheel's machine (`x86_64` -> `amd64`).
fn oci_arch(machine: &str) -> &str {
    match machine {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The context: the recipe's files, the install script, the wheel, and the recipe's
/// hash-locked extra wheels. Nothing else, so the build sees only what is checked.
fn stage_context(
    sh: &Shell,
    ws: &Workspace,
    image: &Planned,
    wheel: &Path,
    context: &Path,
) -> anyhow::Result<()> {
    if context.exists() {
        fs::remove_dir_all(context)?;
    }
    fs::create_dir_all(context)?;
    let recipe_dir = ws.root.join(&image.recipe.recipe);
    let mut files: Vec<PathBuf> = vec![ws.root.join(INSTALL_SCRIPT), wheel.to_owned()];
    for entry in fs::read_dir(&recipe_dir)
        .with_context(|| format!("cannot read {}", recipe_dir.display()))?
    {
        let path = entry?.path();
        if path.is_file() {
            files.push(path);
        }
    }
    for f in &files {
        let to = context.join(
            f.file_name()
                .ok_or_else(|| format_err!("{}", f.display()))?,
        );
        fs::copy(f, &to)
            .with_context(|| format!("cannot copy {} into the build context", f.display()))?;
    }
    if let Some(requirements) = &image.recipe.requirements {
        let reqs = recipe_dir.join(requirements);
        let python = env::var(env::XTASK_PYTHON).unwrap_or_else(|| "python3".to_owned());
        let baseline = &ws.config.baseline;
        let (_, arch) = baseline.manylinux()?;
        let platforms = [
            baseline.wheel_platform.clone(),
            format!("manylinux2014_{arch}"),
        ];
        let platform_args: Vec<String> = platforms
            .iter()
            .flat_map(|p| ["--platform".to_owned(), p.clone()])
            .collect();
        let py = &baseline.python;
        // pip checks every file against the hashes in the requirements file.
        cmd!(sh, "{python} -m pip download --quiet --disable-pip-version-check --no-input --no-deps --only-binary=:all: --require-hashes {platform_args...} --python-version {py} -r {reqs} -d {context}")
            .run()
            .with_context(|| format!("cannot fetch the wheels of {} by hash", reqs.display()))?;
    }
    Ok(())
}

/// The release's one wheel, re-hashed against the manifest.
fn release_wheel(dist: &Path, manifest: &Manifest) -> anyhow::Result<(PathBuf, String)> {
    let wheels: Vec<_> = manifest
        .artifacts
        .values()
        .filter(|a| a.kind == "python-wheel")
        .collect();
    let [wheel] = wheels[..] else {
        bail!(
            "the release manifest lists {} wheels; the images install exactly one",
            wheels.len()
        );
    };
    let want = wheel
        .sha256()
        .ok_or_else(|| format_err!("{}: no sha256 in the manifest", wheel.name))?;
    let path = dist.join(&wheel.name);
    let (got, _) = checksums::sha256_file(&path)?;
    if got != want {
        bail!(
            "{} has sha256 {got}, the manifest says {want}",
            path.display()
        );
    }
    Ok((path, got))
}

fn check_labels(labels: &BTreeMap<String, String>, want: &[(&str, &str)]) -> anyhow::Result<()> {
    let wrong: Vec<String> = want
        .iter()
        .filter(|(k, v)| labels.get(*k).map(String::as_str) != Some(*v))
        .map(|(k, v)| {
            format!(
                "{k} is {:?}, want {v:?}",
                labels.get(*k).map(String::as_str).unwrap_or("missing")
            )
        })
        .collect();
    if !wrong.is_empty() {
        bail!("the built image's labels are wrong: {}", wrong.join("; "));
    }
    Ok(())
}

/// `IMAGE_REGISTRY_USERNAME` + `IMAGE_REGISTRY_PASSWORD`: log in to the target registry, with
/// `REGISTRY_AUTH_FILE` pointing at a file under target/ for as long as the guard lives.
/// Neither: nothing to do.
fn login<'a>(sh: &'a Shell, ws: &Workspace) -> anyhow::Result<Option<xshell::PushEnv<'a>>> {
    let user = env::var(env::IMAGE_REGISTRY_USERNAME);
    let password = env::var(env::IMAGE_REGISTRY_PASSWORD);
    let host = ws
        .config
        .images
        .registry
        .split('/')
        .next()
        .unwrap_or_default();
    match (user, password) {
        (Some(u), Some(p)) => {
            let dir = ws.scratch_dir().join("images");
            fs::create_dir_all(&dir)?;
            let guard = sh.push_env("REGISTRY_AUTH_FILE", dir.join("auth.json"));
            registry::login(sh, host, &u, &p)?;
            Ok(Some(guard))
        }
        (None, None) => Ok(None),
        _ => bail!(
            "set both {} and {} (or neither)",
            env::IMAGE_REGISTRY_USERNAME,
            env::IMAGE_REGISTRY_PASSWORD
        ),
    }
}

/// Adds the images to the release's publication record (`publication.json`: what it holds
/// already, places and attestations, is kept) and renders the tag's entry of `RELEASES.md` from
/// the manifest and the record. The manifest and `sha256.sum` are not touched: they are on the
/// release as they were attested.
pub fn record(
    ws: &Workspace,
    source: &Source,
    dist: &Path,
    manifest: &Manifest,
    images: BTreeMap<String, ManifestImage>,
) -> anyhow::Result<(Publication, String)> {
    let mut record = Publication::load_or_new(dist, manifest)?;
    record.images.extend(images);
    let wrote = publication::write(dist, &record)?;
    let changed = ledger::write(ws, source, manifest, &record)?;
    let outcome = format!(
        "{} image digest(s) in {} ({}); {}",
        record.images.len(),
        publication::PUBLICATION,
        if wrote { "updated" } else { "unchanged" },
        if changed {
            "RELEASES.md updated"
        } else {
            "RELEASES.md already has this entry"
        }
    );
    Ok((record, outcome))
}

impl flags::Images {
    pub fn run(self, sh: &Shell) -> anyhow::Result<()> {
        let ws = Workspace::load(sh)?;
        let mut phases = Phases::new(format!("images {}", self.tag));
        let result = self.run_phases(sh, &ws, &mut phases);
        eprint!("{}", phases.summary());
        result
    }

    fn run_phases(&self, sh: &Shell, ws: &Workspace, phases: &mut Phases) -> anyhow::Result<()> {
        let plan = phases.run("check images", || {
            let plan = Plan::check(sh, ws, self.builder.as_deref())?;
            let outcome = plan.summary();
            Ok((plan, outcome))
        })?;
        let source = phases.run("verify source", || {
            let s = source::source(sh, ws, &self.tag)?;
            let outcome = format!("{} is {}", s.tag, s.commit);
            Ok((s, outcome))
        })?;
        let dist = ws.dist_dir(&source.tag);
        let manifest = phases.run("verify dist", || {
            let m = release_manifest(&dist, &source)?;
            Ok((
                m,
                format!("{} matches its {}", dist.display(), checksums::SUMS),
            ))
        })?;
        let images = phases.run("images", || {
            let images = build_and_push(sh, ws, &source, &dist, &manifest, &plan, self.force)?;
            let outcome = images
                .values()
                .map(|i| format!("{}@{}", i.reference, i.digest))
                .collect::<Vec<_>>()
                .join(", ");
            Ok((images, outcome))
        })?;
        phases.run("record", || {
            let (_, outcome) = record(ws, &source, &dist, &manifest, images)?;
            Ok((
                (),
                format!(
                    "{outcome}; attach the record to the release with `cargo xtask publish \
                     record {}`",
                    source.tag
                ),
            ))
        })?;
        Ok(())
    }
}

/// The release directory of `source`: verified against its sums, built from the same commit.
pub fn release_manifest(dist: &Path, source: &Source) -> anyhow::Result<Manifest> {
    checksums::verify_dir(dist).with_context(|| {
        format!(
            "the release directory {} is not usable: build it with `cargo xtask release {} \
             --dry-run` (or download the release's files into it)",
            dist.display(),
            source.tag
        )
    })?;
    let manifest = checksums::read_manifest(dist)?;
    let built_from = manifest.source.get("commit").and_then(|c| c.as_str());
    if built_from != Some(source.commit.as_str()) {
        bail!(
            "{} was built from commit {}, but {} is {}",
            dist.display(),
            built_from.unwrap_or("(not recorded)"),
            source.tag,
            source.commit
        );
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_images_rerun_keeps_the_places_publishing_recorded() {
        use crate::checksums::tests::{standin_manifest, temp_dir};
        use crate::publication::{Place, PlacedFile};
        let root = temp_dir("images-record");
        let dist = root.join("target/dist/v0.1.0");
        fs::create_dir_all(&dist).unwrap();
        let manifest = standin_manifest(&dist);
        checksums::write(&dist, &manifest).unwrap();
        let ws = crate::ledger::tests::workspace(&root);
        let source = crate::ledger::tests::source();
        // What `publish undraft` left: both places.
        let mut published = Publication::new(&dist, &manifest).unwrap();
        let wheel = "standin-0.1.0-py3-none-any.whl";
        let file = PlacedFile {
            url: "https://i/w".into(),
            sha256: manifest.artifacts[wheel].sha256().unwrap().into(),
        };
        published.github = Some(Place {
            name: "GitHub Releases".into(),
            url: "https://g/o/r/releases/tag/v0.1.0".into(),
            files: BTreeMap::from([(wheel.to_owned(), file.clone())]),
        });
        published.index = Some(Place {
            name: "PyPI".into(),
            url: "https://i/p/".into(),
            files: BTreeMap::from([(wheel.to_owned(), file)]),
        });
        publication::write(&dist, &published).unwrap();
        let sums_before = fs::read(dist.join(checksums::SUMS)).unwrap();
        let vllm = || {
            let image = crate::ledger::tests::image("127.0.0.1:5000/o", 'd');
            BTreeMap::from([("vllm-musa".to_owned(), image)])
        };
        let run = |images| record(&ws, &source, &dist, &manifest, images).unwrap();

        let (first, outcome) = run(vllm());
        assert!(outcome.contains("RELEASES.md updated"), "{outcome}");
        assert_eq!(first.github, published.github);
        assert_eq!(first.index, published.index);
        let ledger = fs::read_to_string(root.join("RELEASES.md")).unwrap();
        for line in [
            "- Published: GitHub Releases <https://g/o/r/releases/tag/v0.1.0>",
            "- Published: PyPI <https://i/p/>",
            "| `127.0.0.1:5000/o/vllm-musa:0.1.0` | `sha256:dddd",
        ] {
            assert!(ledger.contains(line), "{line} in {ledger}");
        }

        // The re-run (same digest): nothing changes; the manifest and its sums never do.
        let (again, outcome) = run(vllm());
        assert_eq!(again, first);
        assert!(
            outcome.contains("(unchanged); RELEASES.md already has this entry"),
            "{outcome}"
        );
        // A `release --skip-images` after it: the images stay recorded.
        let (skipped, _) = run(BTreeMap::new());
        assert_eq!(skipped, first);
        assert_eq!(
            fs::read_to_string(root.join("RELEASES.md")).unwrap(),
            ledger
        );
        assert_eq!(fs::read(dist.join(checksums::SUMS)).unwrap(), sums_before);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn wrong_or_missing_labels_are_named() {
        let labels = BTreeMap::from([
            (LABEL_VERSION.to_owned(), "0.3.13".to_owned()),
            (LABEL_REVISION.to_owned(), "abc".to_owned()),
        ]);
        assert!(check_labels(&labels, &[(LABEL_VERSION, "0.3.13")]).is_ok());
        let err = check_labels(
            &labels,
            &[(LABEL_REVISION, "def"), (LABEL_WHEEL_SHA256, "00")],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("revision is \"abc\", want \"def\""), "{err}");
        assert!(err.contains("wheel.sha256 is \"missing\""), "{err}");
    }
}
