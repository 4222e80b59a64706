//! Conntrack entries as the deciding side sees them: the tuples of a connection, its status
//! and TCP state, what an event says happened to it, and whether the fast path may carry it
//! ([`CtEntry::offload_decision`], the one place that decides).
//!
//! The ctnetlink decoder ([`crate::sync::conntrack`]) produces these values;
//! [`FlowManager`](crate::flows::FlowManager) turns them into flow map entries.

use std::net::IpAddr;

/// Conntrack status bits (`IPS_*` from `uapi/linux/netfilter/nf_conntrack_common.h`).
pub use netlink_packet_netfilter::conntrack::Status as CtStatus;

/// IANA protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IANA protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// TCP conntrack states (`enum tcp_conntrack` in `uapi/linux/netfilter/nf_conntrack_tcp.h`),
/// as carried in `CTA_PROTOINFO_TCP_STATE`.
pub mod tcp_state {
    /// No state yet.
    pub const NONE: u8 = 0;
    /// SYN seen from the originator.
    pub const SYN_SENT: u8 = 1;
    /// SYN/ACK seen from the responder.
    pub const SYN_RECV: u8 = 2;
    /// Three-way handshake completed.
    pub const ESTABLISHED: u8 = 3;
    /// First FIN seen.
    pub const FIN_WAIT: u8 = 4;
    /// FIN seen, the other side still sends.
    pub const CLOSE_WAIT: u8 = 5;
    /// Second FIN seen.
    pub const LAST_ACK: u8 = 6;
    /// Both FINs acknowledged.
    pub const TIME_WAIT: u8 = 7;
    /// RST seen.
    pub const CLOSE: u8 = 8;
    /// Simultaneous open.
    pub const SYN_SENT2: u8 = 9;

    /// The kernel's name of a TCP conntrack state (as printed by `conntrack -L`).
    pub fn name(state: u8) -> &'static str {
        match state {
            NONE => "NONE",
            SYN_SENT => "SYN_SENT",
            SYN_RECV => "SYN_RECV",
            ESTABLISHED => "ESTABLISHED",
            FIN_WAIT => "FIN_WAIT",
            CLOSE_WAIT => "CLOSE_WAIT",
            LAST_ACK => "LAST_ACK",
            TIME_WAIT => "TIME_WAIT",
            CLOSE => "CLOSE",
            SYN_SENT2 => "SYN_SENT2",
            _ => "UNKNOWN",
        }
    }
}

/// `IP_CT_TCP_FLAG_BE_LIBERAL` (`uapi/linux/netfilter/nf_conntrack_tcp.h`): window tracking
/// accepts any sequence number in this direction.
pub const TCP_FLAG_BE_LIBERAL: u8 = 0x08;
/// `IP_CT_TCP_FLAG_MAXACK_SET`: `td_maxack` of this direction holds the highest ACK seen.
/// Conntrack checks an RST's sequence number against the other direction's `td_maxack` only
/// while this flag is set.
pub const TCP_FLAG_MAXACK_SET: u8 = 0x20;

/// One direction of a connection, as conntrack keys it. Ports are in host byte order (0 for
/// protocols without ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtTuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// IP protocol number (`IPPROTO_*`).
    pub proto: u8,
    /// Source port, host byte order.
    pub sport: u16,
    /// Destination port, host byte order.
    pub dport: u16,
}

impl CtTuple {
    /// True when both addresses are IPv4.
    pub fn is_ipv4(&self) -> bool {
        self.src.is_ipv4() && self.dst.is_ipv4()
    }

    /// True when both addresses are IPv6.
    pub fn is_ipv6(&self) -> bool {
        self.src.is_ipv6() && self.dst.is_ipv6()
    }
}

impl std::fmt::Display for CtTuple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            IPPROTO_TCP => "tcp".to_owned(),
            IPPROTO_UDP => "udp".to_owned(),
            p => format!("proto {p}"),
        };
        let sock = |a: IpAddr, p: u16| match a {
            IpAddr::V4(a) => format!("{a}:{p}"),
            IpAddr::V6(a) => format!("[{a}]:{p}"),
        };
        write!(
            f,
            "{proto} {} -> {}",
            sock(self.src, self.sport),
            sock(self.dst, self.dport)
        )
    }
}

/// A conntrack entry as ctnetlink reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtEntry {
    /// `CTA_ID`, when the kernel sent it.
    pub id: Option<u32>,
    /// The original direction (as the first packet saw it).
    pub orig: CtTuple,
    /// The reply direction; differs from the swapped `orig` when NAT applies (SNAT shows as a
    /// reply destination that is the router's address).
    pub reply: CtTuple,
    /// `CTA_STATUS` bits.
    pub status: CtStatus,
    /// `CTA_PROTOINFO_TCP_STATE` (see [`tcp_state`]), TCP only; absent from destroy events.
    pub tcp_state: Option<u8>,
    /// `CTA_PROTOINFO_TCP_FLAGS_{ORIGINAL,REPLY}` (`IP_CT_TCP_FLAG_*`), TCP only.
    pub tcp_flags: Option<[u8; 2]>,
    /// Seconds until the entry expires (`CTA_TIMEOUT`); absent from destroy events.
    pub timeout: Option<u32>,
    /// `CTA_MARK` (0 when absent).
    pub mark: u32,
    /// `CTA_ZONE` (0 when absent).
    pub zone: u16,
    /// A helper (ftp, sip, ...) is attached (`CTA_HELP` present, or `IPS_HELPER`).
    pub has_helper: bool,
}

