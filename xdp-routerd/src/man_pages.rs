//! `xdp-routerd man-pages DIR` (a hidden command): the manual pages, section 8, generated from
//! the clap definitions with clap_mangen, one per command (`xdp-routerd.8`, `xdp-routerd-run.8`,
//! …). `cargo xtask dist` runs it to put them in the Debian package.

use std::path::{Path, PathBuf};

use anyhow::Context as _;

/// Writes the page of `cmd` and of each visible subcommand into `dir`; returns their paths.
pub fn write(cmd: clap::Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut cmd = cmd.disable_help_subcommand(true);
    // Fills in each subcommand's display name (`xdp-routerd-run`), which names its page.
    cmd.build();
    let subcommands: Vec<clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .cloned()
        .collect();
    std::iter::once(cmd)
        .chain(subcommands)
        .map(|c| {
            clap_mangen::Man::new(c)
                .section("8")
                .manual("System Manager's Manual")
                .generate_to(dir)
                .with_context(|| format!("cannot write a manual page into {}", dir.display()))
        })
        .collect()
}
