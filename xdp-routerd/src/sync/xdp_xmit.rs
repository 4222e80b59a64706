//! Which devices can transmit XDP frames, as the kernel says it: the `netdev` generic-netlink
//! family (Linux 6.3) reports each device's XDP features, and `NETDEV_XDP_ACT_NDO_XMIT` is the
//! one that says an `XDP_REDIRECT` into the device is sent rather than dropped.
//!
//! It is not static: a veth can transmit redirected frames only while its peer has an XDP
//! program or GRO (`veth_set_xdp_features` in `drivers/net/veth.c`), and the kernel announces
//! every change with `NETDEV_CMD_DEV_CHANGE_NTF` on the family's `mgmt` multicast group. A
//! thread follows that group and sends [`XmitEvent`]s; the daemon flips `IFACE_F_NO_XDP_XMIT`.
//!
//! Kernels without the family (before 6.3) get a conservative answer from the link kind: the
//! software devices that have no `ndo_xdp_xmit` (or only one that drops without a capable
//! lower device) are never redirected to; any other kind is assumed to transmit, as before.

use std::{collections::BTreeMap, io};

use netlink_sys::{Socket, protocols::NETLINK_GENERIC};
use tokio::sync::mpsc;
use tracing::{debug, error};

use super::nlsocket::request_socket;

/// `NETDEV_XDP_ACT_NDO_XMIT` (`uapi/linux/netdev.h`): the device implements `ndo_xdp_xmit`
/// and will send frames redirected to it.
pub const NETDEV_XDP_ACT_NDO_XMIT: u64 = 1 << 2;

/// `GENL_ID_CTRL`, the generic-netlink controller.
const GENL_ID_CTRL: u16 = 0x10;
/// `CTRL_CMD_NEWFAMILY` / `CTRL_CMD_GETFAMILY`.
const CTRL_CMD_GETFAMILY: u8 = 3;
/// `CTRL_ATTR_FAMILY_ID` (u16), `CTRL_ATTR_FAMILY_NAME` (string), `CTRL_ATTR_MCAST_GROUPS`.
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
/// Inside each multicast group entry: `CTRL_ATTR_MCAST_GRP_NAME`, `CTRL_ATTR_MCAST_GRP_ID`.
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;

/// `netdev` family commands (`uapi/linux/netdev.h`).
const NETDEV_CMD_DEV_GET: u8 = 1;
const NETDEV_CMD_DEV_ADD_NTF: u8 = 2;
const NETDEV_CMD_DEV_DEL_NTF: u8 = 3;
const NETDEV_CMD_DEV_CHANGE_NTF: u8 = 4;
/// `NETDEV_A_DEV_IFINDEX` (u32), `NETDEV_A_DEV_XDP_FEATURES` (u64).
const NETDEV_A_DEV_IFINDEX: u16 = 1;
const NETDEV_A_DEV_XDP_FEATURES: u16 = 3;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
/// nlmsghdr (16) + genlmsghdr (4).
const GENL_HDRLEN: usize = 20;

/// Link kinds that cannot transmit XDP frames, for kernels without the `netdev` family: a
/// bridge, team, VLAN and PPP device have no `ndo_xdp_xmit`; a bond's drops the frame unless
/// every slave is XDP-capable in a supported mode (`bond_xdp_xmit`), which old kernels do not
/// report.
pub const KINDS_WITHOUT_XMIT: [&str; 5] = ["bridge", "bond", "team", "vlan", "ppp"];

/// Whether the fast path may redirect packets into a device, and on what grounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XdpXmit {
    /// The kernel reports `NETDEV_XDP_ACT_NDO_XMIT`.
    Capable,
    /// The kernel reports XDP features without `NETDEV_XDP_ACT_NDO_XMIT` (a bridge, or a veth
    /// whose peer has neither XDP nor GRO).
    NotCapable,
    /// No `netdev` family (Linux < 6.3) and a link kind in [`KINDS_WITHOUT_XMIT`].
    KindWithoutXmit(String),
    /// No `netdev` family and another kind: assumed capable.
    Assumed,
    /// The kernel has the family but has not reported this device yet: not redirected to
    /// until it does.
    Unknown,
}

