//! The optional kernel features the fast path uses, found by asking this kernel, and what the
//! absence of each one turns off. Distribution kernels backport and remove features, so no
//! version number decides: [`probe`] loads a tiny program that calls a helper (aya's helper
//! probe), and [`probe_fib_mark`] runs the object's probe program, whose `bpf_fib_lookup` call
//! tells whether the kernel takes the mark, and [`probe_multi_buffer`] loads the object's
//! multi-buffer probe program, which the kernel refuses without `xdp.frags` (the kernel version
//! stands in for these two answers only where the object could not be loaded). Without
//! multi-buffer XDP the daemon attaches the single-buffer XDP program ([`xdp_program`]).
//!
//! [`probe`] runs once, before the eBPF object is loaded: a missing feature becomes a load-time
//! constant of the object (the verifier then prunes the code that needs it), a `warn` line in
//! `check-system`, a line in `status` and the `xdp_router_kernel_feature` gauge. Only what needs
//! the feature is lost; the daemon starts.

use std::fmt;

use aya::{
    Ebpf,
    programs::{ProgramError, ProgramType, TestRun as _, TestRunOptions, Xdp},
    sys::{BpfHelper, is_helper_supported},
    util::KernelVersion,
};
use serde::{Deserialize, Serialize};
use xdp_router_common::{
    FIB_MARK_PROBE_PROG_NAME, MULTI_BUFFER_PROBE_PROG_NAME, PROG_NAME, SINGLE_BUFFER_PROG_NAME,
};

/// An optional kernel feature.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Feature {
    /// XDP metadata (`bpf_xdp_adjust_meta` in XDP programs): marks the packets native XDP hands
    /// over to the TC fast path behind it.
    XdpMetadata,
    /// `bpf_fib_lookup` with the packet mark (`BPF_FIB_LOOKUP_MARK`, Linux 6.10): policy routing
    /// by mark in the fast path.
    FibLookupMark,
    /// Multi-buffer XDP (`xdp.frags` programs and `bpf_xdp_get_buff_len`, Linux 5.18): native
    /// XDP on a port whose MTU does not fit a frame in one page (jumbo frames).
    MultiBufferXdp,
}

impl Feature {
    /// Every feature, in the order they are listed.
    pub const ALL: [Feature; 3] = [
        Feature::XdpMetadata,
        Feature::FibLookupMark,
        Feature::MultiBufferXdp,
    ];

    /// The name in `status`, `check-system` and the metrics' `feature` label.
    pub fn name(self) -> &'static str {
        match self {
            Feature::XdpMetadata => "xdp_metadata",
            Feature::FibLookupMark => "fib_lookup_mark",
            Feature::MultiBufferXdp => "multi_buffer_xdp",
        }
    }

    /// What the fast path does without it.
    pub fn without(self) -> &'static str {
        match self {
            Feature::XdpMetadata => {
                "the hand-over from native XDP to the TC fast path behind it (traffic leaving by \
                 a TC port, macvlan, Wi-Fi or tunnel) works without its mark: the TC program \
                 looks up every packet XDP passes on such a port"
            }
            Feature::FibLookupMark => {
                "flows the kernel forwarded with a packet mark stay in the kernel \
                 (mark_unsupported_by_kernel): policy routing by mark is not fast-pathed"
            }
            Feature::MultiBufferXdp => {
                "the XDP program is loaded without multi-buffer support: a port whose MTU needs \
                 it (jumbo frames, above about 3 500 bytes) gets no native XDP and runs the TC \
                 fast path (datapath = \"auto\") or generic XDP, its reason in status"
            }
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the probe found out about one feature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "state", content = "why")]
pub enum Availability {
    /// The kernel has it.
    Available,
    /// The kernel refused it (or its version is below the one that brought it, where nothing
    /// can be asked: the text says which).
    Missing(String),
    /// The probe itself failed (the text says how): taken as missing.
    Unknown(String),
}

impl Availability {
    /// Whether the fast path may use the feature.
    pub fn usable(&self) -> bool {
        matches!(self, Availability::Available)
    }
}

