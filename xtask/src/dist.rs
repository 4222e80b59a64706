//! `cargo xtask dist [--arch amd64|arm64|all]`: a Debian package of the daemon per architecture,
//! `target/dist/xdp-router_<version>_<arch>.deb`, built with Debian's own tools and without root:
//! dpkg-shlibdeps computes the library dependencies, dpkg-gencontrol writes DEBIAN/control
//! (Installed-Size included), dpkg-deb `--root-owner-group` builds the archive.
//!
//! Reproducible: SOURCE_DATE_EPOCH is the commit's time; every file and directory gets that
//! mtime and a fixed mode; gzip runs with `-n`; dpkg-deb sorts the entries. The same binary gives
//! a byte-identical package (`cargo xtask test`'s packages step builds twice and compares).
//! What goes in: packaging/debian/ (control, copyright, maintainer scripts), config/ (the unit,
//! the commented config as a conffile, the Grafana dashboard), the man pages the daemon writes
//! from its clap definitions (`xdp-routerd man-pages`), a generated changelog.Debian.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::{cmd, cross, workspace};

/// The binary package's name.
pub const PACKAGE: &str = "xdp-router";
/// Where the daemon is installed (the unit's ExecStart names it).
pub const DAEMON_PATH: &str = "usr/sbin/xdp-routerd";
/// The unit, where Debian 12 packages put units.
pub const UNIT_PATH: &str = "lib/systemd/system/xdp-routerd.service";
/// The commented config, a conffile: the path the unit's ExecStart reads.
pub const CONFIG_PATH: &str = "etc/xdp-router/xdp-routerd.toml";
/// The Grafana dashboard.
const DASHBOARD_PATH: &str = "usr/share/xdp-router/grafana-dashboard.json";
/// The package's documentation directory.
const DOC_DIR: &str = "usr/share/doc/xdp-router";
/// The man pages' directory (section 8: a system administration command).
const MAN_DIR: &str = "usr/share/man/man8";

/// Which packages `dist` builds.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DistArch {
    /// x86-64 (the native release build).
    Amd64,
    /// aarch64 (the cross build of `cargo xtask build --arch arm64`).
    Arm64,
    /// Both.
    All,
}

impl DistArch {
    /// The Debian architectures this choice names.
    fn debian(self) -> &'static [DebArch] {
        match self {
            DistArch::Amd64 => &[DebArch::Amd64],
            DistArch::Arm64 => &[DebArch::Arm64],
            DistArch::All => &[DebArch::Amd64, DebArch::Arm64],
        }
    }
}

/// One Debian architecture.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DebArch {
    Amd64,
    Arm64,
}

impl DebArch {
    /// Debian's name.
    pub fn name(self) -> &'static str {
        match self {
            DebArch::Amd64 => "amd64",
            DebArch::Arm64 => "arm64",
        }
    }

    /// The binutils `strip` for its binaries.
    fn strip(self) -> &'static str {
        match self {
            DebArch::Amd64 => "strip",
            DebArch::Arm64 => "aarch64-linux-gnu-strip",
        }
    }

    /// Builds the release daemon for it; the binary's path.
    fn build(self) -> anyhow::Result<PathBuf> {
        match self {
            DebArch::Amd64 if std::env::consts::ARCH != "x86_64" => bail!(
                "amd64 packages are built on x86-64 machines (this one is {})",
                std::env::consts::ARCH
            ),
            DebArch::Amd64 => workspace::build_release_daemon(),
            DebArch::Arm64 => cross::arm64(),
        }
    }

    /// Runs the daemon built for it with `args` (under qemu-user for arm64); its stdout.
    fn run_daemon(self, bin: &Path, args: &[&str]) -> anyhow::Result<String> {
        match self {
            DebArch::Amd64 => cmd::output(Command::new(bin).args(args)),
            DebArch::Arm64 => cross::run_under_qemu(bin, args),
        }
    }
}

/// The version and time every package of one `dist` run carries.
pub struct Release {
    /// Debian version: the workspace version, plus `~git<date>.<hash>` off a release tag, then
    /// the packaging's revision `-1` (a non-native package: the packaging is not upstream's).
    pub version: String,
    /// The commit's time (seconds since the epoch): SOURCE_DATE_EPOCH.
    pub epoch: u64,
}

