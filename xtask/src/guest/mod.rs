//! The guest steps of `cargo xtask test`: privileged tests in a qemu guest that boots a Debian
//! kernel with virtme-ng. Emulated (no KVM here): a guest's timings mean nothing, its results do.
//! - [`amd64`]: Debian's amd64 kernel with the modules this machine's kernel lacks (802.1Q
//!   VLAN, PPPoE, ESP, bridge VLAN filtering), sharing this root filesystem.
//! - [`arm64`]: Debian's arm64 kernel on an emulated Cortex-A57, with an arm64 root of its own:
//!   the fixtures and the core end-to-end tests against the arm64 package.
//! - [`deb12`]: Debian 12's own amd64 kernel (6.1: no TCX links, the oldest verifier), booted
//!   as the amd64 guest is: `check-system` and the core end-to-end tests.
//! - [`jammy`]: Ubuntu 22.04's own amd64 kernel (5.15: no multi-buffer XDP either), booted as
//!   the Debian 12 guest is, with its tests; opt-in (`--jammy`).
//!
//! Both write a shell script into a directory the guest shares writable, boot once, and read
//! back the script's overall status and the skips the tests logged. An amd64 guest that ended
//! before its script did (a kernel panic, the emulator's exit: [`Unfinished`], with its last
//! console lines) is booted once more by `cargo xtask test`, which says so in its summary.
//! The amd64 guest, then the Debian 12 guest, can boot in the background ([`boot_beside`])
//! while the host's privileged tests run: those leave the CPUs idle nine tenths of the time, and
//! the emulator, at the idle scheduling class, takes only what they leave.

pub mod amd64;
pub mod arm64;
pub mod deb12;
pub mod jammy;
mod timings;

