//! The Debian packages of `cargo xtask dist`. The amd64 one is installed into a clean Debian 12
//! root (mmdebstrap, cached by xtask) with `apt-get install ./xdp-router_…deb` (offline: its
//! dependencies must already be there), its files and conffile checked, the unit's own
//! ExecStartPre/ExecStart run in the testbed's router namespace from that root (chroot; nothing
//! here runs systemd as PID 1) with a config naming the testbed's interfaces, `status` and
//! `/metrics` checked, then it is purged and the root must be as before. The arm64 one is
//! inspected: the same files, an aarch64 daemon, arm64 dependencies (installing it in an arm64
//! guest is a later step).
//!
//! Run by the packages step of `cargo xtask test` (xtask/src/packages.rs), which builds the
//! packages and the root and names them in `XDP_ROUTER_DEB`, `XDP_ROUTER_DEB_ARM64` and
//! `XDP_ROUTER_CLEAN_ROOT`; `#[ignore]`d otherwise.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns,
    testbed::{LAN_IF, TempDir, Testbed, WAN_IF, ready},
};
use xdp_routerd::status::Status;

/// Where the packaged daemon listens for scrapes (the config written below).
const METRICS: &str = "127.0.0.1:9824";
/// Paths a package's install and purge may leave changed: dpkg's and apt's own records, logs
/// and caches, and the package file the test copies in.
const BOOKKEEPING: &[&str] = &[
    "var/lib/dpkg/",
    "var/lib/apt/",
    "var/log/",
    "var/cache/",
    "tmp/",
];

/// `$var` as a path, or a loud skip.
fn env_path(test: &str, var: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(p) => Some(PathBuf::from(p)),
        None => {
            netns::skip(
                test,
                &format!("{var} is not set: run by the packages step of `cargo xtask test`"),
            );
            None
        }
    }
}

/// Runs `prog args…` (on the host); its output, whatever the status.
fn run(prog: &str, args: &[&str]) -> Output {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"))
}

/// Runs `prog args…` chrooted into `root`, with a plain environment; its output.
fn in_root(root: &Path, prog: &str, args: &[&str]) -> Output {
    Command::new("chroot")
        .arg(root)
        .arg(prog)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("LC_ALL", "C")
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("spawn chroot {prog}: {e}"))
}

/// [`in_root`] that must succeed; its stdout.
fn in_root_ok(root: &Path, prog: &str, args: &[&str]) -> String {
    let out = in_root(root, prog, args);
    assert!(
        out.status.success(),
        "in the clean root: {prog} {}: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every path under `root` (relative, directories with a trailing `/`), symlinks not followed,
/// leaving out [`BOOKKEEPING`].
fn tree(root: &Path) -> BTreeSet<String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeSet<String>) {
        let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
        for e in entries {
            let path = e.expect("dir entry").path();
            let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir());
            let mut rel = path
                .strip_prefix(root)
                .expect("under root")
                .to_string_lossy()
                .into_owned();
            if is_dir {
                rel.push('/');
            }
            if BOOKKEEPING.iter().any(|b| rel.starts_with(b)) {
                continue;
            }
            out.insert(rel);
            if is_dir {
                walk(root, &path, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(root, root, &mut out);
    out
}

/// The values of `key=` in the `[Service]` section of the unit file `text`.
fn service_values(text: &str, key: &str) -> Vec<String> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            out.push(v.trim().to_owned());
        }
    }
    out
}

