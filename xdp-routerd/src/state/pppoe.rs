//! The managed PPP devices' PPPoE sessions, as the state keeps them: what the last read of
//! `/proc/net/pppoe` found for each ([`crate::sync::pppoe::read`]), the session bound in the
//! datapath ([`State::apply_pppoe`]: bound, rebound, or unbound, where no session is paired
//! and the TC fast path on the device itself may carry it), and the egress shaping and
//! hooks of the devices managed only for that session (its lower device and, for a VLAN lower
//! device, that one's parent), which their flags come from.

use std::collections::BTreeMap;

use tracing::{debug, error, info, warn};
use xdp_router_common::{IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED};

use super::{Ports, SHAPED_UNKNOWN, State, egress::egress_flags};
use crate::{
    datapath::{PppoeBinding, VlanParent},
    sync::{
        hooks::Hooks,
        pppoe::{Found, PppoeReads, SessionRead},
        qdisc::Egress,
        xdp_xmit::Capabilities,
    },
};

/// What the fast path must know of a device managed only for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Its shaping qdisc's kind as last read (`SHAPED_UNKNOWN` until read).
    pub shaper: Option<String>,
    /// Its hooks as last read.
    pub hooks: Hooks,
}

impl Default for Side {
    fn default() -> Side {
        Side {
            shaper: Some(SHAPED_UNKNOWN.into()),
            hooks: Hooks::default(),
        }
    }
}

/// A managed PPP device's session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PppoeState {
    /// What the last read found; `None` before the first read.
    pub found: Option<Found>,
    /// The session bound in the datapath (`found`'s, unless binding it failed).
    pub bound: Option<SessionRead>,
    /// Why binding `found`'s session failed (status).
    pub bind_error: Option<String>,
    /// No session is paired with the device, and the TC fast path runs on it itself
    /// (`Ports::set_pppoe`: L2TP, PPTP, a serial modem, an ambiguous PPPoE session).
    pub unpaired_on_tc: bool,
    /// The bound session's lower device.
    pub lower: Side,
    /// The parent of the bound session's lower device, when that is a VLAN device.
    pub parent: Side,
}

/// A device the bound session needs, as its flags are written: ifindex, name, link kind
/// and what was read of it.
pub struct SideDevice<'a> {
    pub ifindex: u32,
    pub name: &'a str,
    pub kind: Option<&'a str>,
    pub side: &'a Side,
}

impl PppoeState {
    /// The devices the bound session runs over: its lower device, then that one's VLAN
    /// parent (when it is a VLAN device).
    pub fn sides(&self) -> Vec<SideDevice<'_>> {
        let Some(b) = &self.bound else {
            return Vec::new();
        };
        let mut out = vec![SideDevice {
            ifindex: b.lower.ifindex,
            name: &b.session.lower,
            kind: b.lower.kind.as_deref(),
            side: &self.lower,
        }];
        if let Some(v) = &b.lower.vlan {
            out.push(SideDevice {
                ifindex: v.link.parent,
                name: &v.parent_name,
                kind: v.parent_kind.as_deref(),
                side: &self.parent,
            });
        }
        out
    }

    /// Records freshly read hooks of the devices the session runs over (`of`: by name).
    pub fn set_hooks(&mut self, of: impl Fn(&str) -> Hooks) {
        let Some(b) = &self.bound else {
            return;
        };
        self.lower.hooks = of(&b.session.lower);
        if let Some(v) = &b.lower.vlan {
            self.parent.hooks = of(&v.parent_name);
        }
    }

    /// Why the fast path carries nothing of the PPP device (status); `None` while a session
    /// is bound, or while the TC fast path carries the device without one.
    pub fn not_accelerated_because(&self) -> Option<String> {
        if self.bound.is_some() || self.unpaired_on_tc {
            return None;
        }
        Some(match (&self.bind_error, &self.found) {
            (Some(e), _) => e.clone(),
            (None, Some(Err(why))) => why.to_string(),
            (None, Some(Ok(_))) | (None, None) => "its PPPoE session is not read yet".into(),
        })
    }
}

