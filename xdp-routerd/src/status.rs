//! What `xdp-routerd status` and `xdp-routerd flows` show: the JSON shapes (a stable interface
//! for scripts and tests) and their human-readable rendering.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// `status --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    /// Whether established flows are forwarded in XDP.
    pub fastpath: bool,
    /// Managed interfaces.
    pub interfaces: Vec<IfaceStatus>,
    /// Offloaded flow directions per family and the capacity of each map.
    pub flows: FlowCounts,
    /// One row per (managed interface, reason); rows are per ingress interface.
    pub counters: Vec<CounterRow>,
    /// Conntrack sync.
    pub conntrack: ConntrackStatus,
}

/// One managed interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IfaceStatus {
    pub name: String,
    /// 0 while the interface does not exist.
    pub ifindex: u32,
    pub role: String,
    /// `native`, `generic`, or `detached` (interface missing).
    pub attach_mode: String,
    pub shaped: bool,
}

/// Flow map occupancy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowCounts {
    /// IPv4 flow directions (two per connection).
    pub ipv4: u64,
    /// IPv6 flow directions.
    pub ipv6: u64,
    /// Capacity of each map.
    pub capacity: u32,
}

/// Packets and bytes of one reason on one ingress interface.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CounterRow {
    pub interface: String,
    pub reason: String,
    pub packets: u64,
    pub bytes: u64,
}

/// Conntrack sync counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConntrackStatus {
    /// ctnetlink events received.
    pub events: u64,
    /// Full resyncs from a dump (start, netlink overrun).
    pub resyncs: u64,
    /// Connections currently offloaded.
    pub offloaded: u64,
    /// Connections offloaded since start.
    pub offloaded_total: u64,
    /// Connections taken back from the fast path since start.
    pub removed_total: u64,
    /// Conntrack timeout refreshes sent by the keep-alive.
    pub refreshes: u64,
    /// ctnetlink errors (failed dumps, refreshes, socket errors).
    pub errors: u64,
    /// Connections considered but not offloaded, by reason.
    pub skipped: std::collections::BTreeMap<String, u64>,
    /// Duration of the last full resync, in milliseconds.
    pub last_resync_ms: u64,
}

/// One offloaded flow direction (`flows --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FlowRow {
    pub family: String,
    pub ingress: String,
    pub proto: String,
    pub src: String,
    pub dst: String,
    pub new_src: String,
    pub new_dst: String,
    /// `original` or `reply`.
    pub direction: String,
    pub packets: u64,
    pub bytes: u64,
    /// Milliseconds since the fast path last forwarded a packet of it; null if never.
    pub idle_ms: Option<u64>,
}

/// `flows --json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Flows {
    pub flows: Vec<FlowRow>,
}

impl Status {
    /// Human-readable rendering. Counter rows that are zero are left out.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "fast path: {}", if self.fastpath { "on" } else { "off" });
        let _ = writeln!(s, "interfaces:");
        for i in &self.interfaces {
            let _ = writeln!(
                s,
                "  {:<12} ifindex {:<4} role {:<4} xdp {}{}",
                i.name,
                i.ifindex,
                i.role,
                i.attach_mode,
                if i.shaped {
                    " (shaped egress: not used by the fast path)"
                } else {
                    ""
                }
            );
        }
        let _ = writeln!(
            s,
            "flows: {} IPv4 + {} IPv6 directions (capacity {} each)",
            self.flows.ipv4, self.flows.ipv6, self.flows.capacity
        );
        let c = &self.conntrack;
        let _ = writeln!(
            s,
            "conntrack: {} offloaded now, {} offloaded / {} removed since start, {} events, {} resyncs, {} refreshes, {} errors",
            c.offloaded,
            c.offloaded_total,
            c.removed_total,
            c.events,
            c.resyncs,
            c.refreshes,
            c.errors
        );
        if !c.skipped.is_empty() {
            let list: Vec<String> = c.skipped.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(s, "not offloaded: {}", list.join(" "));
        }
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16}",
            "INTERFACE", "REASON", "PACKETS", "BYTES"
        );
        for r in self.counters.iter().filter(|r| r.packets != 0) {
            let _ = writeln!(
                s,
                "{:<12} {:<22} {:>14} {:>16}",
                r.interface, r.reason, r.packets, r.bytes
            );
        }
        s
    }
}

impl Flows {
    /// Human-readable table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>8}",
            "FAM",
            "IN",
            "PROTO",
            "SRC -> DST",
            "REWRITTEN SRC -> DST",
            "DIR",
            "PACKETS",
            "BYTES",
            "IDLE"
        );
        for f in &self.flows {
            let idle = f
                .idle_ms
                .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                .unwrap_or("-".into());
            let _ = writeln!(
                s,
                "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>8}",
                f.family,
                f.ingress,
                f.proto,
                format!("{} -> {}", f.src, f.dst),
                format!("{} -> {}", f.new_src, f.new_dst),
                f.direction,
                f.packets,
                f.bytes,
                idle
            );
        }
        let _ = writeln!(s, "{} flow directions", self.flows.len());
        s
    }
}
