//! The conntrack sysctls the daemon reads from `/proc/sys/net/netfilter`: the kernel's
//! timeouts a refresh restores ([`KernelTimeouts`]), whether conntrack verifies checksums
//! ([`conntrack_checksum`]) and counts traffic ([`conntrack_acct`]), and how many entries it
//! holds ([`conntrack_count`]).

use std::{io, path::Path};

use super::ctnetlink::CtNetlinkError;
use crate::flows::conntrack::{IPPROTO_TCP, IPPROTO_UDP};

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

/// `net.netfilter.nf_conntrack_acct` of the calling thread's network namespace: whether
/// conntrack counts packets and bytes per connection (for connections created while it is 1).
/// Missing or unreadable counts as the kernel default, 0.
pub fn conntrack_acct() -> bool {
    read_u32(Path::new("/proc/sys/net/netfilter/nf_conntrack_acct")).is_ok_and(|v| v != 0)
}

/// `net.netfilter.nf_conntrack_count` of the calling thread's network namespace: how many
/// entries conntrack holds now (what a dump will about return). None when unreadable.
pub fn conntrack_count() -> Option<u32> {
    read_u32(Path::new("/proc/sys/net/netfilter/nf_conntrack_count")).ok()
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
    use super::*;

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
}