impl Release {
    /// From the workspace version and git: the tag `v<version>` on HEAD gives the plain version.
    pub fn from_git(crate_version: &str) -> anyhow::Result<Release> {
        let git = |args: &[&str]| {
            cmd::output(
                Command::new("git")
                    .current_dir(workspace::root())
                    .args(args),
            )
            .map(|s| s.trim().to_owned())
        };
        let epoch: u64 = git(&["log", "-1", "--format=%ct"])
            .context("dist needs the git checkout (the commit's time is the packages' time)")?
            .parse()
            .context("`git log -1 --format=%ct` printed no number")?;
        let tags = git(&["tag", "--points-at", "HEAD"])?;
        let hash = git(&["rev-parse", "--short=7", "HEAD"])?;
        let date = cmd::output(
            Command::new("date")
                .args(["-u", "-d", &format!("@{epoch}")])
                .arg("+%Y%m%d"),
        )?;
        let version = version(crate_version, &tags, date.trim(), &hash);
        if !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty() {
            println!(
                "dist: warning: the work tree has uncommitted changes; {version} is not what \
                 commit {hash} builds"
            );
        }
        Ok(Release { version, epoch })
    }
}

/// `0.1.0-1` when `tags` (one per line) hold `v0.1.0`, else `0.1.0~git20261127.53790dd-1` (`~`
/// sorts before the release, so the release upgrades these snapshots).
/// A Cargo pre-release (`0.2.0-rc.1`) becomes `0.2.0~rc.1`: `-` separates Debian's revision,
/// and `~` sorts before the release as Cargo's pre-releases do.
fn version(crate_version: &str, tags: &str, date: &str, hash: &str) -> String {
    let tag = format!("v{crate_version}");
    let upstream = crate_version.replace('-', "~");
    if tags.lines().any(|t| t.trim() == tag) {
        format!("{upstream}-1")
    } else {
        format!("{upstream}~git{date}.{hash}-1")
    }
}

/// A package `dist` built.
pub struct Built {
    pub arch: DebArch,
    /// The .deb.
    pub deb: PathBuf,
    /// The daemon binary it holds (before stripping).
    pub bin: PathBuf,
}

/// Builds the packages `arch` names into `target/dist`; prints their paths and sizes.
pub fn run(arch: DistArch) -> anyhow::Result<(Release, Vec<Built>)> {
    for tool in ["dpkg-deb", "dpkg-shlibdeps", "dpkg-gencontrol", "gzip"] {
        if cmd::which(tool).is_none() {
            bail!("`{tool}` not found: run `cargo xtask setup` (Debian's dpkg-dev)");
        }
    }
    let ws = workspace::Workspace::load()?;
    let crate_version = ws
        .package_version("xdp-routerd")
        .context("cargo metadata names no xdp-routerd package")?;
    let release = Release::from_git(crate_version)?;
    let out_dir = ws.target_dir().join("dist");
    let mut built = Vec::new();
    for &arch in arch.debian() {
        let bin = arch.build()?;
        let deb = package(arch, &bin, &release, &out_dir)?;
        let size = fs::metadata(&deb).map(|m| m.len()).unwrap_or(0);
        println!(
            "{} ({:.1} MiB)",
            deb.display(),
            size as f64 / (1024.0 * 1024.0)
        );
        built.push(Built { arch, deb, bin });
    }
    Ok((release, built))
}

/// Packages `bin` for `arch` into `out_dir`; the .deb's path.
pub fn package(
    arch: DebArch,
    bin: &Path,
    release: &Release,
    out_dir: &Path,
) -> anyhow::Result<PathBuf> {
    // dpkg-shlibdeps and dpkg-gencontrol want a source tree: `<work>/debian/control`, the
    // package's files in `<work>/debian/xdp-router`.
    let work = out_dir.join(format!("build-{}", arch.name()));
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("remove {}", work.display()))?;
    }
    let root = work.join("debian").join(PACKAGE);
    stage_files(arch, bin, &root)?;
    stage_docs(arch, release, &work, &root)?;
    write_control(arch, &work, &root)?;
    normalise(&root, release.epoch)?;
    let deb = out_dir.join(format!("{PACKAGE}_{}_{}.deb", release.version, arch.name()));
    cmd::output(
        Command::new("dpkg-deb")
            .env("SOURCE_DATE_EPOCH", release.epoch.to_string())
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&root)
            .arg(&deb),
    )
    .context("dpkg-deb --build")?;
    Ok(deb)
}

