//! SIGINT and SIGTERM, heard by a thread of their own so that shutdown does not depend on the
//! runtime's workers: under load both workers can be busy (or waiting for the state lock) for
//! a while, and a signal that only the runtime's I/O driver would notice could wait with them.
//!
//! [`block`] runs first in `main`, before any thread exists: every thread inherits the blocked
//! mask, so the signals stay pending until the waiter thread takes them with `sigwait(3)`. The
//! first one asks the daemon to detach and exit; if it has not exited [`EXIT_DEADLINE`] later,
//! or a second signal comes, the process exits at once (the kernel detaches the XDP programs
//! when their bpf_link file descriptors close).

use std::{io, time::Duration};

use tokio::sync::watch;
use tracing::error;

/// How long the daemon has to detach and exit after the first signal.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(3);

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        set
    }
}

/// Blocks SIGINT and SIGTERM in the calling thread and every thread it starts from now on.
pub fn block() -> io::Result<()> {
    let set = signal_set();
    // SAFETY: a valid set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Gives a child process the default signal mask back: a blocked mask survives `exec`, and a
/// `tc` or `iptables-legacy-save` the daemon runs must still die of SIGTERM/SIGINT.
pub fn unblocked_in_child(cmd: &mut tokio::process::Command) -> &mut tokio::process::Command {
    let set = signal_set();
    // SAFETY: the closure runs between fork and exec and only calls pthread_sigmask, which is
    // async-signal-safe, on a set built before the fork.
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// [`unblocked_in_child`] for a child run from a blocking thread (`std::process`).
pub fn unblocked_in_std_child(cmd: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let set = signal_set();
    // SAFETY: as in `unblocked_in_child`.
    unsafe {
        cmd.pre_exec(move || {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
            Ok(())
        })
    }
}

/// The signal that asked the daemon to exit, once one has.
#[derive(Clone)]
pub struct Shutdown(watch::Receiver<Option<&'static str>>);

impl Shutdown {
    /// Resolves with the signal's name (`SIGINT`, `SIGTERM`) when one arrives.
    pub async fn requested(&mut self) -> &'static str {
        match self.0.wait_for(Option::is_some).await {
            Ok(name) => name.unwrap_or("a signal"),
            // The waiter thread is gone: no signal will be heard again.
            Err(_) => std::future::pending().await,
        }
    }
}

/// Starts the thread that waits for SIGINT/SIGTERM (blocked by [`block`] first).
pub fn spawn_waiter() -> io::Result<Shutdown> {
    let (tx, rx) = watch::channel(None);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let set = signal_set();
            let mut first = true;
            loop {
                let mut sig = 0;
                // SAFETY: a valid set and out pointer.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                if rc != 0 {
                    continue;
                }
                let name = if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" };
                if !first {
                    error!("{name} again: exiting now; the kernel detaches the XDP programs");
                    std::process::exit(1);
                }
                first = false;
                let _ = tx.send(Some(name));
                // Bounded: the daemon gets EXIT_DEADLINE to detach and exit in order.
                std::thread::spawn(|| {
                    std::thread::sleep(EXIT_DEADLINE);
                    error!(
                        "did not exit within {} s of the signal: exiting now; the kernel detaches the XDP programs",
                        EXIT_DEADLINE.as_secs()
                    );
                    std::process::exit(1);
                });
            }
        })?;
    Ok(Shutdown(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child of a thread that blocks SIGTERM gets it unblocked (the `SigBlk` mask in
    /// /proc/self/status of the child).
    #[test]
    fn children_get_the_signals_unblocked() {
        let blocked_mask = |unblock: bool| {
            std::thread::spawn(move || {
                block().unwrap();
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async {
                    let mut cmd = tokio::process::Command::new("grep");
                    cmd.args(["^SigBlk:", "/proc/self/status"]);
                    if unblock {
                        unblocked_in_child(&mut cmd);
                    }
                    let out = cmd.output().await.unwrap();
                    let line = String::from_utf8(out.stdout).unwrap();
                    u64::from_str_radix(line.trim_start_matches("SigBlk:").trim(), 16).unwrap()
                })
            })
            .join()
            .unwrap()
        };
        let term = 1u64 << (libc::SIGTERM - 1);
        let int = 1u64 << (libc::SIGINT - 1);
        assert_eq!(blocked_mask(false) & (term | int), term | int, "inherited");
        assert_eq!(blocked_mask(true) & (term | int), 0);
    }
}
