//! The TC programs' attachments: the arming program on each managed interface's egress, the
//! DSCP stamp on its ingress, and the TC fast path on the ingress of interfaces whose datapath
//! is TC (or behind native XDP for the hand-over). Each goes in as a TCX link (Linux 6.6) where
//! the kernel has them, else as a classic tc filter (a `clsact` qdisc and a `cls_bpf`
//! direct-action filter, which aya attaches through netlink). Which one is decided by trying:
//! the first TCX attachment the kernel refuses as unknown (`EINVAL`, `EOPNOTSUPP`, `ENOTSUPP`:
//! [`tcx_missing`]) turns every later one classic, whatever the version says (distribution
//! kernels backport). Each link records which it got ([`TcHook`], in `status`).
//!
//! # Fail-open without TCX links
//!
//! The daemon's promise is that the kernel carries every packet itself as soon as the daemon
//! is gone, however it ends (SIGKILL included). A TCX or XDP link is a bpf_link the kernel
//! removes with the process; a classic tc filter is not, and stays after the daemon. What a
//! filter left behind would do, per program:
//! - the arming program only writes flow maps nobody reads any more, and never changes a
//!   packet: harmless, but it costs every packet a lookup;
//! - the DSCP stamp writes `skb->tc_index`, which the kernel's own `tcindex` classifier and
//!   `dsmark` qdisc read (6.1 still has both): it could change how those classify;
//! - the TC fast path would keep forwarding offloaded flows from stale maps, past firewall
//!   changes no daemon is there to see: not fail-open at all.
//!
//! So no filter runs one of these programs directly. Each filter runs an entry point of its
//! own (`xr_cls_*`, the eBPF crate's `classic.rs`) that only tail-calls its program through a
//! program array ([`MAP_CLASSIC_TC`]). The kernel empties a program array when the last file
//! descriptor on it is closed (the map's "uref", `prog_array_map_release_uref` in
//! `kernel/bpf/arraymap.c`: exactly so that programs referring to each other do not outlive
//! their loader); the daemon never pins it, so that descriptor is the daemon's own and closes
//! with the process. A filter left behind then tail-calls into an empty slot, the call falls
//! through, and the entry point hands the packet on untouched (`TC_ACT_UNSPEC`, as with no
//! filter): from the daemon's death on, the kernel alone decides, with no timeout involved.
//! The only thing left is the cost of an empty tail call per packet, until the daemon's next
//! start removes every filter running one of its entry points from every interface (by the
//! program name the filter carries). On a clean exit each
//! filter is deleted with its link, and the `clsact` qdisc is left (empty, it changes nothing).
//!
//! Each classic filter has a fixed priority and handle ([`CLASSIC_TC_PREFS`],
//! [`CLASSIC_TC_HANDLE`]), so the daemon knows its own: a listing of the interface's filters
//! (`sync/hooks.rs`) leaves them out. The TC fast path's priority is below the DSCP stamp's, as it
//! runs first among the TCX programs; user filters at a lower priority run before them (with
//! any user filter there, the direction is the kernel's anyway, see `sync/hooks.rs`).

use anyhow::{Context as _, anyhow, bail};
use aya::{
    maps::{MapData, ProgramArray},
    programs::{
        LinkOrder, SchedClassifier, TcAttachType,
        tc::{
            self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttachOptions, TcHandle,
        },
    },
};
use tracing::{debug, error, info, warn};
use xdp_router_common::{
    ARM_L3_PROG_NAME, ARM_PROG_NAME, CLASSIC_ARM_L3_PROG_NAME, CLASSIC_ARM_PROG_NAME,
    CLASSIC_STAMP_PROG_NAME, CLASSIC_TC_HANDLE, CLASSIC_TC_PREFS, CLASSIC_TC_PROG_NAME,
    ClassicSlot, MAP_CLASSIC_TC, STAMP_PROG_NAME, TC_PROG_NAME,
};

use super::{AttachMode, Datapath, verifier};

