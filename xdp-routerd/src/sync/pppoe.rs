//! PPPoE sessions (`ppp0` dialled by pppd's rp-pppoe kernel plugin): a managed PPP device is
//! paired with the kernel's PPPoE session it carries, so the XDP program on the session's
//! lower device (`eth0`, or the VLAN device `eth0.7`) can take the session's frames off the
//! wire as the PPP device's, and send packets routed out of the PPP device as session frames.
//!
//! The sessions come from `/proc/net/pppoe` (per network namespace; `pppoe_seq_show` in
//! `drivers/net/ppp/pppoe.c`):
//! ```text
//! Id       Address              Device
//! 00000100 52:54:00:12:34:56     eth0
//! ```
//! `%08X` of the session ID as the kernel holds it (`__be16`: the wire bytes read as a native
//! integer, so session 1 prints as `00000100` on a little-endian host), `%pM` the access
//! concentrator's MAC, `%8s` the lower device. The file does not say which PPP unit carries a
//! session, so [`pair`] decides: a PPP device takes the one session there is, or the one on
//! its `pppoe_device`; anything else is unpaired (no session for XDP to take: the datapath
//! may still run TC on the PPP device itself, see `Ports::set_pppoe`).
//!
//! It is read again on link notifications and every [`crate::tasks::pppoe::POLL`] (pppd can
//! set a session up again under a new ID while `ppp0` stays, e.g. with `demand`). This module
//! reads and parses; [`crate::state`] binds.

use std::{collections::BTreeMap, fmt, io};

use super::{netdev, ppp_compression, vlan::VlanRead, xdp_xmit};

/// Where the kernel lists the PPPoE sessions of the namespace.
pub const PROC_NET_PPPOE: &str = "/proc/net/pppoe";

/// One PPPoE session as `/proc/net/pppoe` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The session ID as the kernel holds it and the wire carries it (network order).
    pub sid_be: u16,
    /// The access concentrator's MAC.
    pub peer: [u8; 6],
    /// The device the session runs over.
    pub lower: String,
}

impl Session {
    /// The session ID (host order), as pppd logs it.
    pub fn id(&self) -> u16 {
        u16::from_be(self.sid_be)
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(m: [u8; 6]) -> String {
    m.map(|b| format!("{b:02x}")).join(":")
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PPPoE session {:#06x} over {} (peer {})",
            self.id(),
            self.lower,
            fmt_mac(self.peer)
        )
    }
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        let p = parts.next().filter(|p| p.len() == 2)?;
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// The sessions in the text of `/proc/net/pppoe`: the header and lines that are not a
/// session (a format this code does not know) are skipped. Pure.
pub fn parse(text: &str) -> Vec<Session> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (id, mac, dev) = (f.next()?, f.next()?, f.next()?);
            if f.next().is_some() || id.len() != 8 {
                return None;
            }
            // A __be16 printed with %08X: never above 0xffff.
            let sid_be = u16::try_from(u32::from_str_radix(id, 16).ok()?).ok()?;
            Some(Session {
                sid_be,
                peer: parse_mac(mac)?,
                lower: dev.to_string(),
            })
        })
        .collect()
}

/// Why a managed PPP device is not paired with a session (the fast path then carries
/// nothing of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unpaired {
    /// `/proc/net/pppoe` lists no session (not dialled yet, or not PPPoE).
    NoSession,
    /// No session runs over its `pppoe_device`.
    NoSessionOn(String),
    /// Several sessions, and no `pppoe_device` to choose one.
    Several(usize),
    /// Several sessions run over its `pppoe_device`.
    SeveralOn(String, usize),
    /// Another managed PPP device was paired with the same session.
    Claimed(String),
    /// The session's lower device cannot be found.
    LowerMissing(String),
    /// The session's lower device is of a kind the program cannot run on for it.
    LowerUnsupported(String, String),
    /// `/proc/net/pppoe` cannot be read.
    Unreadable(String),
    /// Whether CCP runs on the PPP device cannot be read (`SIOCGPPPCSTATS`):
    /// in doubt the kernel carries it.
    CompressionUnknown(String),
}

impl fmt::Display for Unpaired {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unpaired::NoSession => write!(f, "no PPPoE session in {PROC_NET_PPPOE}"),
            Unpaired::NoSessionOn(d) => write!(f, "no PPPoE session over {d} (pppoe_device)"),
            Unpaired::Several(n) => write!(
                f,
                "{n} PPPoE sessions in {PROC_NET_PPPOE}: set pppoe_device to the device its session runs over"
            ),
            Unpaired::SeveralOn(d, n) => write!(
                f,
                "{n} PPPoE sessions over {d} (pppoe_device): cannot tell which one is its"
            ),
            Unpaired::Claimed(other) => {
                write!(f, "its session is also {other}'s: set pppoe_device on both")
            }
            Unpaired::LowerMissing(d) => write!(f, "its session's device {d} cannot be found"),
            Unpaired::LowerUnsupported(d, kind) => {
                write!(f, "its session runs over {d}, a {kind} device")
            }
            Unpaired::Unreadable(e) => write!(f, "cannot read {PROC_NET_PPPOE}: {e}"),
            Unpaired::CompressionUnknown(e) => {
                write!(f, "cannot tell whether CCP runs on it: {e}")
            }
        }
    }
}

