//! The Prometheus `/metrics` endpoint (`metrics_listen` in the config, loopback by default).
//!
//! Everything is read at scrape time: a [`Collector`] asks the daemon for a [`Status`] snapshot
//! (which sums the per-CPU `STATS` map and reads the flow maps right then) and encodes it, so a
//! scrape never sees a stale copy and the datapath never does anything for metrics.
//!
//! Naming follows the Prometheus conventions: every name starts with `xdp_router_`, counters end
//! in `_total`, sizes are in bytes and durations in seconds (base units, named in the metric),
//! and variants are labels (`interface`, `direction`, `reason`, `family`, `type`, `mode`), not
//! names. The exposition format is OpenMetrics text.

use std::{convert::Infallible, fmt, net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header,
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, NoLabelSet},
    metrics::{MetricType, counter::Counter},
    registry::{Registry, Unit},
};
use tracing::{debug, info, warn};
use xdp_router_common::Reason;

use crate::status::Status;

/// Where the metrics' status comes from (the daemon's state; a fixed one in tests).
pub type StatusSource = Arc<dyn Fn() -> anyhow::Result<Status> + Send + Sync>;

/// Every metric name starts with this (plus `_`).
pub const PREFIX: &str = "xdp_router";

/// `Content-Type` of the exposition (OpenMetrics text 1.0, which Prometheus negotiates).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The attach modes an interface can be in (`xdp_router_interface_attach_mode{mode}`); one
/// series per mode, 1 for the current one, so a change shows as a 0 → 1 flip.
const ATTACH_MODES: [&str; 5] = ["native", "generic", "ports", "lower", "detached"];

/// Reads a [`Status`] per scrape and turns it into metric families.
struct StatusCollector {
    source: StatusSource,
    /// Scrapes whose status read failed (also exported, so an alert can fire on it).
    errors: Counter,
}

impl fmt::Debug for StatusCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StatusCollector").finish_non_exhaustive()
    }
}

impl Collector for StatusCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        match (self.source)() {
            Ok(status) => encode_status(&status, &mut encoder)?,
            Err(e) => {
                self.errors.inc();
                warn!(error = %format!("{e:#}"), "metrics scrape: cannot read the daemon status");
            }
        }
        counters(
            &mut encoder,
            "status_read_errors",
            "Scrapes during which the daemon status could not be read (the datapath metrics are missing from those).",
            None,
            [(vec![], self.errors.get())],
        )
    }
}

/// Counter family: `name` (+ unit) + `_total`, one sample per label set.
fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Result<(), fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        } else {
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, u64, u64>(&v, None)?;
        }
    }
    Ok(())
}

