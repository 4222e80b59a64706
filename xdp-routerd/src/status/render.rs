//! The human-readable rendering of `xdp-routerd status` and `xdp-routerd flows`.

use std::fmt::Write as _;

use super::{Flows, Status};

impl Status {
    /// Human-readable rendering. Counter rows that are zero are left out.
    pub fn render(&self) -> String {
        let mut s = String::new();
        if self.age_ms > 0 {
            let _ = writeln!(
                s,
                "(the daemon is busy: these figures are {} ms old)",
                self.age_ms
            );
        }
        let _ = writeln!(s, "fast path: {}", if self.fastpath { "on" } else { "off" });
        let _ = writeln!(s, "interfaces:");
        for i in &self.interfaces {
            let qdisc = i
                .egress_qdisc
                .as_deref()
                .map(|q| format!(" qdisc {q}"))
                .unwrap_or_default();
            let shaped = match (&i.shaped_by, i.shaped) {
                (Some(by), true) => format!(" (egress shaped by {by}: not used by the fast path)"),
                (None, true) => " (egress shaped: not used by the fast path)".to_string(),
                (_, false) => String::new(),
            };
            let bridge = match (&i.bridge, i.fdb_entries, &i.bridge_vlans) {
                (Some(b), _, None) => format!(" (port of {b})"),
                (Some(b), _, Some(v)) => format!(" (port of {b}, {})", v.render()),
                (None, Some(n), None) => format!(" (bridge: {n} FDB entries)"),
                (None, Some(n), Some(v)) => format!(
                    " (bridge: {n} FDB entries, VLAN filtering {}, {})",
                    v.protocol(),
                    v.render()
                ),
                (None, None, _) => String::new(),
            };
            let encap = i
                .encap
                .as_deref()
                .map(|e| format!(" ({e})"))
                .unwrap_or_default();
            // `tc`: the TC fast path runs there instead of XDP.
            let datapath = if i.attach_mode == "tc" {
                "tc ingress".to_string()
            } else if i.attach_mode == "detached" {
                "not attached".to_string()
            } else if i.tc_handoff {
                format!("xdp {} + tc hand-over", i.attach_mode)
            } else {
                format!("xdp {}", i.attach_mode)
            };
            // How its TC programs are attached, when it has any (`tcx`, `classic tc`).
            let hook = i
                .tc_hook
                .as_deref()
                .map(|h| format!(", tc: {h}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {:<12} ifindex {:<4} role {:<4} {datapath}{hook}{qdisc}{shaped}{bridge}{encap}",
                i.name, i.ifindex, i.role,
            );
            if let ("tc", Some(why)) = (i.attach_mode.as_str(), &i.datapath_because) {
                let _ = writeln!(s, "    datapath tc because: {why}");
            }
            if let Some(why) = &i.generic_because {
                let _ = writeln!(s, "    generic XDP because: {why}");
            }
            if let Some(why) = &i.no_xdp_xmit_because {
                let _ = writeln!(s, "    no XDP redirect into it: {why}");
            }
            if let Some(why) = i
                .pppoe
                .as_ref()
                .and_then(|p| p.not_accelerated_because.as_ref())
            {
                let _ = writeln!(s, "    PPPoE not accelerated: {why}");
            }
            if let Some(why) = &i.not_accelerated_because {
                let _ = writeln!(s, "    not accelerated: {why}");
            }
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
        let r = &self.ruleset;
        let _ = writeln!(
            s,
            "firewall: ruleset generation {}, {} changes since start, arming on {} interfaces{}",
            r.generation,
            r.changes,
            r.armed_interfaces,
            if r.fib_mark {
                ""
            } else {
                " (marked flows stay in the kernel: Linux < 6.10)"
            }
        );
        let missing: Vec<_> = self.kernel.missing().collect();
        if missing.is_empty() {
            let _ = writeln!(
                s,
                "kernel: every optional feature the fast path uses is there"
            );
        }
        for (feature, why) in missing {
            let _ = writeln!(s, "kernel: no {feature} ({why}): {}", feature.without());
        }
        match (r.verdict_max_age_ms, self.per_packet.why_verdicts_expire()) {
            (0, _) => {
                let _ = writeln!(
                    s,
                    "kernel verdicts: kept until the ruleset changes (verdict_max_age_ms = 0: \
                     ipset and time rules do not reach offloaded flows)"
                );
            }
            (ms, Some(why)) if r.verdicts_expire => {
                let _ = writeln!(s, "kernel verdicts: renewed every {ms} ms ({why})");
            }
            (ms, _) if r.verdicts_expire => {
                let _ = writeln!(
                    s,
                    "kernel verdicts: renewed every {ms} ms until the ruleset is read"
                );
            }
            (ms, _) => {
                let _ = writeln!(
                    s,
                    "kernel verdicts: kept until the ruleset changes (no rule established \
                     packets reach matches an ipset, a set with timeouts, the time or a route \
                     lookup; renewed every {ms} ms once one does)"
                );
            }
        }
        let f = &self.fib_cache;
        if f.max_age_ms == 0 {
            let _ = writeln!(s, "fib cache: off (every packet is looked up)");
        } else {
            let _ = writeln!(
                s,
                "fib cache: answers kept up to {} ms, generation {}, {} invalidations",
                f.max_age_ms, f.generation, f.invalidations
            );
        }
        if let Some(line) = self.per_packet.line() {
            let _ = writeln!(s, "{line}");
        }
        if let Some(line) = self.per_packet.not_held_line() {
            let _ = writeln!(s, "{line}");
        }
        if let Some(line) = self.per_packet.dscp_rewrite.line() {
            let _ = writeln!(s, "{line}");
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
    /// Human-readable table: per direction, what the fast path forwarded, conntrack's own
    /// counter (what the kernel forwarded) and their sum, in packets and IP bytes.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>10} {:>12} {:>10} {:>12} {:>8}",
            "FAM",
            "IN",
            "PROTO",
            "SRC -> DST",
            "REWRITTEN SRC -> DST",
            "DIR",
            "FP PKTS",
            "FP BYTES",
            "CT PKTS",
            "CT BYTES",
            "PACKETS",
            "BYTES",
            "IDLE"
        );
        for f in &self.flows {
            let idle = if f.awaiting_traffic {
                "start*".to_owned()
            } else {
                f.idle_ms
                    .map(|ms| format!("{:.1}s", ms as f64 / 1000.0))
                    .unwrap_or("-".into())
            };
            let (ct_packets, ct_bytes) = f.conntrack.map_or(("-".into(), "-".into()), |c| {
                (c.packets.to_string(), c.bytes.to_string())
            });
            let _ = writeln!(
                s,
                "{:<5} {:<8} {:<4} {:<42} {:<42} {:<8} {:>10} {:>12} {:>10} {:>12} {:>10} {:>12} {:>8}",
                f.family,
                f.ingress,
                f.proto,
                format!("{} -> {}", f.src, f.dst),
                format!("{} -> {}", f.new_src, f.new_dst),
                f.direction,
                f.packets,
                f.bytes,
                ct_packets,
                ct_bytes,
                f.total.packets,
                f.total.bytes,
                idle
            );
        }
        let _ = writeln!(s, "{} flow directions", self.flows.len());
        let _ = writeln!(
            s,
            "FP: forwarded by the fast path; CT: conntrack's own counter (what the kernel \
             forwarded); PACKETS/BYTES: both, what conntrack would count without the fast path \
             (bytes: IP datagram lengths)"
        );
        if self.flows.iter().any(|f| f.awaiting_traffic) {
            let _ = writeln!(
                s,
                "start*: a TCP connection found at the daemon's start, idle since: the kernel \
                 forwards it until its first packet, after which the keep-alive marks it \
                 \"be liberal\" in conntrack and the fast path takes it"
            );
        }
        if let Some(note) = &self.conntrack_note {
            let _ = writeln!(s, "no conntrack counters: {note}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::accounting::Traffic;
    use crate::status::{FlowRow, IfaceStatus, PppoeStatus, tests::status};

    #[test]
    fn flows_show_fast_path_conntrack_and_total_per_direction() {
        let t = |packets, bytes| Traffic { packets, bytes };
        let row = |direction: &str, fp: Traffic, ct: Option<Traffic>| FlowRow {
            family: "ipv4".into(),
            ingress: "eth1".into(),
            proto: "tcp".into(),
            src: "10.0.1.2:40000".into(),
            dst: "10.0.2.2:5201".into(),
            new_src: "10.0.2.1:40000".into(),
            new_dst: "10.0.2.2:5201".into(),
            direction: direction.into(),
            packets: fp.packets,
            bytes: fp.bytes,
            conntrack: ct,
            total: fp + ct.unwrap_or_default(),
            idle_ms: Some(400),
            awaiting_traffic: false,
        };
        let flows = Flows {
            flows: vec![
                row("original", t(69_354, 103_602_064), Some(t(7, 7612))),
                row("reply", t(1344, 69_912), None),
            ],
            conntrack_note: Some("net.netfilter.nf_conntrack_acct is 0".into()),
        };
        let text = flows.render();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].contains("FP BYTES") && lines[0].contains("CT BYTES"),
            "{text}"
        );
        let cols: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cols[cols.len() - 7..],
            [
                "69354",
                "103602064",
                "7",
                "7612",
                "69361",
                "103609676",
                "0.4s"
            ]
        );
        assert!(
            lines[2].contains(" - "),
            "no conntrack counter shows as -: {text}"
        );
        assert!(text.ends_with("no conntrack counters: net.netfilter.nf_conntrack_acct is 0\n"));
    }

    #[test]
    fn an_old_status_says_how_old() {
        let mut st = status(&[]);
        assert!(st.render().starts_with("fast path:"));
        st.age_ms = 1250;
        assert!(
            st.render()
                .starts_with("(the daemon is busy: these figures are 1250 ms old)\nfast path:")
        );
    }

    /// A kernel without a feature says what it lacks and what that costs, one line each.
    #[test]
    fn a_missing_kernel_feature_is_a_line_of_its_own() {
        use crate::kernel_features::{Availability, Feature};
        let mut st = status(&[]);
        assert!(
            st.render()
                .contains("kernel: every optional feature the fast path uses is there\n")
        );
        st.kernel.set(
            Feature::XdpMetadata,
            Availability::Missing("refused".into()),
        );
        let text = st.render();
        assert!(
            text.contains(&format!(
                "kernel: no xdp_metadata (refused): {}\n",
                Feature::XdpMetadata.without()
            )),
            "{text}"
        );
        assert!(!text.contains("every optional feature"), "{text}");
    }

    fn ppp0(pppoe: PppoeStatus, encap: Option<&str>) -> IfaceStatus {
        IfaceStatus {
            name: "ppp0".into(),
            ifindex: 12,
            role: "wan".into(),
            attach_mode: "lower".into(),
            shaped: false,
            shaped_config: "auto".into(),
            shaped_by: None,
            egress_qdisc: None,
            xdp_xmit: pppoe.session_id.is_some(),
            no_xdp_xmit_because: None,
            datapath_because: None,
            tc_handoff: false,
            tc_hook: None,
            generic_because: None,
            bridge: None,
            fdb_entries: None,
            encap: encap.map(str::to_string),
            pppoe: Some(pppoe),
            bridge_vlans: None,
            not_accelerated_because: None,
        }
    }

    /// An interface running the TC fast path says so, and why; an XDP one does not say why, but
    /// says when the TC program runs behind it (and how its TC programs are attached, when it
    /// is said); a device without a link-layer header says why it runs TC.
    #[test]
    fn a_tc_interface_shows_its_datapath_and_why() {
        let mut st = status(&[]);
        let mut eth1 = ppp0(PppoeStatus::default(), None);
        eth1.name = "eth1".into();
        eth1.pppoe = None;
        eth1.attach_mode = "tc".into();
        eth1.datapath_because = Some("datapath = \"tc\" in the global setting".into());
        let mut eth0 = eth1.clone();
        eth0.name = "eth0".into();
        eth0.attach_mode = "native".into();
        eth0.datapath_because = Some("datapath = \"auto\" in the global setting".into());
        let mut eth2 = eth0.clone();
        eth2.name = "eth2".into();
        eth2.tc_handoff = true;
        eth2.tc_hook = Some("classic tc".into());
        let mut wg0 = eth0.clone();
        wg0.name = "wg0".into();
        wg0.attach_mode = "tc".into();
        wg0.datapath_because = Some(crate::datapath::NO_LINK_LAYER_TC.into());
        st.interfaces = vec![eth1, eth0, eth2, wg0];
        let text = st.render();
        assert!(
            text.contains(
                "wg0          ifindex 12   role wan  tc ingress\n    datapath tc because: no \
                 link-layer header (an L3 device such as WireGuard or tun): the TC fast path, \
                 whatever `datapath` says (XDP would run generic there)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "eth2         ifindex 12   role wan  xdp native + tc hand-over, tc: classic tc\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("eth1         ifindex 12   role wan  tc ingress\n")
                && text
                    .contains("    datapath tc because: datapath = \"tc\" in the global setting\n"),
            "{text}"
        );
        assert!(
            text.contains("eth0         ifindex 12   role wan  xdp native\n")
                && !text.contains("\"auto\""),
            "{text}"
        );
    }

    #[test]
    fn a_ppp_device_shows_its_session_or_why_it_has_none() {
        let mut st = status(&[]);
        st.interfaces.push(ppp0(
            PppoeStatus {
                session_id: Some(1),
                lower: Some("eth0".into()),
                peer_mac: Some("52:54:00:12:34:56".into()),
                not_accelerated_because: None,
            },
            Some("PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56)"),
        ));
        let text = st.render();
        assert!(
            text.contains("ppp0         ifindex 12   role wan  xdp lower (PPPoE session 0x0001 over eth0 (peer 52:54:00:12:34:56))\n"),
            "{text}"
        );
        assert!(!text.contains("PPPoE not accelerated"), "{text}");
        st.interfaces[0] = ppp0(
            PppoeStatus {
                not_accelerated_because: Some("no PPPoE session in /proc/net/pppoe".into()),
                ..PppoeStatus::default()
            },
            None,
        );
        let text = st.render();
        assert!(
            text.contains("\n    PPPoE not accelerated: no PPPoE session in /proc/net/pppoe\n"),
            "{text}"
        );
        // JSON round trip; an older daemon's status (no `pppoe`) still parses.
        let json = serde_json::to_value(&st).unwrap();
        assert_eq!(
            json["interfaces"][0]["pppoe"]["session_id"],
            serde_json::Value::Null
        );
        let back: Status = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back.interfaces[0].pppoe, st.interfaces[0].pppoe);
        let mut old = json;
        old["interfaces"][0]
            .as_object_mut()
            .unwrap()
            .remove("pppoe");
        let back: Status = serde_json::from_value(old).unwrap();
        assert_eq!(back.interfaces[0].pppoe, None);
    }
}