use std::{
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    sync::mpsc,
    thread,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::cmd;

/// Longest a guest may run before it is stopped (its tests then count as not finished).
const TIMEOUT_SECS: &str = "1800";

/// One test binary the guest runs, with its arguments.
pub struct Run {
    pub binary: PathBuf,
    pub args: Vec<String>,
}

/// The modules the core end-to-end tests and the fixtures use, loaded up front in every guest
/// that runs them (the arm64 and Debian 12 guests; the amd64 guest has its own list).
pub const CORE_MODULES: &[&str] = &[
    "veth",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_tables",
    "nft_compat",
    "nft_ct",
    "nft_masq",
    "nft_chain_nat",
    "xt_conntrack",
    "xt_MASQUERADE",
    "xt_tcpudp",
    "iptable_nat",
    "iptable_filter",
    "iptable_mangle",
    "ip6table_nat",
    "ip6table_filter",
    "ip6table_mangle",
    "sch_ingress",
];

/// The directories where a guest installing the package writes (dpkg's database, the binary,
/// the unit, the config), given to `vng` as `--overlay-rwdir`: writable in the guest, their
/// changes gone with it. The root it shares stays untouched (the amd64-hosted guests share this
/// machine's).
pub const PACKAGE_OVERLAYS: [&str; 3] = ["/etc", "/usr", "/var"];

/// A guest's setup that installs the package `deb` (a path the guest sees) with dpkg, as
/// `apt install ./xdp-router_*.deb` would on a router, then runs the installed daemon:
/// `--version` and `check-system`. man-db's trigger is switched off first (its documented
/// switch, the file `/var/lib/man-db/auto-update`): on a guest sharing this machine's root it
/// re-indexed every man page there, minutes under emulation.
pub fn install_package(deb: &Path) -> Vec<String> {
    let daemon = format!("/{}", crate::dist::DAEMON_PATH);
    vec![
        "rm -f /var/lib/man-db/auto-update".into(),
        format!("dpkg -i {}", quote(&deb.to_string_lossy())),
        format!("{daemon} --version"),
        format!("{daemon} check-system"),
    ]
}

/// A guest's teardown that purges the package and checks it left nothing behind.
pub fn purge_package() -> Vec<String> {
    use crate::dist::{DAEMON_PATH, PACKAGE, UNIT_PATH};
    vec![
        format!("dpkg --purge {PACKAGE}"),
        format!("test ! -e /{DAEMON_PATH}"),
        "test ! -e /etc/xdp-router".into(),
        format!("test ! -e /{UNIT_PATH}"),
    ]
}

/// `vng`'s arguments that boot `kernel` emulated (no KVM here) with 2 CPUs and 4 GiB, as
/// every amd64-hosted guest boots.
pub fn vng_boot_args(kernel: std::path::PathBuf) -> Vec<std::ffi::OsString> {
    vec![
        "-r".into(),
        kernel.into_os_string(),
        "--disable-kvm".into(),
        "--cpus".into(),
        "2".into(),
        "--memory".into(),
        "4G".into(),
    ]
}

/// What the guest's script does: run `prelude`, load modules, set the environment, run `setup`
/// (any failure of those ends the run as failed), each test binary one at a time (announced by
/// a [`timings::RUNNING`] line, each test's time reported by libtest's `--report-time`, each
/// binary's exit status and the time so far printed), then `teardown`; it writes the overall
/// status to the result file.
pub struct Script {
    pub prelude: Vec<String>,
    pub modules: Vec<&'static str>,
    pub path: String,
    pub env: Vec<(&'static str, String)>,
    pub cwd: PathBuf,
    pub setup: Vec<String>,
    pub runs: Vec<Run>,
    pub teardown: Vec<String>,
}

/// Single-quotes `s` for the shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl Script {
    /// The script's text; `result` is where it writes its status. Its stderr joins its stdout:
    /// the guest's two console streams reach the host as two qemu ports writing into one pipe,
    /// where they could interleave inside a line.
    fn text(&self, result: &Path) -> String {
        let result = quote(&result.to_string_lossy());
        let mut s = String::from(
            "set -u\n\
             exec 2>&1\n\
             echo \"guest: $(uname -r) $(uname -m)\"\n",
        );
        for line in &self.prelude {
            s.push_str(&must(line, &result));
        }
        s.push_str(&format!(
            "modprobe -a {modules} || {{ echo 'guest: modprobe failed'; echo 1 > {result}; exit 1; }}\n\
             export PATH={path}\n",
            modules = self.modules.join(" "),
            path = quote(&self.path),
        ));
        for (k, v) in &self.env {
            s.push_str(&format!("export {k}={}\n", quote(v)));
        }
        if std::env::var_os("CI").is_some() {
            s.push_str("export CI=1\n");
        }
        s.push_str(&format!(
            "cd {}\nrc=0\n",
            quote(&self.cwd.to_string_lossy())
        ));
        for line in &self.setup {
            s.push_str(&must(line, &result));
        }
        for r in &self.runs {
            let args: Vec<String> = r.args.iter().map(|a| quote(a)).collect();
            let name = quote(&r.binary.file_name().unwrap_or_default().to_string_lossy());
            // `--report-time` is unstable: RUSTC_BOOTSTRAP lets the stable-built harness take it.
            s.push_str(&format!(
                "echo {}{name}\n\
                 RUSTC_BOOTSTRAP=1 {} -Z unstable-options --report-time {}\n\
                 s=$?; printf 'guest: %s exited %s after %s s\\n' {name} $s $SECONDS; [ $s -eq 0 ] || rc=1\n",
                quote(timings::RUNNING),
                quote(&r.binary.to_string_lossy()),
                args.join(" "),
            ));
        }
        for line in &self.teardown {
            s.push_str(&format!(
                "{line} || {{ echo {}; rc=1; }}\n",
                quote(&format!("guest: failed: {line}"))
            ));
        }
        s.push_str(&format!("echo $rc > {result}\n"));
        s
    }
}

/// `line` as a script line whose failure ends the run as failed (status 1 in the quoted
/// `result` file).
fn must(line: &str, result: &str) -> String {
    format!(
        "{line} || {{ echo {}; echo 1 > {result}; exit 1; }}\n",
        quote(&format!("guest: failed: {line}"))
    )
}

/// A directory under target/ that the guest shares writable: the script, its result, the skips
/// the tests log. Removed when the run is read.
pub struct Shared {
    pub dir: PathBuf,
}

impl Shared {
    /// `target/guest-<name>-<pid>`, created.
    pub fn new(name: &str) -> anyhow::Result<Shared> {
        let dir = crate::workspace::root()
            .join("target")
            .join(format!("guest-{name}-{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        Ok(Shared { dir })
    }

    /// Where the tests in the guest log their skips (appended to the host's skip log).
    pub fn skips(&self) -> PathBuf {
        self.dir.join("skips")
    }

    fn result(&self) -> PathBuf {
        self.dir.join("result")
    }

    /// Boots the guest: `vng` with `args` (kernel, architecture, root…) plus the shared
    /// directory (seen at `guest_dir` in the guest), running `script`, at `priority`; its
    /// console goes to `sink`. The names of the tests that failed; an error when the guest
    /// could not run or its run did not finish.
    fn boot(
        self,
        args: &[OsString],
        guest_dir: &Path,
        script: &Script,
        priority: Priority,
        skip_log: &Path,
        sink: &mut dyn std::io::Write,
    ) -> anyhow::Result<Vec<String>> {
        let vng =
            cmd::which("vng").context("virtme-ng (`vng`) not found: run `cargo xtask setup`")?;
        let guest_result = guest_dir.join("result");
        let script_file = self.dir.join("run.sh");
        fs::write(&script_file, script.text(&guest_result))
            .with_context(|| format!("write {}", script_file.display()))?;
        // The guest's console goes to stderr, which qemu reopens (truncating a log file that
        // stderr is redirected to): `sh` sends it into the stdout pipe read below instead.
        let mut c = Command::new("sh");
        c.args(["-c", "exec \"$@\" 2>&1", "sh"]);
        if priority == Priority::Idle {
            // Inherited by everything vng starts, qemu's vCPU threads included.
            c.args(["chrt", "--idle", "0"]);
        }
        c.args(["timeout", TIMEOUT_SECS])
            .arg(vng)
            .args(args)
            // The kernel's console reaches this output (`--verbose`), with messages of error
            // level and worse only: a guest kernel that panics (it reboots at once,
            // `panic=-1`, ending qemu) says why instead of going silent mid-test.
            .args(["--verbose", "--append", "loglevel=4"])
            .arg("--rwdir")
            .arg(if guest_dir == self.dir {
                self.dir.clone().into_os_string()
            } else {
                let mut a = guest_dir.as_os_str().to_owned();
                a.push("=");
                a.push(&self.dir);
                a
            })
            .arg("--exec")
            .arg(format!("bash {}", guest_dir.join("run.sh").display()));
        let mut timed = timings::Timings::new(sink);
        let failed = cmd::run_collecting_failures_into(&mut c, &mut timed);
        let table = timed.table();
        let _ = std::io::Write::write_all(sink, table.as_bytes());
        let status = fs::read_to_string(self.result());
        if let Ok(skips) = fs::read_to_string(self.skips()) {
            use std::io::Write as _;
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(skip_log)
                .and_then(|mut f| f.write_all(skips.as_bytes()))
                .with_context(|| format!("append the guest's skips to {}", skip_log.display()))?;
        }
        let _ = fs::remove_dir_all(&self.dir);
        let failed = match failed {
            // vng's status when qemu ended without the script's: the guest kernel panicked
            // (it reboots at once, ending qemu) or the emulator died.
            Err(e)
                if status.is_err()
                    && e.downcast_ref::<cmd::Failed>()
                        .is_some_and(|f| f.status.code() == Some(255)) =>
            {
                return Err(Unfinished(format!("{e:#}")).into());
            }
            failed => failed?,
        };
        match status.as_deref().map(str::trim) {
            Ok("0") => Ok(failed),
            Ok(_) if !failed.is_empty() => Ok(failed),
            Ok(rc) => {
                bail!("a guest step failed (exit {rc}) without naming a test: see its output")
            }
            Err(_) => bail!("the guest did not finish its tests (no result file): see its output"),
        }
    }
}

/// A guest that ended before its script did, without a timeout: its kernel panicked or the
/// emulator died (what it printed last is in the message). Not a verdict on the tests: the
/// caller may boot it once more (see `test.rs`).
#[derive(Debug)]
pub struct Unfinished(String);

impl std::fmt::Display for Unfinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the guest ended before its tests finished (its kernel panicked or the emulator \
             exited): {}",
            self.0
        )
    }
}

