//! `cargo xtask lab`: the README's first command. Installs what is missing (`setup`), builds the
//! release daemon and benchmark, then runs `xdp-router-bench lab`: a home router in network
//! namespaces running xdp-routerd with `config/xdp-routerd.toml`, 64-byte UDP and an iperf3 TCP
//! transfer with the fast path off, then on, side by side (see bench/src/demo.rs). The bench
//! removes everything at the end, on failure and on Ctrl-C.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::{cmd, workspace};

/// Options of `cargo xtask lab`.
#[derive(clap::Args)]
pub struct LabArgs {
    /// Seconds of each measurement (UDP and TCP; the kernel, XDP and TC).
    #[arg(long, default_value_t = 3)]
    seconds: u32,
    /// Use the already built target/release binaries instead of building them first.
    #[arg(long)]
    no_build: bool,
    /// Leave out the TC fast path's run (the daemon restarted with `datapath = "tc"`).
    #[arg(long)]
    no_tc: bool,
}

/// Runs the lab.
pub fn run(args: &LabArgs) -> anyhow::Result<()> {
    // The bench (our child, same process group) gets Ctrl-C too and cleans up; xtask waits.
    cmd::catch_interrupts();
    if !cmd::is_root() {
        bail!(
            "the lab needs root (network namespaces, XDP, iptables): run `sudo -E env \
             \"PATH=$PATH\" cargo xtask lab`"
        );
    }
    // First use installs what the lab needs (apt packages, rust-src, bpf-linker; not the
    // tests' guest kernel); a second run only checks (well under a second).
    crate::setup::run_for(crate::setup::Needs::Host)?;
    let config = workspace::root().join("config/xdp-routerd.toml");
    if !config.is_file() {
        bail!("{} is missing", config.display());
    }
    let ws = workspace::Workspace::load()?;
    if !ws.has_package(workspace::BENCH_PACKAGE) {
        bail!(
            "package {} is not in this workspace; the lab runs its `lab` mode",
            workspace::BENCH_PACKAGE
        );
    }
    let daemon = ws.release_daemon();
    let bench: PathBuf = daemon.with_file_name(workspace::BENCH_PACKAGE);
    if !args.no_build {
        // Two builds, exactly as `cargo xtask build` and `cargo xtask bench` do them: one build
        // of both packages would unify their dependencies' features differently and make each
        // of those commands rebuild afterwards.
        workspace::build_release_daemon()?;
        let mut c = cmd::cargo();
        c.args(["build", "--release", "-p", workspace::BENCH_PACKAGE]);
        cmd::run(&mut c)
            .context("building the benchmark failed (missing toolchain? `cargo xtask setup`)")?;
    }
    for bin in [&daemon, &bench] {
        if !cmd::is_executable(bin) {
            bail!("{} is not built (drop --no-build)", bin.display());
        }
    }
    cmd::check_interrupted()?;
    let mut c = Command::new(&bench);
    c.arg("lab")
        .arg("--seconds")
        .arg(args.seconds.to_string())
        .arg("--config")
        .arg(&config)
        .arg("--daemon")
        .arg(&daemon);
    if args.no_tc {
        c.arg("--no-tc");
    }
    cmd::run(&mut c)
}
