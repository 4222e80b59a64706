//! The arm64 guest: Debian's arm64 kernel booted under `qemu-system-aarch64` (an emulated
//! Cortex-A57, weakly ordered like the routers' cores) with an arm64 Debian root of its own. In
//! it the arm64 package of `cargo xtask dist` is installed with dpkg, `xdp-routerd
//! check-system` runs, and the cross-built tests run against the installed daemon: the whole
//! BPF_PROG_RUN fixture table (the eBPF object the arm64 daemon embeds, built with
//! `bpf_target_arch = "aarch64"`: the BPF atomics of `order.rs`) and the core end-to-end tests
//! ([`E2E`]); then the package is purged and must leave nothing behind.
//!
//! The root is a `mmdebstrap --arch=arm64` of bookworm with the kernel, the testbed's tools and
//! a static busybox (virtme-ng's initramfs), made once through qemu-user (binfmt_misc) and
//! cached under the user's cache directory (`cargo xtask test` makes it beside the privileged
//! tests, [`root_beside`]). The guest sees it read-only, with overlays where
//! dpkg writes.

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use super::{Prepared, Priority, Run, Script, Shared};
use crate::{cmd, cross, dist, setup};

/// The suite of the root.
const SUITE: &str = "bookworm";
/// Debian's arm64 kernel package (6.12, as the amd64 guest's).
const KERNEL_PACKAGE: &str = "linux-image-6.12-arm64";
/// What the root holds besides minbase: the kernel, virtme-ng's busybox, the testbed's tools
/// (tests/src/testbed/topology.rs `TOOLS`) and what the package depends on.
const ROOT_PACKAGES: &[&str] = &[
    KERNEL_PACKAGE,
    "busybox-static",
    "kmod",
    "iproute2",
    "iptables",
    "nftables",
    "conntrack",
    "iputils-ping",
    "procps",
    "ethtool",
    "bpftool",
    "init-system-helpers",
];
/// The file in the root that names the packages it was made with.
const STAMP: &str = ".xdp-router-root-packages";
/// Where the guest sees the shared directory (a mount point made in the root).
const GUEST_DIR: &str = "/xr";

/// The fixture table: every case.
const FIXTURES: &str = "prog_run";
/// The core end-to-end tests, by test target: v4 NAT both ways and v4 and v6 offloaded and
/// intact (TTL and checksums checked at the receiver), the negative control, a FORWARD DROP
/// stopping an offloaded stream, SIGKILL failing open, and `/metrics` scraped (the per-host
/// counters against the wire, over a 100 MB fast-pathed TCP transfer). Not the unpaced bulk
/// tests (`tcp_v4_bulk_…`, `tcp_v6_bulk_…`): they count from the transfer's first packet, and
/// the emulated daemon's offload (1–3 s) made their "≥ 90 % fast-pathed" a timing check here
/// (38.6 % in one of three runs).
const E2E: &[(&str, &[&str])] = &[
    (
        "e2e",
        &[
            "udp_v4_both_directions_with_reverse_nat",
            "ttl_and_checksums_at_the_receiver",
            "negative_control_fastpath_off",
            "sigkill_fails_open",
        ],
    ),
    ("firewall", &["iptables_drop_stops_an_offloaded_stream"]),
    (
        "accounting",
        &["hundred_megabytes_fast_pathed_are_counted_per_flow_and_per_host"],
    ),
];