impl XdpXmit {
    /// Whether packets may be redirected into the device.
    pub fn allowed(&self) -> bool {
        matches!(self, XdpXmit::Capable | XdpXmit::Assumed)
    }

    /// Why packets are not redirected into the device (status, logs); `None` when they are.
    pub fn why_not(&self) -> Option<String> {
        match self {
            XdpXmit::Capable | XdpXmit::Assumed => None,
            XdpXmit::NotCapable => Some(
                "the kernel reports no XDP transmit (NETDEV_XDP_ACT_NDO_XMIT off: a bridge, \
                 bond or VLAN device, or a veth whose peer has neither XDP nor GRO)"
                    .into(),
            ),
            XdpXmit::KindWithoutXmit(kind) => Some(format!(
                "a {kind} device cannot transmit XDP frames (kernel < 6.3: judged by link kind)"
            )),
            XdpXmit::Unknown => Some("XDP features not reported by the kernel yet".into()),
        }
    }

    /// The answer for a device from its reported features (`Some`), or, without the family,
    /// from its link kind.
    pub fn judge(family: bool, features: Option<u64>, kind: Option<&str>) -> XdpXmit {
        match (family, features) {
            (_, Some(f)) if f & NETDEV_XDP_ACT_NDO_XMIT != 0 => XdpXmit::Capable,
            (_, Some(_)) => XdpXmit::NotCapable,
            (true, None) => XdpXmit::Unknown,
            (false, None) => match kind {
                Some(k) if KINDS_WITHOUT_XMIT.contains(&k) => XdpXmit::KindWithoutXmit(k.into()),
                _ => XdpXmit::Assumed,
            },
        }
    }
}

/// A change reported on the `mgmt` group (or by a re-read after lost notifications).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XmitEvent {
    /// A device appeared or its XDP features changed.
    Features { ifindex: u32, xdp_features: u64 },
    /// A device went away.
    Gone { ifindex: u32 },
    /// Notifications were lost; this is every device's features as read again.
    Snapshot(BTreeMap<u32, u64>),
}

/// What the kernel last reported about every device's XDP features (or that it reports
/// nothing: kernels without the `netdev` family), and the judgement for a device.
#[derive(Debug, Default)]
pub struct Capabilities {
    /// Features by ifindex; `None` without the `netdev` family.
    features: Option<BTreeMap<u32, u64>>,
}

impl Capabilities {
    /// From [`Subscription::initial`].
    pub fn new(initial: Option<BTreeMap<u32, u64>>) -> Capabilities {
        Capabilities { features: initial }
    }

    /// The judgement for device `ifindex` of link kind `kind` (see [`link_kind`], read before
    /// the state lock is taken; it counts only on kernels without the family).
    pub fn of(&self, ifindex: u32, kind: Option<&str>) -> XdpXmit {
        match &self.features {
            Some(f) => XdpXmit::judge(true, f.get(&ifindex).copied(), None),
            None => XdpXmit::judge(false, None, kind),
        }
    }

    /// Records a reported change.
    pub fn apply(&mut self, event: XmitEvent) {
        let features = self.features.get_or_insert_with(BTreeMap::new);
        match event {
            XmitEvent::Features {
                ifindex,
                xdp_features,
            } => {
                features.insert(ifindex, xdp_features);
            }
            XmitEvent::Gone { ifindex } => {
                features.remove(&ifindex);
            }
            XmitEvent::Snapshot(all) => *features = all,
        }
    }
}

/// The kind of a link, from `/sys/class/net/<name>/uevent` (`DEVTYPE=`); `None` for plain
/// Ethernet devices, which have no DEVTYPE.
pub fn link_kind(name: &str) -> Option<String> {
    let uevent = std::fs::read_to_string(format!("/sys/class/net/{name}/uevent")).ok()?;
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVTYPE="))
        .map(str::to_string)
}

