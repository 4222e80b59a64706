//! The Debian packages of `cargo xtask dist`. The amd64 one is installed into a clean Debian 12
//! root (mmdebstrap, cached by xtask) booted with systemd in a container (systemd-nspawn) that
//! shares the testbed's router namespace: `apt-get install ./xdp-router_…deb` (offline: the root
//! must already hold its dependencies), its files and conffile checked, not enabled nor started;
//! then, as an admin would, the config names the testbed's interfaces and
//! `systemctl enable --now xdp-routerd` starts the installed unit under systemd, sandbox,
//! dynamic user and capabilities included; `status` and `/metrics` are checked; `apt-get purge`
//! stops it and must leave the root as it was. The arm64 one is inspected: the same files, an
//! aarch64 daemon, arm64 dependencies (the arm64 guest step installs it, runs the core tests
//! against it and purges it: xtask/src/guest/arm64.rs).
//!
//! Run by the packages step of `cargo xtask test` (xtask/src/packages.rs), which builds the
//! packages and the root and names them in `XDP_ROUTER_DEB`, `XDP_ROUTER_DEB_ARM64` and
//! `XDP_ROUTER_CLEAN_ROOT`; `#[ignore]`d otherwise.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns,
    testbed::{LAN_IF, TempDir, Testbed, WAN_IF, on_path, ready},
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
    "var/tmp/",
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

/// A Debian root booted with systemd by systemd-nspawn in a network namespace; powered off
/// (SIGKILLed if it must) on drop.
struct Container {
    nspawn: Child,
    /// The container's PID 1 (systemd), as this machine numbers it.
    init: u32,
    log: PathBuf,
}

impl Container {
    /// Boots `root` in the namespace `netns` (its name under /run/netns) with the capabilities
    /// the unit asks for (nspawn's default set lacks CAP_BPF and CAP_PERFMON, and CAP_NET_ADMIN
    /// without a private network of its own), and waits until systemd is up.
    fn boot(root: &Path, netns: &str, log: &Path) -> Container {
        let out = fs::File::create(log).expect("create the container log");
        let err = out.try_clone().expect("dup the log");
        let nspawn = Command::new("systemd-nspawn")
            .arg("--directory")
            .arg(root)
            .args([
                "--register=no",
                "--keep-unit",
                "--boot",
                &format!("--network-namespace-path=/run/netns/{netns}"),
                "--capability=CAP_NET_ADMIN,CAP_BPF,CAP_PERFMON",
                "--system-call-filter=bpf perf_event_open",
            ])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start systemd-nspawn");
        let mut c = Container {
            init: 0,
            nspawn,
            log: log.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(
                c.nspawn.try_wait().expect("wait").is_none(),
                "systemd-nspawn exited; its log:\n{}",
                c.log()
            );
            if c.init == 0 {
                c.init = child_of(c.nspawn.id()).unwrap_or(0);
            }
            if c.init != 0 {
                let state = c.exec(&["systemctl", "is-system-running"]);
                let state = String::from_utf8_lossy(&state.stdout);
                if ["running", "degraded"].contains(&state.trim()) {
                    return c;
                }
            }
            assert!(
                Instant::now() < deadline,
                "the container's systemd did not come up within 60 s; its log:\n{}",
                c.log()
            );
            sleep(Duration::from_millis(200));
        }
    }

    /// Runs `argv` in the container (every namespace and the root of its PID 1), with a plain
    /// environment; its output.
    fn exec(&self, argv: &[&str]) -> Output {
        Command::new("nsenter")
            .args([
                "--target",
                &self.init.to_string(),
                "--all",
                "--root",
                "--wd",
            ])
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LC_ALL", "C")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("spawn nsenter {}: {e}", argv.join(" ")))
    }