/// The session of each managed PPP device (`devices`: its name and `pppoe_device`), in the
/// order given. A device with a `pppoe_device` takes the one session over it; one without
/// takes the one session over a device no other `pppoe_device` names. A session two devices
/// would take is neither's. Pure.
pub fn pair(
    sessions: &[Session],
    devices: &[(String, Option<String>)],
) -> Vec<Result<Session, Unpaired>> {
    let named: Vec<&str> = devices.iter().filter_map(|(_, d)| d.as_deref()).collect();
    let mut paired: Vec<Result<Session, Unpaired>> = devices
        .iter()
        .map(|(_, want)| {
            let candidates: Vec<&Session> = sessions
                .iter()
                .filter(|s| match want {
                    Some(d) => s.lower == *d,
                    None => !named.contains(&s.lower.as_str()),
                })
                .collect();
            match (candidates.as_slice(), want) {
                ([one], _) => Ok((*one).clone()),
                ([], None) => Err(Unpaired::NoSession),
                ([], Some(d)) => Err(Unpaired::NoSessionOn(d.clone())),
                (many, None) => Err(Unpaired::Several(many.len())),
                (many, Some(d)) => Err(Unpaired::SeveralOn(d.clone(), many.len())),
            }
        })
        .collect();
    for i in 0..paired.len() {
        let Ok(s) = &paired[i] else { continue };
        let other = (0..paired.len()).find(|&j| j != i && paired[j].as_ref().ok() == Some(s));
        if let Some(j) = other {
            let (a, b) = (devices[i].0.clone(), devices[j].0.clone());
            paired[i] = Err(Unpaired::Claimed(b));
            paired[j] = Err(Unpaired::Claimed(a));
        }
    }
    paired
}

/// The device a session runs over, as read before the state lock is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LowerRead {
    pub ifindex: u32,
    /// Its link kind (see [`xdp_xmit::link_kind`]).
    pub kind: Option<String>,
    pub mac: Option<[u8; 6]>,
    /// When it is a VLAN device: its VLAN and parent (where the program then runs).
    pub vlan: Option<VlanRead>,
}

/// A managed PPP device's session and its lower device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRead {
    pub session: Session,
    pub lower: LowerRead,
    /// CCP (PPP compression, MPPE encryption) has run on the PPP device: its compressor and
    /// decompressor must see every packet (see [`ppp_compression`]), which only the TC fast
    /// path on the PPP device itself leaves them.
    pub ccp: bool,
}

/// What a read found for a managed PPP device.
pub type Found = Result<SessionRead, Unpaired>;

/// [`Found`]s by PPP device name.
pub type PppoeReads = BTreeMap<String, Found>;

/// Link kinds a session's lower device cannot be (a PPP device has no Ethernet header).
const LOWER_KINDS_UNSUPPORTED: [&str; 1] = ["ppp"];

impl SessionRead {
    /// Why XDP cannot take this session's frames off the wire, if so: its lower device is a
    /// bridge (a bridge's frames are its ports'), or a VLAN device over a bridge or over
    /// another VLAN device (stacked tags are not popped). The TC fast path on the PPP device
    /// itself serves such a session. Pure.
    pub fn not_for_xdp(&self) -> Option<String> {
        let lower = &self.session.lower;
        if self.lower.kind.as_deref() == Some("bridge") {
            return Some(format!("its session runs over {lower}, a bridge device"));
        }
        let v = self.lower.vlan.as_ref()?;
        v.parent_kind
            .as_deref()
            .filter(|k| matches!(*k, "bridge" | "vlan"))
            .map(|k| {
                format!(
                    "its session runs over {lower}, a VLAN device over {}, a {k} device",
                    v.parent_name
                )
            })
    }
}

