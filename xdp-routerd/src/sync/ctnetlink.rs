//! The ctnetlink socket: dump, events, timeout refresh.
//!
//! Two socket types, both tokio-driven and both living in the network namespace of the thread
//! that creates them (the daemon runs inside the router's netns):
//! - [`CtSubscription`] listens on the conntrack NEW/UPDATE/DESTROY multicast groups and yields
//!   batches of [`CtEvent`]s. A socket overrun (ENOBUFS: events were lost) surfaces as
//!   [`CtNetlinkError::Overrun`]; the caller then resyncs from a fresh [`CtNetlink::dump`] and
//!   keeps reading the same subscription (subscribe first, then dump, then reconcile). The
//!   events still queued at the overrun are discarded with it: they are older than the events
//!   the kernel dropped, and replayed after the dump they would bring back states the dump has
//!   already superseded (a closed connection offloaded again).
//! - [`CtNetlink`] sends requests: [`dump`](CtNetlink::dump), [`get`](CtNetlink::get) and
//!   [`update`](CtNetlink::update) (timeout refresh and TCP "be liberal" flags on an existing
//!   entry, never creating one).
//!
//! Constructors need a tokio runtime with IO enabled (the sockets register with its reactor).

use std::{
    io,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use netlink_packet_core::{
    DecodeError, NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer,
    NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterProtoFamily,
    conntrack::{ConntrackAttribute, ConntrackMessage, ProtoInfo, ProtoInfoTCP, TCPFlags},
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use tracing::warn;

use super::conntrack::{
    CTA_ZONE, CtParseError, decode_message, entry_from_message, event_from_message,
    tuple_attributes,
};
use super::datagram::messages;
use super::nlsocket::{AsyncNetlink, setsockopt_int};
use crate::flows::conntrack::{
    CtEntry, CtEvent, CtTuple, IPPROTO_TCP, IPPROTO_UDP, TCP_FLAG_BE_LIBERAL, TCP_FLAG_MAXACK_SET,
};
/// `NFNLGRP_CONNTRACK_NEW` (`uapi/linux/netfilter/nfnetlink.h`).
pub const NFNLGRP_CONNTRACK_NEW: u32 = 1;
/// `NFNLGRP_CONNTRACK_UPDATE`.
pub const NFNLGRP_CONNTRACK_UPDATE: u32 = 2;
/// `NFNLGRP_CONNTRACK_DESTROY`.
pub const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;

/// Receive buffer asked for the event socket: bursts of thousands of connections must not
/// overrun it between two reads.
pub const DEFAULT_EVENT_RCVBUF: usize = 16 << 20;

/// Receive buffer for one `recv`: the kernel's netlink dump skbs are at most 32 KiB, event
/// messages far smaller.
const RECV_BUF: usize = 64 << 10;

/// Most requests [`CtNetlink::update_many`] sends in one datagram: their acknowledgements
/// (one skb each, ~1 KiB of receive buffer with the request echoed on errors) must fit the
/// socket's default receive buffer (~208 KiB).
const PIPELINE: usize = 64;

/// Most datagrams drained into one event batch, so one batch stays bounded.
const MAX_DATAGRAMS_PER_BATCH: usize = 256;

/// What can go wrong talking ctnetlink.
#[derive(Debug, thiserror::Error)]
pub enum CtNetlinkError {
    /// EPERM from the kernel.
    #[error("ctnetlink {op}: permission denied: need CAP_NET_ADMIN")]
    PermissionDenied {
        /// The operation that failed.
        op: &'static str,
    },
    /// EPROTONOSUPPORT/EOPNOTSUPP: no nfnetlink or no ctnetlink in this kernel.
    #[error("ctnetlink {op}: nf_conntrack_netlink not available in this kernel")]
    NotAvailable {
        /// The operation that failed.
        op: &'static str,
    },
    /// The event socket overflowed (ENOBUFS): events were lost; resync from a fresh dump.
    #[error("ctnetlink event socket overrun (ENOBUFS): events were lost, resync from a dump")]
    Overrun,
    /// Any other error reported by the kernel or the socket layer.
    #[error("ctnetlink {op}: {source}")]
    Io {
        /// The operation that failed.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A reply that does not parse as netlink.
    #[error("ctnetlink {op}: undecodable reply: {source}")]
    Decode {
        /// The operation that failed.
        op: &'static str,
        /// The decoder's error.
        #[source]
        source: DecodeError,
    },
    /// A reply that is netlink but not a usable conntrack entry.
    #[error("ctnetlink {op}: {source}")]
    Malformed {
        /// The operation that failed.
        op: &'static str,
        /// What is wrong with the entry.
        #[source]
        source: CtParseError,
    },
    /// A conntrack timeout sysctl could not be read.
    #[error("reading {}: {source}", path.display())]
    Sysctl {
        /// The sysctl file.
        path: PathBuf,
        /// Why it could not be read or parsed.
        #[source]
        source: io::Error,
    },
}

impl CtNetlinkError {
    /// Classifies an OS error of operation `op` (errno → typed error).
    fn from_io(op: &'static str, source: io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::EPERM) => CtNetlinkError::PermissionDenied { op },
            Some(libc::EPROTONOSUPPORT | libc::EOPNOTSUPP) => CtNetlinkError::NotAvailable { op },
            _ => CtNetlinkError::Io { op, source },
        }
    }

    /// The errno behind this error, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            CtNetlinkError::PermissionDenied { .. } => Some(libc::EPERM),
            CtNetlinkError::NotAvailable { .. } => Some(libc::EOPNOTSUPP),
            CtNetlinkError::Overrun => Some(libc::ENOBUFS),
            CtNetlinkError::Io { source, .. } | CtNetlinkError::Sysctl { source, .. } => {
                source.raw_os_error()
            }
            CtNetlinkError::Decode { .. } | CtNetlinkError::Malformed { .. } => None,
        }
    }
}

