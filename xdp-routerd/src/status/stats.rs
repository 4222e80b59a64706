//! `xdp-routerd stats`: the per-interface, per-reason counter rows (with rates between two
//! samples) and their table.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use xdp_router_common::Reason;

use super::Status;

/// One row of `xdp-routerd stats`: a (managed interface, reason) counter and, when a previous
/// sample is given (`--watch`), what changed since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsRow {
    pub interface: String,
    pub reason: Reason,
    /// True for the reasons that mean "forwarded by the fast path"; the others are fallbacks
    /// (packets handed to the kernel).
    pub forwarded: bool,
    pub packets: u64,
    pub bytes: u64,
    /// Packets since the previous sample (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_packets: Option<u64>,
    /// Bytes since the previous sample (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta_bytes: Option<u64>,
    /// Packets per second over the interval (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packets_per_second: Option<f64>,
    /// Bits per second (L2 frame bytes × 8) over the interval (watch mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bits_per_second: Option<f64>,
}

impl Status {
    /// The counter rows for `stats`, in interface then reason order. With `prev` (an earlier
    /// snapshot and the seconds between the two) each row also carries its delta and rates. A
    /// counter that went backwards (daemon restarted in between) counts from zero.
    pub fn stats_rows(&self, prev: Option<(&Status, f64)>) -> Vec<StatsRow> {
        self.counters
            .iter()
            .map(|c| {
                let mut row = StatsRow {
                    interface: c.interface.clone(),
                    reason: c.reason,
                    forwarded: c.reason.is_forwarded(),
                    packets: c.packets,
                    bytes: c.bytes,
                    delta_packets: None,
                    delta_bytes: None,
                    packets_per_second: None,
                    bits_per_second: None,
                };
                if let Some((p, secs)) = prev {
                    let before = p
                        .counters
                        .iter()
                        .find(|o| o.interface == c.interface && o.reason == c.reason);
                    let delta = |now: u64, then: u64| if now >= then { now - then } else { now };
                    let dp = delta(c.packets, before.map_or(0, |b| b.packets));
                    let db = delta(c.bytes, before.map_or(0, |b| b.bytes));
                    let secs = secs.max(1e-3);
                    row.delta_packets = Some(dp);
                    row.delta_bytes = Some(db);
                    row.packets_per_second = Some(dp as f64 / secs);
                    row.bits_per_second = Some(db as f64 * 8.0 / secs);
                }
                row
            })
            .collect()
    }
}

/// Renders `stats` rows as a table, like `nstat` for the fast path: per interface, the
/// forwarded counters, then every fallback reason, then the share the fast path carried. Rows
/// whose total is zero are left out unless `zeros`.
pub fn render_stats(rows: &[StatsRow], zeros: bool) -> String {
    let watch = rows.iter().any(|r| r.delta_packets.is_some());
    let mut s = String::new();
    if watch {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16} {:>10} {:>10} {:>10}",
            "INTERFACE", "REASON", "PACKETS", "BYTES", "+PACKETS", "PKT/S", "BIT/S"
        );
    } else {
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>14} {:>16}",
            "INTERFACE", "REASON", "PACKETS", "BYTES"
        );
    }
    let mut interfaces: Vec<&str> = Vec::new();
    for r in rows {
        if !interfaces.contains(&r.interface.as_str()) {
            interfaces.push(&r.interface);
        }
    }
    for iface in interfaces {
        let mine: Vec<&StatsRow> = rows.iter().filter(|r| r.interface == iface).collect();
        // Forwarded first, then the fallbacks, each group in reason order.
        let ordered = mine
            .iter()
            .filter(|r| r.forwarded)
            .chain(mine.iter().filter(|r| !r.forwarded));
        for r in ordered.filter(|r| zeros || r.packets != 0) {
            let label = if r.forwarded {
                r.reason.name().to_string()
            } else {
                format!("pass:{}", r.reason.name())
            };
            if watch {
                let _ = writeln!(
                    s,
                    "{:<12} {:<22} {:>14} {:>16} {:>10} {:>10} {:>10}",
                    r.interface,
                    label,
                    r.packets,
                    r.bytes,
                    r.delta_packets.unwrap_or(0),
                    si(r.packets_per_second.unwrap_or(0.0)),
                    si(r.bits_per_second.unwrap_or(0.0)),
                );
            } else {
                let _ = writeln!(
                    s,
                    "{:<12} {:<22} {:>14} {:>16}",
                    r.interface, label, r.packets, r.bytes
                );
            }
        }
        let total: u64 = mine.iter().map(|r| r.packets).sum();
        let fwd: u64 = mine.iter().filter(|r| r.forwarded).map(|r| r.packets).sum();
        let share = |f: u64, t: u64| {
            if t == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", f as f64 * 100.0 / t as f64)
            }
        };
        if watch {
            let dt: u64 = mine.iter().map(|r| r.delta_packets.unwrap_or(0)).sum();
            let df: u64 = mine
                .iter()
                .filter(|r| r.forwarded)
                .map(|r| r.delta_packets.unwrap_or(0))
                .sum();
            let _ = writeln!(
                s,
                "{iface}: fast path carried {} of {total} packets received (last interval: {} of {dt})",
                share(fwd, total),
                share(df, dt)
            );
        } else {
            let _ = writeln!(
                s,
                "{iface}: fast path carried {} of {total} packets received",
                share(fwd, total)
            );
        }
    }
    s
}

