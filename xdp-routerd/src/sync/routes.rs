//! Route queries (`ip route get`) over an async rtnetlink socket, many in flight at once.
//!
//! Deciding whether a conntrack entry may be offloaded takes up to three route queries (where
//! each endpoint is reached, whether the NAT address is local). A conntrack burst, a resync of a
//! million entries or a routing change that revalidates every flow asks thousands of them: they
//! are sent in batches (several requests per datagram, a window of replies outstanding) on a
//! nonblocking socket, so neither a runtime worker nor a lock waits on one round trip after
//! another.

use std::{io, net::IpAddr, os::fd::AsRawFd, time::Duration};

use netlink_packet_core::{NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload};
use netlink_packet_route::{
    AddressFamily, RouteNetlinkMessage,
    route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage},
};
use netlink_sys::protocols::NETLINK_ROUTE;
use tracing::warn;

use super::nlsocket::AsyncNetlink;
use crate::paths::{RouteInfo, RouteQuery, RouteSource};

/// Requests per datagram.
const PER_DATAGRAM: usize = 64;
/// Replies outstanding at most (each takes about 1 KiB of the receive buffer).
const WINDOW: usize = 512;
/// Receive buffer asked for (SO_RCVBUFFORCE, else SO_RCVBUF capped by `net.core.rmem_max`).
const RCVBUF: usize = 4 << 20;
/// How long to wait for the next reply before counting the outstanding queries as lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(2);

/// Route queries over a private rtnetlink socket (one user at a time: `&mut self`).
pub struct RouteLookup {
    sock: AsyncNetlink,
    seq: u32,
    buf: Vec<u8>,
}

impl RouteLookup {
    /// Opens the socket (in the caller's network namespace; needs a tokio runtime).
    pub fn new() -> io::Result<RouteLookup> {
        let sock = AsyncNetlink::open(NETLINK_ROUTE)?;
        let size = libc::c_int::try_from(RCVBUF).unwrap_or(libc::c_int::MAX);
        if super::nlsocket::setsockopt_int(
            sock.socket().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            size,
        )
        .is_err()
        {
            sock.socket().set_rx_buf_sz(size)?;
        }
        Ok(RouteLookup {
            sock,
            seq: 1,
            buf: vec![0; 64 << 10],
        })
    }

    /// Answers every query, in order: `None` when the kernel has no usable route (unreachable,
    /// blackhole and prohibit routes make it answer with an error) or the reply was lost.
    pub async fn lookup_all(&mut self, queries: &[RouteQuery]) -> Vec<Option<RouteInfo>> {
        let mut answers: Vec<Option<Option<RouteInfo>>> = vec![None; queries.len()];
        let base = self.seq;
        // The next call starts past every sequence number used here, so late replies to
        // queries given up on are never mistaken for its own.
        self.seq = self
            .seq
            .wrapping_add(u32::try_from(queries.len()).unwrap_or(u32::MAX))
            .wrapping_add(1);
        let mut next = 0;
        let mut outstanding = 0usize;
        let mut lost = 0usize;
        while next < queries.len() || outstanding > 0 {
            while next < queries.len() && outstanding < WINDOW {
                let end = (next + PER_DATAGRAM)
                    .min(queries.len())
                    .min(next + WINDOW - outstanding);
                let mut datagram = Vec::new();
                for (i, q) in queries.iter().enumerate().take(end).skip(next) {
                    datagram.extend_from_slice(&request(q, base.wrapping_add(i as u32)));
                }
                if let Err(e) = self.sock.send(&datagram).await {
                    warn!(error = %e, "route query failed");
                    for a in &mut answers[next..end] {
                        *a = Some(None);
                    }
                } else {
                    outstanding += end - next;
                }
                next = end;
            }
            if outstanding == 0 {
                continue;
            }
            let n = match tokio::time::timeout(REPLY_TIMEOUT, self.sock.recv(&mut self.buf)).await {
                Ok(Ok(n)) => n,
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ENOBUFS (replies dropped), a timeout or another error: what is outstanding
                // is lost.
                res => {
                    if let Ok(Err(e)) = res {
                        warn!(error = %e, "route query replies lost");
                    }
                    for a in answers[..next].iter_mut().filter(|a| a.is_none()) {
                        *a = Some(None);
                        lost += 1;
                    }
                    outstanding = 0;
                    continue;
                }
            };
            for (seq, info) in replies(&self.buf[..n]) {
                let i = seq.wrapping_sub(base) as usize;
                if let Some(slot) = answers.get_mut(i).filter(|a| a.is_none()) {
                    *slot = Some(info);
                    outstanding -= 1;
                }
            }
        }
        if lost > 0 {
            warn!(
                lost,
                "route queries without a reply: those connections stay in the kernel for now"
            );
        }
        answers.into_iter().map(Option::flatten).collect()
    }
}

