//! [`CtSubscription`]: the conntrack NEW/UPDATE/DESTROY event stream, read in bounded batches,
//! its own requests' echoes ignored (in the kernel, see [`super::echo_filter`]), and the queue
//! discarded at an overrun.

use std::{io, os::fd::AsRawFd, time::Duration};

use tracing::warn;

use super::{
    CtNetlinkError, DEFAULT_EVENT_RCVBUF, NFNLGRP_CONNTRACK_DESTROY, NFNLGRP_CONNTRACK_NEW,
    NFNLGRP_CONNTRACK_UPDATE, NlSocket, RECV_BUF, echo_filter, open_socket, recv_error,
};
use crate::flows::conntrack::CtEvent;
use crate::sync::conntrack::CtMessage;
use crate::sync::datagram::messages;
use crate::sync::nlsocket::setsockopt_int;

/// Most datagrams drained into one event batch, so one batch stays bounded.
const MAX_DATAGRAMS_PER_BATCH: usize = 256;

/// A batch of fewer datagrams than this when the reader woke up waits [`COALESCE`] for more
/// before it is handed on: each batch costs the event loop a fixed amount (the state lock,
/// route resolution, a read of the kernel-forwarded counters, a "be liberal" pipeline), which
/// at a few events per wake-up made the daemon's cost per new connection several times what
/// the events themselves cost (docs/benchmarks.md, connection churn).
const COALESCE_BELOW: usize = 32;

/// How long a small batch waits for more events: well under what a connection takes to carry
/// its first data, so offloading is not noticeably later.
const COALESCE: Duration = Duration::from_millis(1);

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
    /// the batch may still be empty when a datagram held only ignored messages); when only a
    /// few were, waits [`COALESCE`] and adds those that arrived meanwhile.
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
        let mut read = 1 + self.drain(MAX_DATAGRAMS_PER_BATCH - 1, &mut events)?;
        if read < COALESCE_BELOW {
            tokio::time::sleep(COALESCE).await;
            read += self.drain(MAX_DATAGRAMS_PER_BATCH - read, &mut events)?;
        }
        debug_assert!(read <= MAX_DATAGRAMS_PER_BATCH);
        Ok(events)
    }

    /// Reads at most `max` queued datagrams without waiting; returns how many it read.
    fn drain(&mut self, max: usize, events: &mut Vec<CtEvent>) -> Result<usize, CtNetlinkError> {
        const OP: &str = "receive conntrack events";
        for read in 0..max {
            match self.sock.try_recv(&mut self.buf) {
                Ok(n) => self.collect(n, events),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(read),
                Err(e) => return Err(self.on_error(OP, e)),
            }
        }
        Ok(max)
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
            let msg = match raw.and_then(CtMessage::parse) {
                Ok(Some(msg)) => msg,
                Ok(None) => continue,
                Err(e) => {
                    self.decode_errors += 1;
                    warn!(error = %e, "skipping undecodable conntrack event");
                    continue;
                }
            };
            if self.ignored_ports.contains(&msg.port) {
                continue;
            }
            match msg.event() {
                Ok(ev) => events.push(ev),
                Err(e) => {
                    self.decode_errors += 1;
                    warn!(error = %e, "skipping malformed conntrack event");
                }
            }
        }
    }
}
