//! A bulk conntrack writer: creates established connections through ctnetlink
//! (`IPCTNL_MSG_CT_NEW` with `NLM_F_CREATE`), many per datagram, so the scale benchmark can fill
//! the router's table with a million entries in seconds without opening real sockets.

use std::net::IpAddr;

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterProtoFamily as ProtoFamily,
    conntrack::{
        ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Status,
        Tuple,
    },
};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};

/// IANA protocol numbers.
pub const TCP: u8 = 6;
pub const UDP: u8 = 17;

/// `IPS_SEEN_REPLY | IPS_ASSURED | IPS_CONFIRMED`: what an established connection's status
/// shows. CONFIRMED must be there: ctnetlink confirms a created entry before it applies
/// `CTA_STATUS`, and answers EBUSY to a status that would clear it
/// (`nf_ct_change_status_common`).
const ESTABLISHED_STATUS: u32 = (1 << 1) | (1 << 2) | (1 << 3);
/// `TCP_CONNTRACK_ESTABLISHED`.
const TCP_ESTABLISHED: u8 = 3;
/// Messages per datagram (each answered by an ACK before the next datagram is sent).
const PER_DATAGRAM: usize = 128;

/// One direction of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tuple5 {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

impl Tuple5 {
    fn attributes(&self) -> Vec<Tuple> {
        vec![
            Tuple::Ip(vec![
                IPTuple::SourceAddress(self.src),
                IPTuple::DestinationAddress(self.dst),
            ]),
            Tuple::Proto(vec![
                ProtoTuple::Protocol(self.proto.into()),
                ProtoTuple::SourcePort(self.sport),
                ProtoTuple::DestinationPort(self.dport),
            ]),
        ]
    }
}

/// An established (TCP) or assured two-way (UDP) connection to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn {
    pub orig: Tuple5,
    pub reply: Tuple5,
    /// Conntrack timeout, seconds.
    pub timeout: u32,
}

fn encode(conn: &Conn, seq: u32, out: &mut Vec<u8>) {
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(conn.orig.attributes()),
        ConntrackAttribute::CtaTupleReply(conn.reply.attributes()),
        ConntrackAttribute::CtaStatus(Status::from_bits_retain(ESTABLISHED_STATUS)),
        ConntrackAttribute::CtaTimeout(conn.timeout),
    ];
    if conn.orig.proto == TCP {
        attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
            vec![ProtoInfoTCP::State(TCP_ESTABLISHED)],
        )]));
    }
    let family = if conn.orig.src.is_ipv6() {
        ProtoFamily::IPv6
    } else {
        ProtoFamily::IPv4
    };
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            ConntrackMessage::New(attrs),
        )),
    );
    packet.finalize();
    let start = out.len();
    out.resize(start + packet.buffer_len(), 0);
    packet.serialize(&mut out[start..]);
}

/// What [`create`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Created {
    pub created: u64,
    /// Rejected by the kernel (EEXIST, table full, ...); `first_error` tells which.
    pub failed: u64,
    pub first_error: Option<i32>,
}

/// `NFNLGRP_CONNTRACK_DESTROY`.
const GROUP_DESTROY: u32 = 3;

/// Creates `conns` in the current network namespace's conntrack table.
///
/// The socket listens to conntrack's DESTROY group while it creates them: with
/// `nf_conntrack_events` = 2 (the default) the kernel gives an entry its event extension only
/// when some ctnetlink listener exists at its creation, and an entry without it never reports
/// its destruction. So the entries are like those of a router on which xdp-routerd (or
/// conntrackd) already listened, e.g. before a daemon restart.
pub fn create(conns: impl Iterator<Item = Conn>) -> Result<Created> {
    let mut sock = Socket::new(NETLINK_NETFILTER).context("opening a ctnetlink socket")?;
    sock.bind_auto().context("binding the ctnetlink socket")?;
    sock.add_membership(GROUP_DESTROY)
        .context("joining the conntrack DESTROY group")?;
    let mut done = Created::default();
    let mut buf = Vec::with_capacity(PER_DATAGRAM * 160);
    let mut rx = vec![0u8; 64 << 10];
    let mut seq = 0u32;
    let mut conns = conns.peekable();
    while conns.peek().is_some() {
        buf.clear();
        let mut pending = 0usize;
        for c in conns.by_ref().take(PER_DATAGRAM) {
            seq = seq.wrapping_add(1);
            encode(&c, seq, &mut buf);
            pending += 1;
        }
        let n = sock.send(&buf, 0).context("sending to ctnetlink")?;
        if n != buf.len() {
            bail!("short ctnetlink send: {n} of {} bytes", buf.len());
        }
        // One ACK (an NLMSG_ERROR, code 0 on success) per message.
        while pending > 0 {
            let n = sock
                .recv(&mut &mut rx[..], 0)
                .context("reading ctnetlink ACKs")?;
            let mut off = 0;
            while off + 16 <= n {
                let msg = NetlinkBuffer::new_checked(&rx[off..n])
                    .context("malformed ctnetlink answer")?;
                let len = msg.length() as usize;
                if len < 16 {
                    bail!("malformed ctnetlink answer (length {len})");
                }
                // NLMSG_ERROR = 2; its payload starts with the (negative) errno.
                if msg.message_type() == 2 {
                    let p = msg.payload();
                    let code = i32::from_ne_bytes([p[0], p[1], p[2], p[3]]);
                    if code == 0 {
                        done.created += 1;
                    } else {
                        done.failed += 1;
                        done.first_error.get_or_insert(-code);
                    }
                    pending = pending.saturating_sub(1);
                }
                off += (len + 3) & !3;
            }
        }
    }
    Ok(done)
}
