//! The image builders xtask drives: podman, buildah or docker buildx, whichever exists. Each
//! builds a recipe and writes the result as an OCI image layout directory, so the digest is
//! known before anything is pushed and every builder is pushed the same way (`skopeo copy`).

use std::path::Path;

use anyhow::{bail, Context};
use xshell::{cmd, Shell};

use crate::env;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// `podman build --isolation=chroot`: no daemon, works unprivileged-ish in CI containers.
    Podman,
    Buildah,
    /// `docker buildx build --output type=oci`: needs a running daemon.
    DockerBuildx,
}

/// What one build needs; `build_args` in the order they are passed.
#[derive(Debug)]
pub struct BuildSpec<'a> {
    pub context: &'a Path,
    pub build_args: Vec<(&'static str, String)>,
    /// `SOURCE_DATE_EPOCH`: every timestamp in the image.
    pub timestamp: i64,
    /// Pull the base over plain HTTP (a loopback registry).
    pub insecure_base: bool,
    /// Scratch name for the builder's local store.
    pub local_name: String,
    /// Where the OCI image layout goes (replaced), and the tag it gets there.
    pub layout: &'a Path,
    pub layout_tag: &'a str,
}

impl Builder {
    pub const ALL: [Builder; 3] = [Builder::Podman, Builder::Buildah, Builder::DockerBuildx];