/// The ctnetlink flavour of the shared async netlink socket.
type NlSocket = AsyncNetlink;

fn open_socket(op: &'static str) -> Result<NlSocket, CtNetlinkError> {
    AsyncNetlink::open(NETLINK_NETFILTER).map_err(|e| CtNetlinkError::from_io(op, e))
}

/// The conntrack event stream of the current network namespace.
pub struct CtSubscription {
    sock: NlSocket,
    buf: Vec<u8>,
    rcvbuf: usize,
    ignored_ports: Vec<u32>,
    decode_errors: u64,
    stale_discarded: u64,
}

impl CtSubscription {
    /// Subscribes to NEW, UPDATE and DESTROY events with a [`DEFAULT_EVENT_RCVBUF`] buffer.
    pub fn new() -> Result<Self, CtNetlinkError> {
        Self::with_rcvbuf(DEFAULT_EVENT_RCVBUF)
    }

    /// Subscribes with a receive buffer of `bytes` (SO_RCVBUFFORCE, falling back to SO_RCVBUF,
    /// which the kernel caps at `net.core.rmem_max`).
    pub fn with_rcvbuf(bytes: usize) -> Result<Self, CtNetlinkError> {
        const OP: &str = "subscribe to conntrack events";
        let sock = open_socket(OP)?;
        let s = sock.socket();
        let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        if setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).is_err() {
            // Without CAP_NET_ADMIN in the initial user namespace: the capped variant.
            s.set_rx_buf_sz(size)
                .map_err(|e| CtNetlinkError::from_io(OP, e))?;
        }
        let rcvbuf = s
            .get_rx_buf_sz()
            .map_err(|e| CtNetlinkError::from_io(OP, e))?;
        for group in [
            NFNLGRP_CONNTRACK_NEW,
            NFNLGRP_CONNTRACK_UPDATE,
            NFNLGRP_CONNTRACK_DESTROY,
        ] {
            s.add_membership(group)
                .map_err(|e| CtNetlinkError::from_io(OP, e))?;
        }
        Ok(CtSubscription {
            sock,
            buf: vec![0; RECV_BUF],
            rcvbuf,
            ignored_ports: Vec::new(),
            decode_errors: 0,
            stale_discarded: 0,
        })
    }

    /// The receive buffer the kernel granted, in bytes (as reported by SO_RCVBUF).
    pub fn rcvbuf(&self) -> usize {
        self.rcvbuf
    }

    /// Drops events caused by requests from the netlink port `port` (see
    /// [`CtNetlink::port_id`]): the daemon's own timeout refreshes come back as UPDATE events
    /// that carry nothing new. Call once per request socket to ignore.
    pub fn ignore_events_from(&mut self, port: u32) {
        if !self.ignored_ports.contains(&port) {
            self.ignored_ports.push(port);
        }
    }

    /// Messages that could not be decoded and were skipped so far.
    pub fn decode_errors(&self) -> u64 {
        self.decode_errors
    }

    /// Event datagrams discarded at overruns so far (see [`CtSubscription::next_batch`]).
    pub fn stale_discarded(&self) -> u64 {
        self.stale_discarded
    }

    /// Waits for events and returns those that are queued (at least one datagram's worth;
    /// the batch may still be empty when a datagram held only ignored messages).
    ///
    /// [`CtNetlinkError::Overrun`] means events were lost: resync from a dump, then keep
    /// calling this method. The events that were still queued (this batch's included) are
    /// discarded before it is returned: the kernel reports the overrun ahead of them, but they
    /// are older than the events it dropped, so applied after the dump they would undo it
    /// (a connection that closed meanwhile would be offloaded again, its closing events lost).
    pub async fn next_batch(&mut self) -> Result<Vec<CtEvent>, CtNetlinkError> {
        const OP: &str = "receive conntrack events";
        let mut events = Vec::new();
        let n = match self.sock.recv(&mut self.buf).await {
            Ok(n) => n,
            Err(e) => return Err(self.on_error(OP, e)),
        };
        self.collect(n, &mut events);
        for _ in 1..MAX_DATAGRAMS_PER_BATCH {
            match self.sock.try_recv(&mut self.buf) {
                Ok(n) => self.collect(n, &mut events),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(self.on_error(OP, e)),
            }
        }
        Ok(events)
    }

    /// Turns a receive error into [`CtNetlinkError`]; at an overrun, first discards every
    /// event datagram still queued (including ones that overflow again meanwhile), for two
    /// reasons: they are older than the events the kernel dropped (see
    /// [`CtSubscription::next_batch`]), and after reporting ENOBUFS once the kernel drops
    /// every further event for this socket, silently, until its receive queue has been
    /// emptied (`NETLINK_S_CONGESTED`, cleared in `netlink_rcv_wake`): events after the
    /// resync's dump would be lost too.
    fn on_error(&mut self, op: &'static str, e: io::Error) -> CtNetlinkError {
        let err = recv_error(op, e);
        if matches!(err, CtNetlinkError::Overrun) {
            // Bounded: a queue refilled faster than it drains must not hold the task forever.
            for _ in 0..1_000_000 {
                match self.sock.try_recv(&mut self.buf) {
                    Ok(_) => self.stale_discarded += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // Another overrun report (or an error): keep draining until empty.
                    Err(_) => {}
                }
            }
        }
        err
    }

    fn collect(&mut self, len: usize, events: &mut Vec<CtEvent>) {
        let Some(datagram) = self.buf.get(..len) else {
            return;
        };
        for raw in messages(datagram) {
            let msg = match raw.and_then(decode_message) {
                Ok(msg) => msg,
                Err(e) => {
                    self.decode_errors += 1;
                    warn!(error = %e, "skipping undecodable conntrack event");
                    continue;
                }
            };
            if self.ignored_ports.contains(&msg.header.port_number) {
                continue;
            }
            let NetlinkPayload::InnerMessage(inner) = &msg.payload else {
                continue;
            };
            match event_from_message(inner, msg.header.flags) {
                Ok(Some(ev)) => events.push(ev),
                Ok(None) => {}
                Err(e) => {
                    self.decode_errors += 1;
                    warn!(error = %e, "skipping malformed conntrack event");
                }
            }
        }
    }
}