impl std::error::Error for Unfinished {}

/// A guest ready to boot: its binaries built, its script's parts set, its `vng` arguments
/// (kernel, architecture, root) chosen.
pub struct Prepared {
    shared: Shared,
    script: Script,
    args: Vec<OsString>,
    /// Where the guest sees the shared directory.
    guest_dir: PathBuf,
}

/// A guest booted in the background (see [`boot_beside`]): [`Beside::wait`] gives its outcome.
pub struct Beside {
    /// The outcome, when the guest started and when it ended; sent when it ended.
    done: mpsc::Receiver<(anyhow::Result<Vec<String>>, Instant, Instant)>,
    log: PathBuf,
}

/// Boots `guests` one after another on a thread of its own, each one's emulator in the idle
/// scheduling class (it runs only on CPU time nothing else wants, so tests running beside it
/// keep theirs; never two emulators at once: side by side they take twice as long), each one's
/// console going to its log (printed by [`Beside::wait`], so two runs' lines do not mix). For
/// each guest in their order, its [`Beside`], or why it cannot boot (it was not prepared, its
/// log could not be created).
pub fn boot_beside(
    guests: Vec<(anyhow::Result<Prepared>, PathBuf)>,
    skip_log: &Path,
) -> Vec<anyhow::Result<Beside>> {
    let mut runs = Vec::new();
    let mut waits = Vec::new();
    for (prepared, log) in guests {
        let file = fs::File::create(&log).with_context(|| format!("create {}", log.display()));
        match (prepared, file) {
            (Ok(prepared), Ok(file)) => {
                let (tx, done) = mpsc::channel();
                runs.push((prepared, file, tx));
                waits.push(Ok(Beside { done, log }));
            }
            (Err(e), _) | (_, Err(e)) => waits.push(Err(e)),
        }
    }
    let skip_log = skip_log.to_owned();
    thread::spawn(move || {
        for (p, mut file, tx) in runs {
            let started = Instant::now();
            let outcome = p.shared.boot(
                &p.args,
                &p.guest_dir,
                &p.script,
                Priority::Idle,
                &skip_log,
                &mut file,
            );
            let _ = tx.send((outcome, started, Instant::now()));
        }
    });
    waits
}

