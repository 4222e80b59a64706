//! [`CtNetlink`]: the request socket (dump, get, update and pipelined updates), one request
//! at a time, with the draining of abandoned replies.

use std::io;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkPayload,
};
use netlink_packet_netfilter::{NetfilterProtoFamily, conntrack::ConntrackMessage};
use tokio::sync::mpsc;
use tracing::warn;

use super::update::{CtUpdate, encode_request, family_of, key_attributes};
use super::{CtNetlinkError, NlSocket, RECV_BUF, open_socket};
use crate::flows::{
    accounting::{DirTraffic, KernelCounters},
    conntrack::{CtEntry, CtTuple},
};
use crate::sync::conntrack::{CtMessage, CtParseError, decode_message};
use crate::sync::datagram::messages;

/// Most requests [`CtNetlink::update_many`] sends in one datagram: their acknowledgements
/// (one skb each, ~1 KiB of receive buffer with the request echoed on errors) must fit the
/// socket's default receive buffer (~208 KiB).
const PIPELINE: usize = 64;

/// Requests to ctnetlink in the current network namespace. One request at a time (`&mut self`).
pub struct CtNetlink {
    sock: NlSocket,
    seq: u32,
    buf: Vec<u8>,
    /// A request was abandoned before its reply was read (its future dropped, or it failed
    /// mid-way): the next request first drains what the kernel still has for it.
    in_flight: bool,
}

impl CtNetlink {
    /// Opens the request socket.
    pub fn new() -> Result<Self, CtNetlinkError> {
        Ok(CtNetlink {
            sock: open_socket("open ctnetlink socket")?,
            seq: 0,
            buf: vec![0; RECV_BUF],
            in_flight: false,
        })
    }

    /// The socket's netlink port id (events caused by this socket's updates carry it).
    pub fn port_id(&self) -> u32 {
        self.sock.port()
    }

    /// All conntrack entries, IPv4 and IPv6. Entries that do not decode are skipped with a
    /// warning (they stay on the kernel path).
    pub async fn dump(&mut self) -> Result<Vec<CtEntry>, CtNetlinkError> {
        // Each message becomes an entry as it arrives: a million entries as parsed netlink
        // messages (nested attribute vectors) would take gigabytes at once.
        let mut entries = Vec::new();
        self.request_each(
            "dump conntrack table",
            NetfilterProtoFamily::Unspec,
            ConntrackMessage::Get(vec![]),
            NLM_F_REQUEST | NLM_F_DUMP,
            |m| add_dumped(&mut entries, &m),
        )
        .await?;
        Ok(entries)
    }

    /// [`CtNetlink::dump`] in parts: whenever at least `chunk` entries are parsed (and at the
    /// end), they are sent to `out`, waiting while it is full, so the kernel produces the rest
    /// of the dump only as fast as `out` is emptied. Returns the number of entries sent; stops
    /// early (abandoning the dump) when `out` is closed.
    pub async fn dump_in_chunks(
        &mut self,
        chunk: usize,
        out: &mpsc::Sender<Vec<CtEntry>>,
    ) -> Result<usize, CtNetlinkError> {
        let mut reply = self
            .send_request(
                "dump conntrack table",
                NetfilterProtoFamily::Unspec,
                ConntrackMessage::Get(vec![]),
                NLM_F_REQUEST | NLM_F_DUMP,
            )
            .await?;
        let mut entries = Vec::with_capacity(chunk);
        let mut sent = 0;
        loop {
            let done = self
                .read_reply(&mut reply, &mut |m| add_dumped(&mut entries, &m))
                .await?;
            if entries.len() >= chunk || (done && !entries.is_empty()) {
                let full = std::mem::replace(&mut entries, Vec::with_capacity(chunk));
                let n = full.len();
                if out.send(full).await.is_err() {
                    return Ok(sent);
                }
                sent += n;
            }
            if done {
                return Ok(sent);
            }
        }
    }