/// The daemon (stripped, as dh_strip does), the unit, the config and its conffile entry, the
/// dashboard, the copyright file and the maintainer scripts, under `root`.
fn stage_files(arch: DebArch, bin: &Path, root: &Path) -> anyhow::Result<()> {
    let src = workspace::root();
    mkdir(&root.join("DEBIAN"))?;
    let daemon = root.join(DAEMON_PATH);
    mkdir(parent(&daemon)?)?;
    cmd::output(
        Command::new(arch.strip())
            .args([
                "--strip-unneeded",
                "--remove-section=.comment",
                "--remove-section=.note",
                "-o",
            ])
            .arg(&daemon)
            .arg(bin),
    )
    .with_context(|| format!("strip the daemon (`{}`)", arch.strip()))?;
    for (from, to) in [
        ("config/xdp-routerd.service", UNIT_PATH),
        ("config/xdp-routerd.toml", CONFIG_PATH),
        ("config/grafana-dashboard.json", DASHBOARD_PATH),
        (
            "packaging/debian/copyright",
            &format!("{DOC_DIR}/copyright"),
        ),
        ("packaging/debian/postinst", "DEBIAN/postinst"),
        ("packaging/debian/prerm", "DEBIAN/prerm"),
        ("packaging/debian/postrm", "DEBIAN/postrm"),
    ] {
        install(&src.join(from), &root.join(to))?;
    }
    fs::write(root.join("DEBIAN/conffiles"), format!("/{CONFIG_PATH}\n"))
        .context("write DEBIAN/conffiles")
}

/// The man pages (written by the staged daemon itself) and the changelog, gzipped, under
/// `root`; the changelog also as `<work>/debian/changelog` for dpkg-gencontrol.
fn stage_docs(arch: DebArch, release: &Release, work: &Path, root: &Path) -> anyhow::Result<()> {
    let man = root.join(MAN_DIR);
    mkdir(&man)?;
    arch.run_daemon(
        &root.join(DAEMON_PATH),
        &["man-pages", &man.to_string_lossy()],
    )
    .context("the daemon could not write its man pages")?;
    for entry in fs::read_dir(&man).context("read the man directory")? {
        gzip(&entry?.path())?;
    }
    let changelog = changelog(&release.version, release.epoch)?;
    fs::write(work.join("debian/changelog"), &changelog).context("write debian/changelog")?;
    let doc = root.join(DOC_DIR).join("changelog.Debian");
    fs::write(&doc, &changelog).with_context(|| format!("write {}", doc.display()))?;
    gzip(&doc)
}

/// DEBIAN/md5sums, then DEBIAN/control by dpkg-gencontrol from packaging/debian/control, with
/// the library dependencies dpkg-shlibdeps finds and the Installed-Size of `root`.
fn write_control(arch: DebArch, work: &Path, root: &Path) -> anyhow::Result<()> {
    let debian = work.join("debian");
    fs::copy(
        workspace::root().join("packaging/debian/control"),
        debian.join("control"),
    )
    .context("copy packaging/debian/control")?;
    let mut shlibdeps = Command::new("dpkg-shlibdeps");
    shlibdeps
        .current_dir(work)
        .arg("-O")
        .arg(format!("debian/{PACKAGE}/{DAEMON_PATH}"));
    if arch == DebArch::Arm64 {
        // The cross libraries of gcc-aarch64-linux-gnu and their dpkg records.
        shlibdeps.arg("-l/usr/aarch64-linux-gnu/lib");
    }
    let substvars =
        cross_packages_to_native(&cmd::output(&mut shlibdeps).context("dpkg-shlibdeps")?);
    fs::write(debian.join("substvars"), substvars).context("write debian/substvars")?;
    md5sums(root)?;
    cmd::output(
        Command::new("dpkg-gencontrol")
            .current_dir(work)
            .env("DEB_HOST_ARCH", arch.name())
            .args([
                &format!("-p{PACKAGE}"),
                &format!("-Pdebian/{PACKAGE}"),
                "-Tdebian/substvars",
                "-fdebian/files",
            ]),
    )
    .context("dpkg-gencontrol")
    .map(drop)
}

/// `fs::create_dir_all` with the path in the error.
fn mkdir(dir: &Path) -> anyhow::Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))
}

fn parent(p: &Path) -> anyhow::Result<&Path> {
    p.parent()
        .with_context(|| format!("{} has no parent", p.display()))
}

/// Copies `from` to `to`, creating `to`'s directory.
fn install(from: &Path, to: &Path) -> anyhow::Result<()> {
    mkdir(parent(to)?)?;
    fs::copy(from, to)
        .map(drop)
        .with_context(|| format!("copy {} to {}", from.display(), to.display()))
}

/// `gzip -9n FILE` (no name or time in the header) → `FILE.gz`.
fn gzip(file: &Path) -> anyhow::Result<()> {
    cmd::output(Command::new("gzip").args(["-9n", "--force"]).arg(file))
        .map(drop)
        .with_context(|| format!("gzip {}", file.display()))
}

/// A one-entry Debian changelog for `version`, dated `epoch` (`date -R`).
fn changelog(version: &str, epoch: u64) -> anyhow::Result<String> {
    let date = cmd::output(Command::new("date").args(["-u", "-R", "-d", &format!("@{epoch}")]))?;
    Ok(changelog_text(version, date.trim()))
}