    pub fn name(self) -> &'static str {
        match self {
            Builder::Podman => "podman",
            Builder::Buildah => "buildah",
            Builder::DockerBuildx => "docker-buildx",
        }
    }

    pub fn parse(s: &str) -> anyhow::Result<Builder> {
        Builder::ALL
            .into_iter()
            .find(|b| b.name() == s || (s == "docker" && *b == Builder::DockerBuildx))
            .with_context(|| {
                format!("unknown image builder {s:?}: use podman, buildah or docker-buildx")
            })
    }

    /// `--builder`, else `$XTASK_IMAGE_BUILDER`, else the first of podman, buildah, docker
    /// buildx that answers.
    pub fn choose(sh: &Shell, wanted: Option<&str>) -> anyhow::Result<Builder> {
        let wanted = wanted
            .map(str::to_owned)
            .or_else(|| env::var(env::XTASK_IMAGE_BUILDER));
        if let Some(w) = wanted {
            let b = Builder::parse(&w)?;
            b.check(sh)?;
            return Ok(b);
        }
        let mut tried = Vec::new();
        for b in Builder::ALL {
            match b.check(sh) {
                Ok(()) => return Ok(b),
                Err(e) => tried.push(format!("{}: {e:#}", b.name())),
            }
        }
        bail!(
            "no image builder found; install podman (or buildah, or docker with buildx and a \
             running daemon), or name one with --builder / {}.\n  {}",
            env::XTASK_IMAGE_BUILDER,
            tried.join("\n  ")
        )
    }

    fn check(self, sh: &Shell) -> anyhow::Result<()> {
        let ok = match self {
            Builder::Podman => cmd!(sh, "podman --version").quiet().ignore_stdout().run(),
            Builder::Buildah => cmd!(sh, "buildah --version").quiet().ignore_stdout().run(),
            Builder::DockerBuildx => cmd!(sh, "docker buildx version")
                .quiet()
                .ignore_stdout()
                .run()
                .and_then(|()| {
                    cmd!(sh, "docker info")
                        .quiet()
                        .ignore_stdout()
                        .ignore_stderr()
                        .run()
                }),
        };
        ok.map_err(|e| anyhow::format_err!("not usable ({e})"))
    }

    /// The build command line (without the program), for the builds and for the tests.
    pub fn build_args(self, spec: &BuildSpec<'_>) -> Vec<String> {
        let mut args: Vec<String> = match self {
            Builder::Podman | Builder::Buildah => vec![
                "build".into(),
                // chroot isolation needs neither a daemon nor user namespaces from the host.
                "--isolation=chroot".into(),
                // One RUN step, no intermediate images; the result is the base plus one layer.
                "--layers=false".into(),
                "--force-rm".into(),
                "--pull=missing".into(),
                format!("--timestamp={}", spec.timestamp),
                format!("--tls-verify={}", !spec.insecure_base),
                "-t".into(),
                spec.local_name.clone(),
            ],
            Builder::DockerBuildx => vec![
                "buildx".into(),
                "build".into(),
                "--provenance=false".into(),
                "--sbom=false".into(),
                format!(
                    "--output=type=oci,dest={},tar=false,rewrite-timestamp=true,name={}",
                    spec.layout.display(),
                    spec.layout_tag
                ),
            ],
        };
        args.push("-f".into());
        args.push(spec.context.join("Dockerfile").display().to_string());
        for (k, v) in &spec.build_args {
            args.push("--build-arg".into());
            args.push(format!("{k}={v}"));
        }
        args.push(spec.context.display().to_string());
        args
    }

    /// Builds and writes the OCI layout. The build's output goes to the terminal: the smoke
    /// test inside the build prints there.
    pub fn build(self, sh: &Shell, spec: &BuildSpec<'_>) -> anyhow::Result<()> {
        if spec.layout.exists() {
            std::fs::remove_dir_all(spec.layout)
                .with_context(|| format!("cannot remove {}", spec.layout.display()))?;
        }
        let args = self.build_args(spec);
        let epoch = spec.timestamp.to_string();
        let _epoch = sh.push_env("SOURCE_DATE_EPOCH", &epoch);
        let program = match self {
            Builder::Podman => "podman",
            Builder::Buildah => "buildah",
            Builder::DockerBuildx => "docker",
        };
        cmd!(sh, "{program} {args...}").run().with_context(|| {
            format!(
                "{} build of {} failed (its output is above)",
                self.name(),
                spec.context.display()
            )
        })?;
        if self == Builder::DockerBuildx {
            return Ok(());
        }
        let dest = format!("oci:{}:{}", spec.layout.display(), spec.layout_tag);
        let local = &spec.local_name;
        let pushed = cmd!(sh, "{program} push --quiet {local} {dest}").run();
        // The local copy is only a step towards the layout; leave the store as it was.
        let _ = cmd!(sh, "{program} rmi --force {local}")
            .quiet()
            .ignore_stdout()
            .ignore_stderr()
            .run();
        pushed.with_context(|| format!("cannot write the OCI layout {}", spec.layout.display()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec<'a>(ctx: &'a Path, layout: &'a Path) -> BuildSpec<'a> {
        BuildSpec {
            context: ctx,
            build_args: vec![("VERSION", "0.3.13".into()), ("WHEEL_SHA256", "ab".into())],
            timestamp: 1_700_000_000,
            insecure_base: true,
            local_name: "localhost/xtask-vllm-musa:0.3.13".into(),
            layout,
            layout_tag: "0.3.13",
        }
    }

    #[test]
    fn podman_and_buildah_build_reproducibly_without_a_daemon() {
        let (ctx, layout) = (Path::new("/c"), Path::new("/l"));
        let a = Builder::Podman.build_args(&spec(ctx, layout));
        for want in [
            "--isolation=chroot",
            "--layers=false",
            "--timestamp=1700000000",
            "--tls-verify=false",
        ] {
            assert!(a.iter().any(|x| x == want), "{want} in {a:?}");
        }
        assert_eq!(
            a[a.len() - 7..],
            [
                "-f",
                "/c/Dockerfile",
                "--build-arg",
                "VERSION=0.3.13",
                "--build-arg",
                "WHEEL_SHA256=ab",
                "/c"
            ]
        );
        assert_eq!(Builder::Buildah.build_args(&spec(ctx, layout)), a);
    }

    #[test]
    fn docker_buildx_writes_an_oci_layout_with_rewritten_timestamps() {
        let a = Builder::DockerBuildx.build_args(&spec(Path::new("/c"), Path::new("/l")));
        assert_eq!(a[..2], ["buildx", "build"]);
        assert!(a.contains(
            &"--output=type=oci,dest=/l,tar=false,rewrite-timestamp=true,name=0.3.13".to_owned()
        ));
        assert!(a.contains(&"--provenance=false".to_owned()));
    }

    #[test]
    fn builder_names_parse() {
        assert_eq!(Builder::parse("podman").unwrap(), Builder::Podman);
        assert_eq!(Builder::parse("docker").unwrap(), Builder::DockerBuildx);
        assert!(format!("{:#}", Builder::parse("kaniko").unwrap_err())
            .contains("podman, buildah or docker-buildx"));
    }
}
