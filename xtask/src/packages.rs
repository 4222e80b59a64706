//! The packages step of `cargo xtask test`: the Debian packages built by `cargo xtask dist`,
//! each packaged a second time from the same binary and compared byte for byte (the packaging
//! is reproducible), lintian over them, then tests/tests/package.rs: the amd64 package
//! installed, started as a systemd unit and purged in a clean Debian 12 root booted with
//! systemd-nspawn, the arm64 one inspected (and installed and run in the arm64 guest,
//! xtask/src/guest/arm64.rs). The arm64 package needs a 3-minute cross build on a fresh target
//! directory: it is packaged here when the arm64 guest step has built it (or with
//! `cargo xtask test --packages-only`), and left out otherwise.
//!
//! The clean root is a `mmdebstrap --variant=minbase` of bookworm plus what the package
//! recommends (nftables, iproute2) and systemd (its `systemctl enable` and unit directories),
//! made once (≈ 1 min with a Debian mirror) and cached as a tarball under the user's cache
//! directory.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::{
    cmd,
    dist::{self, DebArch, DistArch},
    setup,
};

/// The suite of the clean root.
const SUITE: &str = "bookworm";
/// Packages added to minbase: the package's Recommends and systemd (the container's init).
const ROOT_PACKAGES: &str = "systemd,iproute2,nftables";
/// Lintian tags left: the project has no mail domain for a Maintainer address yet.
const LINTIAN_SUPPRESSED: &str = "bogus-mail-host,bogus-mail-host-in-debian-changelog,\
                                  initial-upload-closes-no-bugs";

/// The test of tests/tests/package.rs that needs only the amd64 package.
const AMD64_TEST: &str = "amd64_package_installs_runs_and_purges_in_a_clean_root";

/// Builds and checks the packages (the arm64 one too when `arm64`), then runs
/// tests/tests/package.rs with them.
pub fn run(skip_log: &Path, arm64: bool) -> anyhow::Result<()> {
    let (release, built) = dist::run(if arm64 {
        DistArch::All
    } else {
        DistArch::Amd64
    })?;
    for b in &built {
        reproducible(b, &release)?;
    }
    let amd64 = built
        .iter()
        .find(|b| b.arch == DebArch::Amd64)
        .map(|b| b.deb.clone())
        .context("dist did not build the amd64 package")?;
    let debs: Vec<&PathBuf> = built.iter().map(|b| &b.deb).collect();
    if cmd::which("lintian").is_some() {
        cmd::run(
            Command::new("lintian")
                .args([
                    "--fail-on",
                    "error,warning",
                    "--suppress-tags",
                    LINTIAN_SUPPRESSED,
                ])
                .args(&debs),
        )?;
    } else {
        bail!("lintian not found: run `cargo xtask setup`");
    }
    let root = clean_root()?;
    let mut c = cmd::cargo();
    c.env("XDP_ROUTER_DEB", &amd64)
        .env("XDP_ROUTER_CLEAN_ROOT", &root)
        .env("XDP_ROUTER_SKIP_LOG", skip_log)
        .args([
            "test",
            "-p",
            "xdp-router-tests",
            "--test",
            "package",
            "--",
            "--ignored",
            "--test-threads=1",
            "--show-output",
        ]);
    match built.iter().find(|b| b.arch == DebArch::Arm64) {
        Some(b) => {
            c.env("XDP_ROUTER_DEB_ARM64", &b.deb);
        }
        None => {
            println!(
                "packages: the arm64 package is not built here (a 3-minute cross build, done \
                 by the arm64 guest step; `cargo xtask test --packages-only` builds it too)"
            );
            c.args(["--exact", AMD64_TEST]);
        }
    }
    let failed = cmd::run_collecting_failures(&mut c)?;
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

/// Packages the same binary again into another directory and compares: the packaging step
/// alone must give the same bytes.
fn reproducible(b: &dist::Built, release: &dist::Release) -> anyhow::Result<()> {
    let dir = b
        .deb
        .parent()
        .context("the package has no directory")?
        .join("again");
    let again = dist::package(b.arch, &b.bin, release, &dir)?;
    let (first, second) = (sha256(&b.deb)?, sha256(&again)?);
    println!("packaged {} twice: sha256 {first}, {second}", b.arch.name());
    if first != second {
        bail!(
            "packaging {} twice gave different packages: compare {} and {} with diffoscope",
            b.arch.name(),
            b.deb.display(),
            again.display()
        );
    }
    fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))
}

/// `sha256sum FILE`'s hash.
fn sha256(file: &Path) -> anyhow::Result<String> {
    let out = cmd::output(Command::new("sha256sum").arg(file))?;
    out.split_whitespace()
        .next()
        .map(str::to_owned)
        .context("sha256sum printed nothing")
}

/// The cached clean root tarball, made with mmdebstrap when missing.
fn clean_root() -> anyhow::Result<PathBuf> {
    let dir = setup::cache_dir()?.join("packages");
    let tarball = dir.join(format!("{SUITE}-amd64-root.tar"));
    if tarball.is_file() {
        println!("clean root: {} (cached)", tarball.display());
        return Ok(tarball);
    }
    if cmd::which("mmdebstrap").is_none() {
        bail!("mmdebstrap not found: run `cargo xtask setup` (it makes the clean root once)");
    }
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let partial = tarball.with_extension("tar.partial");
    let t = Instant::now();
    println!(
        "clean root: making {} with mmdebstrap (once)",
        tarball.display()
    );
    cmd::run(
        Command::new("mmdebstrap")
            .args(["--variant=minbase", "--format=tar"])
            .arg(format!("--include={ROOT_PACKAGES}"))
            .arg(SUITE)
            .arg(&partial),
    )
    .context("mmdebstrap could not make the clean root (is a Debian mirror reachable?)")?;
    fs::rename(&partial, &tarball).with_context(|| format!("rename {}", partial.display()))?;
    println!("clean root: made in {:.0} s", t.elapsed().as_secs_f64());
    Ok(tarball)
}
