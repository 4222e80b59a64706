//! `cargo xtask docs`: the manual (docs/manual, an mdBook). Writes the reference pages that are
//! generated from the code (xdp-routerd's `reference` module: fallback reasons, configuration
//! keys, metrics), builds the book into target/manual and checks the relative links of the
//! README and of every page under docs/.
//! `--check` compares the reference pages instead of writing them; `cargo xtask test` runs that
//! comparison as a unit test and [`book`] as its `manual` step.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use crate::{cmd, workspace};

/// Options of `cargo xtask docs`.
#[derive(clap::Args)]
pub struct DocsArgs {
    /// Fail (one line) when a committed reference page differs from what the code generates,
    /// instead of writing the pages.
    #[arg(long)]
    check: bool,
}

/// The book's directory, relative to the workspace root.
pub const BOOK: &str = "docs/manual";

/// The unit test that compares (or writes) the reference pages.
const REFERENCE_TEST: &str = "reference::committed_pages_match_the_code";

pub fn run(args: &DocsArgs) -> anyhow::Result<()> {
    crate::setup::run_for(crate::setup::Needs::Docs)?;
    let mut c = cmd::cargo();
    c.args([
        "test",
        "-p",
        "xdp-routerd",
        "--lib",
        "--",
        "--exact",
        REFERENCE_TEST,
    ]);
    if !args.check {
        c.env("XDP_ROUTER_WRITE_REFERENCE", "1");
    }
    if cmd::run(&mut c).is_err() {
        bail!(
            "the reference pages in {BOOK}/src/reference differ from the code: run `cargo xtask \
             docs` and commit them"
        );
    }
    book()
}

/// Builds the book into target/manual (mdbook fails on a chapter file that is missing) and
/// checks the relative links of README.md and of every page under docs/ (a book page's must
/// stay in the book: the rendered book holds nothing else).
pub fn book() -> anyhow::Result<()> {
    let ws = workspace::Workspace::load()?;
    let root = workspace::root();
    let out = ws.target_dir().join("manual");
    let mut c = std::process::Command::new(crate::setup::mdbook_bin()?);
    c.current_dir(root)
        .args(["build", BOOK, "--dest-dir"])
        .arg(&out);
    cmd::run(&mut c)?;
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files)?;
    let book_src = root.join(BOOK).join("src");
    let mut broken = Vec::new();
    for file in &files {
        let text =
            fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
        // The rendered book holds only its own pages: a link out of it would be dead there.
        let inside = file.starts_with(&book_src).then_some(book_src.as_path());
        for target in broken_links(file, &text, inside) {
            let file = file.strip_prefix(root).unwrap_or(file);
            broken.push(format!("{}: {target}", file.display()));
        }
    }
    if !broken.is_empty() {
        bail!(
            "links to missing files (or, in the book, out of it): {}",
            broken.join("; ")
        );
    }
    println!(
        "manual: {} (links checked in {} pages)",
        out.join("index.html").display(),
        files.len()
    );
    Ok(())
}

/// Every `.md` file under `dir`, recursively.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            markdown_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The relative link targets of `text` (Markdown `](target)`, outside code) that name no file
/// or directory next to `file`, or, with `inside`, a path outside that directory. Anchors are
/// not checked.
fn broken_links(file: &Path, text: &str, inside: Option<&Path>) -> Vec<String> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let mut broken = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            rest = &rest[end..];
            if target.is_empty() || target.starts_with('#') || target.contains("://") {
                continue;
            }
            let path = dir.join(target.split('#').next().unwrap_or_default());
            let outside = inside.is_some_and(|top| {
                path.canonicalize()
                    .is_ok_and(|p| top.canonicalize().is_ok_and(|top| !p.starts_with(top)))
            });
            if !path.exists() || outside {
                broken.push(target.to_owned());
            }
        }
    }
    broken
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broken_links_finds_missing_files_only() {
        let dir = std::env::temp_dir().join(format!("xtask-links-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("there.md"), "").unwrap();
        let page = dir.join("page.md");
        let text = "See [there](there.md#a), [web](https://example.org), [self](#top),\n\
                    [gone](gone.md) and [also gone](sub/x.md \"title\").\n\
                    ```\n[in code](nowhere.md)\n```\n";
        assert_eq!(broken_links(&page, text, None), ["gone.md", "sub/x.md"]);
        // Inside a book in `book/`, a link up and out of it is broken even though the file
        // exists.
        let book = dir.join("book");
        fs::create_dir_all(&book).unwrap();
        let text = "[up](../there.md) and [in](page.md)";
        fs::write(book.join("page.md"), text).unwrap();
        assert_eq!(
            broken_links(&book.join("page.md"), text, Some(&book)),
            ["../there.md"]
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
