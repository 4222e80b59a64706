//! Conntrack entries for benchmarks, without real sockets: created and deleted in bulk over
//! ctnetlink (`IPCTNL_MSG_CT_NEW` with `NLM_F_CREATE`, `IPCTNL_MSG_CT_DELETE`), many per
//! datagram, so `bench scale` fills the router's table with a million entries in seconds and
//! `bench responsive` churns thousands per second (`conntrack -D` scans the whole table per
//! entry: 2,000 deletions took 33 s).

use std::net::Ipv4Addr;

use anyhow::{Context as _, Result, bail};
use netlink_packet_core::{NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NetlinkBuffer};
use netlink_packet_netfilter::{
    NetfilterProtoFamily as ProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, ProtoInfo, ProtoInfoTCP, Status},
};
use netlink_sys::{Socket, protocols::NETLINK_NETFILTER};
use xdp_routerd::{
    flows::conntrack::CtTuple,
    sync::{conntrack::tuple_attributes, ctnetlink::encode_request},
};

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

/// One direction of a connection: the daemon's conntrack tuple, so that requests carry it as
/// the daemon encodes its own (`sync::conntrack::tuple_attributes`).
pub type Tuple5 = CtTuple;

/// An established (TCP) or assured two-way (UDP) connection to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conn {
    pub orig: Tuple5,
    pub reply: Tuple5,
    /// Conntrack timeout, seconds.
    pub timeout: u32,
}

impl Conn {
    /// An established TCP connection from a LAN host to a remote host, masqueraded to `nat`
    /// (ports kept): what a router's conntrack holds for a live connection. 600 s timeout.
    pub fn masqueraded_tcp(
        src: Ipv4Addr,
        sport: u16,
        dst: Ipv4Addr,
        dport: u16,
        nat: Ipv4Addr,
    ) -> Conn {
        Conn {
            orig: Tuple5 {
                src: src.into(),
                dst: dst.into(),
                proto: TCP,
                sport,
                dport,
            },
            reply: Tuple5 {
                src: dst.into(),
                dst: nat.into(),
                proto: TCP,
                sport: dport,
                dport: sport,
            },
            timeout: 600,
        }
    }
}

/// What a request does with a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Create,
    /// By its original tuple.
    Delete,
}

fn encode(conn: &Conn, op: Op, seq: u32, out: &mut Vec<u8>) {
    if op == Op::Delete {
        let attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(
            &conn.orig,
        ))];
        return serialize(conn, ConntrackMessage::Delete(attrs), 0, seq, out);
    }
    let mut attrs = vec![
        ConntrackAttribute::CtaTupleOrig(tuple_attributes(&conn.orig)),
        ConntrackAttribute::CtaTupleReply(tuple_attributes(&conn.reply)),
        ConntrackAttribute::CtaStatus(Status::from_bits_retain(ESTABLISHED_STATUS)),
        ConntrackAttribute::CtaTimeout(conn.timeout),
    ];
    if conn.orig.proto == TCP {
        attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
            vec![ProtoInfoTCP::State(TCP_ESTABLISHED)],
        )]));
    }
    serialize(
        conn,
        ConntrackMessage::New(attrs),
        NLM_F_CREATE | NLM_F_EXCL,
        seq,
        out,
    );
}

/// Appends one acknowledged request about `conn` to `out`, encoded by the daemon's
/// [`encode_request`].
fn serialize(conn: &Conn, msg: ConntrackMessage, flags: u16, seq: u32, out: &mut Vec<u8>) {
    let family = if conn.orig.src.is_ipv6() {
        ProtoFamily::IPv6
    } else {
        ProtoFamily::IPv4
    };
    out.extend_from_slice(&encode_request(
        family,
        msg,
        NLM_F_REQUEST | NLM_F_ACK | flags,
        seq,
    ));
}

/// What [`Writer::create`] or [`Writer::delete`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Created {
    /// Requests the kernel carried out.
    pub created: u64,
    /// Rejected by the kernel (EEXIST, ENOENT, table full, ...); `first_error` tells which.
    pub failed: u64,
    pub first_error: Option<i32>,
}

/// `NFNLGRP_CONNTRACK_DESTROY`.
const GROUP_DESTROY: u32 = 3;

/// A ctnetlink socket in the network namespace of the thread that opened it.
pub struct Writer {
    sock: Socket,
    seq: u32,
    tx: Vec<u8>,
    rx: Vec<u8>,
}

impl Writer {
    /// Opens the socket in the calling thread's network namespace. For entries whose
    /// destruction must be reported while no daemon listens, see [`create`].
    pub fn open() -> Result<Writer> {
        let mut sock = Socket::new(NETLINK_NETFILTER).context("opening a ctnetlink socket")?;
        sock.bind_auto().context("binding the ctnetlink socket")?;
        Ok(Writer {
            sock,
            seq: 0,
            tx: Vec::with_capacity(PER_DATAGRAM * 160),
            rx: vec![0u8; 64 << 10],
        })
    }

