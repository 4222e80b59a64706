//! Attaching the programs: the XDP program (native, or generic when native is refused or
//! configured) or, where the config asks for it (`datapath = "tc"`), the same fast path at TC
//! ingress; the XDP links are bpf_links owned by this process. The TC programs' attachments
//! (TCX links, or classic tc filters where the kernel has none) are in [`super::tc_links`].

use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow, bail};
use aya::programs::{Xdp, XdpMode, links::LinkType, loaded_links, xdp::XdpLinkId};
use tracing::{debug, info, warn};
use xdp_router_common::{
    ARM_PROG_NAME, IFACE_F_BRIDGE_PORT, IFACE_F_GENERIC_XDP, IFACE_F_NO_XDP_XMIT,
    IFACE_F_TC_HANDOFF, IfaceInfo, MAP_IFACES, MAP_TX_PORTS, MAX_IFACE_SLOTS,
};

use super::{Datapath, Ports as _, VlanParent, tc_links::TcLink};
use crate::config::{DatapathConfig, XdpModeConfig};

/// How the program ended up attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    Native,
    Generic,
    /// A bridge: the program runs on its ports (each with its own mode), not on it.
    Ports,
    /// A PPP device: never on it; the program runs on its PPPoE session's lower device (see
    /// [`Ports::attach_ppp`](super::Ports::attach_ppp)).
    Lower,
    /// The TC ingress program ([`TC_PROG_NAME`]) instead of XDP (`datapath = "tc"`).
    Tc,
}

impl AttachMode {
    /// Name used in `status` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Ports => "ports",
            AttachMode::Lower => "lower",
            AttachMode::Tc => "tc",
        }
    }
}

/// Which datapath each interface is to get, from the config (see [`DatapathConfig`]).
#[derive(Debug, Default, Clone)]
pub struct DatapathChoice {
    /// The global `datapath`.
    pub default: DatapathConfig,
    /// Interfaces that set their own.
    pub per_iface: BTreeMap<String, DatapathConfig>,
}

impl DatapathChoice {
    /// The choice for `name` and where it comes from (for `status`).
    pub fn of(&self, name: &str) -> (DatapathConfig, &'static str) {
        match self.per_iface.get(name) {
            Some(c) => (*c, "its [[interface]] section"),
            None => (self.default, "the global setting"),
        }
    }
}

/// The links this process owns, by ifindex: what is attached where, and how.
#[derive(Default)]
pub(super) struct Links {
    /// XDP links.
    pub(super) xdp: BTreeMap<u32, XdpLinkId>,
    /// The mode the XDP program got on each interface in `xdp`.
    pub(super) modes: BTreeMap<u32, AttachMode>,
    /// Why the interfaces in generic mode did not get native XDP (config asked for native).
    pub(super) generic_because: BTreeMap<u32, String>,
    /// TC egress links of the arming programs ([`ARM_PROG_NAME`], or
    /// [`ARM_L3_PROG_NAME`](xdp_router_common::ARM_L3_PROG_NAME) on a PPP device).
    pub(super) armed: BTreeMap<u32, TcLink>,
    /// TC ingress links of the DSCP stamp program
    /// ([`STAMP_PROG_NAME`](xdp_router_common::STAMP_PROG_NAME)), beside each Ethernet arming
    /// program.
    pub(super) stamped: BTreeMap<u32, TcLink>,
    /// TC ingress links of the TC fast path
    /// ([`TC_PROG_NAME`](xdp_router_common::TC_PROG_NAME)), on interfaces whose datapath is TC
    /// (their mode in `modes` is [`AttachMode::Tc`]) or behind native XDP (the hand-over).
    pub(super) tc: BTreeMap<u32, TcLink>,
    /// Why each attached interface runs the datapath it runs (for `status`).
    pub(super) datapath_because: BTreeMap<u32, String>,
    /// The name each registered interface had when it was registered (TC attachments are by
    /// name).
    pub(super) names: BTreeMap<u32, String>,
}