/// Reads `/proc/net/pppoe` once and pairs each of `devices` (name and `pppoe_device`) with a
/// session ([`pair`]), with what the state needs of its lower device and whether CCP has run
/// on it. Blocking but short: a
/// procfs file, then a few sysfs/ioctl/netlink reads per paired device.
pub fn read(devices: &[(String, Option<String>)]) -> PppoeReads {
    let sessions = match std::fs::read_to_string(PROC_NET_PPPOE) {
        Ok(text) => Ok(parse(&text)),
        // No pppoe module loaded: no session.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Unpaired::Unreadable(e.to_string())),
    };
    let paired = match &sessions {
        Ok(s) => pair(s, devices),
        Err(e) => vec![Err(e.clone()); devices.len()],
    };
    devices
        .iter()
        .zip(paired)
        .map(|((name, _), p)| {
            let found = p.and_then(|s| {
                let ccp = ccp_has_run(name)?;
                read_lower(s, ccp)
            });
            (name.clone(), found)
        })
        .collect()
}

/// Whether CCP (compression or MPPE) has run on the PPP device `name` (see
/// [`ppp_compression`]).
fn ccp_has_run(name: &str) -> Result<bool, Unpaired> {
    match ppp_compression::read(name) {
        Ok(stats) => Ok(stats.compression_has_run()),
        // Gone (ENODEV; the link notification follows), or no PPP device after all: either
        // way nothing the fast path should carry.
        Err(e) => Err(Unpaired::CompressionUnknown(e.to_string())),
    }
}

