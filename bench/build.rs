//! Builds the eBPF crate (xdp-router-ebpf) with nightly + bpf-linker, exactly like
//! xdp-routerd's build.rs, and embeds its `lab` binary: the benchmark's generator, sink,
//! bare-redirect and pass programs.
use std::path::PathBuf;

use anyhow::Context as _;
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest_dir
        .join("../xdp-router-ebpf")
        .canonicalize()
        .context("xdp-router-ebpf directory")?;
    let root_dir = ebpf_dir.to_str().context("non-UTF-8 path")?;
    // aya-build turns every stderr line of the nested cargo into a `cargo:warning`: keep that
    // cargo quiet so only its errors (and rustc's diagnostics) come through.
    // SAFETY: a build script is single-threaded here; nothing else reads the environment.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
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
