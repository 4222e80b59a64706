//! [`CtSubscription`]: the conntrack NEW/UPDATE/DESTROY event stream, read in bounded batches,
//! its own requests' echoes ignored (in the kernel, see [`super::echo_filter`]), and the queue
//! discarded at an overrun.

use std::{io, os::fd::AsRawFd};

use netlink_packet_core::NetlinkPayload;
use tracing::warn;

use super::{
    CtNetlinkError, DEFAULT_EVENT_RCVBUF, NFNLGRP_CONNTRACK_DESTROY, NFNLGRP_CONNTRACK_NEW,
    NFNLGRP_CONNTRACK_UPDATE, NlSocket, RECV_BUF, echo_filter, open_socket, recv_error,
};
use crate::flows::conntrack::CtEvent;
use crate::sync::conntrack::{decode_message, event_from_message};
use crate::sync::datagram::messages;
use crate::sync::nlsocket::setsockopt_int;

/// Most datagrams drained into one event batch, so one batch stays bounded.
const MAX_DATAGRAMS_PER_BATCH: usize = 256;

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
    /// [`CtNetlink::port_id`](super::CtNetlink::port_id)): the daemon's own timeout refreshes
    /// and "be liberal" marks come back as UPDATE events that carry nothing new. Call once per
    /// request socket to ignore.
    ///
    /// The kernel drops them before they are queued (the socket filter of [`super::echo_filter`]),
    /// so they take no room in the receive buffer; they are dropped again when read, in case
    /// the filter could not be attached (logged).
    pub fn ignore_events_from(&mut self, port: u32) {
        if self.ignored_ports.contains(&port) {
            return;
        }
        self.ignored_ports.push(port);
        let attached = echo_filter::program(&self.ignored_ports)
            .ok_or_else(|| io::Error::other("too many ports to ignore"))
            .and_then(|prog| echo_filter::attach(self.sock.socket().as_raw_fd(), &prog));
        if let Err(e) = attached {
            warn!(error = %e, port, "cannot filter the daemon's own conntrack events in the kernel: they take room in the event socket's buffer");
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