/// How a TC program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcHook {
    /// A TCX link (Linux 6.6), owned by the daemon's process.
    Tcx,
    /// A classic tc filter (`clsact` + `cls_bpf`), inert once the daemon is gone (see the
    /// module doc).
    Classic,
}

impl TcHook {
    /// Name used in `status` and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            TcHook::Tcx => "tcx",
            TcHook::Classic => "classic tc",
        }
    }
}

/// One TC program attached to one interface.
pub(super) struct TcLink {
    /// The TC program ([`TC_PROG_NAME`], [`ARM_PROG_NAME`], …), whichever way it is attached.
    pub(super) prog: &'static str,
    pub(super) hook: TcHook,
    /// The link, owned by `prog` (TCX) or by its classic entry point (see [`classic_entry`]).
    id: SchedClassifierLinkId,
}

/// What this kernel takes, learnt from the attachments so far.
#[derive(Default)]
pub(super) struct TcAttach {
    /// The kernel refused a TCX link as unknown (the error, for `status` and logs): every TC
    /// program goes in as a classic filter.
    no_tcx: Option<String>,
    /// The classic entry points' program array, filled at the first classic filter. Held
    /// (never pinned) for as long as the daemon runs: see the module doc.
    classic: Option<ProgramArray<MapData>>,
}

/// The priority of the daemon's classic filter running the entry point `entry` (see
/// [`CLASSIC_TC_PREFS`]).
fn classic_pref(entry: &str) -> u16 {
    CLASSIC_TC_PREFS
        .iter()
        .find(|(e, _)| *e == entry)
        .map_or(CLASSIC_TC_PREFS[2].1, |(_, p)| *p)
}

/// The classic entry point of the TC program `prog` and its slot in [`MAP_CLASSIC_TC`].
fn classic_entry(prog: &str) -> anyhow::Result<(&'static str, ClassicSlot)> {
    Ok(match prog {
        TC_PROG_NAME => (CLASSIC_TC_PROG_NAME, ClassicSlot::Tc),
        ARM_PROG_NAME => (CLASSIC_ARM_PROG_NAME, ClassicSlot::Arm),
        ARM_L3_PROG_NAME => (CLASSIC_ARM_L3_PROG_NAME, ClassicSlot::ArmL3),
        STAMP_PROG_NAME => (CLASSIC_STAMP_PROG_NAME, ClassicSlot::Stamp),
        _ => bail!("no classic tc entry point for {prog}"),
    })
}

/// The TC programs with a classic entry point.
const CLASSIC_PROGS: [&str; 4] = [
    TC_PROG_NAME,
    ARM_PROG_NAME,
    ARM_L3_PROG_NAME,
    STAMP_PROG_NAME,
];

/// Whether a refused TCX attachment (errno `errno`) means the kernel has no TCX links: an
/// unknown attach type is `EINVAL` (Linux < 6.6 `link_create`), `EOPNOTSUPP` or `ENOTSUPP`.
/// Anything else (`EPERM`, `ENODEV`…) would refuse a classic filter too. Pure.
pub fn tcx_missing(errno: Option<i32>) -> bool {
    /// The kernel-internal `ENOTSUPP`, which reaches user space as 524.
    const ENOTSUPP: i32 = 524;
    matches!(errno, Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP))
}

/// The errno under `err`, if any.
fn errno_of(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.raw_os_error();
        }
        source = e.source();
    }
    None
}

