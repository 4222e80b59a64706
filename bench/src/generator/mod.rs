//! The testbed's traffic generators: the frames of one stream ([`GenConfig`] and its initial
//! frame) sent out of one host's interface, flat out or paced, from one pinned CPU.
//!
//! [`live_frames`] runs the lab's `lab_gen` program with live-frames `BPF_PROG_RUN`. Kernels
//! may refuse that (EPERM), so a generator probes it once when it is made and otherwise sends
//! the same frames ([`frames`]) from an AF_PACKET TX ring ([`af_packet`]). Both send in the
//! bursts of a [`pacing::Pacer`].

mod af_packet;
pub mod frames;
mod live_frames;
mod pacing;

use std::{fmt, io, time::Duration};

use anyhow::Result;
use xdp_router_common::lab::GenConfig;
use xdp_router_testbed::netns::Netns;

use self::{af_packet::AfPacket, live_frames::LiveFrames, pacing::Pacer};
use crate::pin::pin_current_thread;

/// Which generator sends a testbed's frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenKind {
    /// The lab's `lab_gen` program, run by live-frames `BPF_PROG_RUN`.
    LiveFrames,
    /// An AF_PACKET TX ring, because the kernel refused live frames with the errno `refused`.
    AfPacket {
        /// Why the live-frames probe failed (an errno name such as `EPERM`).
        refused: String,
    },
}

impl fmt::Display for GenKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenKind::LiveFrames => f.write_str("live-frames BPF_PROG_RUN"),
            GenKind::AfPacket { refused } => write!(
                f,
                "AF_PACKET TX ring (live frames refused by this kernel: {refused})"
            ),
        }
    }
}

/// Share of the generator's own rate (flat out over the direct pair into a bare sink) from
/// which a rate measured through the router is the generator's limit, not the router's.
const BOUND_SHARE: f64 = 0.9;

/// Whether `pps` is within 10 % of (or above) the generator's own rate `ceiling_pps`: a
/// generator-bound figure, a lower bound of what the router can do.
pub fn generator_bound(pps: f64, ceiling_pps: f64) -> bool {
    ceiling_pps > 0.0 && pps >= BOUND_SHARE * ceiling_pps
}

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

enum Sender {
    LiveFrames(LiveFrames),
    AfPacket(AfPacket),
}

/// The generator of one namespace.
pub struct Generator {
    sender: Sender,
    kind: GenKind,
    ns_name: String,
    cpu: usize,
}

impl Generator {
    /// A generator for namespace `ns`, whose frames are sent from CPU `cpu`: live frames where
    /// the kernel runs them (the program then stays attached to `spare_if`, one end of a veth
    /// pair that stays down, see [`LiveFrames::new`]), else an AF_PACKET TX ring sending
    /// through that pair, `spare_peer` its other end, from the same CPU (see
    /// [`AfPacket::new`]).
    pub fn new(ns: &Netns, spare_if: &str, spare_peer: &str, cpu: usize) -> Result<Generator> {
        let live = LiveFrames::new(ns, spare_if)?;
        let (sender, kind) = match live.probe()? {
            Ok(()) => (Sender::LiveFrames(live), GenKind::LiveFrames),
            Err(refused) => {
                // Detaches the program from `spare_if`.
                drop(live);
                (
                    Sender::AfPacket(AfPacket::new(ns, spare_if, spare_peer, cpu)?),
                    GenKind::AfPacket { refused },
                )
            }
        };
        Ok(Generator {
            sender,
            kind,
            ns_name: ns.name().to_owned(),
            cpu,
        })
    }

    /// Which generator this is.
    pub fn kind(&self) -> &GenKind {
        &self.kind
    }

    /// Sends the frames of `cfg` (see [`frames`]) for `duration`, flat out when `rate` is
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
        let (sender, ns_name, cpu) = (&mut self.sender, &self.ns_name, self.cpu);
        let flat_out_burst = match sender {
            Sender::LiveFrames(_) => live_frames::UNPACED_CHUNK,
            Sender::AfPacket(_) => af_packet::UNPACED_CHUNK,
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                pin_current_thread(cpu)?;
                let pacer = Pacer::new(rate, duration, max_frames, flat_out_burst)?;
                let sent = match sender {
                    Sender::LiveFrames(g) => g.run(cfg, frame, &pacer),
                    Sender::AfPacket(g) => g.run(cfg, frame, &pacer),
                }
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

/// The errno name of a refused call (the ones a kernel answers an unsupported `BPF_PROG_RUN`
/// with), else the error's text.
fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        // ENOTSUPP, the kernel-internal "not supported" some BPF paths return.
        Some(524) => "ENOTSUPP".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_near_the_ceiling_are_generator_bound() {
        assert!(generator_bound(900_000.0, 1_000_000.0));
        assert!(generator_bound(1_050_000.0, 1_000_000.0));
        assert!(!generator_bound(899_000.0, 1_000_000.0));
        // No ceiling measured: nothing is marked.
        assert!(!generator_bound(1_000.0, 0.0));
    }

    #[test]
    fn the_kind_names_the_generator_and_the_refusal() {
        assert_eq!(GenKind::LiveFrames.to_string(), "live-frames BPF_PROG_RUN");
        let refused = errno_name(&io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(
            GenKind::AfPacket { refused }.to_string(),
            "AF_PACKET TX ring (live frames refused by this kernel: EPERM)"
        );
        assert_eq!(
            errno_name(&io::Error::from_raw_os_error(libc::ENOENT)),
            io::Error::from_raw_os_error(libc::ENOENT).to_string()
        );
    }
}
