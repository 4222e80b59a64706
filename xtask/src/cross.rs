//! `cargo xtask build --arch arm64`: the daemon, with its eBPF object embedded, cross-built for
//! arm64 routers (Raspberry Pi, NanoPi, Rockchip and MediaTek boards) on this x86-64 machine.
//! Installs what it needs first (rustup's `aarch64-unknown-linux-gnu` standard library,
//! Debian's cross gcc as the linker, qemu-user), then runs the binary under qemu-user as a
//! smoke test: `--version` and `check-config` of the example config. Nothing BPF runs there;
//! the programs themselves are the same bytecode for both architectures.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{cmd, setup, workspace};

/// Rust's name of the target.
pub const TARGET: &str = "aarch64-unknown-linux-gnu";
/// Debian's cross linker for it, and the variable that names it to cargo.
pub const LINKER: &str = "aarch64-linux-gnu-gcc";
pub const LINKER_ENV: &str = "CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER";
/// qemu-user for arm64 binaries.
const QEMU: &str = "qemu-aarch64-static";

/// Installs the cross toolchain when missing, builds, smoke-tests; returns the binary's path.
pub fn arm64() -> anyhow::Result<PathBuf> {
    let mut missing = Vec::new();
    if cmd::which(LINKER).is_none() {
        missing.extend(["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"]);
    }
    if cmd::which(QEMU).is_none() {
        missing.push("qemu-user-static");
    }
    if !missing.is_empty() {
        setup::apt_install(&missing)?;
    }
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .context("cannot run rustup (install Rust with rustup)")?;
    if !String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == TARGET)
    {
        cmd::run(Command::new("rustup").args(["target", "add", TARGET]))?;
    }
    let ws = workspace::Workspace::load()?;
    let mut c = cmd::cargo();
    c.args([
        "build",
        "--release",
        "-p",
        "xdp-routerd",
        "--target",
        TARGET,
    ])
    .env(LINKER_ENV, LINKER);
    cmd::run(&mut c).context("the arm64 build failed (missing toolchain? `cargo xtask setup`)")?;
    let bin = ws
        .target_dir()
        .join(TARGET)
        .join("release")
        .join("xdp-routerd");
    if !cmd::is_executable(&bin) {
        bail!("the build succeeded but {} does not exist", bin.display());
    }
    let version = run_under_qemu(&bin, &["--version"])?;
    let example = workspace::root().join("config/xdp-routerd.toml");
    let check = run_under_qemu(&bin, &["check-config", &example.to_string_lossy()])?;
    println!("arm64 smoke test under {QEMU}: {version}; {check}");
    Ok(bin)
}

/// Runs the arm64 binary `bin` with `args` under qemu-user, with the cross libc as its root for
/// the dynamic loader; its stdout.
pub fn run_under_qemu(bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(QEMU)
        .args(["-L", "/usr/aarch64-linux-gnu"])
        .arg(bin)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {QEMU}"))?;
    if !out.status.success() {
        bail!(
            "the arm64 binary failed under {QEMU} ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