/// The daemon started from the clean root; SIGKILLed on drop if still running.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
#[ignore = "run by the packages step of `cargo xtask test` (the .deb and a clean root)"]
fn amd64_package_installs_runs_and_purges_in_a_clean_root() {
    const T: &str = "amd64_package_installs_runs_and_purges_in_a_clean_root";
    if !ready(T) {
        return;
    }
    let (Some(deb), Some(tarball)) = (
        env_path(T, "XDP_ROUTER_DEB"),
        env_path(T, "XDP_ROUTER_CLEAN_ROOT"),
    ) else {
        return;
    };
    let dir = TempDir::new();
    let root = dir.path().join("root");
    fs::create_dir(&root).expect("mkdir root");
    let out = run(
        "tar",
        &[
            "-xpf",
            &tarball.to_string_lossy(),
            "-C",
            &root.to_string_lossy(),
        ],
    );
    assert!(
        out.status.success(),
        "unpack {}: {out:?}",
        tarball.display()
    );
    let before = tree(&root);

    // Install as a user would: apt resolves the dependencies (the root has no package lists,
    // so nothing can be downloaded: the clean root must already satisfy them).
    fs::copy(&deb, root.join("tmp/xdp-router.deb")).expect("copy the package into the root");
    let t = Instant::now();
    in_root_ok(&root, "apt-get", &["install", "-y", "/tmp/xdp-router.deb"]);
    println!("installed in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        in_root_ok(
            &root,
            "dpkg-query",
            &["-W", "-f", "${Status}", "xdp-router"]
        ),
        "install ok installed"
    );
    for file in [
        "usr/sbin/xdp-routerd",
        "lib/systemd/system/xdp-routerd.service",
        "etc/xdp-router/xdp-routerd.toml",
        "usr/share/xdp-router/grafana-dashboard.json",
        "usr/share/man/man8/xdp-routerd.8.gz",
        "usr/share/man/man8/xdp-routerd-run.8.gz",
        "usr/share/doc/xdp-router/copyright",
        "usr/share/doc/xdp-router/changelog.Debian.gz",
    ] {
        assert!(root.join(file).is_file(), "the package installs /{file}");
    }
    let conffiles = in_root_ok(
        &root,
        "dpkg-query",
        &["-W", "-f", "${Conffiles}", "xdp-router"],
    );
    assert!(
        conffiles.contains("/etc/xdp-router/xdp-routerd.toml "),
        "the config is a conffile: {conffiles:?}"
    );
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/xdp-routerd.toml");
    assert_eq!(
        fs::read_to_string(root.join("etc/xdp-router/xdp-routerd.toml")).expect("read config"),
        fs::read_to_string(example).expect("read the example config"),
        "the installed config is the commented example"
    );
    // Installed neither enabled nor started: the config must name the interfaces first.
    let wants = root.join("etc/systemd/system/multi-user.target.wants/xdp-routerd.service");
    assert!(
        fs::symlink_metadata(&wants).is_err(),
        "the package must not enable the unit"
    );
    assert_eq!(
        String::from_utf8_lossy(
            &in_root(&root, "systemctl", &["is-enabled", "xdp-routerd"]).stdout
        )
        .trim(),
        "disabled"
    );

    // The unit as installed: its ExecStartPre passes on the shipped config, as written.
    let unit = fs::read_to_string(root.join("lib/systemd/system/xdp-routerd.service"))
        .expect("read the installed unit");
    let argv = |key: &str| -> Vec<String> {
        let values = service_values(&unit, key);
        assert_eq!(values.len(), 1, "the unit sets {key} once: {values:?}");
        values[0].split_whitespace().map(str::to_owned).collect()
    };
    let (pre, start) = (argv("ExecStartPre"), argv("ExecStart"));
    assert_eq!(
        start[0], "/usr/sbin/xdp-routerd",
        "ExecStart runs the packaged daemon"
    );
    let pre_args: Vec<&str> = pre[1..].iter().map(String::as_str).collect();
    in_root_ok(&root, &pre[0], &pre_args);

    // What the admin does: name the interfaces (here the testbed's), enable the unit.
    fs::write(
        root.join("etc/xdp-router/xdp-routerd.toml"),
        format!(
            "metrics_listen = \"{METRICS}\"\n\
             [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
        ),
    )
    .expect("write the config");
    in_root_ok(&root, &pre[0], &pre_args);
    in_root_ok(&root, "systemctl", &["enable", "xdp-routerd"]);
    assert!(
        fs::symlink_metadata(&wants).is_ok(),
        "systemctl enable made {}",
        wants.display()
    );

    // Start: the unit's ExecStart in the router namespace, chrooted into the clean root, with
    // what systemd would provide (RuntimeDirectory=xdp-router; /proc and /sys, mounted in the
    // private mount namespace of `ip netns exec`, so they go when the daemon does).
    let tb = Testbed::new("pkg");
    let rundir = root.join("run/xdp-router");
    fs::create_dir_all(&rundir).expect("mkdir run/xdp-router");
    fs::set_permissions(&rundir, fs::Permissions::from_mode(0o700)).expect("chmod");
    let log = dir.path().join("xdp-routerd.log");
    let out = fs::File::create(&log).expect("create the log");
    let err = out.try_clone().expect("dup the log");
    let child = tb
        .router
        .command("sh")
        .args([
            "-c",
            r#"root=$1; shift
               mount -t proc proc "$root/proc" && mount -t sysfs sysfs "$root/sys" &&
               exec chroot "$root" "$@""#,
            "sh",
        ])
        .arg(&root)
        .args(&start)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .expect("start the daemon");
    let mut daemon = Daemon { child, log };

    // `status` through the packaged CLI, on the default control socket.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status: Status = loop {
        assert!(
            daemon.child.try_wait().expect("wait").is_none(),
            "the packaged daemon exited at start; log:\n{}",
            daemon.log()
        );
        let out = in_root(&root, "/usr/sbin/xdp-routerd", &["status", "--json"]);
        if out.status.success() {
            break serde_json::from_slice(&out.stdout).expect("status --json parses");
        }
        assert!(
            Instant::now() < deadline,
            "the packaged daemon did not answer `status` within 60 s; log:\n{}",
            daemon.log()
        );
        sleep(Duration::from_millis(200));
    };
    assert!(status.fastpath, "fast path on");
    let mut managed: Vec<(String, String)> = status
        .interfaces
        .iter()
        .map(|i| (i.name.clone(), i.role.clone()))
        .collect();
    managed.sort();
    let mut configured = vec![
        (LAN_IF.to_owned(), "lan".to_owned()),
        (WAN_IF.into(), "wan".into()),
    ];
    configured.sort();
    assert_eq!(
        managed, configured,
        "status names the configured interfaces"
    );
    assert!(
        status
            .interfaces
            .iter()
            .all(|i| i.attach_mode != "detached"),
        "both interfaces attached: {:?}",
        status.interfaces
    );
    let table = in_root_ok(&root, "/usr/sbin/xdp-routerd", &["status"]);
    println!("{table}");
    let scrape = tb.router.exec_ok(
        "curl",
        &[
            "-sf",
            "--max-time",
            "5",
            &format!("http://{METRICS}/metrics"),
        ],
    );
    assert!(
        scrape.contains("xdp_router_build_info") && scrape.contains(&format!("\"{WAN_IF}\"")),
        "/metrics answers with the daemon's metrics:\n{scrape}"
    );

    // Stop as systemd does (SIGTERM; TimeoutStopSec=10s), then what systemd removes.
    // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(st) = daemon.child.try_wait().expect("wait") {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "no exit within 10 s of SIGTERM; log:\n{}",
            daemon.log()
        );
        sleep(Duration::from_millis(50));
    };
    assert!(
        exit.success(),
        "exit on SIGTERM: {exit}; log:\n{}",
        daemon.log()
    );
    fs::remove_dir_all(&rundir).expect("remove run/xdp-router");

    // Purge: nothing of the package is left, the edited conffile and the enable symlink
    // included.
    in_root_ok(&root, "apt-get", &["purge", "-y", "xdp-router"]);
    let status = in_root(
        &root,
        "dpkg-query",
        &["-W", "-f", "${Status}", "xdp-router"],
    );
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.is_empty() || status.ends_with("not-installed"),
        "purged: {status:?}"
    );
    let after = tree(&root);
    let added: Vec<_> = after.difference(&before).collect();
    let removed: Vec<_> = before.difference(&after).collect();
    assert!(
        added.is_empty() && removed.is_empty(),
        "the purge leaves the root as it was: left behind {added:?}, missing {removed:?}"
    );
}

