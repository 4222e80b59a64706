//! The lab programs (xdp-router-ebpf `lab` binary) on the host side: the live-frames traffic
//! generator, the counting sink, the bare redirect (XDP ceiling) and the pass program.

use std::{
    ffi::CString,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, PerCpuArray},
    programs::{TestRun as _, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};
use xdp_router_common::lab::{
    GenConfig, LAB_GEN_PROG, LAB_PASS_PROG, LAB_REDIRECT_PROG, LAB_SINK_PROG, LabCounter,
    MAP_LAB_GEN, MAP_LAB_REDIR, MAP_LAB_SINK, RedirectConfig,
};

use xdp_router_testbed::netns::{Netns, enter_netns};

use crate::pin::pin_current_thread;

/// The lab object, built by build.rs (aya-build) and embedded in the binary.
pub static LAB_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lab"));

/// Largest live-frames batch the kernel accepts (`TEST_XDP_MAX_BATCH` in net/bpf/test_run.c).
const MAX_BATCH: u32 = 256;

/// Live-frames batch (frames per page-pool refill and redirect flush). Every call builds a new
/// page pool, so its first batch allocates fresh pages: 64 measured fastest here for short calls
/// (256 doubles the per-call cost, 16 flushes too often).
const BATCH: u32 = 64;

/// Frames per `BPF_PROG_RUN` call when the generator runs flat out (≈ 3 ms at 5 Mpps, so a trial
/// overshoots its length by at most that much).
const UNPACED_CHUNK: u32 = 16_384;

fn load(prog: &str) -> Result<Ebpf> {
    let mut ebpf = Ebpf::load(LAB_OBJECT).context("loading the lab eBPF object")?;
    xdp(&mut ebpf, prog)?
        .load()
        .with_context(|| format!("loading lab program {prog} (verifier)"))?;
    Ok(ebpf)
}

fn xdp<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(prog)
        .ok_or_else(|| anyhow!("lab object has no program {prog}"))?
        .try_into()
        .with_context(|| format!("{prog} is not an XDP program"))
}

/// Index of interface `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).context("interface name contains NUL")?;
    // SAFETY: a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no interface {name}: {}", std::io::Error::last_os_error());
    }
    Ok(idx)
}

/// Attaches `prog` of `ebpf` to `ifname` inside `ns` (native mode unless `mode` says otherwise).
fn attach(ebpf: &mut Ebpf, prog: &str, ns: &Netns, ifname: &str, mode: XdpMode) -> Result<()> {
    let p = xdp(ebpf, prog)?;
    ns.enter(|| {
        p.attach(ifname, mode)
            .map(drop)
            .with_context(|| format!("attach {prog} to {ifname} in {}", ns.name()))
    })
}

/// An attached lab program; detached when dropped (the links belong to this process).
pub struct Attached {
    _ebpf: Ebpf,
}

/// Attaches the `XDP_PASS` program to `ifname` (native), so the veth accepts redirected frames.
pub fn attach_pass(ns: &Netns, ifname: &str) -> Result<Attached> {
    let mut ebpf = load(LAB_PASS_PROG)?;
    attach(&mut ebpf, LAB_PASS_PROG, ns, ifname, XdpMode::Driver)?;
    Ok(Attached { _ebpf: ebpf })
}

/// Attaches the bare redirect to `ifname` (native): every frame gets `cfg`'s MACs and goes out
/// of `cfg.ifindex`.
pub fn attach_redirect(ns: &Netns, ifname: &str, cfg: RedirectConfig) -> Result<Attached> {
    let mut ebpf = load(LAB_REDIRECT_PROG)?;
    let mut map: Array<_, RedirectConfig> = Array::try_from(
        ebpf.map_mut(MAP_LAB_REDIR)
            .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_REDIR}"))?,
    )?;
    map.set(0, cfg, 0).context("writing the redirect config")?;
    attach(&mut ebpf, LAB_REDIRECT_PROG, ns, ifname, XdpMode::Driver)?;
    Ok(Attached { _ebpf: ebpf })
}

/// The counting sink on one interface: counts and drops benchmark UDP, passes the rest.
pub struct Sink {
    ebpf: Ebpf,
    ifname: String,
}

impl Sink {
    /// Loads a sink (with its own counters) and attaches it natively to `ifname` in `ns`.
    pub fn attach(ns: &Netns, ifname: &str) -> Result<Sink> {
        let mut ebpf = load(LAB_SINK_PROG)?;
        attach(&mut ebpf, LAB_SINK_PROG, ns, ifname, XdpMode::Driver)?;
        Ok(Sink {
            ebpf,
            ifname: ifname.to_owned(),
        })
    }

    /// Packets and bytes counted so far (summed over CPUs).
    pub fn read(&self) -> Result<LabCounter> {
        let map: PerCpuArray<_, LabCounter> = PerCpuArray::try_from(
            self.ebpf
                .map(MAP_LAB_SINK)
                .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_SINK}"))?,
        )?;
        let values = map
            .get(&0, 0)
            .with_context(|| format!("reading the sink counters of {}", self.ifname))?;
        Ok(values
            .iter()
            .fold(LabCounter::default(), |a, v| LabCounter {
                packets: a.packets + v.packets,
                bytes: a.bytes + v.bytes,
            }))
    }
}