impl Datapath {
    /// The program `prog` (a [`SchedClassifier`]).
    fn classifier(&mut self, prog: &str) -> anyhow::Result<&mut SchedClassifier> {
        let p = self
            .ebpf
            .program_mut(prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {prog}"))?;
        Ok(<&mut SchedClassifier>::try_from(p)?)
    }

    /// Attaches the TC program `prog` to `name` at `at`: a TCX link (first among the TCX
    /// programs there when `first`), or where the kernel has none a classic filter (see the
    /// module doc).
    pub(super) fn attach_tc(
        &mut self,
        name: &str,
        prog: &'static str,
        at: TcAttachType,
        first: bool,
    ) -> anyhow::Result<TcLink> {
        if self.tc_attach.no_tcx.is_none() {
            let order = if first {
                LinkOrder::first()
            } else {
                LinkOrder::default()
            };
            match self.classifier(prog)?.attach_with_options(
                name,
                at,
                TcAttachOptions::TcxOrder(order),
            ) {
                Ok(id) => {
                    return Ok(TcLink {
                        prog,
                        hook: TcHook::Tcx,
                        id,
                    });
                }
                Err(e) if tcx_missing(errno_of(&e)) => {
                    info!(
                        interface = name,
                        error = %e,
                        "the kernel has no TCX links (Linux < 6.6): the TC programs go in as \
                         classic tc filters (clsact, cls_bpf), inert once the daemon is gone"
                    );
                    self.tc_attach.no_tcx = Some(e.to_string());
                }
                Err(e) => return Err(anyhow!("{name}: {prog}: TCX attach: {e}")),
            }
        }
        let id = self.attach_classic(name, prog, at)?;
        Ok(TcLink {
            prog,
            hook: TcHook::Classic,
            id,
        })
    }

    /// Attaches `prog`'s classic entry point to `name` at `at` as a `cls_bpf` filter at the
    /// daemon's priority and handle, after the `clsact` qdisc; a filter of the daemon's found
    /// there (left by a killed daemon) is replaced.
    fn attach_classic(
        &mut self,
        name: &str,
        prog: &'static str,
        at: TcAttachType,
    ) -> anyhow::Result<SchedClassifierLinkId> {
        self.classic_ready()?;
        match tc::qdisc_add_clsact(name) {
            Ok(()) => {}
            Err(e) if errno_of(&e) == Some(libc::EEXIST) => {}
            Err(e) => bail!("{name}: cannot add the clsact qdisc: {e}"),
        }
        let (entry, _) = classic_entry(prog)?;
        let (priority, handle) = (classic_pref(entry), TcHandle::from(CLASSIC_TC_HANDLE));
        let options = || {
            TcAttachOptions::Netlink(NlOptions {
                priority,
                handle,
                classid: None,
            })
        };
        let program = self.classifier(entry)?;
        match program.attach_with_options(name, at, options()) {
            Ok(id) => Ok(id),
            Err(e) if errno_of(&e) == Some(libc::EEXIST) => {
                // One of the daemon's filters, left behind (the sweep at start missed it).
                SchedClassifierLink::attached(name, at, priority, handle, None)
                    .map_err(aya::programs::ProgramError::from)
                    .and_then(aya::programs::Link::detach)
                    .with_context(|| format!("{name}: cannot remove a stale {entry} filter"))?;
                Ok(self
                    .classifier(entry)?
                    .attach_with_options(name, at, options())?)
            }
            Err(e) => Err(anyhow!("{name}: {prog}: classic tc filter: {e}")),
        }
    }

    /// Before the first classic filter: loads the classic entry points, fills their program
    /// array with the TC programs, and removes every classic filter of the daemon's left on any
    /// interface (a killed daemon's: inert, see the module doc).
    fn classic_ready(&mut self) -> anyhow::Result<()> {
        if self.tc_attach.classic.is_some() {
            return Ok(());
        }
        let map = self
            .ebpf
            .take_map(MAP_CLASSIC_TC)
            .ok_or_else(|| anyhow!("eBPF object has no map {MAP_CLASSIC_TC}"))?;
        let mut array = ProgramArray::try_from(map)
            .with_context(|| format!("map {MAP_CLASSIC_TC} has an unexpected type"))?;
        for prog in CLASSIC_PROGS {
            let (entry, slot) = classic_entry(prog)?;
            let p = self.classifier(entry)?;
            if p.fd().is_err() {
                p.load().map_err(|e| {
                    verifier::refusal("the kernel rejected a classic tc entry point", entry, e)
                })?;
            }
            if prog == TC_PROG_NAME && self.tc_unavailable.is_some() {
                // Not loaded: its slot stays empty and nothing attaches it.
                continue;
            }
            array
                .set(slot as u32, self.classifier(prog)?.fd()?, 0)
                .with_context(|| format!("cannot put {prog} into {MAP_CLASSIC_TC}"))?;
        }
        self.tc_attach.classic = Some(array);
        self.sweep_classic();
        Ok(())
    }

    /// Removes the daemon's classic filters (by the entry point each one runs) from the ingress
    /// and egress of every interface: those of a daemon that was killed.
    fn sweep_classic(&self) {
        let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
            return;
        };
        for name in dir
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
        {
            for prog in CLASSIC_PROGS {
                let Ok((entry, _)) = classic_entry(prog) else {
                    continue;
                };
                let at = if matches!(prog, TC_PROG_NAME | STAMP_PROG_NAME) {
                    TcAttachType::Ingress
                } else {
                    TcAttachType::Egress
                };
                match tc::qdisc_detach_program(&name, at, entry) {
                    Ok(()) => info!(
                        interface = name,
                        "removed a classic tc filter left by an earlier daemon ({entry})"
                    ),
                    // None there (or no clsact qdisc at all).
                    Err(e) => debug!(interface = name, error = %e, "no {entry} filter to remove"),
                }
            }
        }
    }