impl Datapath {
    /// Whether the XDP program attached takes multi-buffer frames.
    fn multi_buffer(&self) -> bool {
        self.features
            .usable(crate::kernel_features::Feature::MultiBufferXdp)
    }

    /// The XDP program.
    fn program(&mut self) -> anyhow::Result<&mut Xdp> {
        Ok(self
            .ebpf
            .program_mut(self.xdp_prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {}", self.xdp_prog))?
            .try_into()?)
    }

    /// The mode the program runs in on `ifindex`; `None` where it is not attached.
    pub fn mode_of(&self, ifindex: u32) -> Option<AttachMode> {
        self.links.modes.get(&ifindex).copied()
    }

    /// The mode the program got on `ifindex`, where it is attached.
    pub(super) fn attached_mode(&self, ifindex: u32) -> AttachMode {
        self.links
            .modes
            .get(&ifindex)
            .copied()
            .unwrap_or(AttachMode::Native)
    }

    /// Writes `info` for `ifindex`, its `TX_PORTS` entry (unless it cannot transmit XDP frames)
    /// and attaches the program (and the arming program when `arm`).
    pub(super) fn register(
        &mut self,
        name: &str,
        ifindex: u32,
        info: IfaceInfo,
        mode: XdpModeConfig,
        arm: bool,
    ) -> anyhow::Result<AttachMode> {
        let (slot, mut flags) = (info.slot, info.flags);
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        if self.tc_handoff(ifindex) {
            // Registered again (for a device over it) with the TC program behind XDP: the
            // flag stays with the link, or the TC program would take every packet XDP passed
            // for its own.
            flags |= IFACE_F_TC_HANDOFF;
        }
        // Generic until the attachment is known to be native (see IFACE_F_GENERIC_XDP).
        let info = IfaceInfo {
            flags: flags | IFACE_F_GENERIC_XDP,
            ..info
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        // A device that cannot transmit XDP frames is no redirect target.
        if flags & IFACE_F_NO_XDP_XMIT == 0 {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .with_context(|| format!("{name}: cannot add to {MAP_TX_PORTS}"))?;
        }
        self.links.names.insert(ifindex, name.to_string());
        let (choice, from) = self.datapath_choice.of(name);
        // Where the TC fast path may run instead of XDP: an interface managed for itself
        // (`arm`) or a bridge's port. A VLAN parent registered here runs XDP for its VLANs (a
        // VLAN device whose parent has no native XDP runs the TC fast path itself, see
        // `vlan_on_tc`); PPPoE lower devices keep XDP for now.
        let tc_capable = arm || flags & IFACE_F_BRIDGE_PORT != 0;
        let mode = if self.links.xdp.contains_key(&ifindex) {
            // The program already runs there for a VLAN device over it (see
            // `attach_vlan`): the interface is now managed itself too.
            self.attached_mode(ifindex)
        } else if self.links.tc.contains_key(&ifindex) {
            // Registered again while the TC program runs there.
            AttachMode::Tc
        } else if choice == DatapathConfig::Tc && tc_capable {
            match self.attach_tc_program(name, ifindex) {
                Ok(()) => {
                    self.links
                        .datapath_because
                        .insert(ifindex, format!("datapath = \"tc\" in {from}"));
                    AttachMode::Tc
                }
                Err(e) => {
                    let _ = self.ifaces.remove(&ifindex);
                    let _ = self.tx_ports.remove(ifindex);
                    return Err(e);
                }
            }
        } else if choice == DatapathConfig::Auto
            && tc_capable
            && mode == XdpModeConfig::Native
            && self.tc_unavailable.is_none()
        {
            match self.attach_auto(name, ifindex, from) {
                Ok(mode) => mode,
                Err(e) => {
                    let _ = self.ifaces.remove(&ifindex);
                    let _ = self.tx_ports.remove(ifindex);
                    return Err(e);
                }
            }
        } else {
            let because = if choice == DatapathConfig::Tc {
                warn!(
                    interface = name,
                    "{name}: datapath = \"tc\" does not apply to the lower device of a PPPoE \
                     session or of a VLAN device that runs XDP: XDP runs there"
                );
                format!(
                    "datapath = \"tc\" in {from}, but the lower device of a PPPoE session or \
                     of a VLAN device that runs XDP keeps XDP"
                )
            } else {
                format!("datapath = \"{}\" in {from}", choice.as_str())
            };
            self.links.datapath_because.insert(ifindex, because);
            match self.attach_program(name, ifindex, mode) {
                Ok(mode) => mode,
                Err(e) => {
                    let _ = self.ifaces.remove(&ifindex);
                    let _ = self.tx_ports.remove(ifindex);
                    return Err(e);
                }
            }
        };
        if matches!(mode, AttachMode::Native | AttachMode::Tc) {
            // The TC program runs on skbs with their checksum state (see the eBPF `tc.rs`):
            // what generic XDP cannot rewrite, it can.
            self.update_iface(ifindex, IfaceInfo { flags, ..info })?;
        }
        if arm && !self.links.armed.contains_key(&ifindex) {
            self.attach_arming(name, ifindex, ARM_PROG_NAME);
        }
        self.update_handoffs();
        Ok(mode)
    }

    /// `datapath = "auto"` on an interface managed for itself or a bridge port: native XDP
    /// where the driver takes it, else the TC fast path (not generic XDP, which forwards
    /// nothing), else, if the TC program cannot be attached either, generic XDP as before.
    fn attach_auto(&mut self, name: &str, ifindex: u32, from: &str) -> anyhow::Result<AttachMode> {
        let refused = match self.attach_native(name, ifindex)? {
            Ok(()) => {
                self.links.datapath_because.insert(
                    ifindex,
                    format!("datapath = \"auto\" in {from}: native XDP"),
                );
                return Ok(AttachMode::Native);
            }
            Err(refused) => refused,
        };
        let why = native_attach_failure(&refused, self.multi_buffer());
        match self.attach_tc_program(name, ifindex) {
            Ok(()) => {
                info!(
                    interface = name,
                    error = %refused,
                    "{name}: native XDP refused ({why}): the TC fast path runs there instead"
                );
                self.links.datapath_because.insert(
                    ifindex,
                    format!("datapath = \"auto\" in {from}, and native XDP was refused: {why}"),
                );
                Ok(AttachMode::Tc)
            }
            Err(tc_err) => {
                warn!(
                    interface = name,
                    error = %format!("{tc_err:#}"),
                    "{name}: native XDP refused ({why}) and the TC fast path cannot be \
                     attached: generic XDP (nothing is forwarded there)"
                );
                self.links
                    .datapath_because
                    .insert(ifindex, format!("datapath = \"auto\" in {from}"));
                self.attach_program(name, ifindex, XdpModeConfig::Generic)
                    .inspect(|_| {
                        self.links.generic_because.insert(ifindex, why);
                    })
            }
        }
    }

    /// Puts the TC fast path behind the XDP program ([`IFACE_F_TC_HANDOFF`]) on every
    /// interface that runs native XDP (managed for itself, a bridge's port, or the device
    /// under a VLAN device or a PPPoE session), once some interface runs the TC datapath: XDP
    /// cannot redirect into such a port (no XDP transmit), so packets of offloaded flows
    /// routed there are handed to the TC program at the same ingress instead of the kernel.
    /// Left in place when the last TC port goes (the XDP program then has nothing to hand over
    /// but to ports without XDP transmit, which TC serves as well).
    pub(super) fn update_handoffs(&mut self) {
        if self.tc_unavailable.is_some() || !self.links.modes.values().any(|m| *m == AttachMode::Tc)
        {
            return;
        }
        let natives: Vec<u32> = self
            .links
            .modes
            .iter()
            .filter(|(i, m)| **m == AttachMode::Native && !self.links.tc.contains_key(i))
            .map(|(i, _)| *i)
            .collect();
        for ifindex in natives {
            if let Err(e) = self.attach_handoff(ifindex) {
                warn!(
                    ifindex,
                    error = %format!("{e:#}"),
                    "cannot put the TC fast path behind XDP: packets routed from there to a \
                     port without XDP transmit stay in the kernel"
                );
            }
        }
    }

    /// [`Datapath::update_handoffs`] for one interface: the TC program first, then the flag.
    fn attach_handoff(&mut self, ifindex: u32) -> anyhow::Result<()> {
        let name = self
            .links
            .names
            .get(&ifindex)
            .cloned()
            .unwrap_or_else(|| ifindex.to_string());
        let link = self.attach_tc_link(&name)?;
        let hook = link.hook;
        self.links.tc.insert(ifindex, link);
        let info = self.iface(ifindex)?;
        self.update_iface(
            ifindex,
            IfaceInfo {
                flags: info.flags | IFACE_F_TC_HANDOFF,
                ..info
            },
        )?;
        info!(
            interface = name,
            ifindex,
            hook = hook.as_str(),
            "TC fast path attached behind XDP (hand-over to ports without XDP transmit)"
        );
        Ok(())
    }

    /// Whether the TC fast path runs behind XDP on `ifindex` (see
    /// [`Datapath::update_handoffs`]).
    pub fn tc_handoff(&self, ifindex: u32) -> bool {
        self.mode_of(ifindex) == Some(AttachMode::Native) && self.links.tc.contains_key(&ifindex)
    }

    /// Makes the TC fast path run on `ifindex` (`name`), a device that gets it instead of XDP
    /// on the device under it (a VLAN or PPP device) or without a link-layer header, and
    /// records why (`because`, for `status`).
    pub(super) fn run_tc_on(
        &mut self,
        name: &str,
        ifindex: u32,
        because: String,
    ) -> anyhow::Result<()> {
        self.links.names.insert(ifindex, name.to_string());
        if !self.links.tc.contains_key(&ifindex) {
            self.attach_tc_program(name, ifindex)?;
        }
        self.links.datapath_because.insert(ifindex, because);
        Ok(())
    }

    /// `datapath = "auto"` (in `from`) for the device `name` over `host`, where the program
    /// would run for it: native XDP on `host` if its driver takes it (`None`: attached, and
    /// kept for `name`; its entry is written when `name` is registered), else why the driver
    /// refused it (see [`native_attach_failure`]), for the TC fast path on `name` itself.
    pub(super) fn native_on_host_or_why(
        &mut self,
        name: &str,
        host: &VlanParent,
        from: &str,
    ) -> anyhow::Result<Option<String>> {
        match self.attach_native(&host.name, host.ifindex)? {
            Ok(()) => {
                self.links.datapath_because.insert(
                    host.ifindex,
                    format!("datapath = \"auto\" in {from} (for {name}): native XDP"),
                );
                Ok(None)
            }
            Err(refused) => {
                let why = native_attach_failure(&refused, self.multi_buffer());
                info!(
                    interface = name,
                    host = %host.name,
                    error = %refused,
                    "{name}: native XDP refused on {} ({why}): the TC fast path runs on {name} \
                     instead",
                    host.name
                );
                Ok(Some(why))
            }
        }
    }

    /// Attaches the XDP program to `ifindex` in `mode` (native falling back to generic, with
    /// the reason kept for `status`), and makes sure the kernel made it a bpf_link.
    fn attach_program(
        &mut self,
        name: &str,
        ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        if mode == XdpModeConfig::Native {
            let native_err = match self.attach_native(name, ifindex)? {
                Ok(()) => return Ok(AttachMode::Native),
                Err(e) => e,
            };
            let why = native_attach_failure(&native_err, self.multi_buffer());
            warn!(
                interface = name,
                error = %native_err,
                "{name}: native XDP attach failed: {why}; falling back to generic XDP \
                 (much slower)"
            );
            let link = self
                .program()?
                .attach_to_if_index(ifindex, XdpMode::Skb)
                .map_err(|e| {
                    anyhow!("{name}: cannot attach XDP: native: {native_err}; generic: {e}")
                })?;
            self.links.generic_because.insert(ifindex, why);
            self.keep_xdp_link(name, ifindex, link, AttachMode::Generic)?;
            return Ok(AttachMode::Generic);
        }
        let link = self
            .program()?
            .attach_to_if_index(ifindex, XdpMode::Skb)
            .map_err(|e| anyhow!("{name}: cannot attach XDP (generic mode): {e}"))?;
        self.keep_xdp_link(name, ifindex, link, AttachMode::Generic)?;
        Ok(AttachMode::Generic)
    }

    /// Attaches the XDP program natively to `ifindex`; `Ok(Err(_))` with the kernel's error
    /// when the driver refuses (see [`native_attach_failure`]).
    fn attach_native(
        &mut self,
        name: &str,
        ifindex: u32,
    ) -> anyhow::Result<Result<(), aya::programs::ProgramError>> {
        match self.program()?.attach_to_if_index(ifindex, XdpMode::Driver) {
            Ok(link) => {
                self.keep_xdp_link(name, ifindex, link, AttachMode::Native)?;
                Ok(Ok(()))
            }
            Err(e) => Ok(Err(e)),
        }
    }

    /// Records the XDP `link` on `ifindex`, attached in mode `got`, after making sure the
    /// kernel made it a bpf_link.
    fn keep_xdp_link(
        &mut self,
        name: &str,
        ifindex: u32,
        link: XdpLinkId,
        got: AttachMode,
    ) -> anyhow::Result<()> {
        self.links.xdp.insert(ifindex, link);
        self.links.modes.insert(ifindex, got);
        // Fail-open relies on every attachment being a bpf_link owned by this process, which the
        // kernel removes when the process goes away. aya falls back to a netlink attach when
        // bpf_link_create() answers EINVAL (kernels before 5.9); such an attachment would
        // outlive a killed daemon and keep forwarding from stale maps, so refuse it.
        match self.owned_xdp_links() {
            Ok(n) if n == self.links.xdp.len() => {}
            Ok(n) => {
                self.detach(ifindex);
                bail!(
                    "{name}: the kernel attached XDP without a bpf_link ({n} links for {} \
                     attachments); refusing, since it would outlive the daemon (Linux >= 5.9 needed)",
                    self.links.xdp.len() + 1
                );
            }
            // Enumerating links needs CAP_SYS_ADMIN, which the least-privilege systemd unit
            // does not grant; `load` already refused kernels without XDP bpf_links.
            Err(e) => {
                debug!(interface = name, error = %format!("{e:#}"), "cannot verify the XDP link")
            }
        }
        info!(
            interface = name,
            ifindex,
            mode = got.as_str(),
            "XDP program attached"
        );
        Ok(())
    }

    /// Number of XDP bpf_links that point at our program (one per attached interface).
    fn owned_xdp_links(&self) -> anyhow::Result<usize> {
        let prog: &Xdp = self
            .ebpf
            .program(self.xdp_prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {}", self.xdp_prog))?
            .try_into()?;
        let id = prog.info()?.id();
        let mut n = 0;
        for link in loaded_links() {
            let link = link.context("cannot list BPF links")?;
            if link.program_id() == id && matches!(link.link_type(), Ok(LinkType::Xdp)) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Takes the XDP program off `ifindex` and forgets its mode (see
    /// [`Datapath::attach_program`]).
    pub(super) fn detach_program(&mut self, ifindex: u32) {
        if let Some(link) = self.links.xdp.remove(&ifindex)
            && let Ok(prog) = self.program()
        {
            let _ = prog.detach(link);
        }
        self.detach_tc_program(ifindex);
        self.links.datapath_because.remove(&ifindex);
        self.links.generic_because.remove(&ifindex);
        self.links.modes.remove(&ifindex);
        self.links.names.remove(&ifindex);
    }

    /// Detaches from every interface (shutdown): the kernel carries everything again, whoever
    /// still holds a reference to the datapath.
    pub fn detach_all(&mut self) {
        // The PPP devices first: their lower devices are then detached, not kept for them.
        let ifindexes: Vec<u32> = self
            .pppoe
            .devices
            .keys()
            .chain(self.links.xdp.keys())
            .chain(self.links.tc.keys())
            .chain(self.links.armed.keys())
            .copied()
            .collect();
        for ifindex in ifindexes {
            self.detach(ifindex);
        }
    }

    /// Sets which datapath each interface gets when it is attached (before the first).
    pub fn set_datapath_choice(&mut self, choice: DatapathChoice) {
        self.datapath_choice = choice;
    }

    /// Which datapath `ifindex` runs (`xdp`, `tc`) and why; `None` when not attached itself.
    pub fn datapath_because(&self, ifindex: u32) -> Option<&str> {
        self.links
            .datapath_because
            .get(&ifindex)
            .map(String::as_str)
    }

    /// Why `ifindex` runs generic XDP although native was asked for (see
    /// [`native_attach_failure`]); `None` when native or not attached.
    pub fn generic_because(&self, ifindex: u32) -> Option<&str> {
        self.links.generic_because.get(&ifindex).map(String::as_str)
    }
}

/// Why the kernel refused a native (driver mode) XDP attachment, from the errno of the
/// failed call. An XDP bpf_link attach returns no extack text (the kernel's message goes only
/// to the `xdp:bpf_xdp_link_attach_failed` tracepoint), so the errnos the drivers use are
/// mapped here (`dev_xdp_attach` in `net/core/dev.c`, `veth_xdp_set` in
/// `drivers/net/veth.c`).
///
/// `multi_buffer`: whether the program attached takes multi-buffer frames (see
/// [`crate::kernel_features::Feature::MultiBufferXdp`]), which decides what a too large MTU means.
pub fn native_attach_failure(
    err: &(dyn std::error::Error + 'static),
    multi_buffer: bool,
) -> String {
    let mut source = Some(err);
    let mut errno = None;
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            errno = io.raw_os_error();
            break;
        }
        source = e.source();
    }
    match errno {
        Some(libc::ERANGE) if !multi_buffer => "the MTU needs multi-buffer XDP, which this \
             kernel lacks (multi_buffer_xdp: the program is loaded without it, so each frame \
             must fit in one page, about 3 500 bytes); lower it for native XDP"
            .into(),
        Some(libc::ERANGE) => "the MTU is too large for this driver's native XDP (the program \
             takes multi-buffer frames, but the driver does not: it needs each frame in one \
             page, about 3 500 bytes); lower it for native XDP"
            .into(),
        Some(libc::EOPNOTSUPP) => {
            "the driver has no native XDP (a bridge, a bond or VLAN device, or an old driver)"
                .into()
        }
        Some(libc::ENOSPC) => {
            "fewer RX queues than its veth peer has TX queues (create it with numrxqueues >= \
             the peer's numtxqueues)"
                .into()
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            "another XDP program is already attached to it".into()
        }
        Some(libc::ENOTCONN) => "a veth without a peer".into(),
        Some(n) => format!(
            "the kernel refused it ({})",
            std::io::Error::from_raw_os_error(n)
        ),
        None => format!("{err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::native_attach_failure;

    /// A driver's ERANGE (the MTU needs frames longer than a page) names the missing kernel
    /// feature where the program attached is the single-buffer one.
    #[test]
    fn a_too_large_mtu_names_multi_buffer_xdp_only_where_the_kernel_lacks_it() {
        let erange = std::io::Error::from_raw_os_error(libc::ERANGE);
        let without = native_attach_failure(&erange, false);
        assert!(without.contains("multi_buffer_xdp"), "{without}");
        let with = native_attach_failure(&erange, true);
        assert!(with.contains("the driver does not"), "{with}");
        assert!(!with.contains("multi_buffer_xdp"), "{with}");
    }
}