impl RouteSource for RouteLookup {
    fn lookup_all(
        &mut self,
        queries: &[RouteQuery],
    ) -> impl Future<Output = Vec<Option<RouteInfo>>> + Send {
        RouteLookup::lookup_all(self, queries)
    }
}

/// The RTM_GETROUTE request for `q` with sequence number `seq` (pure).
pub fn request(q: &RouteQuery, seq: u32) -> Vec<u8> {
    let mut header = RouteHeader::default();
    let (family, len) = match q.dst {
        IpAddr::V4(_) => (AddressFamily::Inet, 32),
        IpAddr::V6(_) => (AddressFamily::Inet6, 128),
    };
    header.address_family = family;
    header.destination_prefix_length = len;
    let mut msg = RouteMessage::default();
    msg.header = header;
    msg.attributes
        .push(RouteAttribute::Destination(RouteAddress::from(q.dst)));
    if let Some((src, iif, mark)) = q.from {
        msg.header.source_prefix_length = len;
        msg.attributes
            .push(RouteAttribute::Source(RouteAddress::from(src)));
        msg.attributes.push(RouteAttribute::Iif(iif));
        if mark != 0 {
            msg.attributes.push(RouteAttribute::Mark(mark));
        }
    }
    let mut nl_header = NetlinkHeader::default();
    nl_header.flags = NLM_F_REQUEST;
    nl_header.sequence_number = seq;
    let mut req = NetlinkMessage::new(
        nl_header,
        NetlinkPayload::from(RouteNetlinkMessage::GetRoute(msg)),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len().next_multiple_of(4)];
    req.serialize(&mut buf);
    buf
}

/// The answers in one datagram of replies: `(sequence number, route)`, `None` for an error
/// reply (ENETUNREACH, EINVAL for blackhole, EACCES for prohibit, ...). Pure.
pub fn replies(data: &[u8]) -> Vec<(u32, Option<RouteInfo>)> {
    super::datagram::messages(data)
        .map_while(Result::ok)
        .filter_map(|bytes| {
            let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).ok()?;
            let seq = msg.header.sequence_number;
            match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(r)) => {
                    Some((seq, Some(route_info(&r))))
                }
                NetlinkPayload::Error(_) => Some((seq, None)),
                _ => None,
            }
        })
        .collect()
}

fn route_info(r: &RouteMessage) -> RouteInfo {
    let oif = r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        _ => None,
    });
    RouteInfo {
        kind: r.header.kind,
        oif,
    }
}

#[cfg(test)]
mod tests {
    use netlink_packet_core::ErrorMessage;
    use netlink_packet_route::route::RouteType;

    use super::*;

    fn reply(seq: u32, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<u8> {
        let mut h = NetlinkHeader::default();
        h.sequence_number = seq;
        let mut m = NetlinkMessage::new(h, payload);
        m.finalize();
        let mut buf = vec![0; m.buffer_len().next_multiple_of(4)];
        m.serialize(&mut buf);
        buf
    }

    #[test]
    fn a_datagram_of_replies_yields_each_answer_by_sequence_number() {
        // RTM_NEWROUTE reply to `ip route get 10.0.2.2`: unicast via oif 4; then an error
        // reply (unreachable) for the next query.
        let mut r = RouteMessage::default();
        r.header.address_family = AddressFamily::Inet;
        r.header.kind = RouteType::Unicast;
        r.attributes.push(RouteAttribute::Oif(4));
        let mut data = reply(7, NetlinkPayload::from(RouteNetlinkMessage::NewRoute(r)));
        let mut err = ErrorMessage::default();
        err.code = std::num::NonZeroI32::new(-libc::ENETUNREACH);
        data.extend(reply(8, NetlinkPayload::Error(err)));
        assert_eq!(
            replies(&data),
            vec![
                (
                    7,
                    Some(RouteInfo {
                        kind: RouteType::Unicast,
                        oif: Some(4)
                    })
                ),
                (8, None)
            ]
        );
    }

    #[test]
    fn requests_carry_source_iif_and_mark_only_when_asked() {
        let plain = RouteQuery {
            dst: "10.0.2.2".parse().unwrap(),
            from: None,
        };
        let fwd = RouteQuery {
            from: Some(("10.0.1.2".parse().unwrap(), 3, 7)),
            ..plain
        };
        for (q, extra) in [(plain, 0), (fwd, 3)] {
            let bytes = request(&q, 42);
            let m = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&bytes).unwrap();
            assert_eq!(m.header.sequence_number, 42);
            let NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetRoute(r)) = m.payload else {
                panic!("not a route request");
            };
            assert_eq!(r.attributes.len(), 1 + extra);
            assert_eq!(r.header.destination_prefix_length, 32);
        }
        // Requests are 4-byte aligned, so several can share one datagram.
        assert_eq!(request(&plain, 1).len() % 4, 0);
    }
}
