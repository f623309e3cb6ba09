//! Every environment variable xtask reads, named once.

/// Workspace to operate on (default: the workspace this xtask was built from).
pub const XTASK_ROOT: &str = "XTASK_ROOT";
/// Root of the host files the baseline check reads (`etc/os-release`, the MUSA version file).
pub const XTASK_HOST_ROOT: &str = "XTASK_HOST_ROOT";
/// Interpreter probed for the Python, glibc and PyTorch versions of the baseline.
pub const XTASK_BASELINE_PYTHON: &str = "XTASK_BASELINE_PYTHON";
/// Interpreter that creates the locked build-tools venv (default `python3`).
pub const XTASK_PYTHON: &str = "XTASK_PYTHON";
/// Cargo target directory for release builds, shared by checkouts (default: the checkout's
/// `target/xtask/cargo-target`); its path is remapped to `/target` in the artifacts.
pub const XTASK_CARGO_TARGET_DIR: &str = "XTASK_CARGO_TARGET_DIR";
/// Set by the release build for its rustc wrapper: the checkout whose prefix becomes `/src`.
pub const XTASK_REMAP_CHECKOUT: &str = "XTASK_REMAP_CHECKOUT";
/// `true` on GitHub Actions: the baseline check is strict.
pub const GITHUB_ACTIONS: &str = "GITHUB_ACTIONS";
pub const GITHUB_TOKEN: &str = "GITHUB_TOKEN";
/// REST API base (GitHub Enterprise, the loopback stand-in); default `https://api.github.com`.
pub const GITHUB_API_URL: &str = "GITHUB_API_URL";
/// PyPI API token (user `__token__`) or, with `PYPI_USERNAME`, a password.
pub const PYPI_API_TOKEN: &str = "PYPI_API_TOKEN";
pub const PYPI_USERNAME: &str = "PYPI_USERNAME";
/// Override `pypi.repository_url` / `pypi.index_url` of release.toml (e.g. TestPyPI, devpi).
pub const PYPI_REPOSITORY_URL: &str = "PYPI_REPOSITORY_URL";
pub const PYPI_INDEX_URL: &str = "PYPI_INDEX_URL";
/// Set by GitHub Actions with `id-token: write`: PyPI trusted publishing.
pub const ACTIONS_ID_TOKEN_REQUEST_URL: &str = "ACTIONS_ID_TOKEN_REQUEST_URL";
pub const ACTIONS_ID_TOKEN_REQUEST_TOKEN: &str = "ACTIONS_ID_TOKEN_REQUEST_TOKEN";
/// Image builder for `images` (podman, buildah, docker-buildx); default: the first found.
pub const XTASK_IMAGE_BUILDER: &str = "XTASK_IMAGE_BUILDER";
/// Credentials for the image registry of release.toml `[images] registry` (`skopeo login`).
pub const IMAGE_REGISTRY_USERNAME: &str = "IMAGE_REGISTRY_USERNAME";
pub const IMAGE_REGISTRY_PASSWORD: &str = "IMAGE_REGISTRY_PASSWORD";

pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}
