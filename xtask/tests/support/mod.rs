//! Test fixtures: real git repositories holding a small workspace shaped like ours (a root
//! Cargo.toml, a `bindings/` crate with a maturin pyproject.toml, release.toml), and a runner
//! for the built `xtask` binary pointed at them.

#![allow(dead_code)]

pub mod devpi;
pub mod github_standin;
pub mod openapi;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's own release.toml: fixtures use the real configuration.
pub const RELEASE_TOML: &str = include_str!("../../../release.toml");

/// release.toml naming the stand-ins' project (`standin-dist`, see `devpi::standin_artifacts`)
/// and GitHub repository (`o/r`).
pub fn standin_release_toml() -> String {
    RELEASE_TOML
        .replace(
            "distribution = \"mooncake-transfer-engine-musa\"",
            "distribution = \"standin-dist\"",
        )
        .replace(
            "repository = \"mooncake-musa/transfer-engine-rs\"",
            "repository = \"o/r\"",
        )
}

pub struct Fixture {
    pub dir: PathBuf,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A temp directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("xtask-test-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

impl Fixture {
    /// A committed workspace at Cargo version `cargo_version`, not yet tagged.
    pub fn new(name: &str, cargo_version: &str) -> Fixture {
        let dir = temp_dir(name);
        let f = Fixture { dir };
        f.write(
            "Cargo.toml",
            &format!(
                "[workspace]\nresolver = \"2\"\nmembers = [\"bindings\"]\n\n[workspace.package]\n\
                 version = \"{cargo_version}\"\nedition = \"2021\"\n"
            ),
        );
        f.write(
            "bindings/Cargo.toml",
            "[package]\nname = \"fixture-bindings\"\nversion.workspace = true\nedition.workspace = true\n\n\
             [lib]\npath = \"src/lib.rs\"\n",
        );
        f.write("bindings/src/lib.rs", "");
        f.write(
            "bindings/pyproject.toml",
            "[build-system]\nrequires = [\"maturin>=1.9.4,<2\"]\nbuild-backend = \"maturin\"\n\n\
             [project]\nname = \"mooncake-transfer-engine-musa\"\ndynamic = [\"version\"]\n\n\
             [tool.maturin.sbom]\nrust = false\nauditwheel = false\n",
        );
        f.write("release.toml", RELEASE_TOML);
        f.write(".gitignore", "/target\n");
        f.git(&["init", "-q", "-b", "main"]);
        f.commit("initial");
        f
    }

    pub fn write(&self, path: &str, text: &str) {
        let p = self.dir.join(path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    pub fn git(&self, args: &[&str]) -> String {
        git_in(&self.dir, args)
    }

    pub fn commit(&self, msg: &str) -> String {
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "--allow-empty", "-m", msg]);
        self.git(&["rev-parse", "HEAD"])
    }

    pub fn xtask(&self, args: &[&str]) -> Run {
        xtask_in(&self.dir, args, &[])
    }
}

pub struct Run {
    pub output: Output,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn success(&self) -> bool {
        self.output.status.success()
    }

    #[track_caller]
    pub fn assert_ok(&self) -> &Run {
        assert!(
            self.success(),
            "xtask failed:\n{}\n{}",
            self.stdout,
            self.stderr
        );
        self
    }

    #[track_caller]
    pub fn assert_fails_with(&self, needle: &str) -> &Run {
        assert!(
            !self.success(),
            "xtask succeeded:\n{}\n{}",
            self.stdout,
            self.stderr
        );
        assert!(
            self.stderr.contains(needle),
            "expected {needle:?} in:\n{}",
            self.stderr
        );
        self
    }
}

/// Runs the built xtask on `root` with a controlled environment.
/// `git args` in `dir`, isolated from the user's configuration, with a fixed identity and
/// date; panics with git's message on failure.
pub fn git_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Release Test")
        .env("GIT_AUTHOR_EMAIL", "release@test.invalid")
        .env("GIT_COMMITTER_NAME", "Release Test")
        .env("GIT_COMMITTER_EMAIL", "release@test.invalid")
        .env("GIT_AUTHOR_DATE", "1700000000 +0000")
        .env("GIT_COMMITTER_DATE", "1700000000 +0000")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

pub fn xtask_in(root: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.args(args)
        .current_dir(root)
        .env("XTASK_ROOT", root)
        .env_remove("GITHUB_ACTIONS")
        .env_remove("XTASK_HOST_ROOT")
        .env_remove("XTASK_BASELINE_PYTHON")
        .env_remove("GITHUB_TOKEN")
        .env_remove("PYPI_API_TOKEN")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    Run {
        output,
        stdout,
        stderr,
    }
}