    /// [`Container::exec`] that must succeed; its stdout.
    fn exec_ok(&self, argv: &[&str]) -> String {
        let out = self.exec(argv);
        assert!(
            out.status.success(),
            "in the container: {}: {}{}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `systemctl ARGS` in the container: its stdout, trimmed (whatever the status).
    fn systemctl(&self, args: &[&str]) -> String {
        let mut argv = vec!["systemctl"];
        argv.extend_from_slice(args);
        String::from_utf8_lossy(&self.exec(&argv).stdout)
            .trim()
            .to_owned()
    }

    /// The unit's journal, for failure messages.
    fn journal(&self) -> String {
        let out = self.exec(&["journalctl", "-u", "xdp-routerd", "--no-pager", "-n", "60"]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Powers the container off (SIGTERM to nspawn does that); true when it stopped within 30 s.
    fn power_off(&mut self) -> bool {
        // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
        unsafe { libc::kill(self.nspawn.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self.nspawn.try_wait().ok().flatten().is_some() {
                return true;
            }
            sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        if self.nspawn.try_wait().ok().flatten().is_none() && !self.power_off() {
            // Killing PID 1 of the container ends its PID namespace, then nspawn exits.
            if self.init != 0 {
                // SAFETY: kill(2) on the container's init, a process of this test's container.
                unsafe { libc::kill(self.init as i32, libc::SIGKILL) };
            }
            let _ = self.nspawn.kill();
            let _ = self.nspawn.wait();
        }
    }
}

/// The PID of a child of process `parent` (from /proc), if it has one.
fn child_of(parent: u32) -> Option<u32> {
    fs::read_dir("/proc").ok()?.find_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (comm) state ppid …`: comm may hold spaces, so split after its `)`.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
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

#[test]
#[ignore = "run by the packages step of `cargo xtask test` (the .deb and a clean root)"]
fn amd64_package_installs_runs_and_purges_in_a_clean_root() {
    const T: &str = "amd64_package_installs_runs_and_purges_in_a_clean_root";
    if !ready(T) {
        return;
    }
    if !on_path("systemd-nspawn") {
        netns::skip(
            T,
            "`systemd-nspawn` not found (cargo xtask setup: systemd-container)",
        );
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
    // /var/tmp: the container mounts a tmpfs on /tmp.
    fs::copy(&deb, root.join("var/tmp/xdp-router.deb")).expect("copy the package into the root");

    let tb = Testbed::new("pkg");
    let container = Container::boot(&root, tb.router.name(), &dir.path().join("nspawn.log"));
    let before = tree(&root);

    // Install as a user would: apt resolves the dependencies (the root has no package lists,
    // so nothing can be downloaded: the clean root must already satisfy them).
    let t = Instant::now();
    container.exec_ok(&["apt-get", "install", "-y", "/var/tmp/xdp-router.deb"]);
    println!("installed in {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        container.exec_ok(&["dpkg-query", "-W", "-f", "${Status}", "xdp-router"]),
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
    let conffiles = container.exec_ok(&["dpkg-query", "-W", "-f", "${Conffiles}", "xdp-router"]);
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
    assert_eq!(
        container.systemctl(&["is-enabled", "xdp-routerd"]),
        "disabled"
    );
    assert_eq!(
        container.systemctl(&["is-active", "xdp-routerd"]),
        "inactive"
    );
    let unit = fs::read_to_string(root.join("lib/systemd/system/xdp-routerd.service"))
        .expect("read the installed unit");
    assert_eq!(
        service_values(&unit, "ExecStart"),
        ["/usr/sbin/xdp-routerd run --config /etc/xdp-router/xdp-routerd.toml"],
        "the unit runs the packaged daemon on the packaged config"
    );

    // What the admin does: name the interfaces (here the testbed's), enable and start.
    fs::write(
        root.join("etc/xdp-router/xdp-routerd.toml"),
        format!(
            "metrics_listen = \"{METRICS}\"\n\
             [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
        ),
    )
    .expect("write the config");
    container.exec_ok(&["systemctl", "enable", "--now", "xdp-routerd"]);
    let wants = root.join("etc/systemd/system/multi-user.target.wants/xdp-routerd.service");
    assert!(
        fs::symlink_metadata(&wants).is_ok(),
        "enabled: {}",
        wants.display()
    );

    // `status` through the packaged CLI, on the default control socket.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status: Status = loop {
        let active = container.systemctl(&["is-active", "xdp-routerd"]);
        assert!(
            ["active", "activating"].contains(&active.as_str()),
            "xdp-routerd.service is {active}; its journal:\n{}",
            container.journal()
        );
        let out = container.exec(&["xdp-routerd", "status", "--json"]);
        if out.status.success() {
            break serde_json::from_slice(&out.stdout).expect("status --json parses");
        }
        assert!(
            Instant::now() < deadline,
            "the unit did not answer `status` within 60 s; its journal:\n{}",
            container.journal()
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
    println!("{}", container.exec_ok(&["xdp-routerd", "status"]));
    // The unit's DynamicUser: the daemon is not root.
    let pid = container.systemctl(&["show", "xdp-routerd", "-p", "MainPID", "--value"]);
    let proc_status = container.exec_ok(&["cat", &format!("/proc/{pid}/status")]);
    let uid = proc_status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap_or_default();
    assert!(
        !uid.is_empty() && uid != "0",
        "the daemon runs as a dynamic user, uid {uid:?}"
    );
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

    // Purge: its prerm stops the running unit; nothing of the package is left, the edited
    // conffile, the enable symlink and deb-systemd-helper's records included.
    container.exec_ok(&["apt-get", "purge", "-y", "xdp-router"]);
    let state = container.systemctl(&["is-active", "xdp-routerd"]);
    assert_eq!(state, "inactive", "purge stopped the unit");
    let status = container.exec(&["dpkg-query", "-W", "-f", "${Status}", "xdp-router"]);
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
