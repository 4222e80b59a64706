//! The ctnetlink socket: dump, events, timeout refresh.
//!
//! Two socket types, both tokio-driven and both living in the network namespace of the thread
//! that creates them (the daemon runs inside the router's netns):
//! - [`CtSubscription`] listens on the conntrack NEW/UPDATE/DESTROY multicast groups and yields
//!   batches of [`CtEvent`](crate::flows::conntrack::CtEvent)s. A socket overrun (ENOBUFS: events were lost) surfaces as
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
//!
//! Here: the error type, the multicast groups and the socket helpers both share; `events`
//! (the subscription), `echo_filter` (the subscription's kernel-side filter of the daemon's
//! own requests' events), `requests` (the request socket), `update` (request encoding). The
//! conntrack sysctls are read in [`super::sysctl`].

use std::{io, path::PathBuf};

use netlink_packet_core::DecodeError;
use netlink_sys::protocols::NETLINK_NETFILTER;

use crate::sync::conntrack::CtParseError;
use crate::sync::nlsocket::AsyncNetlink;

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
pub(super) const RECV_BUF: usize = 64 << 10;

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
    pub(super) fn from_io(op: &'static str, source: io::Error) -> Self {
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
pub(super) type NlSocket = AsyncNetlink;

pub(super) fn open_socket(op: &'static str) -> Result<NlSocket, CtNetlinkError> {
    AsyncNetlink::open(NETLINK_NETFILTER).map_err(|e| CtNetlinkError::from_io(op, e))
}

/// A receive error: ENOBUFS is an overrun, anything else classified as by
/// [`CtNetlinkError::from_io`].
pub(super) fn recv_error(op: &'static str, e: io::Error) -> CtNetlinkError {
    if e.raw_os_error() == Some(libc::ENOBUFS) {
        CtNetlinkError::Overrun
    } else {
        CtNetlinkError::from_io(op, e)
    }
}

mod echo_filter;
mod events;
mod requests;
mod update;

pub use events::CtSubscription;
pub use requests::CtNetlink;
pub use update::{CtUpdate, encode_request};

#[cfg(test)]
mod tests {
    use super::*;

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
}
