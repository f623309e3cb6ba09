//! devpi-server on loopback (scripts/release-devpi.sh): the PyPI of the publish tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use xtask::release::build::tools_venv;
use xtask::release::pypi::{publish_files, uv, Credentials, Index};
use xtask::Workspace;

pub struct Devpi {
    pub dir: PathBuf,
    pub url: String,
    pub user: String,
    pub password: String,
}

impl Drop for Devpi {
    fn drop(&mut self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/release-devpi.sh")
}

pub fn devpi_venv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/xtask/devpi-venv")
}

pub fn start_devpi() -> Devpi {
    let dir = super::temp_dir("devpi");
    let out = Command::new(script())
        .arg("start")
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "devpi did not start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Devpi {
        dir,
        url: v["url"].as_str().unwrap().to_owned(),
        user: v["user"].as_str().unwrap().to_owned(),
        password: v["password"].as_str().unwrap().to_owned(),
    }
}

impl Devpi {
    /// A fresh non-volatile index (no bases) for one scenario.
    pub fn index(&self, name: &str) -> Index {
        let client = self.dir.join("client");
        let devpi = devpi_venv().join("bin/devpi");
        let ok = Command::new(devpi)
            .args([
                "index",
                "-c",
                &format!("{}/{name}", self.user),
                "bases=",
                "volatile=False",
            ])
            .env("DEVPI_CLIENTDIR", client)
            .output()
            .unwrap();
        assert!(
            ok.status.success(),
            "{}",
            String::from_utf8_lossy(&ok.stderr)
        );
        Index {
            upload_url: format!("{}/{}/{name}/", self.url, self.user),
            simple_url: format!("{}/{}/{name}/+simple/", self.url, self.user),
        }
    }

    /// Uploads stand-in artifacts of `standin-dist` to `index`, as a publisher would.
    pub fn upload_standin(&self, index: &Index, files: &[PathBuf]) {
        let sh = xshell::Shell::new().unwrap();
        publish_files(
            &sh,
            &tools_uv(),
            index,
            &self.credentials(),
            "standin-dist",
            files,
        )
        .unwrap();
    }

    pub fn credentials(&self) -> Credentials {
        Credentials::Password {
            username: self.user.clone(),
            password: self.password.clone(),
        }
    }
}

/// `uv` of this workspace's build-tools venv (`xtask/requirements-build.txt`), made if missing:
/// the uploader `publish pypi` runs.
pub fn tools_uv() -> PathBuf {
    let sh = xshell::Shell::new().unwrap();
    sh.change_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let ws = Workspace::load(&sh).unwrap();
    uv(&tools_venv(&sh, &ws).unwrap())
}

/// A stand-in wheel and sdist of `standin-dist` 0.1.0; `variant` changes their bytes.
pub fn standin_artifacts(dir: &Path, variant: &str) -> Vec<PathBuf> {
    std::fs::create_dir_all(dir).unwrap();
    let script = r#"
import io, sys, tarfile, zipfile
out, variant = sys.argv[1], sys.argv[2]
meta = "Metadata-Version: 2.4\nName: standin-dist\nVersion: 0.1.0\nSummary: stand-in for the release tests\nRequires-Python: >=3.9\nClassifier: Programming Language :: Python :: 3\nClassifier: Typing :: Typed\n\nLong description.\n"
with zipfile.ZipFile(out + "/standin_dist-0.1.0-py3-none-any.whl", "w") as z:
    z.writestr(zipfile.ZipInfo("standin/__init__.py", (1980, 1, 1, 0, 0, 0)), "VARIANT = %r\n" % variant)
    z.writestr(zipfile.ZipInfo("standin_dist-0.1.0.dist-info/METADATA", (1980, 1, 1, 0, 0, 0)), meta)
    z.writestr(zipfile.ZipInfo("standin_dist-0.1.0.dist-info/WHEEL", (1980, 1, 1, 0, 0, 0)), "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    z.writestr(zipfile.ZipInfo("standin_dist-0.1.0.dist-info/RECORD", (1980, 1, 1, 0, 0, 0)), "")
with tarfile.open(out + "/standin_dist-0.1.0.tar.gz", "w:gz") as t:
    for name, data in [("standin_dist-0.1.0/PKG-INFO", meta), ("standin_dist-0.1.0/standin/__init__.py", "VARIANT = %r\n" % variant)]:
        info = tarfile.TarInfo(name); b = data.encode(); info.size = len(b); info.mtime = 0
        t.addfile(info, io.BytesIO(b))
"#;
    let ok = Command::new("python3")
        .args(["-c", script])
        .arg(dir)
        .arg(variant)
        .status()
        .unwrap();
    assert!(ok.success());
    [
        "standin_dist-0.1.0-py3-none-any.whl",
        "standin_dist-0.1.0.tar.gz",
    ]
    .iter()
    .map(|n| dir.join(n))
    .collect()
}