/// What the state needs of the device `session` runs over (`ccp`: see [`SessionRead`]).
fn read_lower(session: Session, ccp: bool) -> Found {
    let name = &session.lower;
    let Some(ifindex) = netdev::ifindex(name) else {
        return Err(Unpaired::LowerMissing(name.clone()));
    };
    let kind = xdp_xmit::link_kind(name);
    if let Some(k) = kind
        .as_deref()
        .filter(|k| LOWER_KINDS_UNSUPPORTED.contains(k))
    {
        return Err(Unpaired::LowerUnsupported(name.clone(), k.to_string()));
    }
    let vlan = if kind.as_deref() == Some("vlan") {
        // A VLAN device that cannot be read (logged) is no lower the program can serve.
        let v = super::vlan::read_with_parent(name)
            .ok_or_else(|| Unpaired::LowerMissing(name.clone()))?;
        Some(v)
    } else {
        None
    };
    Ok(SessionRead {
        lower: LowerRead {
            ifindex,
            mac: netdev::hw_addr(name),
            kind,
            vlan,
        },
        session,
        ccp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As Linux 6.12 prints it on x86-64: a header, then one line per session.
    const TWO: &str = "Id       Address              Device\n\
                       00000100 52:54:00:12:34:56     eth0\n\
                       0000D204 02:00:00:00:00:aa   eth0.7\n";

    fn session(sid: u16, peer: u8, lower: &str) -> Session {
        Session {
            sid_be: sid.to_be(),
            peer: [2, 0, 0, 0, 0, peer],
            lower: lower.into(),
        }
    }

    #[test]
    fn the_kernels_table_parses() {
        let s = parse(TWO);
        assert_eq!(s.len(), 2);
        // Printed from the __be16 as a native integer: the map takes exactly that value.
        assert_eq!(s[0].sid_be, 0x0100);
        assert_eq!(s[0].id(), u16::from_be(0x0100));
        assert_eq!(s[0].peer, [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_eq!(s[0].lower, "eth0");
        assert_eq!(s[1].sid_be, 0xd204);
        assert_eq!(s[1].peer, [2, 0, 0, 0, 0, 0xaa]);
        assert_eq!(s[1].lower, "eth0.7");
        // On a little-endian host the wire's 00 01 is session 1.
        if cfg!(target_endian = "little") {
            assert_eq!(s[0].id(), 1);
            assert_eq!(
                s[0].to_string(),
                "PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56)"
            );
        }
    }

    #[test]
    fn header_only_blank_and_garbage_lines_give_no_session() {
        assert_eq!(parse(""), vec![]);
        assert_eq!(parse("Id       Address              Device\n"), vec![]);
        let garbage = "Id       Address              Device\n\
                       \n\
                       zzzzzzzz 52:54:00:12:34:56     eth0\n\
                       00000100 52:54:00:12:34          eth0\n\
                       00000100 52:54:00:12:34:56:78  eth0\n\
                       00000100 5:54:00:12:34:567     eth0\n\
                       00010000 52:54:00:12:34:56     eth0\n\
                       100 52:54:00:12:34:56     eth0\n\
                       00000100 52:54:00:12:34:56\n\
                       00000100 52:54:00:12:34:56 eth0 extra\n\
                       00000300 52:54:00:12:34:57 averylongname15\n";
        let s = parse(garbage);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s[0].lower, "averylongname15");
        assert_eq!(s[0].sid_be, 0x0300);
    }

    fn dev(name: &str, lower: Option<&str>) -> (String, Option<String>) {
        (name.into(), lower.map(str::to_string))
    }

    #[test]
    fn the_single_session_is_the_ppp_devices() {
        let one = [session(1, 1, "eth0")];
        assert_eq!(pair(&one, &[dev("ppp0", None)]), vec![Ok(one[0].clone())]);
        assert_eq!(
            pair(&[], &[dev("ppp0", None)]),
            vec![Err(Unpaired::NoSession)]
        );
        // pppoe_device must match even when there is only one session.
        assert_eq!(
            pair(&one, &[dev("ppp0", Some("eth0.7"))]),
            vec![Err(Unpaired::NoSessionOn("eth0.7".into()))]
        );
        assert_eq!(
            pair(&one, &[dev("ppp0", Some("eth0"))]),
            vec![Ok(one[0].clone())]
        );
    }

    #[test]
    fn several_sessions_need_pppoe_device() {
        let s = parse(TWO);
        assert_eq!(
            pair(&s, &[dev("ppp0", None)]),
            vec![Err(Unpaired::Several(2))]
        );
        assert_eq!(
            pair(&s, &[dev("ppp0", Some("eth0.7"))]),
            vec![Ok(s[1].clone())]
        );
        // One named, the other takes what is left.
        assert_eq!(
            pair(&s, &[dev("ppp0", Some("eth0.7")), dev("ppp1", None)]),
            vec![Ok(s[1].clone()), Ok(s[0].clone())]
        );
        let same_lower = [session(1, 1, "eth0"), session(2, 1, "eth0")];
        assert_eq!(
            pair(&same_lower, &[dev("ppp0", Some("eth0"))]),
            vec![Err(Unpaired::SeveralOn("eth0".into(), 2))]
        );
    }

    #[test]
    fn a_session_two_devices_would_take_is_neithers() {
        let one = [session(1, 1, "eth0")];
        assert_eq!(
            pair(&one, &[dev("ppp0", None), dev("ppp1", None)]),
            vec![
                Err(Unpaired::Claimed("ppp1".into())),
                Err(Unpaired::Claimed("ppp0".into()))
            ]
        );
        assert_eq!(
            pair(
                &one,
                &[dev("ppp0", Some("eth0")), dev("ppp1", Some("eth0"))]
            ),
            vec![
                Err(Unpaired::Claimed("ppp1".into())),
                Err(Unpaired::Claimed("ppp0".into()))
            ]
        );
    }

    /// XDP runs for a session over an Ethernet port or a VLAN device over one; over a bridge,
    /// or a VLAN device over a bridge or another VLAN device, only TC can (the reason says
    /// which device is what).
    #[test]
    fn a_session_over_a_bridge_is_not_for_xdp() {
        use crate::sync::vlan::{VlanLink, VlanRead};
        let read = |lower: &str, kind: Option<&str>, parent_kind: Option<&str>| SessionRead {
            session: session(1, 0xaa, lower),
            lower: LowerRead {
                ifindex: 5,
                kind: kind.map(str::to_string),
                mac: None,
                vlan: parent_kind.map(|k| VlanRead {
                    link: VlanLink {
                        parent: 4,
                        vid: 7,
                        tpid: 0x8100,
                    },
                    parent_name: "br-wan".into(),
                    parent_kind: Some(k.to_string()).filter(|k| !k.is_empty()),
                    parent_mac: None,
                }),
            },
            ccp: false,
        };
        assert_eq!(read("eth0", None, None).not_for_xdp(), None);
        assert_eq!(read("eth0.7", Some("vlan"), Some("")).not_for_xdp(), None);
        assert_eq!(
            read("br-wan", Some("bridge"), None)
                .not_for_xdp()
                .as_deref(),
            Some("its session runs over br-wan, a bridge device")
        );
        assert_eq!(
            read("br-wan.7", Some("vlan"), Some("bridge"))
                .not_for_xdp()
                .as_deref(),
            Some("its session runs over br-wan.7, a VLAN device over br-wan, a bridge device")
        );
        assert!(
            read("eth0.7.8", Some("vlan"), Some("vlan"))
                .not_for_xdp()
                .is_some()
        );
    }

    #[test]
    fn reasons_are_one_line() {
        for u in [
            Unpaired::NoSession,
            Unpaired::NoSessionOn("eth0".into()),
            Unpaired::Several(3),
            Unpaired::SeveralOn("eth0".into(), 2),
            Unpaired::Claimed("ppp1".into()),
            Unpaired::LowerMissing("eth9".into()),
            Unpaired::LowerUnsupported("ppp1".into(), "ppp".into()),
            Unpaired::Unreadable("permission denied".into()),
            Unpaired::CompressionUnknown("No such device (os error 19)".into()),
        ] {
            let text = u.to_string();
            assert!(!text.is_empty() && !text.contains('\n'), "{text:?}");
        }
    }
}
