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
                // No date: the pages are the same for every build of one version.
                .source(concat!("xdp-routerd ", env!("CARGO_PKG_VERSION")))
                .generate_to(dir)
                .with_context(|| format!("cannot write a manual page into {}", dir.display()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    #[test]
    fn one_page_per_visible_command_with_its_options() {
        let dir = std::env::temp_dir().join(format!("xdp-routerd-man-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let pages = super::write(crate::Cli::command(), &dir).expect("write the pages");
        let names: Vec<String> = pages
            .iter()
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(names[0], "xdp-routerd.8");
        assert!(names.contains(&"xdp-routerd-run.8".to_owned()), "{names:?}");
        assert!(
            names.contains(&"xdp-routerd-check-system.8".to_owned()),
            "{names:?}"
        );
        assert!(
            !names
                .iter()
                .any(|n| n.contains("man-pages") || n.contains("help")),
            "hidden commands and help get no page: {names:?}"
        );
        let run = std::fs::read_to_string(dir.join("xdp-routerd-run.8")).expect("read");
        assert!(
            run.contains(concat!(
                ".TH xdp-routerd-run 8  \"xdp-routerd ",
                env!("CARGO_PKG_VERSION"),
                "\""
            )),
            "{run}"
        );
        assert!(run.contains("\\-\\-config"), "{run}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
