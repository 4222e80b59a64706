//! `cargo xtask …`: the project's developer tasks (see `cargo xtask --help`).
//!
//! Builds with stable Rust alone: `setup` is what installs the eBPF toolchain.

mod cmd;
mod cross;
mod dist;
mod docs;
mod guest;
mod lab;
#[cfg(test)]
mod layout;
mod packages;
mod setup;
mod test;
mod test_output;
mod workspace;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for xdp-router.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building and testing needs (apt packages, nightly + rust-src, bpf-linker).
    /// Idempotent and quick when everything is present.
    Setup,
    /// Build the release daemon (`cargo build --release -p xdp-routerd`); `--arch arm64`
    /// cross-builds it for arm64 routers (installing the cross toolchain) and smoke-tests it
    /// under qemu-user.
    Build {
        /// Target architecture.
        #[arg(long, value_enum, default_value_t = Arch::Native)]
        arch: Arch,
    },
    /// Build the Debian packages (target/dist/xdp-router_<version>_<arch>.deb) from the release
    /// build, without root and reproducibly (see xtask/src/dist.rs).
    Dist {
        /// Which architectures.
        #[arg(long, value_enum, default_value_t = dist::DistArch::Amd64)]
        arch: dist::DistArch,
    },
    /// Run every test: unit tests, then the privileged tests as root, then the quick benchmark
    /// (when the xdp-router-bench package exists). Exits non-zero on any failure.
    Test(test::TestArgs),
    /// Demo (< 1 min after the build): a home router in network namespaces running xdp-routerd
    /// with config/xdp-routerd.toml; 64-byte UDP, iperf3 TCP and the router's CPU at fixed UDP
    /// rates with the fast path off, on (XDP) and on at TC ingress.
    Lab(lab::LabArgs),
    /// Write the manual's reference pages from the code (fallback reasons, configuration keys,
    /// metrics), build the manual (docs/manual) into target/manual and check its links.
    Docs(docs::DocsArgs),
    /// Run the A/B benchmark: `cargo run --release -p xdp-router-bench -- ARGS`.
    Bench {
        /// Arguments for xdp-router-bench (see `cargo xtask bench -- --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// What `build` builds for.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Arch {
    /// This machine's architecture.
    Native,
    /// aarch64-unknown-linux-gnu.
    Arm64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::run(),
        Task::Build { arch: Arch::Native } => build(),
        Task::Build { arch: Arch::Arm64 } => {
            cross::arm64().map(|bin| println!("xdp-routerd (arm64): {}", bin.display()))
        }
        Task::Dist { arch } => dist::run(arch).map(drop),
        Task::Test(args) => test::run(&args),
        Task::Lab(args) => lab::run(&args),
        Task::Docs(args) => docs::run(&args),
        Task::Bench { args } => bench(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) if cmd::interrupted() => {
            eprintln!("xtask: interrupted; cleaned up");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the release daemon and prints where it is.
fn build() -> anyhow::Result<()> {
    let bin = workspace::build_release_daemon()?;
    println!("xdp-routerd: {}", bin.display());
    Ok(())
}

/// Forwards to the benchmark crate, when it exists.
fn bench(args: &[String]) -> anyhow::Result<()> {
    let ws = workspace::Workspace::load()?;
    if !ws.has_package(workspace::BENCH_PACKAGE) {
        anyhow::bail!(
            "package {} is not in this workspace (yet); nothing to run",
            workspace::BENCH_PACKAGE
        );
    }
    let mut c = cmd::cargo();
    c.args(["run", "--release", "-p", workspace::BENCH_PACKAGE, "--"])
        .args(args);
    cmd::run(&mut c)
}