/// `1234567.0` → `1.23M`: short SI rendering for rates.
fn si(v: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e9, "G"), (1e6, "M"), (1e3, "k")];
    for (scale, unit) in UNITS {
        if v >= scale {
            return format!("{:.2}{unit}", v / scale);
        }
    }
    format!("{v:.0}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::tests::status;

    #[test]
    fn stats_table_orders_forwarded_first_and_hides_zeros() {
        let s = status(&[
            ("lan0", "no_flow", 5, 500),
            ("lan0", "forwarded_original", 95, 95_000),
            ("lan0", "not_ip", 0, 0),
            ("wan0", "forwarded_reply", 0, 0),
        ]);
        let out = render_stats(&s.stats_rows(None), false);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("INTERFACE"), "{out}");
        assert!(
            lines[1].contains("forwarded_original") && lines[1].contains("95000"),
            "{out}"
        );
        assert!(
            lines[2].contains("pass:no_flow") && lines[2].ends_with(" 500"),
            "{out}"
        );
        assert!(!out.contains("not_ip"), "{out}");
        assert!(
            out.contains("lan0: fast path carried 95.0% of 100 packets"),
            "{out}"
        );
        assert!(
            out.contains("wan0: fast path carried - of 0 packets"),
            "{out}"
        );
        assert!(render_stats(&s.stats_rows(None), true).contains("pass:not_ip"));
    }

    #[test]
    fn stats_rates_come_from_the_previous_sample() {
        let before = status(&[("lan0", "forwarded_original", 100, 10_000)]);
        let after = status(&[("lan0", "forwarded_original", 300, 2_010_000)]);
        let rows = after.stats_rows(Some((&before, 2.0)));
        assert_eq!(rows[0].delta_packets, Some(200));
        assert_eq!(rows[0].delta_bytes, Some(2_000_000));
        assert_eq!(rows[0].packets_per_second, Some(100.0));
        assert_eq!(rows[0].bits_per_second, Some(8_000_000.0));
        let out = render_stats(&rows, false);
        assert!(out.contains("+PACKETS") && out.contains("8.00M"), "{out}");
        assert!(out.contains("(last interval: 100.0% of 200)"), "{out}");
        // A restarted daemon (counter went backwards) counts from zero, never underflows.
        let rows = before.stats_rows(Some((&after, 1.0)));
        assert_eq!(rows[0].delta_packets, Some(100));
        // JSON without a previous sample has no rate fields.
        let json = serde_json::to_value(&before.stats_rows(None)[0]).unwrap();
        assert!(json.get("packets_per_second").is_none(), "{json}");
        assert_eq!(json["forwarded"], true);
    }
}
