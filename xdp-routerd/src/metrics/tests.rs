//! The exposition of a hand-made status: every family, names, errors, the dashboard's queries.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
};

use super::*;
use crate::flows::{
    per_packet::{PerPacketKind, PerPacketMode, PerPacketRule},
    rule_origin::{RuleOrigin, RulePlace},
    rule_reach::{CtState, NotHeld},
};
use crate::kernel_features::{Availability, Feature, KernelFeatures};
use crate::status::{
    BridgeVlanStatus, BridgeVlansStatus, ConntrackStatus, CounterRow, DscpRewriteStatus,
    FibCacheStatus, FlowCounts, IfaceStatus, PerPacketStatus, PppoeStatus, RulesetStatus,
};

/// A status with every family populated (also used to list the exported names).
fn sample_status() -> Status {
    let mut counters = Vec::new();
    for iface in ["lan0", "wan0"] {
        for r in xdp_router_common::Reason::ALL {
            let n = r as u64 + 1;
            counters.push(CounterRow {
                interface: iface.into(),
                reason: r,
                packets: n * if iface == "lan0" { 10 } else { 100 },
                bytes: n * 1000,
            });
        }
    }
    Status {
        fastpath: true,
        interfaces: vec![
            IfaceStatus {
                name: "lan0".into(),
                ifindex: 4,
                role: "lan".into(),
                attach_mode: "native".into(),
                shaped: false,
                shaped_config: "auto".into(),
                shaped_by: None,
                egress_qdisc: Some("noqueue".into()),
                xdp_xmit: true,
                no_xdp_xmit_because: None,
                datapath_because: None,
                tc_handoff: false,
                tc_hook: None,
                generic_because: None,
                bridge: None,
                fdb_entries: None,
                encap: None,
                pppoe: None,
                bridge_vlans: Some(BridgeVlansStatus {
                    tpid: 0x8100,
                    pvid: Some(1),
                    vlans: vec![
                        BridgeVlanStatus {
                            vid: 1,
                            pvid: true,
                            untagged: true,
                        },
                        BridgeVlanStatus {
                            vid: 20,
                            pvid: false,
                            untagged: false,
                        },
                    ],
                }),
                not_accelerated_because: None,
            },
            IfaceStatus {
                name: "wan0".into(),
                ifindex: 5,
                role: "wan".into(),
                attach_mode: "generic".into(),
                shaped: true,
                shaped_config: "auto".into(),
                shaped_by: Some("htb".into()),
                egress_qdisc: Some("htb".into()),
                xdp_xmit: false,
                no_xdp_xmit_because: Some("test".into()),
                datapath_because: None,
                tc_handoff: false,
                tc_hook: None,
                generic_because: Some("test".into()),
                bridge: None,
                fdb_entries: None,
                encap: None,
                pppoe: Some(PppoeStatus {
                    session_id: Some(1),
                    lower: Some("eth0".into()),
                    peer_mac: Some("52:54:00:12:34:56".into()),
                    not_accelerated_because: None,
                }),
                bridge_vlans: None,
                not_accelerated_because: None,
            },
        ],
        flows: FlowCounts {
            ipv4: 6,
            ipv6: 2,
            capacity: 1024,
        },
        counters,
        conntrack: ConntrackStatus {
            events: 42,
            events_by_type: BTreeMap::from([
                ("new".into(), 10),
                ("update".into(), 20),
                ("destroy".into(), 12),
            ]),
            resyncs: 2,
            offloaded: 4,
            offloaded_total: 9,
            removed_total: 5,
            refreshes: 77,
            joined_on_traffic: 8,
            errors: 1,
            decode_errors: 2,
            skipped: BTreeMap::from([(crate::flows::Skip::NotEstablished, 3)]),
            last_resync_ms: 1250,
        },
        fib_cache: FibCacheStatus {
            max_age_ms: 100,
            generation: 7,
            invalidations: 6,
        },
        ruleset: RulesetStatus {
            generation: 4,
            changes: 3,
            armed_interfaces: 2,
            fib_mark: true,
            verdict_max_age_ms: 1000,
            verdicts_expire: false,
        },
        age_ms: 0,
        per_packet: PerPacketStatus {
            mode: PerPacketMode::Hold,
            held: true,
            held_connections: 3,
            reading: false,
            rules: vec![
                PerPacketRule {
                    origin: RuleOrigin::NftIp,
                    table: "filter".into(),
                    chain: "FORWARD".into(),
                    position: 1,
                    kinds: vec![PerPacketKind::Hashlimit],
                    flows: Default::default(),
                    not_held_because: None,
                    held_connections: None,
                },
                PerPacketRule {
                    origin: RuleOrigin::NftInet,
                    table: "fw".into(),
                    chain: "forward".into(),
                    position: 3,
                    kinds: vec![PerPacketKind::Limit, PerPacketKind::Log],
                    flows: Default::default(),
                    not_held_because: None,
                    held_connections: Some(2),
                },
                PerPacketRule {
                    origin: RuleOrigin::LegacyIpv4,
                    table: "mangle".into(),
                    chain: "POSTROUTING".into(),
                    position: 2,
                    kinds: vec![PerPacketKind::Log],
                    flows: Default::default(),
                    not_held_because: Some(NotHeld::CtState {
                        states: [CtState::New].into_iter().collect(),
                    }),
                    held_connections: None,
                },
            ],
            unreadable: vec![],
            unproven: vec![],
            dscp_rewrite: DscpRewriteStatus {
                fast_path: true,
                setters: vec![RulePlace {
                    origin: RuleOrigin::NftInet,
                    table: "mangle".into(),
                    chain: "forward".into(),
                    position: 1,
                }],
                blocker: None,
            },
            expiring: Vec::new(),
        },
        kernel: KernelFeatures {
            features: vec![
                (
                    Feature::XdpMetadata,
                    Availability::Missing("refused".into()),
                ),
                (Feature::FibLookupMark, Availability::Available),
            ],
        },
    }
}