/// One generic-netlink request: header, `cmd`, then `attrs` (already encoded).
fn request(family: u16, flags: u16, seq: u32, cmd: u8, attrs: &[u8]) -> Vec<u8> {
    let len = GENL_HDRLEN + attrs.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&family.to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    // genlmsghdr: cmd, version 1, reserved.
    msg.extend_from_slice(&[cmd, 1, 0, 0]);
    msg.extend_from_slice(attrs);
    msg
}

/// One netlink attribute, padded to 4 bytes.
fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut a = Vec::with_capacity((len + 3) & !3);
    a.extend_from_slice(&(len as u16).to_ne_bytes());
    a.extend_from_slice(&kind.to_ne_bytes());
    a.extend_from_slice(payload);
    a.resize((len + 3) & !3, 0);
    a
}

/// The attributes in `data` as (type without the nested/byte-order bits, payload). Stops at
/// the first malformed one. Pure.
fn attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([data[0], data[1]]) as usize;
        let kind = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        if len < 4 || len > data.len() {
            return None;
        }
        let payload = &data[4..len];
        data = data.get((len + 3) & !3..).unwrap_or_default();
        Some((kind, payload))
    })
}

fn u32_of(p: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(p.get(..4)?.try_into().ok()?))
}

/// The `netdev` family as the controller describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetdevFamily {
    /// Generic-netlink family id (the nlmsg_type of its messages).
    pub id: u16,
    /// Id of its `mgmt` multicast group.
    pub mgmt_group: Option<u32>,
}

/// Parses a `CTRL_CMD_NEWFAMILY` reply (whole message). Pure.
pub fn parse_family(msg: &[u8]) -> Option<NetdevFamily> {
    let mut id = None;
    let mut mgmt_group = None;
    for (kind, payload) in attrs(msg.get(GENL_HDRLEN..)?) {
        match kind {
            CTRL_ATTR_FAMILY_ID => id = payload.get(..2).map(|b| u16::from_ne_bytes([b[0], b[1]])),
            CTRL_ATTR_MCAST_GROUPS => {
                for (_, group) in attrs(payload) {
                    let mut name = None;
                    let mut gid = None;
                    for (k, p) in attrs(group) {
                        match k {
                            CTRL_ATTR_MCAST_GRP_NAME => name = Some(p),
                            CTRL_ATTR_MCAST_GRP_ID => gid = u32_of(p),
                            _ => {}
                        }
                    }
                    if name == Some(b"mgmt\0".as_slice()) {
                        mgmt_group = gid;
                    }
                }
            }
            _ => {}
        }
    }
    Some(NetdevFamily {
        id: id?,
        mgmt_group,
    })
}

/// The device messages of the `netdev` family (id `family`) in one datagram, as events: a dump
/// reply or an add/change notification gives the device's features, a delete notification its
/// disappearance. Pure.
pub fn events_in(data: &[u8], family: u16) -> Vec<XmitEvent> {
    super::datagram::messages(data)
        .map_while(Result::ok)
        .filter(|m| u16::from_ne_bytes([m[4], m[5]]) == family && m.len() >= GENL_HDRLEN)
        .filter_map(|m| {
            let mut ifindex = None;
            let mut features = None;
            for (kind, p) in attrs(&m[GENL_HDRLEN..]) {
                match kind {
                    NETDEV_A_DEV_IFINDEX => ifindex = u32_of(p),
                    NETDEV_A_DEV_XDP_FEATURES => {
                        features = p
                            .get(..8)
                            .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                    }
                    _ => {}
                }
            }
            let ifindex = ifindex?;
            match m[16] {
                NETDEV_CMD_DEV_DEL_NTF => Some(XmitEvent::Gone { ifindex }),
                NETDEV_CMD_DEV_GET | NETDEV_CMD_DEV_ADD_NTF | NETDEV_CMD_DEV_CHANGE_NTF => {
                    Some(XmitEvent::Features {
                        ifindex,
                        xdp_features: features?,
                    })
                }
                _ => None,
            }
        })
        .collect()
}