    /// Creates `conns`.
    pub fn create(&mut self, conns: impl IntoIterator<Item = Conn>) -> Result<Created> {
        self.run(Op::Create, conns)
    }

    /// Deletes `conns` (by their original tuples).
    pub fn delete(&mut self, conns: impl IntoIterator<Item = Conn>) -> Result<Created> {
        self.run(Op::Delete, conns)
    }

    fn run(&mut self, op: Op, conns: impl IntoIterator<Item = Conn>) -> Result<Created> {
        let mut done = Created::default();
        let mut conns = conns.into_iter().peekable();
        while conns.peek().is_some() {
            self.tx.clear();
            let first = self.seq.wrapping_add(1);
            let mut pending = 0usize;
            for c in conns.by_ref().take(PER_DATAGRAM) {
                self.seq = self.seq.wrapping_add(1);
                encode(&c, op, self.seq, &mut self.tx);
                pending += 1;
            }
            let n = self
                .sock
                .send(&self.tx, 0)
                .context("sending to ctnetlink")?;
            if n != self.tx.len() {
                bail!("short ctnetlink send: {n} of {} bytes", self.tx.len());
            }
            // One ACK (an NLMSG_ERROR, code 0 on success) per request.
            while pending > 0 {
                let n = self
                    .sock
                    .recv(&mut &mut self.rx[..], 0)
                    .context("reading ctnetlink ACKs")?;
                let mut off = 0;
                while off + 16 <= n {
                    let msg = NetlinkBuffer::new_checked(&self.rx[off..n])
                        .context("malformed ctnetlink answer")?;
                    let len = msg.length() as usize;
                    if len < 16 {
                        bail!("malformed ctnetlink answer (length {len})");
                    }
                    // NLMSG_ERROR = 2 answering one of this datagram's requests (DESTROY
                    // events have sequence number 0); its payload starts with the errno.
                    let seq = msg.sequence_number();
                    if msg.message_type() == 2 && seq.wrapping_sub(first) < PER_DATAGRAM as u32 {
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
}

/// Creates `conns` in the calling thread's network namespace's conntrack table.
///
/// The socket listens to conntrack's DESTROY group while it creates them: with
/// `nf_conntrack_events` = 2 (the default) the kernel gives an entry its event extension only
/// when some ctnetlink listener exists at its creation, and an entry without it never reports
/// its destruction. So the entries are like those of a router on which xdp-routerd (or
/// conntrackd) already listened, e.g. before a daemon restart. (The events it receives are
/// skipped; a long-lived [`Writer`] that deletes must not listen: the events of its own
/// deletions would overrun it.)
pub fn create(conns: impl IntoIterator<Item = Conn>) -> Result<Created> {
    let mut w = Writer::open()?;
    w.sock
        .add_membership(GROUP_DESTROY)
        .context("joining the conntrack DESTROY group")?;
    w.create(conns)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn conn() -> Conn {
        Conn::masqueraded_tcp(
            Ipv4Addr::new(10, 0, 1, 2),
            40000,
            Ipv4Addr::new(198, 51, 100, 7),
            443,
            Ipv4Addr::new(203, 0, 113, 1),
        )
    }

    #[test]
    fn masqueraded_reply_comes_back_to_the_nat_address() {
        let c = conn();
        assert_eq!(c.reply.src, c.orig.dst);
        assert_eq!(c.reply.dst, IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1)));
        assert_eq!((c.reply.sport, c.reply.dport), (443, 40000));
    }

    #[test]
    fn requests_are_whole_netlink_messages_back_to_back() {
        let mut buf = Vec::new();
        encode(&conn(), Op::Create, 1, &mut buf);
        let create_len = buf.len();
        encode(&conn(), Op::Delete, 2, &mut buf);
        let create = NetlinkBuffer::new_checked(&buf[..]).unwrap();
        assert_eq!(create.length() as usize, create_len);
        // NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_NEW, then DELETE.
        assert_eq!(create.message_type(), 1 << 8);
        let delete = NetlinkBuffer::new_checked(&buf[create_len..]).unwrap();
        assert_eq!(delete.message_type(), (1 << 8) | 2);
        assert_eq!(delete.sequence_number(), 2);
        assert_eq!(create_len + delete.length() as usize, buf.len());
        // The delete names the original tuple only: 10.0.1.2:40000, no NAT address.
        let d = delete.payload();
        assert!(d.windows(4).any(|w| w == [10, 0, 1, 2]));
        assert!(d.windows(2).any(|w| w == 40000u16.to_be_bytes()));
        assert!(!d.windows(4).any(|w| w == [203, 0, 113, 1]));
    }
}