    /// Takes `link` off its interface.
    pub(super) fn detach_tc(&mut self, link: TcLink) {
        let owner = match link.hook {
            TcHook::Tcx => Some(link.prog),
            TcHook::Classic => classic_entry(link.prog).ok().map(|(entry, _)| entry),
        };
        if let Some(owner) = owner
            && let Ok(p) = self.classifier(owner)
            && let Err(e) = p.detach(link.id)
        {
            warn!(prog = link.prog, error = %e, "cannot detach a TC program");
        }
    }

    /// How this kernel takes TC programs, found by attaching the DSCP stamp to the loopback
    /// device's ingress as a TCX link for a moment (`check-system`; the daemon learns it from
    /// its first attachment): [`TcHook::Tcx`], or [`TcHook::Classic`] where the kernel refuses
    /// TCX links as unknown; the error when the attempt failed otherwise.
    pub fn probe_tc_hook(&mut self) -> Result<TcHook, String> {
        let p = self
            .classifier(STAMP_PROG_NAME)
            .map_err(|e| format!("{e:#}"))?;
        match p.attach_with_options(
            "lo",
            TcAttachType::Ingress,
            TcAttachOptions::TcxOrder(LinkOrder::default()),
        ) {
            Ok(id) => {
                let _ = p.detach(id);
                Ok(TcHook::Tcx)
            }
            Err(e) if tcx_missing(errno_of(&e)) => Ok(TcHook::Classic),
            Err(e) => Err(format!("a TCX link on lo: {e}")),
        }
    }

    /// How the TC programs are attached to `ifindex` (`None`: none is).
    pub fn tc_hook(&self, ifindex: u32) -> Option<TcHook> {
        let l = &self.links;
        l.armed
            .get(&ifindex)
            .or_else(|| l.tc.get(&ifindex))
            .or_else(|| l.stamped.get(&ifindex))
            .map(|t| t.hook)
    }

    /// Why the TC programs go in as classic filters here, once the kernel refused a TCX link.
    pub fn no_tcx_because(&self) -> Option<&str> {
        self.tc_attach.no_tcx.as_deref()
    }

    /// Attaches the arming program `prog` ([`ARM_PROG_NAME`], or [`ARM_L3_PROG_NAME`] for a
    /// device without a link-layer header) to the egress of `name`, owned by this process like
    /// the XDP links (or inert without it, see the module doc). Without it no flow direction
    /// is ever armed: the kernel keeps forwarding every packet of that interface's flows
    /// (correct, not faster). With the Ethernet arming program, the DSCP stamp goes on the
    /// ingress (see [`STAMP_PROG_NAME`]); without it, the kernel keeps applying its DSCP
    /// rewrites itself.
    pub(super) fn attach_arming(&mut self, name: &str, ifindex: u32, prog: &'static str) {
        if prog == ARM_PROG_NAME && !self.links.stamped.contains_key(&ifindex) {
            match self.attach_tc(name, STAMP_PROG_NAME, TcAttachType::Ingress, false) {
                Ok(link) => {
                    self.links.stamped.insert(ifindex, link);
                }
                Err(e) => warn!(
                    interface = name,
                    error = %format!("{e:#}"),
                    "{name}: cannot attach the TC ingress DSCP stamp: DSCP rewrites of flows \
                     entering here stay in the kernel"
                ),
            }
        }
        match self.attach_tc(name, prog, TcAttachType::Egress, false) {
            Ok(link) => {
                self.links.armed.insert(ifindex, link);
            }
            Err(e) => error!(
                interface = name,
                error = %format!("{e:#}"),
                "{name}: cannot attach the TC egress arming program: no flow through {name} is \
                 fast-pathed, the kernel forwards them all"
            ),
        }
    }