/// Builds the arm64 package and tests, makes the root when missing and writes the guest's
/// script.
pub fn prepare() -> anyhow::Result<Prepared> {
    for (tool, package) in [
        ("qemu-system-aarch64", "qemu-system-arm"),
        ("mmdebstrap", "mmdebstrap"),
    ] {
        if cmd::which(tool).is_none() {
            bail!("`{tool}` not found: run `cargo xtask setup` ({package})");
        }
    }
    let (_, built) = dist::run(dist::DistArch::Arm64)?;
    let deb = &built.first().context("dist built no arm64 package")?.deb;
    let mut targets = vec![FIXTURES];
    targets.extend(E2E.iter().map(|(t, _)| *t));
    let binaries = super::build_test_binaries(
        &targets,
        &["--release", "--target", cross::TARGET],
        &[(cross::LINKER_ENV, cross::LINKER)],
    )?;
    let root = root(Priority::Normal, None)?;
    let kernel = kernel(&root)?;

    let shared = Shared::new("arm64")?;
    let guest = Path::new(GUEST_DIR);
    let copy = |from: &Path| -> anyhow::Result<PathBuf> {
        let name = from.file_name().context("a file name")?;
        fs::copy(from, shared.dir.join(name))
            .with_context(|| format!("copy {} to {}", from.display(), shared.dir.display()))?;
        Ok(guest.join(name))
    };
    let guest_deb = copy(deb)?;
    let mut runs = Vec::new();
    for (target, binary) in targets.iter().zip(&binaries) {
        let mut args = vec!["--test-threads=1".to_owned(), "--show-output".to_owned()];
        if let Some((_, names)) = E2E.iter().find(|(t, _)| t == target) {
            args.push("--exact".into());
            args.extend(names.iter().map(|n| (*n).to_owned()));
        }
        runs.push(Run {
            binary: copy(binary)?,
            args,
        });
    }
    let script = Script {
        prelude: Vec::new(),
        modules: super::CORE_MODULES.to_vec(),
        path: "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        env: vec![
            ("XDP_ROUTERD_BIN", format!("/{}", dist::DAEMON_PATH)),
            (
                "XDP_ROUTER_SKIP_LOG",
                guest.join("skips").to_string_lossy().into_owned(),
            ),
            // An emulated CPU: "promptly" may take five times longer (testbed `time_scale`).
            ("XDP_ROUTER_TIME_SCALE", "5".into()),
        ],
        cwd: guest.to_owned(),
        setup: super::install_package(&guest_deb),
        runs,
        teardown: super::purge_package(),
    };
    println!(
        "arm64 guest: will boot {} under qemu-system-aarch64 to install {} and run the \
         fixtures and {} end-to-end tests",
        kernel.display(),
        guest_deb.display(),
        E2E.iter().map(|(_, n)| n.len()).sum::<usize>()
    );
    let mut args: Vec<OsString> = vec![
        "--arch".into(),
        "arm64".into(),
        "--root".into(),
        root.clone().into_os_string(),
        "-r".into(),
        kernel.into_os_string(),
        "--busybox".into(),
        root.join("bin/busybox").into_os_string(),
        "--disable-kvm".into(),
        "--cpus".into(),
        "2".into(),
        "--memory".into(),
        "3G".into(),
    ];
    for dir in super::PACKAGE_OVERLAYS {
        args.extend(["--overlay-rwdir".into(), dir.into()]);
    }
    Ok(Prepared {
        shared,
        script,
        args,
        guest_dir: PathBuf::from(GUEST_DIR),
    })
}

/// The kernel image in the root's /boot.
fn kernel(root: &Path) -> anyhow::Result<PathBuf> {
    let boot = root.join("boot");
    let mut found: Vec<PathBuf> = fs::read_dir(&boot)
        .with_context(|| format!("read {}", boot.display()))?
        .filter_map(|e| {
            let p = e.ok()?.path();
            p.file_name()?
                .to_str()?
                .starts_with("vmlinuz-")
                .then_some(p)
        })
        .collect();
    found.sort();
    found.pop().with_context(|| {
        format!(
            "no vmlinuz in {}: remove the root to remake it",
            boot.display()
        )
    })
}

/// Makes the cached arm64 root when it is missing, on a thread of its own, mmdebstrap in the
/// idle scheduling class (it takes only CPU time the tests beside it leave; most of its time is
/// downloading) with its output in `log`: [`RootBeside::wait`] prints it. [`prepare`] then
/// finds the root made, or makes it itself if this failed.
pub fn root_beside(log: PathBuf) -> RootBeside {
    let handle = std::thread::spawn(move || {
        let file = fs::File::create(&log).with_context(|| format!("create {}", log.display()))?;
        root(Priority::Idle, Some(file)).map(|_| ())
    });
    RootBeside { handle }
}

/// The arm64 root being made beside other steps.
pub struct RootBeside {
    handle: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl RootBeside {
    /// Waits for it; what went wrong (the arm64 step then makes the root itself).
    pub fn wait(self) -> anyhow::Result<()> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the root's thread panicked")))
    }
}