/// The `IFACE_F_*` flags of a device managed only for a session: its own XDP transmit
/// judgement, shaping and hooks (unless `bypass_hooks`), which the kernel's path out of the
/// PPP device meets too.
pub fn side_flags(xmit: &Capabilities, d: &SideDevice<'_>, bypass_hooks: bool) -> u32 {
    egress_flags(
        xmit.of(d.ifindex, d.kind).allowed(),
        d.side.shaper.is_some(),
        d.side.hooks,
        bypass_hooks,
    )
}

impl<D: Ports> State<D> {
    /// The present, attached PPP devices whose sessions must be read, with their
    /// `pppoe_device` (see [`crate::sync::pppoe::read`]).
    pub fn pppoe_devices(&self) -> Vec<(String, Option<String>)> {
        self.ifaces
            .iter()
            .filter(|m| m.pppoe.is_some() && m.mode.is_some() && m.ifindex.is_some())
            .map(|m| (m.cfg.name.clone(), m.cfg.pppoe_device.clone()))
            .collect()
    }

    /// Binds each attached PPP device to the session a read found for it (`found`, by name;
    /// see [`crate::sync::pppoe::read`]): rebinds when the session (ID, peer, lower device)
    /// changed; when it is gone or ambiguous, hands the device to the TC fast path on itself
    /// where the datapath allows, else unbinds it (one warning per change). Returns whether a
    /// session now runs over another device (its qdiscs and hooks must be read).
    pub fn apply_pppoe(&mut self, found: &PppoeReads) -> bool {
        let configured: BTreeMap<u32, bool> = self
            .ifaces
            .iter()
            .filter_map(|m| Some((m.ifindex?, m.mode.is_some())))
            .collect();
        let (mut new_lower, mut rebound) = (false, false);
        let State {
            dp,
            ifaces,
            xmit,
            next_slot,
            parent_slots,
            xdp_mode,
            ..
        } = self;
        for m in ifaces.iter_mut() {
            let (Some(p), Some(ifindex), Some(_)) = (&mut m.pppoe, m.ifindex, m.mode) else {
                continue;
            };
            let Some(f) = found.get(&m.cfg.name) else {
                continue;
            };
            // Unchanged: bound already, or its binding failed (retried when it changes).
            if p.found.as_ref() == Some(f) {
                continue;
            }
            p.found = Some(f.clone());
            p.bind_error = None;
            let want = f.as_ref().ok();
            let name = &m.cfg.name;
            if let Err(why) = f
                && p.bound.is_none()
                && p.unpaired_on_tc
            {
                // Still no session paired: the TC fast path on the device carries it still;
                // `status` says why it is unpaired now.
                dp.reword_unpaired_ppp(name, ifindex, &why.to_string());
                continue;
            }
            let mut slot = |i: u32| match configured.get(&i) {
                // The program runs there for the interface itself: its own entry stays.
                Some(true) => 0,
                _ => *parent_slots.entry(i).or_insert_with(|| {
                    *next_slot += 1;
                    *next_slot - 1
                }),
            };
            let binding = match f {
                Ok(s) => Ok(session_binding(s, xmit, &mut slot)),
                Err(why) => Err(why.to_string()),
            };
            rebound = true;
            match dp.set_pppoe(
                name,
                ifindex,
                binding.as_ref().map_err(String::as_str),
                *xdp_mode,
            ) {
                Ok(carried) => {
                    let lower = |b: &Option<SessionRead>| b.as_ref().map(|b| b.lower.ifindex);
                    if lower(&p.bound) != want.map(|s| s.lower.ifindex) {
                        p.lower = Default::default();
                        p.parent = Default::default();
                        // A device managed for itself has its qdiscs and hooks read already.
                        new_lower |=
                            want.is_some_and(|s| configured.get(&s.lower.ifindex) != Some(&true));
                    }
                    p.bound = want.cloned();
                    p.unpaired_on_tc = want.is_none() && carried;
                    match f {
                        Ok(s) => {
                            info!(interface = %name, "{name}: {}: the fast path carries it", s.session)
                        }
                        Err(why) if carried => info!(
                            interface = %name,
                            "{name}: {why}: the TC fast path on {name} itself carries it"
                        ),
                        Err(why) => warn!(interface = %name, "{name}: not accelerated: {why}"),
                    }
                }
                Err(e) => {
                    let e = format!("{e:#}");
                    error!(interface = %name, error = %e, "{name}: cannot bind its PPPoE session: not accelerated");
                    p.bound = None;
                    p.unpaired_on_tc = false;
                    p.bind_error = Some(e);
                }
            }
        }
        if rebound {
            self.write_session_flags();
        }
        new_lower
    }

