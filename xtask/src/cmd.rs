//! Running external commands with the command line echoed and failures turned into errors.

use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context as _, bail};

use crate::test_output::{Tail, TestOutput};

/// `cargo` as invoked by `cargo xtask` (the `CARGO` variable), with the workspace as cwd.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut c = Command::new(cargo);
    c.current_dir(crate::workspace::root());
    c
}

/// Shell-like rendering of a command, for messages.
pub fn display(c: &Command) -> String {
    let mut s = c.get_program().to_string_lossy().into_owned();
    for a in c.get_args() {
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains(|ch: char| ch.is_whitespace() || ch == '\'') {
            s.push_str(&format!(" '{}'", a.replace('\'', r"'\''")));
        } else {
            s.push(' ');
            s.push_str(&a);
        }
    }
    s
}

/// Runs a command with inherited stdio (echoed first); an error if it fails.
pub fn run(c: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {}", display(c));
    let status = c
        .status()
        .with_context(|| format!("cannot start {}", c.get_program().to_string_lossy()))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(c));
    }
    Ok(())
}

/// Runs a command with its stderr echoed line by line (stdout inherited); when it fails, the
/// error ([`Failed`]) carries its last stderr lines, where a program says why it failed — the
/// step summary shows them, as CI cuts the middle of a long output.
pub fn run_keeping_tail(c: &mut Command) -> anyhow::Result<()> {
    eprintln!("+ {}", display(c));
    let mut child = c
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", c.get_program().to_string_lossy()))?;
    let mut tail = Tail::default();
    if let Some(err) = child.stderr.take() {
        // A read error ends the echo only; the exit status still decides.
        let _ = each_line(err, |line| {
            eprintln!("{line}");
            tail.push(line);
        });
    }
    let status = child.wait().context("waiting for the command")?;
    if !status.success() {
        return Err(Failed {
            command: display(c),
            status,
            tail: tail.indented(),
        }
        .into());
    }
    Ok(())
}

/// Calls `f` with each line of `r`, read as bytes, not with `lines()`: one byte that is not
/// UTF-8 (a guest console interleaving two writers inside a multi-byte character) must not end
/// the reading while the command runs on.
fn each_line(r: impl std::io::Read, mut f: impl FnMut(&str)) -> std::io::Result<()> {
    use std::io::BufRead as _;
    for line in std::io::BufReader::new(r).split(b'\n') {
        f(&String::from_utf8_lossy(&line?));
    }
    Ok(())
}

/// Runs `cargo test …` with stdout echoed line by line, and returns the tests reported as
/// `test NAME ... FAILED`, each with its panic message where the output had it (see
/// [`TestOutput::failures`]); an error, with the output's last lines, when it fails without
/// naming a test (a build error, a crashed test binary, a guest kernel that panicked).
pub fn run_collecting_failures(c: &mut Command) -> anyhow::Result<Vec<String>> {
    run_collecting_failures_into(c, &mut std::io::stdout())
}

/// [`run_collecting_failures`] with the command's output written to `sink` instead of stdout
/// (a guest that runs beside another one).
pub fn run_collecting_failures_into(
    c: &mut Command,
    sink: &mut dyn std::io::Write,
) -> anyhow::Result<Vec<String>> {
    let _ = writeln!(sink, "+ {}", display(c));
    let mut child = c
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", c.get_program().to_string_lossy()))?;
    let mut output = TestOutput::default();
    if let Some(out) = child.stdout.take()
        && let Err(e) = each_line(out, |line| {
            let _ = writeln!(sink, "{line}");
            output.line(line);
        })
    {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e).context("reading test output");
    }
    let status = child.wait().context("waiting for cargo test")?;
    let failed = output.failures();
    if !status.success() && failed.is_empty() {
        return Err(Failed {
            command: display(c),
            status,
            tail: output.tail(),
        }
        .into());
    }
    Ok(failed)
}

/// A command that failed, with its last lines ([`run_keeping_tail`], or
/// [`run_collecting_failures`] when it failed without naming a test).
#[derive(Debug)]
pub struct Failed {
    pub command: String,
    pub status: std::process::ExitStatus,
    /// The last lines of its output, indented (see [`TestOutput::tail`]).
    pub tail: String,
}

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` failed ({}); its last lines:{}",
            self.command, self.status, self.tail
        )
    }
}

impl std::error::Error for Failed {}

/// Runs a command quietly and returns its stdout; an error carrying its stderr if it fails.
pub fn output(c: &mut Command) -> anyhow::Result<String> {
    let out = c
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {}", c.get_program().to_string_lossy()))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            display(c),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Finds an executable in `PATH`, and in the sbin directories that a non-root `PATH` may lack.
pub fn which(name: impl AsRef<OsStr>) -> Option<PathBuf> {
    let name = name.as_ref();
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

/// True when `p` is a regular file with an execute bit.
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// True when running as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT/SIGTERM so that Ctrl-C does not kill xtask before its cleanup guards run: the
/// children (same process group) get the signal and exit, the waiting call returns, and the
/// caller checks [`interrupted`] and unwinds normally.
pub fn catch_interrupts() {
    // SAFETY: the handler only stores to an atomic (async-signal-safe); the sigaction struct is
    // fully initialised (zeroed, then handler and an empty mask set).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        for sig in [libc::SIGINT, libc::SIGTERM] {
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// True once SIGINT/SIGTERM arrived (after [`catch_interrupts`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An error when the user pressed Ctrl-C; call between steps.
pub fn check_interrupted() -> anyhow::Result<()> {
    if interrupted() {
        bail!("interrupted");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_collected_past_bytes_that_are_not_utf8() {
        // A guest console line broken inside a multi-byte character, a padded CR-ended result
        // line, then a failed test: the reading goes on to the end and names it.
        let mut c = Command::new("sh");
        c.args([
            "-c",
            r"printf 'LAN\342\206 \342\206\224\377\n'; printf 'test a ... ok   \r\n'; \
              printf 'test b::c ... FAILED\r\n'; exit 1",
        ]);
        // Into a buffer: CI reads this test's output for failed tests too.
        let mut sink = Vec::new();
        assert_eq!(
            run_collecting_failures_into(&mut c, &mut sink).unwrap(),
            ["b::c"]
        );
        assert!(String::from_utf8_lossy(&sink).contains("test b::c ... FAILED"));
    }

    #[test]
    fn a_failure_without_a_named_test_is_an_error() {
        let mut c = Command::new("sh");
        c.args(["-c", r"printf 'no tests\377\n'; exit 3"]);
        let e = run_collecting_failures_into(&mut c, &mut Vec::new()).unwrap_err();
        let e = format!("{e:#}");
        assert!(e.contains("exit status: 3"), "{e}");
        assert!(e.ends_with("its last lines:\n    no tests\u{fffd}"), "{e}");
    }

    #[test]
    fn a_failed_command_says_why_with_its_last_stderr_lines() {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "echo 'soak: run 1' >&2; echo 'soak: error: no resync' >&2; exit 1",
        ]);
        let e = format!("{:#}", run_keeping_tail(&mut c).unwrap_err());
        assert!(
            e.ends_with("its last lines:\n    soak: run 1\n    soak: error: no resync"),
            "{e}"
        );
        run_keeping_tail(Command::new("sh").args(["-c", "echo fine >&2"])).unwrap();
    }
}