fn changelog_text(version: &str, date: &str) -> String {
    format!(
        "{PACKAGE} ({version}) unstable; urgency=medium\n\n  \
         * Built from the xdp-router repository by `cargo xtask dist`.\n\n \
         -- xdp-router developers <dev@xdp-router>  {date}\n"
    )
}

/// dpkg-shlibdeps' output for a cross build names the cross toolchain's packages
/// (`libc6:arm64`, `libgcc-s1-arm64-cross`), which carry the same symbols and versions as
/// the target's own: the target's package names, as `substvars` lines.
fn cross_packages_to_native(shlibdeps: &str) -> String {
    shlibdeps.replace(":arm64", "").replace("-arm64-cross", "")
}

/// DEBIAN/md5sums (what dh_md5sums writes): every file but the conffiles and DEBIAN/, sorted.
fn md5sums(root: &Path) -> anyhow::Result<()> {
    let mut files = Vec::new();
    walk(root, &mut |p, is_dir| {
        if !is_dir {
            files.push(p.strip_prefix(root).unwrap_or(p).to_path_buf());
        }
    })?;
    files.retain(|f| !f.starts_with("DEBIAN") && f != Path::new(CONFIG_PATH));
    files.sort();
    let sums = cmd::output(Command::new("md5sum").current_dir(root).args(&files))?;
    fs::write(root.join("DEBIAN/md5sums"), sums).context("write DEBIAN/md5sums")
}

/// Fixed modes (0755 for directories, maintainer scripts and the daemon; 0644 for the rest) and
/// `epoch` as every mtime, whatever the umask and the clock were.
fn normalise(root: &Path, epoch: u64) -> anyhow::Result<()> {
    let executable = [
        DAEMON_PATH,
        "DEBIAN/postinst",
        "DEBIAN/prerm",
        "DEBIAN/postrm",
    ]
    .map(|p| root.join(p));
    let mut paths = Vec::new();
    walk(root, &mut |p, is_dir| paths.push((p.to_path_buf(), is_dir)))?;
    for (p, is_dir) in &paths {
        let mode = if *is_dir || executable.contains(p) {
            0o755
        } else {
            0o644
        };
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", p.display()))?;
    }
    // Children before parents: setting a file's time does not touch its directory's, but
    // creating files did; the walk lists directories first, so go backwards.
    for (p, _) in paths.iter().rev() {
        set_mtime(p, epoch)?;
    }
    set_mtime(root, epoch)
}

/// Visits everything under `dir` (not `dir` itself), each directory before its contents.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path, bool)) -> anyhow::Result<()> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("read {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("read {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let is_dir = e.file_type().map(|t| t.is_dir()).unwrap_or(false);
        f(&p, is_dir);
        if is_dir {
            walk(&p, f)?;
        }
    }
    Ok(())
}

/// Sets `p`'s modification time to `epoch`.
fn set_mtime(p: &Path, epoch: u64) -> anyhow::Result<()> {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch);
    fs::File::open(p)
        .and_then(|f| f.set_modified(time))
        .with_context(|| format!("set the mtime of {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_off_a_tag_name_the_commit() {
        assert_eq!(
            version("0.1.0", "v0.1.0\n", "20261127", "53790dd"),
            "0.1.0-1"
        );
        assert_eq!(
            version("0.1.0", "v0.0.9\nlatest\n", "20261127", "53790dd"),
            "0.1.0~git20261127.53790dd-1"
        );
        assert_eq!(version("0.2.0-rc.1", "v0.2.0-rc.1", "", ""), "0.2.0~rc.1-1");
        assert_eq!(
            version("0.2.0", "", "20261127", "abc1234"),
            "0.2.0~git20261127.abc1234-1"
        );
    }

    #[test]
    fn cross_dependencies_name_the_target_packages() {
        assert_eq!(
            cross_packages_to_native(
                "shlibs:Depends=libc6:arm64 (>= 2.36), libgcc-s1-arm64-cross (>= 4.2)\n"
            ),
            "shlibs:Depends=libc6 (>= 2.36), libgcc-s1 (>= 4.2)\n"
        );
    }

    #[test]
    fn changelog_is_in_debian_format() {
        let c = changelog_text(
            "0.1.0~git20261127.53790dd-1",
            "Fri, 27 Nov 2026 01:00:00 +0000",
        );
        assert!(c.starts_with(
            "xdp-router (0.1.0~git20261127.53790dd-1) unstable; urgency=medium\n\n  * "
        ));
        assert!(c.ends_with(
            "\n -- xdp-router developers <dev@xdp-router>  Fri, 27 Nov 2026 01:00:00 +0000\n"
        ));
    }
}