/// The answer for every [`Feature`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFeatures {
    /// One entry per feature, in [`Feature::ALL`]'s order.
    pub features: Vec<(Feature, Availability)>,
}

impl KernelFeatures {
    /// Every feature available: what the eBPF object is built for.
    pub fn all_available() -> KernelFeatures {
        KernelFeatures {
            features: Feature::ALL
                .iter()
                .map(|f| (*f, Availability::Available))
                .collect(),
        }
    }

    /// What was found out about `feature`.
    pub fn get(&self, feature: Feature) -> &Availability {
        self.features
            .iter()
            .find(|(f, _)| *f == feature)
            .map_or(&Availability::Available, |(_, a)| a)
    }

    /// Replaces what is known of `feature` with `answer`.
    pub fn set(&mut self, feature: Feature, answer: Availability) {
        if let Some((_, a)) = self.features.iter_mut().find(|(f, _)| *f == feature) {
            *a = answer;
        }
    }

    /// Whether the fast path may use `feature`.
    pub fn usable(&self, feature: Feature) -> bool {
        self.get(feature).usable()
    }

    /// The features the fast path may not use, with why.
    pub fn missing(&self) -> impl Iterator<Item = (Feature, &str)> {
        self.features.iter().filter_map(|(f, a)| match a {
            Availability::Available => None,
            Availability::Missing(why) | Availability::Unknown(why) => Some((*f, why.as_str())),
        })
    }
}

/// Asks this kernel about every feature that needs no eBPF object ([`Feature::FibLookupMark`]:
/// by version until [`probe_fib_mark`] asks the object). Needs the privileges to load a BPF
/// program (a failed probe is [`Availability::Unknown`], never an error).
pub fn probe() -> KernelFeatures {
    KernelFeatures {
        features: Feature::ALL.iter().map(|f| (*f, probe_one(*f))).collect(),
    }
}

fn probe_one(feature: Feature) -> Availability {
    match feature {
        Feature::XdpMetadata => helper(
            is_helper_supported(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_adjust_meta),
            "bpf_xdp_adjust_meta",
        ),
        Feature::FibLookupMark => since(KernelVersion::current(), KernelVersion::new(6, 10, 0)),
        Feature::MultiBufferXdp => since(KernelVersion::current(), KernelVersion::new(5, 18, 0)),
    }
}

/// The XDP program to attach for what the kernel has: the multi-buffer one, or the same
/// pipeline without `xdp.frags` where multi-buffer XDP is missing or its probe failed. Pure.
pub fn xdp_program(features: &KernelFeatures) -> &'static str {
    if features.usable(Feature::MultiBufferXdp) {
        PROG_NAME
    } else {
        SINGLE_BUFFER_PROG_NAME
    }
}

/// Loads the loaded (not yet verified) object's multi-buffer probe program (an `xdp.frags`
/// program calling `bpf_xdp_get_buff_len`) and unloads it again: whether this kernel takes
/// multi-buffer XDP programs.
pub fn probe_multi_buffer(ebpf: &mut Ebpf) -> Availability {
    let mut load = || -> Result<(), ProbeFailure> {
        let prog: &mut Xdp = ebpf
            .program_mut(MULTI_BUFFER_PROBE_PROG_NAME)
            .ok_or_else(|| {
                ProbeFailure::Other(format!("no program {MULTI_BUFFER_PROBE_PROG_NAME}"))
            })?
            .try_into()
            .map_err(|e| ProbeFailure::Other(format!("{e}")))?;
        let loaded = prog.load();
        let _ = prog.unload();
        loaded.map_err(|e| match &e {
            ProgramError::LoadError { io_error, .. } => {
                ProbeFailure::Refused(io_error.raw_os_error(), format!("{e}"))
            }
            _ => ProbeFailure::Other(format!("{e}")),
        })
    };
    multi_buffer_answer(load())
}

/// Why the multi-buffer probe program did not load.
#[derive(Debug)]
pub enum ProbeFailure {
    /// The kernel answered the load with this errno (and text).
    Refused(Option<i32>, String),
    /// It never reached the kernel.
    Other(String),
}