fn recv_error(op: &'static str, e: io::Error) -> CtNetlinkError {
    if e.raw_os_error() == Some(libc::ENOBUFS) {
        CtNetlinkError::Overrun
    } else {
        CtNetlinkError::from_io(op, e)
    }
}

/// A change to one existing conntrack entry, sent as one `IPCTNL_MSG_CT_NEW` without
/// `NLM_F_CREATE` (the kernel answers ENOENT instead of creating the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtUpdate {
    /// The entry's original tuple.
    pub orig: CtTuple,
    /// The entry's zone.
    pub zone: u16,
    /// New timeout in seconds (`CTA_TIMEOUT`), if any.
    pub timeout: Option<u32>,
    /// Set `IP_CT_TCP_FLAG_BE_LIBERAL` and clear `IP_CT_TCP_FLAG_MAXACK_SET` on both
    /// directions (TCP only; no other flag is touched).
    ///
    /// Why: once the fast path carries the data, conntrack's TCP window tracking no longer sees
    /// the sequence numbers and ACKs. The closing FIN would look out of window, become INVALID
    /// and be dropped by a FORWARD chain that accepts only ESTABLISHED (hence "be liberal");
    /// and an RST would be checked against a stale `td_maxack` of the other direction, found
    /// not to match exactly and ignored ("keep established state to allow a possible challenge
    /// ACK"), leaving the entry ESTABLISHED for days (hence clearing MAXACK_SET, which skips
    /// that check until conntrack sees an ACK again). nf_flowtable does the same in
    /// `flow_offload_fixup_tcp()`. Conntrack sets MAXACK_SET again on the next ACK it sees, so
    /// the keep-alive repeats this with each refresh.
    pub tcp_liberal: bool,
}

