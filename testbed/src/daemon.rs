//! An `xdp-routerd` process in a network namespace, driven through its command line as a user
//! would: started with a config file and a control socket, waited for until it answers
//! `status`, asked with CLI subcommands, and stopped with SIGTERM (it detaches and cleans up),
//! SIGKILL after a grace period.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

/// How long SIGTERM has before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// A running `xdp-routerd`; SIGTERM (then SIGKILL) on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    bin: PathBuf,
    socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Spawns `command`, a command that runs `bin` in the router's namespace (from
    /// `Netns::command`, perhaps through `taskset`), with `run --config CONFIG --socket SOCKET`,
    /// stdin closed, and stdout and stderr in the file `log`.
    pub fn spawn(
        mut command: Command,
        bin: &Path,
        config: &Path,
        socket: &Path,
        log: &Path,
    ) -> Result<Daemon> {
        let out = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log file")?;
        let child = command
            .arg("run")
            .arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Daemon {
            child: Some(child),
            bin: bin.to_owned(),
            socket: socket.to_owned(),
            log: log.to_owned(),
        })
    }

    /// Waits up to `wait` until `status --json` answers. Fails when the daemon exits first or
    /// does not answer in time, with the tail of its log.
    pub fn wait_answering(&mut self, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                bail!(
                    "xdp-routerd exited at start ({st}); log:\n{}",
                    self.log_tail(6000)
                );
            }
            match self.cli(&["status", "--json"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => bail!(
                    "xdp-routerd did not answer `status --json` within {} s ({e:#}); log:\n{}",
                    wait.as_secs(),
                    self.log_tail(6000)
                ),
                Err(_) => thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Runs `xdp-routerd ARGS --socket SOCKET`: its stdout, or an error with its exit status and
    /// stderr.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.bin)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.bin.display()))?;
        if !out.status.success() {
            bail!(
                "xdp-routerd {} ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The daemon's process id while it runs (`ip netns exec` and `taskset` exec in place).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The ids of the BPF maps it holds open (`map_id:` of its file descriptors' fdinfo),
    /// sorted, each once: how the tests and the benchmark find its maps (by name, with
    /// `MapInfo::from_id`).
    pub fn map_ids(&self) -> Result<Vec<u32>> {
        let pid = self.pid().context("the daemon is not running")?;
        let dir = format!("/proc/{pid}/fdinfo");
        let mut ids = Vec::new();
        for fd in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            let text = fs::read_to_string(fd?.path()).unwrap_or_default();
            if let Some(id) = text
                .lines()
                .find_map(|l| l.strip_prefix("map_id:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The file its stdout and stderr go to.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The last `bytes` bytes of its log.
    pub fn log_tail(&self, bytes: usize) -> String {
        let s = fs::read(&self.log).unwrap_or_default();
        let start = s.len().saturating_sub(bytes);
        String::from_utf8_lossy(&s[start..]).into_owned()
    }

    /// Sends `signal` (e.g. SIGSTOP, SIGCONT) to the running daemon.
    pub fn signal(&self, signal: i32) -> Result<()> {
        let pid = self.pid().context("xdp-routerd is not running")?;
        let pid = i32::try_from(pid).context("pid out of range")?;
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("kill({pid}, {signal}): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILL and reap (no cleanup chance: the kernel must detach when its link fds close).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits up to 5 s for it to exit (SIGKILL after that); says how it ended.
    pub fn terminate(&mut self) -> Result<Stop> {
        let Some(mut c) = self.child.take() else {
            return Ok(Stop::NotRunning);
        };
        if let Some(st) = c.try_wait()? {
            return Ok(Stop::ExitedBefore(st));
        }
        let pid = i32::try_from(c.id()).context("pid out of range")?;
        // SAFETY: kill(2) on our own child, which has not been reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Some(st) = c.try_wait()? {
                return Ok(Stop::Exited(st));
            }
            thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        Ok(Stop::Killed)
    }
}

/// How [`Daemon::terminate`] found or left the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Already stopped, killed or reaped.
    NotRunning,
    /// It had exited before the SIGTERM, with this status.
    ExitedBefore(ExitStatus),
    /// It exited on SIGTERM with this status.
    Exited(ExitStatus),
    /// It ignored SIGTERM for 5 s and was killed.
    Killed,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.terminate();
    }
}
