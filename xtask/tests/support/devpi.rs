//! devpi-server on loopback (scripts/release-devpi.sh): the PyPI of the publish tests.

use std::path::{Path, PathBuf};
use std::process::Command;

use xtask::release::pypi::{Credentials, Index};

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

    pub fn credentials(&self) -> Credentials {
        Credentials {
            username: self.user.clone(),
            password: self.password.clone(),
        }
    }
}
