//! Where the benchmark's threads run: pinning a thread or task to one CPU, and real-time
//! priority for the router's NAPI threads.

use anyhow::{Result, bail};

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> Result<()> {
    pin_pid(0, cpu)
}

/// Pins a task (thread or process; 0 = the calling thread) to one CPU.
pub fn pin_pid(pid: i32, cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET and sched_setaffinity get a valid set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "pin task {pid} to CPU{cpu}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Gives a task real-time FIFO priority `prio` (used for the router's NAPI threads: on a real
/// router NAPI runs in softirq, ahead of every process; a threaded NAPI under SCHED_OTHER would
/// instead share its CPU with whatever else runs on this shared machine).
pub fn set_fifo(pid: i32, prio: i32) -> Result<()> {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: a valid sched_param for sched_setscheduler(2).
    if unsafe { libc::sched_setscheduler(pid, libc::SCHED_FIFO, &param) } != 0 {
        bail!(
            "SCHED_FIFO for task {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