/// What loading the multi-buffer probe program says: the kernel refuses an unknown program
/// flag (`BPF_F_XDP_HAS_FRAGS`) or helper with `EINVAL` (missing); any other failure (no
/// privileges, no memory) says nothing about the feature (unknown). Pure.
pub fn multi_buffer_answer(load: Result<(), ProbeFailure>) -> Availability {
    match load {
        Ok(()) => Availability::Available,
        Err(ProbeFailure::Refused(Some(libc::EINVAL), _)) => Availability::Missing(
            "the kernel refuses an xdp.frags program calling bpf_xdp_get_buff_len (EINVAL)"
                .to_owned(),
        ),
        Err(ProbeFailure::Refused(_, why) | ProbeFailure::Other(why)) => Availability::Unknown(
            format!("loading the multi-buffer probe program failed: {why}"),
        ),
    }
}

/// Runs the loaded (not yet verified) object's probe program once (`BPF_PROG_RUN`): whether
/// `bpf_fib_lookup` takes `BPF_FIB_LOOKUP_MARK` here. The program is unloaded again.
pub fn probe_fib_mark(ebpf: &mut Ebpf) -> Availability {
    let mut run = || -> anyhow::Result<u32> {
        let prog: &mut Xdp = ebpf
            .program_mut(FIB_MARK_PROBE_PROG_NAME)
            .ok_or_else(|| anyhow::anyhow!("no program {FIB_MARK_PROBE_PROG_NAME}"))?
            .try_into()?;
        prog.load()?;
        // An Ethernet header's worth of zeroes: the program reads nothing of it.
        let frame = [0u8; 64];
        let ran = prog.test_run(TestRunOptions {
            data_in: Some(&frame),
            ..TestRunOptions::default()
        });
        let _ = prog.unload();
        Ok(ran?.return_value)
    };
    match run() {
        Ok(rc) => fib_mark_answer(rc),
        Err(e) => Availability::Unknown(format!("running the probe program failed: {e:#}")),
    }
}

/// What the probe program's return value (`bpf_fib_lookup`'s, a negative errno as `u32`) says.
/// Pure.
pub fn fib_mark_answer(rc: u32) -> Availability {
    match -(rc as i32) {
        libc::EAFNOSUPPORT => Availability::Available,
        libc::EINVAL => {
            Availability::Missing("bpf_fib_lookup refuses BPF_FIB_LOOKUP_MARK (EINVAL)".to_owned())
        }
        e => Availability::Unknown(format!(
            "bpf_fib_lookup answered the probe with {}",
            std::io::Error::from_raw_os_error(e)
        )),
    }
}

/// A helper probe's answer: `Ok(false)` is the verifier's refusal of `name`.
fn helper(answer: Result<bool, aya::programs::ProgramError>, name: &str) -> Availability {
    match answer {
        Ok(true) => Availability::Available,
        Ok(false) => {
            Availability::Missing(format!("the verifier refuses {name} to this program type"))
        }
        Err(e) => Availability::Unknown(format!("probing {name} failed: {e}")),
    }
}

