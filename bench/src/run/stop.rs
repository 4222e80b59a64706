//! Stopping a run cleanly: SIGINT/SIGTERM become a stop at the next step, and what every
//! privileged mode does first (root check, signal handlers, stale namespaces).

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail};

/// Set by SIGINT/SIGTERM: the run stops at the next trial and cleans up.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// An error once SIGINT/SIGTERM arrived (after [`prepare`]); call between steps.
pub fn check_stop() -> Result<()> {
    if stopped() {
        bail!("interrupted");
    }
    Ok(())
}

/// True once SIGINT/SIGTERM arrived (after [`prepare`]).
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// What every privileged mode does first: checks for root, turns SIGINT/SIGTERM into a stop at
/// the next step (so cleanup runs), removes namespaces of killed earlier runs.
pub fn prepare() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the benchmark needs root (network namespaces, BPF, iptables); run it with sudo");
    }
    // SAFETY: installing an async-signal-safe handler (it only stores to an atomic).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    xdp_router_testbed::netns::cleanup_stale("xr-bench-")
}