/// Gauge family, one sample per label set.
fn gauges<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    rows: impl IntoIterator<Item = (Vec<(&'static str, String)>, V)>,
) -> Result<(), fmt::Error> {
    let mut family = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in rows {
        if labels.is_empty() {
            family.encode_gauge(&v)?;
        } else {
            family.encode_family(&labels)?.encode_gauge(&v)?;
        }
    }
    Ok(())
}

/// The metric families of one status snapshot. Pure: unit-tested on a hand-made [`Status`].
fn encode_status(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    let fast: Vec<_> = s
        .counters
        .iter()
        .filter_map(|c| {
            let direction = match c.reason {
                Reason::ForwardedOriginal => "original",
                Reason::ForwardedReply => "reply",
                _ => return None,
            };
            Some((c, direction))
        })
        .collect();
    counters(
        enc,
        "fastpath_packets",
        "Packets forwarded by the XDP fast path, by ingress interface and connection direction.",
        None,
        fast.iter().map(|(c, d)| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("direction", d.to_string()),
                ],
                c.packets,
            )
        }),
    )?;
    counters(
        enc,
        "fastpath",
        "Bytes (L2 frames as received) forwarded by the XDP fast path, by ingress interface and connection direction.",
        Some(&Unit::Bytes),
        fast.iter().map(|(c, d)| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("direction", d.to_string()),
                ],
                c.bytes,
            )
        }),
    )?;
    let fallback: Vec<_> = s
        .counters
        .iter()
        .filter(|c| !c.reason.is_forwarded())
        .collect();
    counters(
        enc,
        "fallback_packets",
        "Packets handed to the kernel stack unmodified, by ingress interface and reason.",
        None,
        fallback.iter().map(|c| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("reason", c.reason.name().to_string()),
                ],
                c.packets,
            )
        }),
    )?;
    counters(
        enc,
        "fallback",
        "Bytes (L2 frames) handed to the kernel stack unmodified, by ingress interface and reason.",
        Some(&Unit::Bytes),
        fallback.iter().map(|c| {
            (
                vec![
                    ("interface", c.interface.clone()),
                    ("reason", c.reason.name().to_string()),
                ],
                c.bytes,
            )
        }),
    )?;
    gauges(
        enc,
        "fastpath_enabled",
        "1 when the fast path forwards established flows, 0 when it is switched off (everything goes to the kernel).",
        None,
        [(vec![], u64::from(s.fastpath))],
    )?;
    gauges(
        enc,
        "interface_attach_mode",
        "1 for the XDP attach mode each managed interface is in (native, generic, ports for a bridge, lower for a PPP device, or detached when it is missing), 0 for the others.",
        None,
        s.interfaces.iter().flat_map(|i| {
            ATTACH_MODES.iter().map(move |m| {
                (
                    vec![
                        ("interface", i.name.clone()),
                        ("role", i.role.clone()),
                        ("mode", m.to_string()),
                    ],
                    u64::from(i.attach_mode == *m),
                )
            })
        }),
    )?;
    gauges(
        enc,
        "interface_egress_shaped",
        "1 while the egress of a managed interface is shaped (config, or a shaping qdisc found with shaped = \"auto\"): the fast path does not send out of it.",
        None,
        s.interfaces.iter().map(|i| {
            (
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(i.shaped),
            )
        }),
    )?;
    gauges(
        enc,
        "interface_xdp_xmit",
        "1 while the kernel reports that a managed interface transmits XDP frames (NETDEV_XDP_ACT_NDO_XMIT); 0: the fast path does not send out of it (a bridge, a veth whose peer has neither XDP nor GRO) and counts such packets as egress_no_xdp_xmit.",
        None,
        s.interfaces.iter().map(|i| {
            (
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(i.xdp_xmit),
            )
        }),
    )?;
    gauges(
        enc,
        "interface_pppoe_session",
        "1 while the PPPoE session of a managed PPP device is accelerated (the program on its lower device takes its session frames off the wire and sends packets routed out of the PPP device as session frames); 0 while it is not (no session, several sessions and no pppoe_device: see status).",
        None,
        s.interfaces.iter().filter_map(|i| {
            let p = i.pppoe.as_ref()?;
            Some((
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(p.session_id.is_some()),
            ))
        }),
    )?;
    gauges(
        enc,
        "interface_bridge_vlans",
        "VLANs a VLAN-filtering bridge (its own, self VLANs) or one of its ports is a member of, as the fast path uses them (bridge vlan show); only for VLAN-filtering bridges and their ports.",
        None,
        s.interfaces.iter().filter_map(|i| {
            let v = i.bridge_vlans.as_ref()?;
            Some((
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                v.vlans.len() as u64,
            ))
        }),
    )?;
    let families = [("ipv4", s.flows.ipv4), ("ipv6", s.flows.ipv6)];
    gauges(
        enc,
        "flow_entries",
        "Offloaded flow directions in the flow map of each address family (two per connection).",
        None,
        families.map(|(f, n)| (vec![("family", f.to_string())], n)),
    )?;
    gauges(
        enc,
        "flow_capacity_entries",
        "Capacity of the flow map of each address family, in flow directions.",
        None,
        families.map(|(f, _)| (vec![("family", f.to_string())], u64::from(s.flows.capacity))),
    )?;
    let ct = &s.conntrack;
    gauges(
        enc,
        "offloaded_connections",
        "Conntrack connections currently forwarded by the fast path.",
        None,
        [(vec![], ct.offloaded)],
    )?;
    counters(
        enc,
        "connections_offloaded",
        "Conntrack connections handed to the fast path since the daemon started.",
        None,
        [(vec![], ct.offloaded_total)],
    )?;
    counters(
        enc,
        "connections_withdrawn",
        "Connections taken back from the fast path (conntrack destroy, route, address or link change) since the daemon started.",
        None,
        [(vec![], ct.removed_total)],
    )?;
    counters(
        enc,
        "connections_skipped",
        "Conntrack connections considered for offload but left to the kernel, by reason.",
        None,
        ct.skipped
            .iter()
            .map(|(r, n)| (vec![("reason", r.name().to_string())], *n)),
    )?;
    counters(
        enc,
        "conntrack_events",
        "ctnetlink events received, by type (new, update, destroy).",
        None,
        ct.events_by_type
            .iter()
            .map(|(t, n)| (vec![("type", t.clone())], *n)),
    )?;
    counters(
        enc,
        "conntrack_sync_errors",
        "Conntrack sync errors: failed dumps, timeout refreshes, socket errors.",
        None,
        [(vec![], ct.errors)],
    )?;
    counters(
        enc,
        "conntrack_decode_errors",
        "Conntrack event messages that could not be decoded and were skipped (their connections stay in the kernel).",
        None,
        [(vec![], ct.decode_errors)],
    )?;
    counters(
        enc,
        "conntrack_resyncs",
        "Full resyncs of the flow maps from a conntrack dump (start, event socket overrun).",
        None,
        [(vec![], ct.resyncs)],
    )?;
    gauges(
        enc,
        "conntrack_last_resync_duration",
        "Duration of the last full conntrack resync.",
        Some(&Unit::Seconds),
        [(vec![], ct.last_resync_ms as f64 / 1000.0)],
    )?;
    counters(
        enc,
        "conntrack_refreshes",
        "Conntrack timeout refreshes sent for flows that carried fast-path traffic (keep-alive).",
        None,
        [(vec![], ct.refreshes)],
    )?;
    counters(
        enc,
        "fib_cache_invalidations",
        "Times every flow's cached FIB answer was dropped (kernel routing, rule, address, link, neighbour or forwarding notifications).",
        None,
        [(vec![], s.fib_cache.invalidations)],
    )?;
    counters(
        enc,
        "ruleset_changes",
        "Firewall ruleset changes (nftables commits, iptables-legacy changes, lost notifications); each disarms every flow until the kernel forwards it again.",
        None,
        [(vec![], s.ruleset.changes)],
    )?;
    gauges(
        enc,
        "fib_cache_max_age",
        "Longest a flow reuses a FIB answer (fib_cache_ms); 0 = every packet is looked up.",
        Some(&Unit::Seconds),
        [(vec![], s.fib_cache.max_age_ms as f64 / 1000.0)],
    )?;
    gauges(
        enc,
        "status_age",
        "How old this scrape's figures are: 0 when read for it, else the age of the last status read, served because the daemon's state was busy.",
        Some(&Unit::Seconds),
        [(vec![], s.age_ms as f64 / 1000.0)],
    )?;
    Ok(())
}