impl CtUpdate {
    /// An update of the entry with this original tuple and zone that changes nothing yet.
    pub fn new(orig: CtTuple, zone: u16) -> Self {
        CtUpdate {
            orig,
            zone,
            timeout: None,
            tcp_liberal: false,
        }
    }

    /// The update for `entry` (keyed by its original tuple and zone).
    pub fn for_entry(entry: &CtEntry) -> Self {
        Self::new(entry.orig, entry.zone)
    }

    /// Also sets the timeout to `secs` seconds from now.
    pub fn timeout(mut self, secs: u32) -> Self {
        self.timeout = Some(secs);
        self
    }

    /// Also marks both TCP directions "be liberal" (see [`CtUpdate::tcp_liberal`]).
    pub fn tcp_liberal(mut self) -> Self {
        self.tcp_liberal = true;
        self
    }

    /// The request attributes.
    fn attributes(&self) -> Vec<ConntrackAttribute> {
        let mut attrs = key_attributes(&self.orig, self.zone);
        if let Some(t) = self.timeout {
            attrs.push(ConntrackAttribute::CtaTimeout(t));
        }
        if self.tcp_liberal && self.orig.proto == IPPROTO_TCP {
            let flags = || {
                // struct nf_ct_tcp_flags { flags, mask }: the kernel clears the mask's bits,
                // then sets those of flags. TCPFlags is non-exhaustive; its parser is the
                // public constructor.
                TCPFlags::parse(&[
                    TCP_FLAG_BE_LIBERAL,
                    TCP_FLAG_BE_LIBERAL | TCP_FLAG_MAXACK_SET,
                ])
                .expect("two bytes always parse as TCP flags")
            };
            attrs.push(ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(
                vec![
                    ProtoInfoTCP::OriginalFlags(flags()),
                    ProtoInfoTCP::ReplyFlags(flags()),
                ],
            )]));
        }
        attrs
    }
}