    /// Detaches the arming program (and the DSCP stamp) from `ifindex`, if attached there.
    pub(super) fn detach_arming(&mut self, ifindex: u32) {
        if let Some(link) = self.links.stamped.remove(&ifindex) {
            self.detach_tc(link);
        }
        if let Some(link) = self.links.armed.remove(&ifindex) {
            self.detach_tc(link);
        }
    }

    /// Attaches the TC fast path ([`TC_PROG_NAME`]) to the ingress of `name`, first among the
    /// TC ingress programs (before the DSCP stamp: a packet it forwards needs no stamp), and
    /// records it as the datapath of `ifindex`.
    pub(super) fn attach_tc_program(&mut self, name: &str, ifindex: u32) -> anyhow::Result<()> {
        let link = self.attach_tc_link(name)?;
        let hook = link.hook;
        self.links.tc.insert(ifindex, link);
        self.links.modes.insert(ifindex, AttachMode::Tc);
        info!(
            interface = name,
            ifindex,
            mode = "tc",
            hook = hook.as_str(),
            "TC fast path attached (ingress)"
        );
        Ok(())
    }

    /// The ingress link of the TC fast path on `name`, first among the TC ingress programs.
    pub(super) fn attach_tc_link(&mut self, name: &str) -> anyhow::Result<TcLink> {
        if let Some(why) = &self.tc_unavailable {
            bail!("{name}: datapath \"tc\": the TC fast path did not load: {why}");
        }
        self.attach_tc(name, TC_PROG_NAME, TcAttachType::Ingress, true)
            .with_context(|| format!("{name}: cannot attach the TC fast path at TC ingress"))
    }

    /// Takes the TC fast path off `ifindex`, if it runs there.
    pub(super) fn detach_tc_program(&mut self, ifindex: u32) {
        if let Some(link) = self.links.tc.remove(&ifindex) {
            self.detach_tc(link);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unknown_attach_type_means_no_tcx() {
        assert!(tcx_missing(Some(libc::EINVAL)));
        assert!(tcx_missing(Some(libc::EOPNOTSUPP)));
        assert!(tcx_missing(Some(524)));
        assert!(!tcx_missing(Some(libc::EPERM)));
        assert!(!tcx_missing(Some(libc::ENODEV)));
        assert!(!tcx_missing(None));
    }

    #[test]
    fn every_tc_program_has_its_own_entry_point_and_slot() {
        let mut slots: Vec<u32> = CLASSIC_PROGS
            .iter()
            .map(|p| classic_entry(p).unwrap().1 as u32)
            .collect();
        slots.sort();
        assert_eq!(slots, (0..ClassicSlot::COUNT).collect::<Vec<_>>());
        assert!(classic_entry(xdp_router_common::PROG_NAME).is_err());
        // The TC fast path runs before the DSCP stamp on ingress.
        assert!(classic_pref(CLASSIC_TC_PROG_NAME) < classic_pref(CLASSIC_STAMP_PROG_NAME));
        // Each entry point at a priority of its own.
        let mut prefs: Vec<u16> = CLASSIC_TC_PREFS.iter().map(|(_, p)| *p).collect();
        prefs.dedup();
        assert_eq!(prefs.len(), CLASSIC_TC_PREFS.len());
    }
}