/// The exposition of `status`, with one LAN host's traffic.
fn exposition(status: Status) -> String {
    let source: StatusSource = Arc::new(move || Ok(status.clone()));
    let hosts: HostSource = Arc::new(|| HostTotals {
        hosts: [("10.0.1.2".parse().unwrap(), Default::default())].into(),
        other: Default::default(),
    });
    encode(&registry(source, Some(hosts))).unwrap()
}

/// The exposition of [`sample_status`] (every family populated): the manual's metric reference
/// is generated from it (`crate::reference`).
pub(crate) fn sample_exposition() -> String {
    exposition(sample_status())
}

/// The value of the sample `line_prefix` (name plus labels exactly as encoded).
fn value(text: &str, sample: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {sample} in\n{text}"))
        .parse()
        .unwrap()
}

/// Names of every sample in an exposition (`# EOF` and comments skipped).
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_string())
        .collect()
}

#[test]
fn encodes_every_family_with_values_from_the_status() {
    let t = exposition(sample_status());
    assert_eq!(
        value(
            &t,
            r#"xdp_router_fastpath_packets_total{interface="lan0",direction="original"}"#
        ),
        10.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_fastpath_bytes_total{interface="wan0",direction="reply"}"#
        ),
        2000.0
    );
    // no_flow is discriminant 11 → n = 12.
    assert_eq!(
        value(
            &t,
            r#"xdp_router_fallback_packets_total{interface="wan0",reason="no_flow"}"#
        ),
        1200.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_fallback_bytes_total{interface="lan0",reason="no_flow"}"#
        ),
        12000.0
    );
    assert!(
        !t.contains(r#"fallback_packets_total{interface="lan0",reason="forwarded"#),
        "forwarded packets are not fallbacks"
    );
    assert_eq!(value(&t, "xdp_router_fastpath_enabled"), 1.0);
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_attach_mode{interface="wan0",role="wan",mode="generic"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_attach_mode{interface="wan0",role="wan",mode="native"}"#
        ),
        0.0
    );
    assert_eq!(value(&t, r#"xdp_router_flow_entries{family="ipv4"}"#), 6.0);
    assert_eq!(
        value(&t, r#"xdp_router_flow_capacity_entries{family="ipv6"}"#),
        1024.0
    );
    assert_eq!(value(&t, "xdp_router_offloaded_connections"), 4.0);
    assert_eq!(value(&t, "xdp_router_connections_offloaded_total"), 9.0);
    assert_eq!(value(&t, "xdp_router_connections_withdrawn_total"), 5.0);
    assert_eq!(
        value(
            &t,
            r#"xdp_router_connections_skipped_total{reason="not_established"}"#
        ),
        3.0
    );
    assert_eq!(
        value(&t, r#"xdp_router_conntrack_events_total{type="destroy"}"#),
        12.0
    );
    assert_eq!(value(&t, "xdp_router_conntrack_sync_errors_total"), 1.0);
    assert_eq!(value(&t, "xdp_router_conntrack_decode_errors_total"), 2.0);
    assert_eq!(value(&t, "xdp_router_conntrack_resyncs_total"), 2.0);
    assert_eq!(
        value(&t, "xdp_router_conntrack_last_resync_duration_seconds"),
        1.25
    );
    assert_eq!(value(&t, "xdp_router_conntrack_refreshes_total"), 77.0);
    assert_eq!(
        value(&t, "xdp_router_conntrack_joined_on_traffic_total"),
        8.0
    );
    assert_eq!(value(&t, "xdp_router_fib_cache_invalidations_total"), 6.0);
    assert_eq!(value(&t, "xdp_router_fib_cache_max_age_seconds"), 0.1);
    assert_eq!(value(&t, "xdp_router_verdict_max_age_seconds"), 1.0);
    assert_eq!(value(&t, "xdp_router_verdicts_expiring"), 0.0);
    assert_eq!(
        value(&t, r#"xdp_router_kernel_feature{feature="xdp_metadata"}"#),
        0.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_kernel_feature{feature="fib_lookup_mark"}"#
        ),
        1.0
    );
    assert_eq!(value(&t, "xdp_router_ruleset_changes_total"), 3.0);
    assert_eq!(
        value(&t, r#"xdp_router_ruleset_per_packet_rules{kind="log"}"#),
        2.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_ruleset_per_packet_rules{kind="hashlimit"}"#
        ),
        1.0
    );
    // The log rule at mangle POSTROUTING matches ct state new only.
    assert_eq!(
        value(
            &t,
            r#"xdp_router_ruleset_per_packet_rules_holding{kind="log"}"#
        ),
        1.0
    );
    assert_eq!(
        value(&t, r#"xdp_router_ruleset_per_packet_rules{kind="queue"}"#),
        0.0
    );
    assert_eq!(value(&t, "xdp_router_ruleset_per_packet_hold"), 1.0);
    assert_eq!(
        value(&t, "xdp_router_ruleset_per_packet_held_connections"),
        3.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_ruleset_per_packet_rule_held_connections{rule="inet fw forward rule 3"}"#
        ),
        2.0
    );
    assert!(
        !t.contains(r#"rule_held_connections{rule="ip filter FORWARD rule 1"}"#),
        "a rule without a count has no series"
    );
    assert_eq!(value(&t, "xdp_router_ruleset_unreadable"), 0.0);
    assert_eq!(value(&t, "xdp_router_ruleset_dscp_rewrite_rules"), 1.0);
    assert_eq!(value(&t, "xdp_router_dscp_rewrite_fast_path"), 1.0);
    assert_eq!(
        value(
            &t,
            &format!(
                r#"xdp_router_build_info{{version="{}"}}"#,
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0
    );
    assert_eq!(value(&t, "xdp_router_status_read_errors_total"), 0.0);
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_egress_shaped{interface="wan0",role="wan"}"#
        ),
        1.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_egress_shaped{interface="lan0",role="lan"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_xdp_xmit{interface="wan0",role="wan"}"#
        ),
        0.0
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_pppoe_session{interface="wan0",role="wan"}"#
        ),
        1.0
    );
    assert!(
        !t.contains(r#"xdp_router_interface_pppoe_session{interface="lan0""#),
        "only PPP devices have a session: {t}"
    );
    assert_eq!(
        value(
            &t,
            r#"xdp_router_interface_bridge_vlans{interface="lan0",role="lan"}"#
        ),
        2.0
    );
    assert!(
        !t.contains(r#"xdp_router_interface_bridge_vlans{interface="wan0""#),
        "only VLAN-filtering bridges and their ports have VLANs: {t}"
    );
    assert!(t.contains("# UNIT xdp_router_fastpath_bytes bytes"), "{t}");
    assert!(t.ends_with("# EOF\n"), "{t}");
}

/// An interface running the TC fast path (`datapath = "tc"`) is in attach mode `tc`.
#[test]
fn a_tc_interface_is_in_attach_mode_tc() {
    let mut st = sample_status();
    st.interfaces[0].attach_mode = "tc".into();
    let t = exposition(st);
    let mode = |m: &str| {
        value(
            &t,
            &format!(
                r#"xdp_router_interface_attach_mode{{interface="lan0",role="lan",mode="{m}"}}"#
            ),
        )
    };
    assert_eq!(mode("tc"), 1.0);
    assert_eq!(mode("native"), 0.0);
}

#[test]
fn names_follow_prometheus_conventions() {
    let t = exposition(sample_status());
    for name in sample_names(&t) {
        assert!(name.starts_with("xdp_router_"), "{name}");
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "{name}"
        );
    }
    // Counter samples are `<family>_total`, gauge samples are `<family>`: nothing else.
    let kinds: BTreeMap<&str, &str> = t
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    for name in sample_names(&t) {
        let kind = match name.strip_suffix("_total") {
            Some(family) if kinds.get(family) == Some(&"counter") => "counter",
            _ => kinds.get(name.as_str()).copied().unwrap_or("missing"),
        };
        assert_ne!(kind, "missing", "{name} has no TYPE line");
        assert!(kind == "counter" || kind == "gauge", "{name}: {kind}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{name}");
    }
}

#[test]
fn a_failed_status_read_is_counted_not_fatal() {
    let source: StatusSource = Arc::new(|| Err(anyhow::anyhow!("map gone")));
    let r = registry(source, None);
    encode(&r).unwrap();
    let t = encode(&r).unwrap();
    assert_eq!(value(&t, "xdp_router_status_read_errors_total"), 2.0);
    assert!(!t.contains("fastpath_packets_total{"), "{t}");
    assert!(t.contains("xdp_router_build_info"), "{t}");
}

/// Every metric name the Grafana dashboard queries is one the daemon exports.
#[test]
fn dashboard_queries_only_exported_metrics() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/grafana-dashboard.json"
    );
    let text = std::fs::read_to_string(path).expect("read config/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&text).expect("dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dash, &mut exprs);
    assert!(exprs.len() >= 8, "only {} expressions found", exprs.len());
    let exported = sample_names(&exposition(sample_status()));
    let mut used = BTreeSet::new();
    for e in &exprs {
        let names = metric_names_in(e);
        assert!(
            !names.is_empty(),
            "expression names no xdp_router metric: {e}"
        );
        for n in names {
            assert!(
                exported.contains(&n),
                "dashboard expression {e:?} uses {n}, which the daemon does not export (it exports {exported:?})"
            );
            used.insert(n);
        }
    }
    // The dashboard shows the metrics users look at first.
    for must in [
        "xdp_router_fastpath_bytes_total",
        "xdp_router_fallback_packets_total",
        "xdp_router_flow_entries",
        "xdp_router_fastpath_enabled",
        "xdp_router_host_transmit_bytes_total",
        "xdp_router_host_receive_bytes_total",
    ] {
        assert!(used.contains(must), "dashboard does not show {must}");
    }
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    // Panel targets; template variables keep theirs in `query.query`.
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    ("query", serde_json::Value::Object(q)) => {
                        if let Some(serde_json::Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// Identifiers in a PromQL expression that start with `xdp_router_`.
fn metric_names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
        if ident(b[i]) && (i == 0 || !ident(b[i - 1])) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            if word.starts_with("xdp_router_") {
                names.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_metrics_over_http() {
    let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let status = sample_status();
    tokio::spawn(serve_listener(
        listener,
        Arc::new(move || Ok(status.clone())),
        None,
    ));
    let get = |method: &'static str, path: &'static str| {
        tokio::task::spawn_blocking(move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            write!(
                s,
                "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
    };
    let ok = get("GET", "/metrics").await.unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{ok}"
    );
    assert!(ok.contains("xdp_router_fastpath_packets_total{"), "{ok}");
    assert!(
        get("GET", "/nope")
            .await
            .unwrap()
            .starts_with("HTTP/1.1 404")
    );
    let post = get("POST", "/metrics").await.unwrap();
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    // A port in use is a clear start-up error.
    let err = bind(addr).unwrap_err().to_string();
    assert!(err.contains("metrics_listen"), "{err}");
}