/// `CTA_TUPLE_ORIG` (+ `CTA_ZONE` when not 0): what the kernel looks an entry up by.
fn key_attributes(orig: &CtTuple, zone: u16) -> Vec<ConntrackAttribute> {
    let mut attrs = vec![ConntrackAttribute::CtaTupleOrig(tuple_attributes(orig))];
    if zone != 0 {
        attrs.push(ConntrackAttribute::Other(
            netlink_packet_core::DefaultNla::new(CTA_ZONE, zone.to_be_bytes().to_vec()),
        ));
    }
    attrs
}

fn family_of(tuple: &CtTuple) -> NetfilterProtoFamily {
    if tuple.src.is_ipv6() {
        NetfilterProtoFamily::IPv6
    } else {
        NetfilterProtoFamily::IPv4
    }
}

/// Builds one ctnetlink request datagram.
pub fn encode_request(
    family: NetfilterProtoFamily,
    msg: ConntrackMessage,
    flags: u16,
    seq: u32,
) -> Vec<u8> {
    let mut header = NetlinkHeader::default();
    header.flags = flags;
    header.sequence_number = seq;
    let mut packet = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            msg,
        )),
    );
    packet.finalize();
    let mut buf = vec![0; packet.buffer_len()];
    packet.serialize(&mut buf);
    buf
}

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
            |m| match entry_from_message(&m) {
                Ok(e) => entries.extend(e),
                Err(e) => warn!(error = %e, "skipping malformed conntrack dump entry"),
            },
        )
        .await?;
        Ok(entries)
    }

    /// The entry with this original tuple in `zone`, if it exists.
    pub async fn get(
        &mut self,
        orig: &CtTuple,
        zone: u16,
    ) -> Result<Option<CtEntry>, CtNetlinkError> {
        let result = self
            .request(
                "get conntrack entry",
                family_of(orig),
                ConntrackMessage::Get(key_attributes(orig, zone)),
                NLM_F_REQUEST | NLM_F_ACK,
            )
            .await;
        let msgs = match result {
            Ok(msgs) => msgs,
            Err(e) if e.errno() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        };
        for m in &msgs {
            let entry = entry_from_message(m).map_err(|source| CtNetlinkError::Malformed {
                op: "get conntrack entry",
                source,
            })?;
            if entry.is_some() {
                return Ok(entry);
            }
        }
        Ok(None)
    }

    /// Applies `update` to the existing entry. Returns false when there is no such entry (or it
    /// is being destroyed); never creates one.
    pub async fn update(&mut self, update: &CtUpdate) -> Result<bool, CtNetlinkError> {
        let result = self
            .request(
                "update conntrack entry",
                family_of(&update.orig),
                ConntrackMessage::New(update.attributes()),
                // No NLM_F_CREATE: an unknown tuple is ENOENT. No NLM_F_EXCL: update in place.
                NLM_F_REQUEST | NLM_F_ACK,
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

    /// Applies every update in `updates` (in order), pipelined: up to [`PIPELINE`] requests go
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

    /// Sends one request and collects the conntrack messages answering it, until the ACK
    /// (plain requests) or NLMSG_DONE (dumps). Kernel errors become typed errors.
    async fn request(
        &mut self,
        op: &'static str,
        family: NetfilterProtoFamily,
        msg: ConntrackMessage,
        flags: u16,
    ) -> Result<Vec<NetfilterMessage>, CtNetlinkError> {
        let mut out = Vec::new();
        self.request_each(op, family, msg, flags, |m| out.push(m))
            .await?;
        Ok(out)
    }

    /// [`CtNetlink::request`], handing each answering message to `each` as it arrives.
    async fn request_each(
        &mut self,
        op: &'static str,
        family: NetfilterProtoFamily,
        msg: ConntrackMessage,
        flags: u16,
        mut each: impl FnMut(NetfilterMessage),
    ) -> Result<(), CtNetlinkError> {
        if self.in_flight {
            self.drain_stale();
        }
        self.in_flight = true;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let req = encode_request(family, msg, flags, seq);
        self.sock
            .send(&req)
            .await
            .map_err(|e| CtNetlinkError::from_io(op, e))?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut interrupted = false;
        loop {
            let n = self
                .sock
                .recv(&mut self.buf)
                .await
                .map_err(|e| CtNetlinkError::from_io(op, e))?;
            let Some(datagram) = self.buf.get(..n) else {
                continue;
            };
            for raw in messages(datagram) {
                let raw = raw.map_err(|source| CtNetlinkError::Decode { op, source })?;
                let Ok(nl) = NetlinkBuffer::new_checked(raw) else {
                    continue;
                };
                if nl.sequence_number() != seq {
                    continue; // a stale reply
                }
                interrupted |= nl.flags() & NLM_F_DUMP_INTR != 0;
                let msg = match decode_message(raw) {
                    Ok(msg) => msg,
                    Err(e) if dump => {
                        warn!(error = %e, "skipping undecodable conntrack dump entry");
                        continue;
                    }
                    Err(source) => return Err(CtNetlinkError::Decode { op, source }),
                };
                match msg.payload {
                    NetlinkPayload::InnerMessage(m) => each(m),
                    NetlinkPayload::Error(err) => {
                        self.in_flight = false;
                        return match err.code {
                            None => Ok(()),
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
                        if interrupted {
                            // The table changed under the dump; entries may be missing or
                            // duplicated. The event stream covers the changes.
                            warn!("conntrack dump interrupted (NLM_F_DUMP_INTR)");
                        }
                        return Ok(());
                    }
                    _ => {}
                }
            }
        }
    }
}

/// The kernel's conntrack timeouts (seconds) that a refresh should restore, read from
/// `/proc/sys/net/netfilter` of the current network namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTimeouts {
    /// `nf_conntrack_tcp_timeout_established`.
    pub tcp_established: u32,
    /// `nf_conntrack_udp_timeout_stream` (UDP with traffic both ways).
    pub udp_stream: u32,
}

impl KernelTimeouts {
    /// Reads the timeouts of the calling thread's network namespace.
    pub fn read() -> Result<Self, CtNetlinkError> {
        Self::read_from(Path::new("/proc/sys/net/netfilter"))
    }

    /// Reads the timeouts from a directory laid out like `/proc/sys/net/netfilter`.
    pub fn read_from(dir: &Path) -> Result<Self, CtNetlinkError> {
        Ok(KernelTimeouts {
            tcp_established: read_u32(&dir.join("nf_conntrack_tcp_timeout_established"))?,
            udp_stream: read_u32(&dir.join("nf_conntrack_udp_timeout_stream"))?,
        })
    }

    /// The timeout the kernel itself would give an offloaded (established/assured) flow of
    /// `proto`, or None for protocols the fast path does not carry.
    pub fn for_proto(&self, proto: u8) -> Option<u32> {
        match proto {
            IPPROTO_TCP => Some(self.tcp_established),
            IPPROTO_UDP => Some(self.udp_stream),
            _ => None,
        }
    }
}

/// `net.netfilter.nf_conntrack_checksum` of the calling thread's network namespace: whether
/// conntrack verifies TCP/UDP checksums (and marks bad ones INVALID). Missing or unreadable
/// (conntrack not loaded yet) counts as the kernel default, 1.
pub fn conntrack_checksum() -> bool {
    conntrack_checksum_in(Path::new("/proc/sys/net/netfilter"))
}

/// [`conntrack_checksum`] from a directory laid out like `/proc/sys/net/netfilter`.
pub fn conntrack_checksum_in(dir: &Path) -> bool {
    read_u32(&dir.join("nf_conntrack_checksum")).map_or(true, |v| v != 0)
}

fn read_u32(path: &Path) -> Result<u32, CtNetlinkError> {
    let err = |source| CtNetlinkError::Sysctl {
        path: path.to_owned(),
        source,
    };
    let text = std::fs::read_to_string(path).map_err(err)?;
    text.trim().parse().map_err(|e| {
        err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a number of seconds ({:?}): {e}", text.trim()),
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use netlink_packet_core::{NLA_TYPE_MASK, NLM_F_CREATE, NLM_F_EXCL, Nla};
    use netlink_packet_netfilter::{NetfilterMessageInner, conntrack::Tuple};

    use super::*;

    fn tcp4() -> CtTuple {
        CtTuple {
            src: IpAddr::V4(Ipv4Addr::new(10, 71, 1, 2)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 71, 2, 2)),
            proto: IPPROTO_TCP,
            sport: 47252,
            dport: 5002,
        }
    }

    /// Encodes `update` as the socket would and decodes it back with the crate's parser.
    fn round_trip(update: &CtUpdate) -> (NetlinkHeader, NetfilterMessage) {
        let bytes = encode_request(
            family_of(&update.orig),
            ConntrackMessage::New(update.attributes()),
            NLM_F_REQUEST | NLM_F_ACK,
            42,
        );
        let msg = decode_message(&bytes).expect("request decodes");
        assert_eq!(msg.header.length as usize, bytes.len());
        match msg.payload {
            NetlinkPayload::InnerMessage(m) => (msg.header, m),
            other => panic!("unexpected payload {other:?}"),
        }
    }

    fn attrs(m: &NetfilterMessage) -> &[ConntrackAttribute] {
        match &m.inner {
            NetfilterMessageInner::Conntrack(ConntrackMessage::New(a)) => a,
            other => panic!("not IPCTNL_MSG_CT_NEW: {other:?}"),
        }
    }

    #[test]
    fn update_never_creates_and_carries_timeout_and_liberal_flags() {
        let update = CtUpdate::new(tcp4(), 0).timeout(120).tcp_liberal();
        let (header, msg) = round_trip(&update);
        // (NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_NEW
        assert_eq!(header.message_type, 0x0100);
        assert_eq!(
            header.flags & (NLM_F_CREATE | NLM_F_EXCL),
            0,
            "must not create"
        );
        assert_eq!(header.flags, NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(header.sequence_number, 42);
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv4);
        let attrs = attrs(&msg);
        assert_eq!(attrs.len(), 3, "tuple, timeout, protoinfo: {attrs:?}");
        let ConntrackAttribute::CtaTupleOrig(t) = &attrs[0] else {
            panic!("first attribute is CTA_TUPLE_ORIG: {attrs:?}");
        };
        assert_eq!(t, &tuple_attributes(&tcp4()));
        assert_eq!(attrs[1], ConntrackAttribute::CtaTimeout(120));
        let ConntrackAttribute::CtaProtoInfo(info) = &attrs[2] else {
            panic!("third attribute is CTA_PROTOINFO: {attrs:?}");
        };
        let [ProtoInfo::TCP(tcp)] = info.as_slice() else {
            panic!("CTA_PROTOINFO_TCP expected: {info:?}");
        };
        for (i, item) in tcp.iter().enumerate() {
            let f = match item {
                ProtoInfoTCP::OriginalFlags(f) | ProtoInfoTCP::ReplyFlags(f) => f,
                other => panic!("only flags are sent: {other:?}"),
            };
            // Sets BE_LIBERAL, clears MAXACK_SET; no other flag is touched.
            assert_eq!((f.flags, f.mask), (0x08, 0x28), "direction {i}");
        }
        assert_eq!(tcp.len(), 2);
    }

    #[test]
    fn update_keys_by_zone_and_family() {
        let udp6 = CtTuple {
            src: IpAddr::V6(Ipv6Addr::new(0xfd71, 1, 0, 0, 0, 0, 0, 2)),
            dst: IpAddr::V6(Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 2)),
            proto: IPPROTO_UDP,
            sport: 40002,
            dport: 5001,
        };
        // Liberal flags are TCP-only; zone 0 is implicit, other zones are sent.
        let (_, msg) = round_trip(&CtUpdate::new(udp6, 9).timeout(30).tcp_liberal());
        assert_eq!(msg.header.family, NetfilterProtoFamily::IPv6);
        let attrs = attrs(&msg);
        assert!(matches!(&attrs[0], ConntrackAttribute::CtaTupleOrig(t)
            if matches!(&t[0], Tuple::Ip(_))));
        let zone = attrs
            .iter()
            .find_map(|a| match a {
                ConntrackAttribute::Other(n) if n.kind() & NLA_TYPE_MASK == CTA_ZONE => {
                    let mut v = [0u8; 2];
                    n.emit_value(&mut v);
                    Some(u16::from_be_bytes(v))
                }
                _ => None,
            })
            .expect("CTA_ZONE sent");
        assert_eq!(zone, 9);
        assert!(
            !attrs
                .iter()
                .any(|a| matches!(a, ConntrackAttribute::CtaProtoInfo(_)))
        );

        let (_, msg) = round_trip(&CtUpdate::new(tcp4(), 0));
        assert_eq!(
            super::tests::attrs(&msg).len(),
            1,
            "zone 0 and no changes: only the tuple"
        );
    }

    #[test]
    fn a_datagram_of_requests_splits_into_them() {
        let a = encode_request(
            NetfilterProtoFamily::Unspec,
            ConntrackMessage::Get(vec![]),
            NLM_F_REQUEST | NLM_F_DUMP,
            1,
        );
        let b = encode_request(
            NetfilterProtoFamily::IPv4,
            ConntrackMessage::New(CtUpdate::new(tcp4(), 0).timeout(5).attributes()),
            NLM_F_REQUEST,
            2,
        );
        let mut datagram = a.clone();
        datagram.extend_from_slice(&b);
        let parts: Vec<_> = messages(&datagram)
            .collect::<Result<_, _>>()
            .expect("splits");
        assert_eq!(parts, vec![a.as_slice(), b.as_slice()]);

        // A truncated trailing message is an error, not a panic or a silent stop.
        datagram.extend_from_slice(&[0x40, 0, 0, 0, 0]);
        let results: Vec<_> = messages(&datagram).collect();
        assert_eq!(results.len(), 3);
        assert!(results[2].is_err());
    }

    #[test]
    fn errors_name_the_fix() {
        let perm = CtNetlinkError::from_io("dump", io::Error::from_raw_os_error(libc::EPERM));
        assert_eq!(
            perm.to_string(),
            "ctnetlink dump: permission denied: need CAP_NET_ADMIN"
        );
        let missing = CtNetlinkError::from_io(
            "subscribe",
            io::Error::from_raw_os_error(libc::EPROTONOSUPPORT),
        );
        assert!(
            missing
                .to_string()
                .contains("nf_conntrack_netlink not available"),
            "{missing}"
        );
        assert!(matches!(
            recv_error("events", io::Error::from_raw_os_error(libc::ENOBUFS)),
            CtNetlinkError::Overrun
        ));
        let other = CtNetlinkError::from_io("get", io::Error::from_raw_os_error(libc::ENOENT));
        assert_eq!(other.errno(), Some(libc::ENOENT));
    }

    #[test]
    fn kernel_timeouts_from_sysctl_files() {
        let dir = std::env::temp_dir().join(format!("xr-ct-sysctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("nf_conntrack_tcp_timeout_established"), "432000\n")
            .expect("write");
        std::fs::write(dir.join("nf_conntrack_udp_timeout_stream"), "120\n").expect("write");
        let t = KernelTimeouts::read_from(&dir).expect("reads");
        assert_eq!(
            t,
            KernelTimeouts {
                tcp_established: 432_000,
                udp_stream: 120
            }
        );
        assert_eq!(t.for_proto(IPPROTO_TCP), Some(432_000));
        assert_eq!(t.for_proto(IPPROTO_UDP), Some(120));
        assert_eq!(t.for_proto(1), None);

        std::fs::write(dir.join("nf_conntrack_udp_timeout_stream"), "soon\n").expect("write");
        let err = KernelTimeouts::read_from(&dir).expect_err("not a number");
        assert!(
            err.to_string().contains("nf_conntrack_udp_timeout_stream"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn sockets_need_a_runtime() {
        // Outside tokio: a clear error instead of a panic.
        let Err(err) = CtNetlink::new() else {
            panic!("opened without a runtime");
        };
        assert!(err.to_string().contains("tokio runtime"), "{err}");
    }
}
