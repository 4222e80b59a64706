//! The testbed's traffic generators: the frames of one stream ([`GenConfig`] and its initial
//! frame) sent out of one host's interface, flat out or paced, from one pinned CPU.
//!
//! [`live_frames`] runs the lab's `lab_gen` program with live-frames `BPF_PROG_RUN` in the
//! bursts of a [`pacing::Pacer`].

mod live_frames;
mod pacing;

use std::time::Duration;

use anyhow::Result;
use xdp_router_common::lab::GenConfig;
use xdp_router_testbed::netns::Netns;

use self::{live_frames::LiveFrames, pacing::Pacer};
use crate::pin::pin_current_thread;

/// What one generator run did.
#[derive(Clone, Copy, Debug)]
pub struct GenRun {
    /// Frames sent (each one handed to the interface, where a full receive ring may drop it).
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

/// The generator of one namespace.
pub struct Generator {
    live: LiveFrames,
    ns_name: String,
    cpu: usize,
}

impl Generator {
    /// A generator for namespace `ns`, whose frames are sent from CPU `cpu` (the program stays
    /// attached to `spare_if`, a veth that stays down, see [`LiveFrames::new`]).
    pub fn new(ns: &Netns, spare_if: &str, cpu: usize) -> Result<Generator> {
        Ok(Generator {
            live: LiveFrames::new(ns, spare_if)?,
            ns_name: ns.name().to_owned(),
            cpu,
        })
    }

    /// Sends the frames of `cfg` for `duration`, flat out when `rate` is
    /// `None`, else paced at `rate` frames/s in short bursts.
    pub fn run(
        &mut self,
        cfg: &GenConfig,
        frame: &[u8],
        rate: Option<f64>,
        duration: Duration,
    ) -> Result<GenRun> {
        self.run_frames(cfg, frame, rate, duration, u64::MAX)
    }

    /// Sends `count` frames at `rate` frames/s.
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
        let (live, ns_name, cpu) = (&mut self.live, &self.ns_name, self.cpu);
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_current_thread(cpu)?;
                let pacer = Pacer::new(rate, duration, max_frames, live_frames::UNPACED_CHUNK)?;
                let sent = live
                    .run(cfg, frame, &pacer)
                    .map_err(|e| e.context(format!("generator in {ns_name}")))?;
                Ok(GenRun {
                    sent,
                    elapsed: pacer.elapsed(),
                })
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }
}
