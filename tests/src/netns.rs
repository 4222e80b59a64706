//! Network namespaces for privileged tests: the shared [`xdp_router_testbed::netns::Netns`]
//! under a unique name, with calls that panic with the failure (a test fails with the message)
//! instead of returning it; and the root check and loud skip of every privileged test.

use std::{
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use xdp_router_testbed::netns as shared;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A network namespace that lives as long as this value (deleted on drop, even on panic, with
/// whatever the test still runs inside).
pub struct Netns(shared::Netns);

impl Netns {
    /// Creates `xr-<tag>-<pid>-<seq>` (at most 15 chars of tag are kept short by callers).
    pub fn new(tag: &str) -> Netns {
        let name = format!(
            "xr-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        Netns(shared::Netns::create(&name).unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// The namespace's name (for `ip netns exec`).
    pub fn name(&self) -> &str {
        self.0.name()
    }

    /// Runs a command inside the namespace and returns its output (does not check the status).
    pub fn exec(&self, prog: &str, args: &[&str]) -> Output {
        self.0
            .command(prog)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("spawn ip netns exec {prog}: {e}"))
    }

    /// Runs a command inside the namespace; panics with its stderr when it fails.
    pub fn exec_ok(&self, prog: &str, args: &[&str]) -> String {
        let out = self.exec(prog, args);
        assert!(
            out.status.success(),
            "in netns {}: {prog} {}: {}",
            self.name(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a shell snippet inside the namespace; panics when it fails.
    pub fn sh(&self, script: &str) -> String {
        self.exec_ok("sh", &["-c", script])
    }

    /// A `Command` that will run `prog` inside the namespace (for spawning long-lived processes).
    pub fn command(&self, prog: &str) -> Command {
        self.0.command(prog)
    }

    /// Runs `f` on a new thread that has entered this namespace (sockets it creates live there),
    /// and returns its result.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.0.enter(|| Ok(f())).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Creates a veth pair `a` (in self) ⇄ `b` (in `peer`), both up.
    pub fn veth(&self, a: &str, peer: &Netns, b: &str) {
        self.exec_ok(
            "ip",
            &[
                "link",
                "add",
                a,
                "type",
                "veth",
                "peer",
                "name",
                b,
                "netns",
                peer.name(),
            ],
        );
        self.exec_ok("ip", &["link", "set", a, "up"]);
        peer.exec_ok("ip", &["link", "set", b, "up"]);
    }
}

/// True when running as root. Privileged tests call [`require_root`] first.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Returns false (after printing a loud SKIP line) when the test cannot run here; panics instead
/// when `CI` is set, since in CI a skip is a failure.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    skip(test, "needs root (network namespaces, BPF, iptables)")
}

/// Says loudly that `test` checks a degraded path because this kernel lacks a feature (`why`:
/// what it lacks and what runs instead): a `DEGRADED` line, printed and appended to the file
/// named by `XDP_ROUTER_SKIP_LOG`, which `cargo xtask test` lists in its summary as a note (not
/// a skip: the degraded path is what the test checks, and it fails if that is wrong).
pub fn degraded(test: &str, why: &str) {
    let msg = format!("DEGRADED {test}: {why}");
    eprintln!("\n*** {msg} ***\n");
    append_to_skip_log(&msg);
}

/// Appends `line` to the file named by `XDP_ROUTER_SKIP_LOG`, if set.
fn append_to_skip_log(line: &str) {
    if let Some(path) = std::env::var_os("XDP_ROUTER_SKIP_LOG") {
        use std::io::Write as _;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{line}");
        }
    }
}

/// Skips `test` loudly and returns false: prints a SKIP line and appends it to the file named by
/// `XDP_ROUTER_SKIP_LOG` (so `cargo xtask test` can list skips in its summary). Panics instead
/// when `CI` is set, since in CI a skip is a failure.
pub fn skip(test: &str, why: &str) -> bool {
    let msg = format!("SKIP {test}: {why}");
    if std::env::var_os("CI").is_some() {
        panic!("{msg}; CI is set, so a skip is a failure");
    }
    eprintln!("\n*** {msg} ***\n");
    append_to_skip_log(&msg);
    false
}
