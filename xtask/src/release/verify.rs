//! Phase `verify baseline`: is this host the release baseline (`release.toml [baseline]`)?

use std::path::{Path, PathBuf};

use anyhow::bail;
use serde::{Deserialize, Serialize};
use xshell::{cmd, Shell};

use crate::config::Baseline;
use crate::env;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BaselineMode {
    /// The host must be the baseline.
    Strict,
    /// The host is recorded, differences are allowed.
    Local,
}

impl BaselineMode {
    pub fn from_flag(strict_baseline: bool) -> BaselineMode {
        let on_actions = env::var(env::GITHUB_ACTIONS).as_deref() == Some("true");
        if strict_baseline || on_actions {
            BaselineMode::Strict
        } else {
            BaselineMode::Local
        }
    }
}

/// What the build host is, as far as the baseline is concerned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Host {
    pub os_id: Option<String>,
    pub os_version: Option<String>,
    pub glibc: Option<String>,
    pub musa: Option<String>,
    pub python: Option<String>,
    pub torch: Option<String>,
    /// The interpreter that was probed.
    pub python_bin: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BaselineReport {
    pub mode: BaselineMode,
    pub wanted: Baseline,
    pub found: Host,
    /// One line per difference; empty when the host is the baseline.
    pub differences: Vec<String>,
}

impl BaselineReport {
    pub fn outcome(&self) -> String {
        match (self.mode, self.differences.len()) {
            (_, 0) => format!("{:?} mode: host is the baseline", self.mode).to_lowercase(),
            (_, n) => format!(
                "local mode: host differs from the baseline in {n} way{} (recorded): {}",
                if n == 1 { "" } else { "s" },
                self.differences.join("; ")
            ),
        }
    }
}

/// Probes the host (files under `$XTASK_HOST_ROOT`, default `/`; the interpreter
/// `$XTASK_BASELINE_PYTHON`, else `python<baseline.python>`, else `python3`) and compares.
/// Strict mode fails on any difference.
pub fn baseline(
    sh: &Shell,
    wanted: &Baseline,
    mode: BaselineMode,
) -> anyhow::Result<BaselineReport> {
    let root = PathBuf::from(env::var(env::XTASK_HOST_ROOT).unwrap_or_else(|| "/".to_owned()));
    let mut found = Host::default();
    if let Ok(text) = std::fs::read_to_string(root.join("etc/os-release")) {
        found.os_id = os_release_field(&text, "ID");
        found.os_version = os_release_field(&text, "VERSION_ID");
    }
    if let Ok(text) = std::fs::read_to_string(root.join(&wanted.musa_version_file)) {
        found.musa = first_version(&text);
    }
    probe_python(sh, wanted, &mut found);

    let differences = compare(wanted, &found);
    let report = BaselineReport {
        mode,
        wanted: wanted.clone(),
        found,
        differences,
    };
    if mode == BaselineMode::Strict && !report.differences.is_empty() {
        bail!(
            "this host is not the release baseline:\n    {}\nBuild inside the builder image \
             ({}) or, for a local build, leave out --strict-baseline (and GITHUB_ACTIONS=true) \
             to record the differences in the manifest instead.",
            report.differences.join("\n    "),
            wanted.builder_image
        );
    }
    Ok(report)
}

const PROBE: &str = r#"
import json, os, platform, sys
try:
    from importlib.metadata import version
    torch = version("torch")
except Exception:
    torch = None
try:
    glibc = os.confstr("CS_GNU_LIBC_VERSION").split()[-1]
except Exception:
    glibc = platform.libc_ver()[1] or None
print(json.dumps({"python": platform.python_version(), "glibc": glibc, "torch": torch}))
"#;

