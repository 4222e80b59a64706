//! The live-frames generator: the lab's `lab_gen` program run by `BPF_PROG_RUN` with
//! `BPF_F_TEST_XDP_LIVE_FRAMES`; it rewrites every frame as [`super::frames`] describes and
//! redirects it out of the stream's interface.

use anyhow::{Context as _, Result, anyhow};
use aya::{
    Ebpf,
    maps::Array,
    programs::{ProgramError, TestRun as _, TestRunAttrs, TestRunOptions, Xdp, XdpMode},
};
use xdp_router_common::lab::{GenConfig, LAB_GEN_PROG, MAP_LAB_GEN};
use xdp_router_testbed::netns::{Netns, enter_netns};

use super::{errno_name, pacing::Pacer};
use crate::lab::{attach, load};

/// Live-frames batch (frames per page-pool refill and redirect flush). Every call builds a new
/// page pool, so its first batch allocates fresh pages: 64 measured fastest here for short calls
/// (256, the kernel's `TEST_XDP_MAX_BATCH`, doubles the per-call cost, 16 flushes too often).
const BATCH: u32 = 64;

/// Frames per `BPF_PROG_RUN` call when the generator runs flat out (≈ 3 ms at 5 Mpps, so a trial
/// overshoots its length by at most that much).
pub const UNPACED_CHUNK: u32 = 16_384;

/// The generator program of one namespace.
pub struct LiveFrames {
    ebpf: Ebpf,
    ns_path: String,
}

impl LiveFrames {
    /// Loads the generator program for namespace `ns`.
    ///
    /// The program is also attached (generic mode) to `spare_if`, a veth that stays down: every
    /// live-frames `BPF_PROG_RUN` otherwise adds the program to the kernel's XDP dispatcher and
    /// removes it again (`bpf_prog_change_xdp`), which rebuilds the dispatcher and waits for an
    /// RCU grace period on every call (10–25 ms here, see docs/benchmarks-method.md). While the program
    /// is attached somewhere it stays in the dispatcher and a call costs microseconds.
    pub fn new(ns: &Netns, spare_if: &str) -> Result<LiveFrames> {
        let mut ebpf = load(LAB_GEN_PROG)?;
        attach(&mut ebpf, LAB_GEN_PROG, ns, spare_if, XdpMode::Skb)?;
        Ok(LiveFrames {
            ebpf,
            ns_path: ns.path(),
        })
    }

    fn prog(&self) -> Result<&Xdp> {
        self.ebpf
            .program(LAB_GEN_PROG)
            .ok_or_else(|| anyhow!("lab object has no program {LAB_GEN_PROG}"))?
            .try_into()
            .with_context(|| format!("{LAB_GEN_PROG} is not an XDP program"))
    }

    /// Whether this kernel runs the program on live frames: one call with one frame, which the
    /// program aborts (its config is still empty, no flows), so nothing is sent. `Err` holds
    /// the errno name of the refusal (EPERM where live frames are not permitted).
    pub fn probe(&self) -> Result<Result<(), String>> {
        let frame = [0u8; 64];
        let opts = TestRunOptions {
            data_in: Some(&frame),
            repeat: 1,
            attrs: TestRunAttrs::new().xdp_live_frames(1),
            ..TestRunOptions::new()
        };
        Ok(match self.prog()?.test_run(opts) {
            Ok(_) => Ok(()),
            Err(ProgramError::SyscallError(e)) => Err(errno_name(&e.io_error)),
            Err(e) => Err(e.to_string()),
        })
    }

    /// Runs `frame` through the program as `cfg` says, in bursts of `pacer` (one call each);
    /// returns the frames sent. Call on the thread that sends (it enters the namespace).
    pub fn run(&mut self, cfg: &GenConfig, frame: &[u8], pacer: &Pacer) -> Result<u64> {
        {
            let mut map: Array<_, GenConfig> = Array::try_from(
                self.ebpf
                    .map_mut(MAP_LAB_GEN)
                    .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_GEN}"))?,
            )?;
            map.set(0, cfg, 0).context("writing the generator config")?;
        }
        // The redirect target's ifindex is looked up in the calling thread's namespace.
        enter_netns(&self.ns_path)?;
        let prog = self.prog()?;
        let mut sent = 0u64;
        while let Some(n) = pacer.next(sent) {
            let opts = TestRunOptions {
                data_in: Some(frame),
                repeat: n,
                attrs: TestRunAttrs::new().xdp_live_frames(pacer.burst().min(BATCH).min(n)),
                ..TestRunOptions::new()
            };
            prog.test_run(opts)
                .context("BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES failed")?;
            sent += u64::from(n);
        }
        Ok(sent)
    }
}