/// The daemon's registry: build info, scrape errors, and the status collector over `source`.
pub fn registry(source: StatusSource) -> Registry {
    let mut registry = Registry::with_prefix(PREFIX);
    registry.register_collector(Box::new(BuildInfo));
    registry.register_collector(Box::new(StatusCollector {
        source,
        errors: Counter::default(),
    }));
    registry
}

/// `xdp_router_build_info{version} 1`.
#[derive(Debug)]
struct BuildInfo;

impl Collector for BuildInfo {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        gauges(
            &mut enc,
            "build_info",
            "Always 1; the labels say which xdp-routerd is running.",
            None,
            [(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1u64,
            )],
        )
    }
}

/// The exposition text of `registry` (what `/metrics` returns).
pub fn encode(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

/// Binds the metrics listener (before anything is attached, so a taken port is a start-up
/// error, not a silent loss of metrics).
pub fn bind(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| {
        format!(
            "cannot listen on {addr} for /metrics (metrics_listen in the config; \"\" disables it)"
        )
    })?;
    l.set_nonblocking(true)
        .context("cannot make the metrics listener non-blocking")?;
    Ok(l)
}

/// Serves `/metrics` on `listener` (from [`bind`]) with the current tokio runtime, forever
/// (see [`crate::tasks::metrics`] for where it runs); fails only when the listener cannot be
/// registered with the runtime.
pub async fn serve_listener(
    listener: std::net::TcpListener,
    source: StatusSource,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)
        .context("cannot register the metrics listener with tokio")?;
    if let Ok(addr) = listener.local_addr() {
        info!(url = %format!("http://{addr}/metrics"), "serving Prometheus metrics");
    }
    serve(listener, Arc::new(registry(source))).await;
    Ok(())
}

/// Accepts connections forever; each is served by hyper (HTTP/1.1, keep-alive).
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                warn!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let registry = registry.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, registry.clone()));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = conn.await {
                debug!(error = %e, "metrics: connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

async fn handle(
    req: Request<Incoming>,
    registry: Arc<Registry>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "only GET and HEAD\n",
        );
        r.headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    Ok(match req.uri().path() {
        "/metrics" => {
            // The status read does map syscalls under the daemon's lock: not on a runtime thread.
            match tokio::task::spawn_blocking(move || encode(&registry)).await {
                Ok(Ok(text)) => reply(StatusCode::OK, CONTENT_TYPE, text),
                _ => reply(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "cannot encode the metrics\n",
                ),
            }
        }
        "/" => reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "xdp-routerd: Prometheus metrics are at /metrics\n",
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found; try /metrics\n",
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::{
        collections::{BTreeMap, BTreeSet},
        io::{Read as _, Write as _},
    };

    use super::*;
    use crate::status::{
        BridgeVlanStatus, BridgeVlansStatus, ConntrackStatus, CounterRow, FibCacheStatus,
        FlowCounts, IfaceStatus, PppoeStatus, RulesetStatus,
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
            },
            age_ms: 0,
        }
    }

    fn exposition(status: Status) -> String {
        let source: StatusSource = Arc::new(move || Ok(status.clone()));
        encode(&registry(source)).unwrap()
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
        assert_eq!(value(&t, "xdp_router_fib_cache_invalidations_total"), 6.0);
        assert_eq!(value(&t, "xdp_router_fib_cache_max_age_seconds"), 0.1);
        assert_eq!(value(&t, "xdp_router_ruleset_changes_total"), 3.0);
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
        let r = registry(source);
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
}