fn probe_python(sh: &Shell, wanted: &Baseline, found: &mut Host) {
    #[derive(Deserialize)]
    struct Probe {
        python: Option<String>,
        glibc: Option<String>,
        torch: Option<String>,
    }
    let candidates = match env::var(env::XTASK_BASELINE_PYTHON) {
        Some(p) => vec![p],
        None => vec![format!("python{}", wanted.python), "python3".to_owned()],
    };
    // The first candidate that runs (a pyenv shim may exist for a version that is not installed).
    for python in candidates.into_iter().filter(|c| find_program(c).is_some()) {
        let out = cmd!(sh, "{python} -c {PROBE}")
            .quiet()
            .ignore_stderr()
            .read();
        if let Some(p) = out
            .ok()
            .and_then(|o| serde_json::from_str::<Probe>(&o).ok())
        {
            found.python = p.python;
            found.glibc = p.glibc;
            found.torch = p.torch;
            found.python_bin = Some(python);
            return;
        }
    }
}

fn compare(wanted: &Baseline, found: &Host) -> Vec<String> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "nothing".to_owned());
    let mut out = Vec::new();
    if found.os_id.as_deref() != Some(&wanted.os_id)
        || found.os_version.as_deref() != Some(&wanted.os_version)
    {
        out.push(format!(
            "OS: wanted {} {}, found {} {} (etc/os-release)",
            wanted.os_id,
            wanted.os_version,
            show(&found.os_id),
            show(&found.os_version)
        ));
    }
    if found.glibc.as_deref() != Some(&wanted.glibc) {
        out.push(format!(
            "glibc: wanted {}, found {}",
            wanted.glibc,
            show(&found.glibc)
        ));
    }
    if found.musa.as_deref() != Some(&wanted.musa) {
        out.push(format!(
            "MUSA: wanted {}, found {} ({})",
            wanted.musa,
            show(&found.musa),
            wanted.musa_version_file
        ));
    }
    let python_ok = found.python.as_deref().is_some_and(|v| {
        v == wanted.python
            || v.strip_prefix(&wanted.python)
                .is_some_and(|r| r.starts_with('.'))
    });
    if !python_ok {
        let bin = found
            .python_bin
            .as_deref()
            .map(|b| format!(" ({b})"))
            .unwrap_or_default();
        out.push(format!(
            "Python: wanted {}, found {}{bin}",
            wanted.python,
            show(&found.python)
        ));
    }
    let torch = found
        .torch
        .as_deref()
        .map(|t| t.split('+').next().unwrap_or(t));
    if torch != Some(&wanted.torch) {
        out.push(format!(
            "PyTorch: wanted {}, found {}",
            wanted.torch,
            show(&found.torch)
        ));
    }
    out
}

fn os_release_field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.strip_prefix(key)?.strip_prefix('=')?;
        Some(v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
    })
}

/// The first `N.N[.N…]` (or `vN.N…`) word in a text: version files come as plain text or JSON.
fn first_version(text: &str) -> Option<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .map(|w| {
            w.strip_prefix(['v', 'V'])
                .unwrap_or(w)
                .trim_end_matches('.')
        })
        .find(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_owned)
}

/// `which`: a program name looked up on PATH, or a path that exists.
fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).exists().then(|| PathBuf::from(name));
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_and_version_files_parse() {
        let text = "PRETTY_NAME=\"Ubuntu 22.04.4 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\nID_LIKE=debian\n";
        assert_eq!(os_release_field(text, "ID").as_deref(), Some("ubuntu"));
        assert_eq!(
            os_release_field(text, "VERSION_ID").as_deref(),
            Some("22.04")
        );
        assert_eq!(
            first_version("MUSA Toolkit 5.2.0-server\n").as_deref(),
            Some("5.2.0")
        );
        assert_eq!(
            first_version("{\"musa_toolkits\": {\"version\": \"5.2.0\"}}").as_deref(),
            Some("5.2.0")
        );
        assert_eq!(first_version("mp31 v5.2.0.").as_deref(), Some("5.2.0"));
        assert_eq!(first_version("none"), None);
    }
}