    /// The lower devices of the bound sessions that are not managed themselves (and their
    /// VLAN parents): a shaped device (`None`: qdiscs unknown) is not sent out of.
    pub(super) fn apply_session_qdiscs(&mut self, by_ifindex: Option<&BTreeMap<u32, Egress>>) {
        for p in self.ifaces.iter_mut().filter_map(|m| m.pppoe.as_mut()) {
            let shaper = |i: u32| match by_ifindex {
                Some(b) => b.get(&i).and_then(|e| e.shaper.clone()),
                None => Some(SHAPED_UNKNOWN.into()),
            };
            let shapers: Vec<Option<String>> =
                p.sides().iter().map(|d| shaper(d.ifindex)).collect();
            let mut shapers = shapers.into_iter();
            if let Some(s) = shapers.next() {
                p.lower.shaper = s;
            }
            if let Some(s) = shapers.next() {
                p.parent.shaper = s;
            }
        }
        self.write_session_flags();
    }

    /// Writes the flags of every device a bound session runs over that is not managed
    /// itself (see [`side_flags`]).
    pub(super) fn write_session_flags(&mut self) {
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            let (Some(p), Some(_)) = (&m.pppoe, m.mode) else {
                continue;
            };
            for d in p.sides() {
                let Some(&slot) = self.parent_slots.get(&d.ifindex) else {
                    continue;
                };
                if configured.contains(&d.ifindex) {
                    continue;
                }
                let flags = side_flags(&self.xmit, &d, m.cfg.bypass_hooks);
                if let Some(kind) = &d.side.shaper {
                    debug!(interface = %m.cfg.name, lower = %d.name, qdisc = %kind, "{}: its session's device {} is shaped by {kind}: the fast path does not send out of {}", m.cfg.name, d.name, m.cfg.name);
                }
                if let Err(e) = self.dp.set_iface_flags(d.ifindex, slot, flags) {
                    debug!(interface = %d.name, error = %format!("{e:#}"), "cannot update the PPPoE lower device's flags");
                }
            }
        }
    }
}

/// What the datapath gets to bind `s`: the lower device (and, for a VLAN lower device, its
/// parent) with a stats slot from `slot` and, for when it is registered for the session only,
/// its XDP transmit judgement, shaped until its qdiscs are read (see
/// [`State::apply_session_qdiscs`]).
pub(super) fn session_binding(
    s: &SessionRead,
    xmit: &Capabilities,
    slot: &mut impl FnMut(u32) -> u32,
) -> PppoeBinding {
    let flags = |ifindex: u32, kind: Option<&str>| {
        let mut f = IFACE_F_SHAPED;
        if !xmit.of(ifindex, kind).allowed() {
            f |= IFACE_F_NO_XDP_XMIT;
        }
        f
    };
    let l = &s.lower;
    PppoeBinding {
        sid_be: s.session.sid_be,
        peer_mac: s.session.peer,
        lower: VlanParent {
            name: s.session.lower.clone(),
            ifindex: l.ifindex,
            slot: slot(l.ifindex),
            flags: flags(l.ifindex, l.kind.as_deref()),
            mac: l.mac.unwrap_or_default(),
        },
        vlan: l.vlan.as_ref().map(|v| {
            let parent = VlanParent {
                name: v.parent_name.clone(),
                ifindex: v.link.parent,
                slot: slot(v.link.parent),
                flags: flags(v.link.parent, v.parent_kind.as_deref()),
                mac: v.parent_mac.unwrap_or_default(),
            };
            ((v.link.vid, v.link.tpid), parent)
        }),
        ccp: s.ccp,
        not_for_xdp: s.not_for_xdp(),
    }
}
