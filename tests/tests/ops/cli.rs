//! The operator CLI: `stats`, `flows` filters, `check-config`, errors without a daemon.

use super::*;

#[test]
fn cli_stats_flows_filters_and_check_config() {
    const T: &str = "cli_stats_flows_filters_and_check_config";
    if !ready(T) {
        return;
    }
    let tb = Testbed::new("opc");
    let sockdir = TempDir::new();
    let (config, socket) = write_config(tb.dir.path(), sockdir.path(), "");
    let daemon = start_daemon(&tb, &config, &socket);
    let s = socket.to_string_lossy().into_owned();

    let transfer = Transfer::start(
        &tb,
        SocketAddr::new(WAN_HOST_V4.into(), 5302),
        Plan {
            bytes: 64 << 20,
            rate: Some(16 << 20),
        },
    );
    let offloaded = wait_until(Duration::from_secs(5), || {
        status(&socket, &daemon).flows.ipv4 >= 2
    });
    assert!(
        offloaded,
        "the transfer was not offloaded; log:\n{}",
        daemon.log()
    );

    // flows: filters by port and address (before or after NAT), table and JSON.
    let flows = |args: &[&str]| -> Flows {
        let mut a = vec!["flows", "--json"];
        a.extend_from_slice(args);
        serde_json::from_str(&ctl(&socket, &a, &daemon)).expect("flows --json parses")
    };
    let by_port = flows(&["--port", "5302"]);
    assert_eq!(by_port.flows.len(), 2, "both directions: {by_port:?}");
    for f in &by_port.flows {
        assert!(
            f.src.ends_with(":5302") || f.dst.ends_with(":5302"),
            "{f:?}"
        );
    }
    assert!(flows(&["--port", "9"]).flows.is_empty());
    let lan_net = format!("{}/24", LAN_HOST_V4);
    assert_eq!(
        flows(&["--addr", &lan_net, "--port", "5302"]).flows.len(),
        2
    );
    assert_eq!(flows(&["--addr", &WAN_HOST_V4.to_string()]).flows.len(), 2);
    assert!(flows(&["--addr", "192.0.2.0/24"]).flows.is_empty());
    let bad = cli(&["flows", "--addr", "10.0.0.0/40", "--socket", &s]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not an IP address or prefix"));
    let table = ctl(&socket, &["flows", "--port", "5302"], &daemon);
    assert!(table.contains("2 flow directions"), "{table}");

    // stats: one table; watch mode with rates.
    let stats = ctl(&socket, &["stats"], &daemon);
    assert!(stats.contains("forwarded_original"), "{stats}");
    assert!(
        stats.contains(&format!("{LAN_IF}: fast path carried")),
        "{stats}"
    );
    let watch = ctl(
        &socket,
        &["stats", "--watch", "0.5", "--count", "2", "--json"],
        &daemon,
    );
    let samples: Vec<serde_json::Value> = watch
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per sample"))
        .collect();
    assert_eq!(samples.len(), 2, "{watch}");
    for sample in &samples {
        let secs = sample["interval_seconds"].as_f64().expect("interval");
        assert!((0.4..2.0).contains(&secs), "{sample}");
        let row = sample["rows"]
            .as_array()
            .and_then(|rows| {
                rows.iter()
                    .find(|r| r["interface"] == LAN_IF && r["reason"] == "forwarded_original")
            })
            .expect("forwarded_original row");
        let bps = row["bits_per_second"].as_f64().expect("rate");
        // 16 MiB/s of payload is ~134 Mbit/s: the rate must be of that order.
        assert!((50e6..400e6).contains(&bps), "{row}");
    }
    let watch_table = ctl(
        &socket,
        &["stats", "--watch", "0.5", "--count", "1"],
        &daemon,
    );
    assert!(
        watch_table.contains("+PACKETS") && watch_table.contains("BIT/S"),
        "{watch_table}"
    );
    eprintln!(
        "---- xdp-routerd status ----\n{}",
        ctl(&socket, &["status"], &daemon)
    );
    eprintln!("---- xdp-routerd flows ----\n{table}");
    eprintln!("---- xdp-routerd stats ----\n{stats}");
    eprintln!("---- xdp-routerd stats --watch 0.5 --count 1 ----\n{watch_table}");
    let res = transfer.finish();
    assert_eq!(res.sent, res.received);

    // fastpath toggles are logged (one line each).
    ctl(&socket, &["fastpath", "off"], &daemon);
    ctl(&socket, &["fastpath", "on"], &daemon);
    let log = daemon.log();
    for line in [
        "XDP program attached",
        "conntrack resync",
        "serving Prometheus metrics",
        "fast path switched off",
        "fast path switched on",
    ] {
        assert!(log.contains(line), "no log line {line:?} in\n{log}");
    }
    assert!(!log.contains('\x1b'), "no colour codes in a log file");

    // check-config: a missing interface warns (exit 0), a typo names file:line (exit 1).
    let dir = TempDir::new();
    let missing = dir.path().join("missing.toml");
    fs::write(
        &missing,
        "[[interface]]\nname = \"xr-missing0\"\nrole = \"wan\"\n[[interface]]\nname = \"lo\"\nrole = \"lan\"\n",
    )
    .expect("write");
    let out = cli(&["check-config", &missing.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning: interface xr-missing0 does not exist"),
        "{err}"
    );
    assert!(!err.contains("interface lo "), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("metrics: http://127.0.0.1:9824/metrics")
    );
    let typo = dir.path().join("typo.toml");
    fs::write(
        &typo,
        "metrics_listen = \"127.0.0.1:9824\"\nflow_capasity = 10\n",
    )
    .expect("write");
    let out = cli(&["check-config", &typo.to_string_lossy()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("{}:2:", typo.display())), "{err}");

    // Control commands without a daemon: one clear line, non-zero exit.
    for cmd in [
        &["status"][..],
        &["flows"],
        &["stats"],
        &["fastpath", "off"],
    ] {
        let mut a = cmd.to_vec();
        a.extend(["--socket", "/nonexistent/xr.sock"]);
        let out = cli(&a);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("no xdp-routerd is running"), "{err}");
    }
}
