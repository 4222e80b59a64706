//! Facts about the cargo workspace (from `cargo metadata`), and building the daemon.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use crate::cmd;

/// The benchmark crate; `test` and `bench` use it only when it is a workspace member.
pub const BENCH_PACKAGE: &str = "xdp-router-bench";

/// The workspace root (xtask lives in `<root>/xtask`).
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| Path::new("."))
}

/// What `cargo metadata --no-deps` says about the workspace.
pub struct Workspace {
    /// Each member's name and version.
    packages: Vec<(String, String)>,
    target_dir: PathBuf,
}

impl Workspace {
    /// Runs `cargo metadata --no-deps` (quick: no dependency resolution).
    pub fn load() -> anyhow::Result<Workspace> {
        let mut c = cmd::cargo();
        c.args(["metadata", "--format-version", "1", "--no-deps"]);
        let out = cmd::output(&mut c)?;
        let v: serde_json::Value =
            serde_json::from_str(&out).context("cargo metadata printed invalid JSON")?;
        let packages = v["packages"]
            .as_array()
            .context("cargo metadata: no `packages` array")?
            .iter()
            .filter_map(|p| Some((p["name"].as_str()?.into(), p["version"].as_str()?.into())))
            .collect();
        let target_dir = v["target_directory"]
            .as_str()
            .context("cargo metadata: no `target_directory`")?
            .into();
        Ok(Workspace {
            packages,
            target_dir,
        })
    }

    /// True when `name` is a workspace member.
    pub fn has_package(&self, name: &str) -> bool {
        self.packages.iter().any(|(p, _)| p == name)
    }

    /// The version of member `name`.
    pub fn package_version(&self, name: &str) -> Option<&str> {
        self.packages
            .iter()
            .find(|(p, _)| p == name)
            .map(|(_, v)| v.as_str())
    }

    /// The target directory.
    pub fn target_dir(&self) -> &Path {
        &self.target_dir
    }

    /// The release daemon binary's path (whether or not it is built).
    pub fn release_daemon(&self) -> PathBuf {
        self.target_dir.join("release").join("xdp-routerd")
    }
}

/// `cargo build --release -p xdp-routerd`; returns the binary's path.
pub fn build_release_daemon() -> anyhow::Result<PathBuf> {
    let ws = Workspace::load()?;
    let mut c = cmd::cargo();
    c.args(["build", "--release", "-p", "xdp-routerd"]);
    cmd::run(&mut c)
        .context("building the daemon failed (missing toolchain? `cargo xtask setup`)")?;
    let bin = ws.release_daemon();
    if !cmd::is_executable(&bin) {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    Ok(bin)
}