/// The cached arm64 root (a directory), made with mmdebstrap when missing (at `priority`, its
/// messages and mmdebstrap's output going to `log` when given, else to this process's).
fn root(priority: Priority, log: Option<fs::File>) -> anyhow::Result<PathBuf> {
    let say = |line: String| match &log {
        Some(f) => {
            use std::io::Write as _;
            let mut f: &fs::File = f;
            let _ = writeln!(f, "{line}");
        }
        None => println!("{line}"),
    };
    let dir = setup::cache_dir()?.join("guest-arm64");
    let root = dir.join(format!("{SUITE}-arm64-root"));
    // The package list the root was made with: another list makes it again.
    let stamp = root.join(STAMP);
    let packages = ROOT_PACKAGES.join(",");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == packages) {
        say(format!("arm64 root: {} (cached)", root.display()));
        return Ok(root);
    }
    if root.exists() {
        say(format!(
            "arm64 root: {} holds other packages: made again",
            root.display()
        ));
        fs::remove_dir_all(&root).with_context(|| format!("remove {}", root.display()))?;
    }
    binfmt()?;
    let partial = dir.join(format!("{SUITE}-arm64-root.partial"));
    if partial.exists() {
        fs::remove_dir_all(&partial).with_context(|| format!("remove {}", partial.display()))?;
    }
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let t = Instant::now();
    say(format!(
        "arm64 root: making {} with mmdebstrap through qemu-user (once, ≈ 4–5 min)",
        root.display()
    ));
    let mut c = Command::new(if priority == Priority::Idle {
        "chrt"
    } else {
        "mmdebstrap"
    });
    if priority == Priority::Idle {
        c.args(["--idle", "0", "mmdebstrap"]);
    }
    if let Some(f) = &log {
        c.stdout(f.try_clone().context("the root's log")?)
            .stderr(f.try_clone().context("the root's log")?);
    }
    cmd::run(
        c.args(["--arch=arm64", "--variant=minbase", "--format=directory"])
            .arg(format!("--include={packages}"))
            // No initramfs: virtme-ng makes its own, and mkinitramfs through qemu-user takes
            // longer than the rest of the root (over 15 minutes here).
            .arg("--dpkgopt=path-exclude=/etc/kernel/postinst.d/initramfs-tools")
            .arg(SUITE)
            .arg(&partial),
    )
    .context("mmdebstrap could not make the arm64 root (is a Debian mirror reachable?)")?;
    let mount_point = partial.join(GUEST_DIR.trim_start_matches('/'));
    fs::create_dir_all(&mount_point)
        .with_context(|| format!("create {}", mount_point.display()))?;
    fs::write(partial.join(STAMP), &packages).context("write the root's package stamp")?;
    fs::rename(&partial, &root).with_context(|| format!("rename {}", partial.display()))?;
    say(format!(
        "arm64 root: made in {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    Ok(root)
}

/// Makes sure arm64 binaries run here through qemu-user (mmdebstrap runs the root's
/// maintainer scripts): binfmt_misc mounted and qemu-user-static's entry enabled.
fn binfmt() -> anyhow::Result<()> {
    let entry = Path::new("/proc/sys/fs/binfmt_misc/qemu-aarch64");
    if fs::read_to_string(entry).is_ok_and(|s| s.starts_with("enabled")) {
        return Ok(());
    }
    if !Path::new("/proc/sys/fs/binfmt_misc/register").exists() {
        cmd::run(Command::new("mount").args([
            "-t",
            "binfmt_misc",
            "binfmt_misc",
            "/proc/sys/fs/binfmt_misc",
        ]))
        .context("cannot mount binfmt_misc (needed to run arm64 programs through qemu-user)")?;
    }
    cmd::run(Command::new("update-binfmts").args(["--enable", "qemu-aarch64"]))
        .context("cannot enable qemu-aarch64 in binfmt_misc (`cargo xtask setup` installs qemu-user-static and binfmt-support)")?;
    if !fs::read_to_string(entry).is_ok_and(|s| s.starts_with("enabled")) {
        bail!("{} is not enabled after update-binfmts", entry.display());
    }
    Ok(())
}
