//! Builds the eBPF object (xdp-router-ebpf) with nightly + bpf-linker and embeds it: the normal
//! `cargo build` of xdp-routerd produces a daemon that carries its datapath. The benchmark
//! (bench/Cargo.toml `build`) runs this same script and embeds the `lab` binary it also builds.
//! `cargo xtask setup` installs what this needs (rust-src on nightly, bpf-linker).
use std::path::PathBuf;

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir.join("../xdp-router-ebpf");
    let ebpf_dir = ebpf_dir
        .canonicalize()
        .context("xdp-router-ebpf directory")?;
    let root_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    // aya-build turns every stderr line of the nested cargo into a `cargo:warning`: keep that
    // cargo quiet so only its errors (and rustc's diagnostics) come through.
    // SAFETY: a build script is single-threaded here; nothing else reads the environment.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    // The object's debug info and BTF name its sources: with nightly cargo's trim-paths they
    // are relative (`src/flow.rs`, `/rustc/<commit>/library/core`), not this checkout's and
    // rustup's absolute paths, so the daemon that embeds it is the same wherever it is built
    // (`cargo xtask dist`'s packages are reproducible). aya-build sets the nested cargo's
    // rustflags itself, so `--remap-path-prefix` cannot be passed; this profile setting can.
    // SAFETY: as above.
    unsafe {
        std::env::set_var("CARGO_UNSTABLE_TRIM_PATHS", "true");
        std::env::set_var("CARGO_PROFILE_RELEASE_TRIM_PATHS", "all");
    }
    aya_build::build_ebpf(
        [Package {
            name: "xdp-router-ebpf",
            root_dir,
            // The binaries require this feature, so host builds of the workspace skip them.
            features: &["bpf-bins"],
            ..Default::default()
        }],
        Toolchain::default(),
    )
    .context(
        "building the eBPF object failed; run `cargo xtask setup` (nightly rust-src + bpf-linker)",
    )
}