/// The errno of an `NLMSG_ERROR` message (0 = an ACK), if `msg` is one.
fn nlmsg_error(msg: &[u8]) -> Option<i32> {
    (u16::from_ne_bytes([msg[4], msg[5]]) == NLMSG_ERROR)
        .then(|| msg.get(16..20).and_then(u32_of).map(|e| -(e as i32)))
        .flatten()
}

/// Sends `req` on `sock` and collects the reply messages until `NLMSG_DONE` (dumps) or the
/// first message (plain requests). An `NLMSG_ERROR` with an errno becomes that error.
fn transact(sock: &Socket, req: &[u8], dump: bool) -> io::Result<Vec<Vec<u8>>> {
    sock.send(req, 0)?;
    let mut out = Vec::new();
    loop {
        let (data, _) = sock.recv_from_full()?;
        for msg in super::datagram::messages(&data).map_while(Result::ok) {
            match nlmsg_error(msg) {
                Some(0) => return Ok(out),
                Some(errno) => return Err(io::Error::from_raw_os_error(errno)),
                None => {}
            }
            if u16::from_ne_bytes([msg[4], msg[5]]) == NLMSG_DONE {
                return Ok(out);
            }
            out.push(msg.to_vec());
            if !dump {
                return Ok(out);
            }
        }
    }
}

