//! Network namespaces owned by a test or benchmark run: created by name, deleted on drop (also
//! when a run fails, with whatever still runs inside), plus helpers to run commands and closures
//! inside them.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// A network namespace that lives as long as this value.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates the namespace `name` (which must not exist) and brings its loopback up.
    pub fn create(name: &str) -> Result<Netns> {
        run("ip", &["netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
        };
        ns.run("ip", &["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's name (as used by `ip netns`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A `Command` that runs `prog` inside the namespace. `ip netns exec` execs in place (no
    /// fork), so the child's PID is the program's PID, and it mounts the namespace's sysfs.
    pub fn command(&self, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, prog]);
        c
    }

    /// Runs `prog args…` inside the namespace; fails with its stderr when it exits non-zero.
    pub fn run(&self, prog: &str, args: &[&str]) -> Result<String> {
        let mut full = vec!["netns", "exec", &self.name, prog];
        full.extend_from_slice(args);
        run("ip", &full).with_context(|| format!("in netns {}", self.name))
    }

    /// Runs a shell snippet inside the namespace; fails with its stderr when it fails.
    pub fn sh(&self, script: &str) -> Result<String> {
        self.run("sh", &["-c", script])
    }

    /// Runs `f` on a new thread that has entered this namespace (sockets, interface names and
    /// ifindexes it uses are this namespace's) and returns its result.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|s| {
            s.spawn(|| {
                enter_netns(&path)?;
                f()
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Path of the namespace file (for [`enter_netns`] on a thread the caller manages).
    pub fn path(&self) -> String {
        format!("/run/netns/{}", self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Anything still running inside was started by this run (the namespace is ours).
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain kill(2) on a PID listed as living in our namespace.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes namespaces `<prefix><pid>-…` left behind by runs whose process is gone (e.g. killed
/// with SIGKILL), with whatever still runs inside them.
pub fn cleanup_stale(prefix: &str) -> Result<()> {
    let list = run("ip", &["netns", "list"])?;
    for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if std::path::Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        eprintln!("removing stale namespace {name} (its process {pid} is gone)");
        drop(Netns {
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// Moves the calling thread into the network namespace at `path`.
pub fn enter_netns(path: &str) -> Result<()> {
    let file = File::open(path).with_context(|| format!("open {path}"))?;
    // SAFETY: setns on a valid namespace fd only changes the calling thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc != 0 {
        bail!("setns {path}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs a host command; fails with its stderr (first line) when it exits non-zero.
pub fn run(prog: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(prog)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {prog} (is it installed?)"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        bail!(
            "`{prog} {}` failed: {}",
            args.join(" "),
            err.trim().lines().next().unwrap_or("(no message)")
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