impl Prepared {
    /// Boots the guest once and runs everything, its console going to `sink`; the names of
    /// failed tests.
    pub fn boot(
        self,
        skip_log: &Path,
        sink: &mut dyn std::io::Write,
    ) -> anyhow::Result<Vec<String>> {
        self.shared.boot(
            &self.args,
            &self.guest_dir,
            &self.script,
            Priority::Normal,
            skip_log,
            sink,
        )
    }
}

impl Beside {
    /// Waits for the guest, prints its console and returns its outcome (as
    /// [`Prepared::boot`]) and how long it ran, in seconds.
    pub fn wait(self) -> (anyhow::Result<Vec<String>>, f64) {
        let (outcome, secs) = match self.done.recv() {
            Ok((outcome, started, ended)) => (outcome, ended.duration_since(started).as_secs_f64()),
            Err(_) => (Err(anyhow::anyhow!("the guests' thread panicked")), 0.0),
        };
        match fs::read(&self.log) {
            Ok(text) => print!("{}", String::from_utf8_lossy(&text)),
            Err(e) => println!(
                "guest: cannot read its console log {}: {e}",
                self.log.display()
            ),
        }
        (outcome, secs)
    }
}

/// The scheduling class a guest's emulator runs in.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Priority {
    /// The step has the machine to itself.
    Normal,
    /// Beside timing-sensitive tests: `SCHED_IDLE` (`chrt --idle 0`), which any runnable
    /// normal task preempts.
    Idle,
}