#[test]
#[ignore = "run by the packages step of `cargo xtask test` (the arm64 .deb)"]
fn arm64_package_holds_an_aarch64_daemon() {
    const T: &str = "arm64_package_holds_an_aarch64_daemon";
    let (Some(arm64), Some(amd64)) = (
        env_path(T, "XDP_ROUTER_DEB_ARM64"),
        env_path(T, "XDP_ROUTER_DEB"),
    ) else {
        return;
    };
    let field = |deb: &Path, name: &str| -> String {
        let out = run("dpkg-deb", &["--field", &deb.to_string_lossy(), name]);
        assert!(out.status.success(), "dpkg-deb --field {name}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    assert_eq!(field(&arm64, "Architecture"), "arm64");
    let depends = field(&arm64, "Depends");
    assert!(
        depends.contains("libc6 (>= ") && !depends.contains("cross") && !depends.contains(':'),
        "arm64 dependencies name arm64 packages: {depends}"
    );
    // The same files as the amd64 package (sizes aside).
    let contents = |deb: &Path| -> Vec<String> {
        let out = run("dpkg-deb", &["--contents", &deb.to_string_lossy()]);
        assert!(out.status.success(), "dpkg-deb --contents: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().last().map(str::to_owned))
            .collect()
    };
    assert_eq!(contents(&arm64), contents(&amd64));
    let dir = TempDir::new();
    let out = run(
        "dpkg-deb",
        &[
            "-x",
            &arm64.to_string_lossy(),
            &dir.path().to_string_lossy(),
        ],
    );
    assert!(out.status.success(), "dpkg-deb -x: {out:?}");
    let out = run(
        "file",
        &[
            "-b",
            &dir.path().join("usr/sbin/xdp-routerd").to_string_lossy(),
        ],
    );
    let kind = String::from_utf8_lossy(&out.stdout);
    println!("arm64 package's daemon: {kind}");
    assert!(
        kind.contains("ELF 64-bit") && kind.contains("ARM aarch64"),
        "an aarch64 ELF: {kind}"
    );
}
