//! The PPPoE session of a managed PPP device, as the state keeps it: what the last read of
//! `/proc/net/pppoe` found for it ([`crate::sync::pppoe::read`]), the session bound in the
//! datapath, and the egress shaping and hooks of the devices managed only for that session
//! (its lower device and, for a VLAN lower device, that one's parent), which their flags come
//! from. The binding itself is [`super::State::apply_pppoe`].

use super::SHAPED_UNKNOWN;
use crate::sync::{
    hooks::Hooks,
    pppoe::{Found, SessionRead},
    xdp_xmit::Capabilities,
};

/// What the fast path must know of a device managed only for a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Side {
    /// Its shaping qdisc's kind as last read ([`SHAPED_UNKNOWN`] until read).
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
    /// is bound.
    pub fn not_accelerated_because(&self) -> Option<String> {
        if self.bound.is_some() {
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
    super::egress_flags(
        xmit.of(d.ifindex, d.kind).allowed(),
        d.side.shaper.is_some(),
        d.side.hooks,
        bypass_hooks,
    )
}
