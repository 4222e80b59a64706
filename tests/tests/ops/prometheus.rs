//! A real Prometheus server scrapes the daemon during a fast-pathed transfer.

use super::*;

#[test]
fn prometheus_scrapes_a_fast_pathed_transfer() {
    const T: &str = "prometheus_scrapes_a_fast_pathed_transfer";
    if !ready_with(T, &["prometheus", "curl"]) {
        return;
    }
    let tb = Testbed::new("opp");
    let sockdir = TempDir::new();
    let (config, socket) = write_config(tb.dir.path(), sockdir.path(), "");
    let mut daemon = start_daemon(&tb, &config, &socket);

    let prom_dir = tb.dir.path().join("prometheus");
    fs::create_dir_all(&prom_dir).expect("mkdir prometheus");
    let prom_config = prom_dir.join("prometheus.yml");
    fs::write(
        &prom_config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
             scrape_configs:\n  - job_name: xdp-router\n    static_configs:\n      - targets: ['{METRICS}']\n"
        ),
    )
    .expect("write prometheus.yml");
    let mut cmd = tb.router.command("prometheus");
    cmd.arg(format!("--config.file={}", prom_config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            prom_dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={PROM}"))
        .arg("--log.level=warn");
    let mut prom = Proc::spawn(cmd, &prom_dir.join("prometheus.log"));
    let up = wait_until(Duration::from_secs(30), || {
        prom.running()
            && curl(&tb.router, &[&format!("http://{PROM}/-/ready")]).is_some()
            && prom_query(&tb.router, "up{job=\"xdp-router\"} == 1").len() == 1
    });
    assert!(
        up,
        "Prometheus did not come up and scrape the daemon; its log:\n{}",
        prom.log()
    );

    // A transfer of ~4 s, so several scrapes land in the middle of it.
    let series =
        format!("xdp_router_fastpath_bytes_total{{interface=\"{LAN_IF}\",direction=\"original\"}}");
    let t0 = unix_now();
    let transfer = Transfer::start(
        &tb,
        SocketAddr::new(WAN_HOST_V4.into(), 5301),
        Plan {
            bytes: 96 << 20,
            rate: Some(24 << 20),
        },
    );
    let res = transfer.finish();
    assert_eq!(res.sent, res.received, "data arrived intact");
    let t1 = unix_now();

    // Counters are final now; Prometheus must report exactly what the daemon reports.
    let st = status(&socket, &daemon);
    let (fwd_pkts, fwd_bytes) = counter(&st, LAN_IF, "forwarded_original");
    let sent = res.sent.bytes as f64;
    assert!(
        fwd_bytes as f64 >= 0.9 * sent && (fwd_bytes as f64) <= 1.15 * sent,
        "fast path forwarded {fwd_bytes} frame bytes in {fwd_pkts} packets for {sent} payload bytes"
    );
    let mut seen = f64::NAN;
    let matched = wait_until(Duration::from_secs(15), || {
        seen = prom_query(&tb.router, &series)
            .first()
            .map_or(f64::NAN, |r| r.1);
        seen == fwd_bytes as f64
    });
    assert!(
        matched,
        "Prometheus has {series} = {seen}, the daemon {fwd_bytes}"
    );

    // Scrapes during the transfer saw it grow: several samples strictly between 0 and final.
    let body = curl(
        &tb.router,
        &[
            "-G",
            "--data-urlencode",
            &format!("query={series}"),
            "--data-urlencode",
            &format!("start={t0}"),
            "--data-urlencode",
            &format!("end={}", t1 + 1.0),
            "--data-urlencode",
            "step=0.5",
            &format!("http://{PROM}/api/v1/query_range"),
        ],
    )
    .expect("range query");
    let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let values: Vec<f64> = v["data"]["result"][0]["values"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| p[1].as_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut during: Vec<f64> = values
        .iter()
        .copied()
        .filter(|&x| x > 0.0 && x < fwd_bytes as f64)
        .collect();
    during.dedup();
    assert!(
        during.len() >= 2,
        "expected scrapes in the middle of the transfer, got samples {values:?}"
    );
    assert!(
        during.windows(2).all(|w| w[0] <= w[1]),
        "counter went backwards: {during:?}"
    );

    // The other series, with values that follow from the transfer.
    let r = &tb.router;
    assert_eq!(prom_value(r, "xdp_router_fastpath_enabled"), 1.0);
    assert_eq!(
        prom_value(
            r,
            &format!("xdp_router_interface_attach_mode{{interface=\"{LAN_IF}\",mode=\"native\"}}")
        ),
        1.0
    );
    assert_eq!(
        prom_value(
            r,
            &format!(
                "xdp_router_fastpath_packets_total{{interface=\"{LAN_IF}\",direction=\"original\"}}"
            )
        ),
        fwd_pkts as f64
    );
    assert!(
        prom_value(
            r,
            &format!(
                "xdp_router_fastpath_packets_total{{interface=\"{WAN_IF}\",direction=\"reply\"}}"
            )
        ) > 0.0,
        "ACKs of the reply direction are fast-pathed too"
    );
    assert!(
        prom_value(
            r,
            &format!(
                "xdp_router_fallback_packets_total{{interface=\"{LAN_IF}\",reason=\"tcp_syn_fin_rst\"}}"
            )
        ) >= 1.0,
        "the SYN went to the kernel"
    );
    assert!(prom_value(r, "xdp_router_connections_offloaded_total") >= 1.0);
    assert!(prom_value(r, "xdp_router_conntrack_events_total{type=\"new\"}") >= 1.0);
    assert_eq!(prom_value(r, "xdp_router_conntrack_resyncs_total"), 1.0);
    assert_eq!(
        prom_value(r, "xdp_router_flow_capacity_entries{family=\"ipv4\"}"),
        st.flows.capacity as f64
    );
    assert_eq!(prom_value(r, "xdp_router_status_read_errors_total"), 0.0);
    assert_eq!(
        prom_query(
            r,
            &format!(
                "xdp_router_build_info{{version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        )
        .len(),
        1
    );
    // Prometheus' own view: the target's scrapes succeed.
    assert_eq!(prom_value(r, "up{job=\"xdp-router\"}"), 1.0);

    let excerpt = curl(&tb.router, &[&format!("http://{METRICS}/metrics")]).expect("GET /metrics");
    eprintln!(
        "---- /metrics excerpt ----\n{}",
        excerpt
            .lines()
            .filter(
                |l| (l.contains(&format!("\"{LAN_IF}\"")) && !l.ends_with(" 0"))
                    || !l.contains("interface=")
            )
            .collect::<Vec<_>>()
            .join("\n")
    );
    daemon.signal(libc::SIGTERM);
    assert!(
        daemon
            .wait_exit(Duration::from_secs(5))
            .is_some_and(|s| s.success())
    );
}