/// What a ctnetlink message means for the fast path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtEvent {
    /// A NEW event: the kernel just confirmed the entry (`IPCTNL_MSG_CT_NEW` sent with
    /// `NLM_F_CREATE|NLM_F_EXCL` to `NFNLGRP_CONNTRACK_NEW`).
    New(CtEntry),
    /// An entry that exists now and is not new: an UPDATE event (`IPCTNL_MSG_CT_NEW` without
    /// `NLM_F_CREATE`, sent to `NFNLGRP_CONNTRACK_UPDATE`), or an entry of a dump or get reply.
    Update(CtEntry),
    /// The entry is gone (DESTROY event, or a DELETE message).
    Destroy(CtEntry),
}

impl CtEvent {
    /// The entry this event is about.
    pub fn entry(&self) -> &CtEntry {
        match self {
            CtEvent::New(e) | CtEvent::Update(e) | CtEvent::Destroy(e) => e,
        }
    }

    /// The event type as metrics and `status` name it: `new`, `update` or `destroy`.
    pub fn kind(&self) -> &'static str {
        match self {
            CtEvent::New(_) => "new",
            CtEvent::Update(_) => "update",
            CtEvent::Destroy(_) => "destroy",
        }
    }
}

/// Why the fast path must leave a connection to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotOffloadable {
    /// Only TCP and UDP are forwarded by the fast path.
    #[error("protocol {0} is not TCP or UDP")]
    Protocol(u8),
    /// The tuples mix IPv4 and IPv6 addresses.
    #[error("tuples mix address families")]
    FamilyMismatch,
    /// The entry is being torn down.
    #[error("entry is dying")]
    Dying,
    /// A helper (ftp, sip, ...) must see the packets.
    #[error("a conntrack helper is attached")]
    Helper,
    /// Not (yet) assured: conntrack may still drop it early, or it is a probe.
    #[error("not assured")]
    NotAssured,
    /// UDP without traffic in the reply direction.
    #[error("no reply seen")]
    Unreplied,
    /// TCP in a state other than ESTABLISHED (handshake, teardown).
    #[error("TCP state {}", tcp_state::name(*.0))]
    TcpState(u8),
    /// TCP entry without protoinfo (should not happen outside destroy events).
    #[error("TCP state unknown")]
    TcpStateUnknown,
}

impl NotOffloadable {
    /// A short snake_case name, for metric labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            NotOffloadable::Protocol(_) => "protocol",
            NotOffloadable::FamilyMismatch => "family_mismatch",
            NotOffloadable::Dying => "dying",
            NotOffloadable::Helper => "helper",
            NotOffloadable::NotAssured => "not_assured",
            NotOffloadable::Unreplied => "unreplied",
            NotOffloadable::TcpState(_) => "tcp_state",
            NotOffloadable::TcpStateUnknown => "tcp_state_unknown",
        }
    }
}

impl CtEntry {
    /// Decides whether the fast path may carry this connection: TCP only when ESTABLISHED and
    /// ASSURED, UDP only when SEEN_REPLY and ASSURED; never when dying, with a helper attached,
    /// for other protocols, or when the tuples are not all of one address family.
    pub fn offload_decision(&self) -> Result<(), NotOffloadable> {
        let proto = self.orig.proto;
        if (proto != IPPROTO_TCP && proto != IPPROTO_UDP) || self.reply.proto != proto {
            return Err(NotOffloadable::Protocol(proto));
        }
        let all_v4 = self.orig.is_ipv4() && self.reply.is_ipv4();
        let all_v6 = self.orig.is_ipv6() && self.reply.is_ipv6();
        if !all_v4 && !all_v6 {
            return Err(NotOffloadable::FamilyMismatch);
        }
        if self.status.contains(CtStatus::Dying) {
            return Err(NotOffloadable::Dying);
        }
        if self.has_helper {
            return Err(NotOffloadable::Helper);
        }
        if proto == IPPROTO_TCP {
            match self.tcp_state {
                Some(tcp_state::ESTABLISHED) => {}
                Some(state) => return Err(NotOffloadable::TcpState(state)),
                None => return Err(NotOffloadable::TcpStateUnknown),
            }
        } else if !self.status.contains(CtStatus::SeenReply) {
            return Err(NotOffloadable::Unreplied);
        }
        if !self.status.contains(CtStatus::Assured) {
            return Err(NotOffloadable::NotAssured);
        }
        Ok(())
    }

    /// The address family of the entry: true for IPv6 (by the original source address).
    pub fn is_ipv6(&self) -> bool {
        self.orig.src.is_ipv6()
    }

    /// True when the entry source-NATs (its reply destination is not the original source).
    pub fn is_snat(&self) -> bool {
        self.status.contains(CtStatus::SrcNat)
    }

    /// True when the entry destination-NATs (its reply source is not the original destination).
    pub fn is_dnat(&self) -> bool {
        self.status.contains(CtStatus::DstNat)
    }
}
