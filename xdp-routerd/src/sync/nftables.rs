//! Firewall ruleset changes: nftables commit notifications and iptables-legacy polling.
//!
//! Every nftables transaction (`nft`, `iptables-nft`, firewalld, …) ends with one
//! `NFT_MSG_NEWGEN` on the `NFNLGRP_NFTABLES` multicast group of `NETLINK_NETFILTER`. The daemon
//! turns each into a ruleset generation bump (see `Datapath::bump_ruleset_generation`): every
//! offloaded flow direction then goes through the kernel's rules again until the kernel forwards
//! one of its packets. A socket overrun (lost notifications) counts as a change.
//!
//! iptables-legacy has no notifications: while legacy tables exist (`/proc/net/ip_tables_names`
//! or `ip6_tables_names` non-empty) its rules are read every [`LEGACY_POLL`] with
//! `iptables-legacy-save` / `ip6tables-legacy-save` and compared without their counters. The
//! poll runs on a thread of its own and costs two `pread`s and a sleep while no legacy table
//! exists.

use std::{
    collections::hash_map::DefaultHasher,
    fs::File,
    hash::{Hash as _, Hasher as _},
    io,
    os::unix::fs::FileExt as _,
    path::PathBuf,
    time::Duration,
};

use netlink_sys::protocols::NETLINK_NETFILTER;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::nlsocket::notification_socket;

/// `NFNLGRP_NFTABLES` (`uapi/linux/netfilter/nfnetlink.h`).
pub const NFNLGRP_NFTABLES: u32 = 7;
/// `NFNL_SUBSYS_NFTABLES << 8 | NFT_MSG_NEWGEN` (`uapi/linux/netfilter/nf_tables.h`).
const NFT_MSG_NEWGEN: u16 = (10 << 8) | 15;
/// `NFTA_GEN_ID`, the new generation's id (big endian u32).
const NFTA_GEN_ID: u16 = 1;

/// How often iptables-legacy rules are compared while legacy tables exist.
pub const LEGACY_POLL: Duration = Duration::from_millis(500);

/// A change of the firewall ruleset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RulesetEvent {
    /// An nftables transaction was committed (`NFTA_GEN_ID`, when present).
    Committed { generation: Option<u32> },
    /// Notifications were lost (ENOBUFS): assume the rules changed.
    Overrun,
    /// The iptables-legacy rules differ from the previous poll.
    LegacyChanged,
}

/// The ruleset events in one datagram of `NETLINK_NETFILTER` notifications (pure; tested on
/// bytes captured on Linux 6.18). Only `NFT_MSG_NEWGEN` counts: the table/chain/rule messages
/// before it belong to the same transaction.
pub fn events_in(data: &[u8]) -> Vec<RulesetEvent> {
    super::datagram::messages(data)
        .map_while(Result::ok)
        .filter(|msg| u16::from_ne_bytes([msg[4], msg[5]]) == NFT_MSG_NEWGEN)
        // nlmsghdr (16) + nfgenmsg (4), then attributes.
        .map(|msg| RulesetEvent::Committed {
            generation: gen_id(msg.get(20..).unwrap_or_default()),
        })
        .collect()
}

/// `NFTA_GEN_ID` among netlink attributes.
fn gen_id(mut attrs: &[u8]) -> Option<u32> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFTA_GEN_ID && len >= 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = attrs.get((len + 3) & !3..).unwrap_or_default();
    }
    None
}

/// Subscribes to nftables commit notifications (in the caller's network namespace). A thread
/// reads the socket and sends [`RulesetEvent`]s; the receiver closes if the socket fails.
/// Subscribe before anything is offloaded, so no commit in between is missed.
pub fn subscribe() -> io::Result<mpsc::UnboundedReceiver<RulesetEvent>> {
    let sock = notification_socket(NETLINK_NETFILTER, 1 << (NFNLGRP_NFTABLES - 1), 1 << 20)?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("nft-events".into())
        .spawn(move || {
            loop {
                let events = match sock.recv_from_full() {
                    Ok((data, _)) => events_in(&data),
                    Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                        vec![RulesetEvent::Overrun]
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::error!(error = %e, "nftables event socket failed");
                        return;
                    }
                };
                for ev in events {
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
            }
        })?;
    Ok(rx)
}