/// A feature nothing can ask about yet, by the kernel's version.
fn since(current: Result<KernelVersion, impl fmt::Display>, needed: KernelVersion) -> Availability {
    match current {
        Ok(v) if v >= needed => Availability::Available,
        Ok(v) => Availability::Missing(format!("Linux {v} is older than {needed}")),
        Err(e) => Availability::Unknown(format!("the kernel's version is unreadable: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_helper_is_missing_and_a_failed_probe_unknown() {
        assert_eq!(helper(Ok(true), "h"), Availability::Available);
        assert!(
            matches!(helper(Ok(false), "h"), Availability::Missing(w) if w.contains("refuses h"))
        );
        let failed = helper(Err(aya::programs::ProgramError::UnexpectedProgramType), "h");
        assert!(matches!(&failed, Availability::Unknown(w) if w.contains("probing h failed")));
        assert!(!failed.usable());
    }

    #[test]
    fn the_fib_lookups_answer_says_whether_it_takes_the_mark() {
        let rc = |errno: i32| (-errno) as u32;
        assert_eq!(
            fib_mark_answer(rc(libc::EAFNOSUPPORT)),
            Availability::Available
        );
        assert!(matches!(
            fib_mark_answer(rc(libc::EINVAL)),
            Availability::Missing(_)
        ));
        assert!(matches!(fib_mark_answer(0), Availability::Unknown(_)));
        assert!(matches!(
            fib_mark_answer(rc(libc::ENOENT)),
            Availability::Unknown(_)
        ));
    }

    #[test]
    fn versions_decide_only_above_the_one_that_brought_the_feature() {
        let needed = KernelVersion::new(6, 10, 0);
        let v = |a, b, c| Ok::<_, String>(KernelVersion::new(a, b, c));
        assert_eq!(since(v(6, 10, 0), needed), Availability::Available);
        assert_eq!(since(v(6, 12, 3), needed), Availability::Available);
        assert!(
            matches!(since(v(6, 1, 0), needed), Availability::Missing(w) if w.contains("6.1.0"))
        );
        assert!(matches!(
            since(Err::<KernelVersion, _>("no uname".to_owned()), needed),
            Availability::Unknown(_)
        ));
    }

    #[test]
    fn only_what_is_not_available_is_missing() {
        let mut k = KernelFeatures::all_available();
        assert_eq!(k.missing().count(), 0);
        k.features[0].1 = Availability::Missing("refused".to_owned());
        k.features[1].1 = Availability::Unknown("failed".to_owned());
        let missing: Vec<_> = k.missing().collect();
        assert_eq!(
            missing,
            [
                (Feature::XdpMetadata, "refused"),
                (Feature::FibLookupMark, "failed")
            ]
        );
        assert!(!k.usable(Feature::XdpMetadata));
        assert_eq!(
            Feature::ALL.map(Feature::name),
            ["xdp_metadata", "fib_lookup_mark", "multi_buffer_xdp"]
        );
    }

    /// The probe program loads: the multi-buffer program is attached, nothing reported.
    #[test]
    fn multi_buffer_present_loads_the_frags_program() {
        let mut k = KernelFeatures::all_available();
        k.set(Feature::MultiBufferXdp, multi_buffer_answer(Ok(())));
        assert_eq!(xdp_program(&k), PROG_NAME);
        assert_eq!(k.missing().count(), 0);
    }

    /// The kernel refuses it (5.15: an unknown program flag): the single-buffer program is
    /// attached and the feature reported missing.
    #[test]
    fn multi_buffer_absent_loads_the_single_buffer_program() {
        let mut k = KernelFeatures::all_available();
        let refused = ProbeFailure::Refused(Some(libc::EINVAL), "Invalid argument".to_owned());
        k.set(Feature::MultiBufferXdp, multi_buffer_answer(Err(refused)));
        assert_eq!(xdp_program(&k), SINGLE_BUFFER_PROG_NAME);
        assert!(matches!(
            k.get(Feature::MultiBufferXdp),
            Availability::Missing(w) if w.contains("xdp.frags")
        ));
        assert_eq!(
            k.missing().map(|(f, _)| f).collect::<Vec<_>>(),
            [Feature::MultiBufferXdp]
        );
    }

    /// The probe failed for another reason (no privileges, no program): taken as missing, so
    /// the single-buffer program, which every kernel the daemon runs on takes, is attached and
    /// the failure reported.
    #[test]
    fn multi_buffer_probe_failed_loads_the_single_buffer_program() {
        for failure in [
            ProbeFailure::Refused(Some(libc::EPERM), "Operation not permitted".to_owned()),
            ProbeFailure::Refused(None, "no errno".to_owned()),
            ProbeFailure::Other("no program xdp_router_mbp".to_owned()),
        ] {
            let mut k = KernelFeatures::all_available();
            k.set(Feature::MultiBufferXdp, multi_buffer_answer(Err(failure)));
            assert_eq!(xdp_program(&k), SINGLE_BUFFER_PROG_NAME);
            assert!(matches!(
                k.get(Feature::MultiBufferXdp),
                Availability::Unknown(w) if w.contains("multi-buffer probe program failed")
            ));
        }
    }
}