/// What one generator run did.
#[derive(Clone, Copy, Debug)]
pub struct GenRun {
    /// Frames handed to the program (each one redirected unless the config is broken).
    pub sent: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl GenRun {
    /// Offered rate in frames per second.
    pub fn pps(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The live-frames generator of one namespace.
pub struct Generator {
    ebpf: Ebpf,
    ns_path: String,
    ns_name: String,
    cpu: usize,
}

impl Generator {
    /// Loads a generator for namespace `ns`, whose frames are sent from CPU `cpu`.
    ///
    /// The program is also attached (generic mode) to `spare_if`, a veth that stays down: every
    /// live-frames `BPF_PROG_RUN` otherwise adds the program to the kernel's XDP dispatcher and
    /// removes it again (`bpf_prog_change_xdp`), which rebuilds the dispatcher and waits for an
    /// RCU grace period on every call (10–25 ms here, see docs/benchmarks.md). While the program
    /// is attached somewhere it stays in the dispatcher and a call costs microseconds.
    pub fn new(ns: &Netns, spare_if: &str, cpu: usize) -> Result<Generator> {
        let mut ebpf = load(xdp_router_common::lab::LAB_GEN_PROG)?;
        attach(&mut ebpf, LAB_GEN_PROG, ns, spare_if, XdpMode::Skb)?;
        Ok(Generator {
            ebpf,
            ns_path: ns.path(),
            ns_name: ns.name().to_owned(),
            cpu,
        })
    }

    /// Sends `frame` (rewritten per frame by the program as `cfg` says) for `duration`, flat
    /// out when `rate` is `None`, else paced at `rate` frames/s in short bursts.
    pub fn run(
        &mut self,
        cfg: &GenConfig,
        frame: &[u8],
        rate: Option<f64>,
        duration: Duration,
    ) -> Result<GenRun> {
        self.run_frames(cfg, frame, rate, duration, u64::MAX)
    }

    /// Sends exactly `count` frames (rounded up to whole bursts) at `rate` frames/s.
    pub fn send(&mut self, cfg: &GenConfig, frame: &[u8], rate: f64, count: u64) -> Result<GenRun> {
        self.run_frames(cfg, frame, Some(rate), Duration::from_secs(3600), count)
    }

    fn run_frames(
        &mut self,
        cfg: &GenConfig,
        frame: &[u8],
        rate: Option<f64>,
        duration: Duration,
        max_frames: u64,
    ) -> Result<GenRun> {
        if let Some(r) = rate
            && !(r.is_finite() && r >= 1.0)
        {
            bail!("generator rate must be at least 1 frame/s, got {r}");
        }
        {
            let mut map: Array<_, GenConfig> = Array::try_from(
                self.ebpf
                    .map_mut(MAP_LAB_GEN)
                    .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_GEN}"))?,
            )?;
            map.set(0, cfg, 0).context("writing the generator config")?;
        }
        let prog: &Xdp = self
            .ebpf
            .program(LAB_GEN_PROG)
            .ok_or_else(|| anyhow!("lab object has no program {LAB_GEN_PROG}"))?
            .try_into()?;
        let (ns_path, ns_name, cpu) = (&self.ns_path, &self.ns_name, self.cpu);
        std::thread::scope(|s| {
            s.spawn(|| {
                enter_netns(ns_path)?;
                pin_current_thread(cpu)?;
                pace(prog, frame, rate, duration, max_frames)
                    .with_context(|| format!("generator in {ns_name}"))
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}

/// Burst size for a paced rate: about 200 µs of frames, 16..=256. The veth ring holds 256
/// frames, so a burst never overflows it by itself; each call costs tens of µs (page-pool
/// setup), which caps the paced rate at roughly 256 frames per call time (≈ 1–2 Mpps here).
fn burst_for(rate: f64) -> u32 {
    ((rate * 200e-6).round() as u32).clamp(16, MAX_BATCH)
}

fn pace(
    prog: &Xdp,
    frame: &[u8],
    rate: Option<f64>,
    duration: Duration,
    max_frames: u64,
) -> Result<GenRun> {
    let burst = rate.map_or(UNPACED_CHUNK, burst_for);
    let batch = burst.min(BATCH);
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < max_frames {
        let now = Instant::now();
        if now - start >= duration {
            break;
        }
        if let Some(r) = rate {
            // The burst is due when the frames sent so far have used up their time share.
            let due = start + Duration::from_secs_f64(sent as f64 / r);
            if due > now {
                let wait = due - now;
                if wait > Duration::from_micros(300) {
                    std::thread::sleep(wait - Duration::from_micros(150));
                }
                while Instant::now() < due {
                    std::hint::spin_loop();
                }
            }
        }
        let n = burst.min(u32::try_from(max_frames - sent).unwrap_or(u32::MAX));
        let opts = TestRunOptions {
            data_in: Some(frame),
            repeat: n,
            attrs: TestRunAttrs::new().xdp_live_frames(batch.min(n)),
            ..TestRunOptions::new()
        };
        prog.test_run(opts).context(
            "BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES failed (kernel ≥ 5.18 needed)",
        )?;
        sent += u64::from(n);
    }
    Ok(GenRun {
        sent,
        elapsed: start.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_stay_within_the_ring() {
        assert_eq!(burst_for(1_000.0), 16);
        assert_eq!(burst_for(500_000.0), 100);
        assert_eq!(burst_for(10_000_000.0), MAX_BATCH);
    }
}