/// `cargo test -p xdp-router-tests --no-run` of `targets` with `extra` cargo arguments (a
/// profile, a target); their executables, in the order of `targets`.
pub fn build_test_binaries(
    targets: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Vec<PathBuf>> {
    let mut c = cmd::cargo();
    c.args([
        "test",
        "-p",
        "xdp-router-tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .args(extra)
    .envs(env.iter().copied());
    for t in targets {
        c.args(["--test", t]);
    }
    let out = cmd::output(&mut c)?;
    let mut found = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && let (Some(name), Some(exe)) =
                (v["target"]["name"].as_str(), v["executable"].as_str())
            && targets.contains(&name)
        {
            found.push((name.to_owned(), PathBuf::from(exe)));
        }
    }
    targets
        .iter()
        .map(|t| {
            found
                .iter()
                .find(|(name, _)| name == t)
                .map(|(_, exe)| exe.clone())
                .with_context(|| format!("cargo built no `{t}` test binary (built {found:?})"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_runs_every_binary_and_records_the_status() {
        let s = Script {
            prelude: vec!["mount -t tmpfs fw /lib/firmware".into()],
            modules: vec!["veth", "bridge", "8021q"],
            path: "/usr/bin".into(),
            env: vec![("XDP_ROUTERD_BIN", "/r/xdp-routerd".into())],
            cwd: "/w".into(),
            setup: vec!["dpkg -i /x/p.deb".into()],
            runs: vec![
                Run {
                    binary: "/t/vlan-1".into(),
                    args: vec!["--ignored".into(), "name's".into()],
                },
                Run {
                    binary: "/t/pppoe-2".into(),
                    args: vec!["--ignored".into()],
                },
            ],
            teardown: vec!["dpkg --purge p".into()],
        }
        .text(Path::new("/tmp/g/result"));
        assert!(s.starts_with("set -u\nexec 2>&1\n"));
        assert!(s.contains(
            "mount -t tmpfs fw /lib/firmware || { echo 'guest: failed: mount -t tmpfs fw \
             /lib/firmware'; echo 1 > '/tmp/g/result'; exit 1; }\nmodprobe -a veth bridge 8021q"
        ));
        assert!(s.contains("modprobe -a veth bridge 8021q ||"));
        assert!(s.contains(
            "dpkg -i /x/p.deb || { echo 'guest: failed: dpkg -i /x/p.deb'; echo 1 > '/tmp/g/result'; exit 1; }\n"
        ));
        assert!(s.contains(
            "echo 'guest: running ''vlan-1'\n\
             RUSTC_BOOTSTRAP=1 '/t/vlan-1' -Z unstable-options --report-time '--ignored' 'name'\\''s'\n\
             s=$?; printf 'guest: %s exited %s after %s s\\n' 'vlan-1' $s $SECONDS; [ $s -eq 0 ] || rc=1\n"
        ));
        assert!(s.contains("'/t/pppoe-2' -Z unstable-options --report-time '--ignored'\n"));
        assert!(s.contains("export XDP_ROUTERD_BIN='/r/xdp-routerd'\n"));
        assert!(s.contains("dpkg --purge p || { echo 'guest: failed: dpkg --purge p'; rc=1; }\n"));
        assert!(s.ends_with("echo $rc > '/tmp/g/result'\n"));
    }
}