/// Looks up the `netdev` family; `Ok(None)` when the kernel has none (before Linux 6.3).
pub fn resolve(sock: &Socket) -> io::Result<Option<NetdevFamily>> {
    let req = request(
        GENL_ID_CTRL,
        0,
        1,
        CTRL_CMD_GETFAMILY,
        &attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"),
    );
    match transact(sock, &req, false) {
        Ok(msgs) => Ok(msgs.first().and_then(|m| parse_family(m))),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every device's XDP features, read with a `NETDEV_CMD_DEV_GET` dump.
pub fn dump(sock: &Socket, family: u16) -> io::Result<BTreeMap<u32, u64>> {
    let msgs = transact(
        sock,
        &request(family, NLM_F_DUMP, 2, NETDEV_CMD_DEV_GET, &[]),
        true,
    )?;
    let mut out = BTreeMap::new();
    for m in msgs {
        for ev in events_in(&m, family) {
            if let XmitEvent::Features {
                ifindex,
                xdp_features,
            } = ev
            {
                out.insert(ifindex, xdp_features);
            }
        }
    }
    Ok(out)
}

/// Following the kernel's XDP features: what it reported at start, and the changes.
pub struct Subscription {
    /// Features of every device at start; `None` when the kernel has no `netdev` family (then
    /// judge by link kind, see [`XdpXmit::judge`]).
    pub initial: Option<BTreeMap<u32, u64>>,
    /// Changes after `initial` (never sends when `initial` is `None`).
    pub events: mpsc::UnboundedReceiver<XmitEvent>,
}

/// Subscribes to the `netdev` family's `mgmt` group, then reads every device's features (in
/// that order, so no change in between is lost). A thread follows the group; after lost
/// notifications (ENOBUFS) it reads everything again and sends a [`XmitEvent::Snapshot`].
/// Blocking: call it before the runtime's tasks start, or on a blocking thread.
pub fn subscribe() -> io::Result<Subscription> {
    let (tx, events) = mpsc::unbounded_channel();
    let requests = request_socket(NETLINK_GENERIC)?;
    let Some(family) = resolve(&requests)? else {
        debug!("no netdev generic-netlink family (Linux < 6.3): XDP transmit judged by link kind");
        return Ok(Subscription {
            initial: None,
            events,
        });
    };
    let notify = request_socket(NETLINK_GENERIC)?;
    let _ = notify.set_rx_buf_sz(1 << 20);
    match family.mgmt_group {
        Some(group) => notify.add_membership(group)?,
        None => {
            return Err(io::Error::other(
                "the netdev generic-netlink family has no mgmt multicast group",
            ));
        }
    }
    let initial = dump(&requests, family.id)?;
    std::thread::Builder::new()
        .name("xdp-features".into())
        .spawn(move || {
            loop {
                let events = match notify.recv_from_full() {
                    Ok((data, _)) => events_in(&data, family.id),
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        match dump(&requests, family.id) {
                            Ok(all) => vec![XmitEvent::Snapshot(all)],
                            Err(e) => {
                                error!(error = %e, "cannot re-read XDP features");
                                return;
                            }
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        error!(error = %e, "netdev (XDP features) event socket failed");
                        return;
                    }
                };
                for ev in events {
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
        })?;
    Ok(Subscription {
        initial: Some(initial),
        events,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netdev family message: `cmd`, ifindex, and the features when given.
    fn dev_msg(family: u16, cmd: u8, ifindex: u32, features: Option<u64>) -> Vec<u8> {
        let mut a = attr(NETDEV_A_DEV_IFINDEX, &ifindex.to_ne_bytes());
        if let Some(f) = features {
            a.extend(attr(NETDEV_A_DEV_XDP_FEATURES, &f.to_ne_bytes()));
        }
        request(family, 0, 0, cmd, &a)
    }

    #[test]
    fn device_messages_become_events() {
        let mut data = dev_msg(30, NETDEV_CMD_DEV_CHANGE_NTF, 7, Some(0x77));
        data.extend(dev_msg(30, NETDEV_CMD_DEV_DEL_NTF, 8, None));
        data.extend(dev_msg(31, NETDEV_CMD_DEV_ADD_NTF, 9, Some(0)));
        data.extend(dev_msg(30, NETDEV_CMD_DEV_ADD_NTF, 10, None));
        assert_eq!(
            events_in(&data, 30),
            vec![
                XmitEvent::Features {
                    ifindex: 7,
                    xdp_features: 0x77
                },
                XmitEvent::Gone { ifindex: 8 },
            ]
        );
    }

    #[test]
    fn family_reply_gives_id_and_mgmt_group() {
        let group = |name: &[u8], id: u32| {
            let mut g = attr(CTRL_ATTR_MCAST_GRP_NAME, name);
            g.extend(attr(CTRL_ATTR_MCAST_GRP_ID, &id.to_ne_bytes()));
            g
        };
        let mut groups = attr(1, &group(b"page-pool\0", 5));
        groups.extend(attr(2, &group(b"mgmt\0", 4)));
        let mut a = attr(CTRL_ATTR_FAMILY_ID, &33u16.to_ne_bytes());
        a.extend(attr(CTRL_ATTR_FAMILY_NAME, b"netdev\0"));
        a.extend(attr(CTRL_ATTR_MCAST_GROUPS | 0x8000, &groups));
        let msg = request(GENL_ID_CTRL, 0, 1, 1, &a);
        assert_eq!(
            parse_family(&msg),
            Some(NetdevFamily {
                id: 33,
                mgmt_group: Some(4)
            })
        );
    }

    #[test]
    fn judgement_prefers_the_kernels_features() {
        let xmit = NETDEV_XDP_ACT_NDO_XMIT | 3;
        assert_eq!(
            XdpXmit::judge(true, Some(xmit), Some("bridge")),
            XdpXmit::Capable
        );
        // veth with a peer without XDP/GRO: basic + redirect + rx_sg, no ndo_xmit.
        assert_eq!(XdpXmit::judge(true, Some(0x23), None), XdpXmit::NotCapable);
        assert_eq!(XdpXmit::judge(true, None, None), XdpXmit::Unknown);
        assert!(!XdpXmit::Unknown.allowed());
        assert_eq!(
            XdpXmit::judge(false, None, Some("bridge")),
            XdpXmit::KindWithoutXmit("bridge".into())
        );
        assert_eq!(XdpXmit::judge(false, None, None), XdpXmit::Assumed);
        assert!(XdpXmit::Assumed.allowed());
    }
}