/// The rules of an `iptables-save` listing without what changes by itself: comments (with
/// their timestamps) and the `[packets:bytes]` counters.
pub fn normalize_save(listing: &str) -> String {
    let mut out = String::new();
    for line in listing.lines().filter(|l| !l.starts_with('#')) {
        let line = match (line.starts_with(':'), line.rfind(" [")) {
            (true, Some(i)) => &line[..i],
            _ => line,
        };
        let line = match line.strip_prefix('[').and_then(|l| l.split_once("] ")) {
            Some((_, rest)) => rest,
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// The two `/proc/net/ip{,6}_tables_names` files, kept open: a read from offset 0 makes the
/// kernel list the tables anew (a seq_file), so a poll costs one `pread` per file. A file that
/// is not there (the `ip_tables` module is not loaded yet) is tried again at the next poll.
struct LegacyNames {
    files: [(PathBuf, Option<File>); 2],
}

impl LegacyNames {
    fn new() -> LegacyNames {
        LegacyNames::at([
            "/proc/net/ip_tables_names".into(),
            "/proc/net/ip6_tables_names".into(),
        ])
    }

    fn at(paths: [PathBuf; 2]) -> LegacyNames {
        LegacyNames {
            files: paths.map(|p| (p, None)),
        }
    }

    /// Whether iptables-legacy tables are in use (either file non-empty).
    fn any(&mut self) -> bool {
        let mut buf = [0u8; 256];
        let mut any = false;
        for (path, file) in &mut self.files {
            if file.is_none() {
                *file = File::open(&*path).ok();
            }
            let Some(f) = file else { continue };
            match f.read_at(&mut buf, 0) {
                Ok(n) => any |= buf[..n].iter().any(|b| !b.is_ascii_whitespace()),
                Err(_) => *file = None,
            }
        }
        any
    }
}

/// Hash of both families' iptables-legacy rules, or `None` when they cannot be read.
fn legacy_rules_hash() -> Option<u64> {
    let mut h = DefaultHasher::new();
    for tool in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let out = crate::signals::unblocked_in_std_child(&mut std::process::Command::new(tool))
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        normalize_save(&String::from_utf8_lossy(&out.stdout)).hash(&mut h);
    }
    Some(h.finish())
}

/// Polls iptables-legacy every [`LEGACY_POLL`] while legacy tables exist and sends
/// [`RulesetEvent::LegacyChanged`] when their rules change. Blocking: runs on a thread of its
/// own (see [`spawn_legacy_poller`]), whose sleeps cost the runtime no wake-up. Ends when the
/// receiver is gone.
fn poll_legacy(tx: &mpsc::UnboundedSender<RulesetEvent>) {
    let mut names = LegacyNames::new();
    let mut last: Option<u64> = None;
    let mut warned = false;
    // At start the rules found are the baseline; legacy tables that appear later (the first
    // `iptables-legacy` command creates them) are a change.
    let mut started = false;
    while !tx.is_closed() {
        if !names.any() {
            last = None;
            started = true;
            std::thread::sleep(LEGACY_POLL);
            continue;
        }
        let Some(hash) = legacy_rules_hash() else {
            if !warned {
                warn!(
                    "iptables-legacy tables exist but iptables-legacy-save cannot read them: \
                     legacy rule changes are not seen by the fast path"
                );
                warned = true;
            }
            std::thread::sleep(LEGACY_POLL);
            continue;
        };
        if last.map_or(started, |l| l != hash) {
            debug!("iptables-legacy rules changed");
            if tx.send(RulesetEvent::LegacyChanged).is_err() {
                return;
            }
        }
        last = Some(hash);
        started = true;
        std::thread::sleep(LEGACY_POLL);
    }
}

/// Starts `poll_legacy` on a thread of its own; the returned receiver resolves when it ended
/// (it ends only when `tx`'s receiver is gone, or if it panicked).
pub fn spawn_legacy_poller(
    tx: mpsc::UnboundedSender<RulesetEvent>,
) -> io::Result<tokio::sync::oneshot::Receiver<()>> {
    let (ended, ended_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("legacy-poll".into())
        .spawn(move || {
            poll_legacy(&tx);
            let _ = ended.send(());
        })?;
    Ok(ended_rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_names_are_read_again_from_the_start_and_a_missing_file_later() {
        let dir = std::env::temp_dir().join(format!("xr-legacy-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (v4, v6) = (dir.join("ip_tables_names"), dir.join("ip6_tables_names"));
        std::fs::write(&v4, "").unwrap();
        let mut names = LegacyNames::at([v4.clone(), v6.clone()]);
        assert!(!names.any(), "empty file, missing file");
        std::fs::write(&v6, "filter\n").unwrap();
        assert!(names.any(), "the missing file appeared");
        std::fs::write(&v6, "").unwrap();
        assert!(
            !names.any(),
            "read again from offset 0 through the open file"
        );
        std::fs::write(&v4, "nat\n").unwrap();
        assert!(names.any());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// `nft add table inet t1` on Linux 6.18: NFT_MSG_NEWTABLE, then NFT_MSG_NEWGEN (gen 2,
    /// pid, "nft"), in separate datagrams.
    const NFT_NEWTABLE: &str = "38000000000a000001000000d32e000001000002070001007431000008000300000000000c00040000000000000000010800020000000000";
    const NFT_NEWGEN: &str =
        "2c0000000f0a000001000000d32e00000000000208000100000000020800020000002ed3080003006e667400";
    /// `iptables-nft -A FORWARD -p tcp --dport 9 -j DROP`: its NEWGEN (gen 3, "iptables-nft").
    const IPTABLES_NFT_NEWGEN: &str = "380000000f0a000002000000d42e00000000000308000100000000030800020000002ed41100030069707461626c65732d6e667400000000";

    #[test]
    fn a_commit_is_one_event_with_its_generation() {
        assert_eq!(events_in(&hex(NFT_NEWTABLE)), vec![]);
        assert_eq!(
            events_in(&hex(NFT_NEWGEN)),
            vec![RulesetEvent::Committed {
                generation: Some(2)
            }]
        );
        let mut both = hex(NFT_NEWTABLE);
        both.extend(hex(IPTABLES_NFT_NEWGEN));
        assert_eq!(
            events_in(&both),
            vec![RulesetEvent::Committed {
                generation: Some(3)
            }]
        );
        // Truncated: no event, no panic.
        assert_eq!(events_in(&hex(NFT_NEWGEN)[..30]), vec![]);
    }

    #[test]
    fn legacy_listings_compare_without_counters_and_comments() {
        let a = "# Generated by iptables-save v1.8.11 on Mon Nov 23 23:00:00 2026\n*filter\n:INPUT ACCEPT [12:3400]\n:FORWARD DROP [5:300]\n[7:420] -A FORWARD -j ACCEPT\nCOMMIT\n# Completed on Mon Nov 23 23:00:00 2026\n";
        let b = "# Generated by iptables-save v1.8.11 on Mon Nov 23 23:00:01 2026\n*filter\n:INPUT ACCEPT [99:9900]\n:FORWARD DROP [6:360]\n[8:480] -A FORWARD -j ACCEPT\nCOMMIT\n# Completed on Mon Nov 23 23:00:01 2026\n";
        assert_eq!(normalize_save(a), normalize_save(b));
        assert_eq!(
            normalize_save(a),
            "*filter\n:INPUT ACCEPT\n:FORWARD DROP\n-A FORWARD -j ACCEPT\nCOMMIT\n"
        );
        let c = b.replace("-j ACCEPT", "-j DROP");
        assert_ne!(normalize_save(a), normalize_save(&c));
    }
}