    /// Conntrack's own counters of every entry that has them (none while
    /// `nf_conntrack_acct` is off), by original tuple and zone.
    pub async fn dump_counters(&mut self) -> Result<KernelCounters, CtNetlinkError> {
        let mut counters = KernelCounters::default();
        self.request_each(
            "dump conntrack counters",
            NetfilterProtoFamily::Unspec,
            ConntrackMessage::Get(vec![]),
            NLM_F_REQUEST | NLM_F_DUMP,
            |m| match m.counted() {
                Ok(c) => counters.extend(c.map(|(orig, zone, c)| ((orig, zone), c))),
                Err(e) => warn!(error = %e, "skipping malformed conntrack dump entry"),
            },
        )
        .await?;
        Ok(counters)
    }

    /// The entry with this original tuple in `zone`, if it exists.
    pub async fn get(
        &mut self,
        orig: &CtTuple,
        zone: u16,
    ) -> Result<Option<CtEntry>, CtNetlinkError> {
        self.get_with("get conntrack entry", orig, zone, |m| m.entry())
            .await
    }

    /// Conntrack's own counters of the entry with this original tuple in `zone`; `None` when it
    /// is gone or has none (`nf_conntrack_acct` was off when it was created).
    pub async fn get_counters(
        &mut self,
        orig: &CtTuple,
        zone: u16,
    ) -> Result<Option<DirTraffic>, CtNetlinkError> {
        self.get_with("get conntrack counters", orig, zone, |m| {
            Ok(m.counted()?.map(|(_, _, c)| c))
        })
        .await
    }

    /// The first answer `read` finds in the reply to a `get` of the entry with this original
    /// tuple in `zone`; `None` when there is no such entry.
    async fn get_with<T>(
        &mut self,
        op: &'static str,
        orig: &CtTuple,
        zone: u16,
        mut read: impl FnMut(&CtMessage<'_>) -> Result<Option<T>, CtParseError>,
    ) -> Result<Option<T>, CtNetlinkError> {
        let mut found: Result<Option<T>, CtParseError> = Ok(None);
        let result = self
            .request_each(
                op,
                family_of(orig),
                ConntrackMessage::Get(key_attributes(orig, zone)),
                NLM_F_REQUEST | NLM_F_ACK,
                |m| {
                    if let Ok(None) = found {
                        found = read(&m);
                    }
                },
            )
            .await;
        match result {
            Ok(()) => {}
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
        found.map_err(|source| CtNetlinkError::Malformed { op, source })
    }

    /// Applies `update` to the existing entry. Returns false when there is no such entry (or it
    /// is being destroyed); never creates one.
    pub async fn update(&mut self, update: &CtUpdate) -> Result<bool, CtNetlinkError> {
        let result = self
            .request_each(
                "update conntrack entry",
                family_of(&update.orig),
                ConntrackMessage::New(update.attributes()),
                // No NLM_F_CREATE: an unknown tuple is ENOENT. No NLM_F_EXCL: update in place.
                NLM_F_REQUEST | NLM_F_ACK,
                |_| {},
            )
            .await;
        match result {
            Ok(_) => Ok(true),
            // ETIME: the timeout was set on an entry that is dying.
            Err(e) if matches!(e.errno(), Some(libc::ENOENT | libc::ETIME)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Sets the timeout of the existing entry to `timeout_secs` from now; false when it is gone.
    pub async fn refresh_timeout(
        &mut self,
        orig: &CtTuple,
        zone: u16,
        timeout_secs: u32,
    ) -> Result<bool, CtNetlinkError> {
        self.update(&CtUpdate::new(*orig, zone).timeout(timeout_secs))
            .await
    }

    /// Sets `IP_CT_TCP_FLAG_BE_LIBERAL` (and clears `IP_CT_TCP_FLAG_MAXACK_SET`) on both
    /// directions of the existing TCP entry (see [`CtUpdate::tcp_liberal`] for why); false when
    /// it is gone.
    pub async fn set_tcp_liberal(
        &mut self,
        orig: &CtTuple,
        zone: u16,
    ) -> Result<bool, CtNetlinkError> {
        self.update(&CtUpdate::new(*orig, zone).tcp_liberal()).await
    }

    /// Applies every update in `updates` (in order), pipelined: up to `PIPELINE` requests go
    /// out in one datagram and their acknowledgements are collected together, so marking a
    /// batch of connections costs a few round trips, not one each. Per update: whether the
    /// entry existed (as [`CtNetlink::update`]) or the kernel's error for it. The outer error
    /// is a socket failure (the updates after it are not known to be applied).
    pub async fn update_many(
        &mut self,
        updates: &[CtUpdate],
    ) -> Result<Vec<Result<bool, CtNetlinkError>>, CtNetlinkError> {
        const OP: &str = "update conntrack entries";
        let mut out = Vec::with_capacity(updates.len());
        for chunk in updates.chunks(PIPELINE) {
            if self.in_flight {
                self.drain_stale();
            }
            self.in_flight = true;
            let first = self.seq.wrapping_add(1);
            let mut req = Vec::new();
            for u in chunk {
                self.seq = self.seq.wrapping_add(1);
                req.extend(encode_request(
                    family_of(&u.orig),
                    ConntrackMessage::New(u.attributes()),
                    NLM_F_REQUEST | NLM_F_ACK,
                    self.seq,
                ));
                // The kernel walks the datagram by NLMSG_ALIGN(nlmsg_len).
                req.resize(req.len().next_multiple_of(4), 0);
            }
            self.sock
                .send(&req)
                .await
                .map_err(|e| CtNetlinkError::from_io(OP, e))?;
            let mut results: Vec<Option<Result<bool, CtNetlinkError>>> =
                (0..chunk.len()).map(|_| None).collect();
            let mut pending = chunk.len();
            while pending > 0 {
                let n = self
                    .sock
                    .recv(&mut self.buf)
                    .await
                    .map_err(|e| CtNetlinkError::from_io(OP, e))?;
                let Some(datagram) = self.buf.get(..n) else {
                    continue;
                };
                for raw in messages(datagram) {
                    let raw = raw.map_err(|source| CtNetlinkError::Decode { op: OP, source })?;
                    let Ok(nl) = NetlinkBuffer::new_checked(raw) else {
                        continue;
                    };
                    let index = nl.sequence_number().wrapping_sub(first) as usize;
                    let Some(slot @ None) = results.get_mut(index) else {
                        continue; // a stale reply
                    };
                    let msg = decode_message(raw)
                        .map_err(|source| CtNetlinkError::Decode { op: OP, source })?;
                    let NetlinkPayload::Error(err) = msg.payload else {
                        continue;
                    };
                    *slot = Some(match err.code {
                        None => Ok(true),
                        Some(_) => {
                            let e = CtNetlinkError::from_io(OP, err.to_io());
                            match e.errno() {
                                // As in `update`: gone, or dying.
                                Some(libc::ENOENT | libc::ETIME) => Ok(false),
                                _ => Err(e),
                            }
                        }
                    });
                    pending -= 1;
                }
            }
            self.in_flight = false;
            out.extend(results.into_iter().flatten());
        }
        Ok(out)
    }

    /// Reads and discards everything queued on the socket. Reading also lets the kernel
    /// finish an abandoned dump (it produces the next part on each read), which would otherwise
    /// make the next dump fail with EBUSY. Stale replies that arrive later are skipped by
    /// sequence number anyway. Keeps the socket, so [`CtNetlink::port_id`] stays valid.
    fn drain_stale(&mut self) {
        while self.sock.try_recv(&mut self.buf).is_ok() {}
    }

    /// Sends one request and hands each conntrack message answering it to `each` as it
    /// arrives, until the ACK (plain requests) or NLMSG_DONE (dumps). Kernel errors become
    /// typed errors.
    async fn request_each(
        &mut self,
        op: &'static str,
        family: NetfilterProtoFamily,
        msg: ConntrackMessage,
        flags: u16,
        mut each: impl FnMut(CtMessage<'_>),
    ) -> Result<(), CtNetlinkError> {
        let mut reply = self.send_request(op, family, msg, flags).await?;
        while !self.read_reply(&mut reply, &mut each).await? {}
        Ok(())
    }

    /// Sends one request; its answer is read with [`CtNetlink::read_reply`].
    async fn send_request(
        &mut self,
        op: &'static str,
        family: NetfilterProtoFamily,
        msg: ConntrackMessage,
        flags: u16,
    ) -> Result<Reply, CtNetlinkError> {
        if self.in_flight {
            self.drain_stale();
        }
        self.in_flight = true;
        self.seq = self.seq.wrapping_add(1);
        let req = encode_request(family, msg, flags, self.seq);
        self.sock
            .send(&req)
            .await
            .map_err(|e| CtNetlinkError::from_io(op, e))?;
        Ok(Reply {
            op,
            seq: self.seq,
            dump: flags & NLM_F_DUMP == NLM_F_DUMP,
            interrupted: false,
        })
    }

    /// Reads one datagram of `reply` and hands its conntrack messages to `each`. True once the
    /// answer is complete (the ACK of a plain request, NLMSG_DONE of a dump). Kernel errors
    /// become typed errors.
    async fn read_reply(
        &mut self,
        reply: &mut Reply,
        each: &mut impl FnMut(CtMessage<'_>),
    ) -> Result<bool, CtNetlinkError> {
        let op = reply.op;
        let n = self
            .sock
            .recv(&mut self.buf)
            .await
            .map_err(|e| CtNetlinkError::from_io(op, e))?;
        let Some(datagram) = self.buf.get(..n) else {
            return Ok(false);
        };
        for raw in messages(datagram) {
            let raw = raw.map_err(|source| CtNetlinkError::Decode { op, source })?;
            let Ok(nl) = NetlinkBuffer::new_checked(raw) else {
                continue;
            };
            if nl.sequence_number() != reply.seq {
                continue; // a stale reply
            }
            reply.interrupted |= nl.flags() & NLM_F_DUMP_INTR != 0;
            match CtMessage::parse(raw) {
                Ok(Some(m)) => {
                    each(m);
                    continue;
                }
                Ok(None) => {}
                Err(e) if reply.dump => {
                    warn!(error = %e, "skipping undecodable conntrack dump entry");
                    continue;
                }
                Err(source) => return Err(CtNetlinkError::Decode { op, source }),
            }
            // Not a conntrack message: the answer's end (an error or ACK, NLMSG_DONE).
            let msg = match decode_message(raw) {
                Ok(msg) => msg,
                Err(e) if reply.dump => {
                    warn!(error = %e, "skipping undecodable conntrack dump entry");
                    continue;
                }
                Err(source) => return Err(CtNetlinkError::Decode { op, source }),
            };
            match msg.payload {
                NetlinkPayload::Error(err) => {
                    self.in_flight = false;
                    return match err.code {
                        None => Ok(true),
                        Some(_) => Err(CtNetlinkError::from_io(op, err.to_io())),
                    };
                }
                NetlinkPayload::Done(done) => {
                    self.in_flight = false;
                    if done.code < 0 {
                        return Err(CtNetlinkError::from_io(
                            op,
                            io::Error::from_raw_os_error(-done.code),
                        ));
                    }
                    if reply.interrupted {
                        // The table changed under the dump; entries may be missing or
                        // duplicated. The event stream covers the changes.
                        warn!("conntrack dump interrupted (NLM_F_DUMP_INTR)");
                    }
                    return Ok(true);
                }
                _ => {}
            }
        }
        Ok(false)
    }
}

/// Adds the entry of one dump message to `entries`; one that does not decode is skipped with
/// a warning (it stays on the kernel path).
fn add_dumped(entries: &mut Vec<CtEntry>, m: &CtMessage<'_>) {
    match m.entry() {
        Ok(e) => entries.extend(e),
        Err(e) => warn!(error = %e, "skipping malformed conntrack dump entry"),
    }
}

/// A request sent and not yet answered in full.
struct Reply {
    op: &'static str,
    seq: u32,
    dump: bool,
    /// A dump message came with NLM_F_DUMP_INTR.
    interrupted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_need_a_runtime() {
        // Outside tokio: a clear error instead of a panic.
        let Err(err) = CtNetlink::new() else {
            panic!("opened without a runtime");
        };
        assert!(err.to_string().contains("tokio runtime"), "{err}");
    }
}
