//! The systemd unit's ExecStartPre/ExecStart, run as written with exactly its user,
//! capabilities and no-new-privs.

use super::*;

/// `[Service]` of config/xdp-routerd.service: key → values, in order.
fn service_section() -> BTreeMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/xdp-routerd.service");
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    let mut section = String::new();
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            section = line.to_string();
        } else if section == "[Service]"
            && let Some((k, v)) = line.split_once('=')
        {
            out.entry(k.trim().into())
                .or_default()
                .push(v.trim().into());
        }
    }
    out
}

fn one<'a>(unit: &'a BTreeMap<String, Vec<String>>, key: &str) -> &'a str {
    match unit.get(key).map(Vec::as_slice) {
        Some([v]) => v,
        other => panic!("the unit must set {key} exactly once, has {other:?}"),
    }
}

/// The ExecStart-style command line as argv (plain words only: no quoting, no `-@:+!` prefix,
/// which would change how systemd runs it).
fn argv(line: &str) -> Vec<String> {
    assert!(
        !line.starts_with(['-', '@', ':', '+', '!']) && !line.contains(['"', '\'', '$', '%']),
        "keep Exec lines plain for this test: {line}"
    );
    line.split_whitespace().map(str::to_owned).collect()
}

/// `setpriv` arguments giving exactly what the unit gives: its user (DynamicUser → an
/// unprivileged uid), ambient + bounding capabilities, no-new-privs.
fn sandbox(caps: &[String], no_new_privs: bool) -> Vec<String> {
    let list: String = caps
        .iter()
        .map(|c| format!(",+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let mut a = vec![
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".into(),
        format!("--inh-caps=-all{list}"),
        format!("--ambient-caps=-all{list}"),
        format!("--bounding-set=-all{list}"),
    ];
    if no_new_privs {
        a.push("--no-new-privs".into());
    }
    a
}

#[test]
fn systemd_unit_runs_as_written_with_least_privileges() {
    const T: &str = "systemd_unit_runs_as_written_with_least_privileges";
    if !ready_with(T, &["setpriv", "systemd-analyze"]) {
        return;
    }
    let unit = service_section();
    // What the issue asks of the unit.
    assert_eq!(one(&unit, "NoNewPrivileges"), "yes");
    assert_eq!(one(&unit, "ProtectSystem"), "strict");
    assert_eq!(one(&unit, "ProtectHome"), "yes");
    assert_eq!(one(&unit, "RuntimeDirectory"), "xdp-router");
    assert_eq!(one(&unit, "Restart"), "on-failure");
    assert_eq!(one(&unit, "DynamicUser"), "yes", "runs unprivileged");
    let caps: Vec<String> = one(&unit, "CapabilityBoundingSet")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let ambient: Vec<String> = one(&unit, "AmbientCapabilities")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(caps, ambient, "ambient set = bounding set");
    let pre = argv(one(&unit, "ExecStartPre"));
    let start = argv(one(&unit, "ExecStart"));
    assert_eq!(pre[1], "check-config");
    assert_eq!(pre[0], start[0]);
    // The control socket the unit's RuntimeDirectory provides is the default one.
    assert_eq!(
        xdp_routerd::config::DEFAULT_CONTROL_SOCKET,
        "/run/xdp-router/control.sock"
    );

    let tb = Testbed::new("ops");
    // The binary and config in a directory the unprivileged user can read.
    let dir = TempDir::new();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = dir.path().join("xdp-routerd");
    fs::copy(daemon_binary(), &bin).expect("copy the daemon binary");
    // RuntimeDirectory=xdp-router with RuntimeDirectoryMode=0700, owned by the service user.
    let rundir = dir.path().join("run");
    fs::create_dir(&rundir).expect("mkdir run");
    fs::set_permissions(&rundir, fs::Permissions::from_mode(0o700)).expect("chmod run");
    chown(&rundir, Some(NOBODY), Some(NOBODY)).expect("chown run");
    let (config, socket) = write_config(dir.path(), &rundir, "keepalive_interval_ms = 500");
    let unit_config = "/etc/xdp-router/xdp-routerd.toml";
    let subst = |args: &[String]| -> Vec<String> {
        args.iter()
            .map(|a| {
                if *a == start[0] {
                    bin.to_string_lossy().into_owned()
                } else if a == unit_config {
                    config.to_string_lossy().into_owned()
                } else {
                    a.clone()
                }
            })
            .collect()
    };
    assert!(
        start.iter().any(|a| a == unit_config) && pre.iter().any(|a| a == unit_config),
        "the unit uses {unit_config}"
    );

    // systemd-analyze verify, with nothing substituted but the binary path: no complaint.
    let unit_text = fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../config/xdp-routerd.service"
    ))
    .expect("read unit");
    let unit_copy = dir.path().join("xdp-routerd.service");
    fs::write(
        &unit_copy,
        unit_text.replace(&start[0], &bin.to_string_lossy()),
    )
    .expect("write");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit_copy)
        .output()
        .expect("run systemd-analyze");
    let complaints = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify: {complaints}"
    );

    let no_new_privs = one(&unit, "NoNewPrivileges") == "yes";
    let run = |line: &[String], cap_set: &[String], log: &str| {
        let mut cmd = tb.router.command("setpriv");
        cmd.args(sandbox(cap_set, no_new_privs))
            .arg("--")
            .args(subst(line));
        Proc::spawn(cmd, &dir.path().join(log))
    };

    // ExecStartPre, then ExecStart, exactly as the unit runs them.
    let mut check = run(&pre, &caps, "pre.log");
    let st = check.wait_exit(Duration::from_secs(10));
    assert!(
        st.is_some_and(|s| s.success()),
        "ExecStartPre failed: {}",
        check.log()
    );
    let mut daemon = run(&start, &caps, "daemon.log");
    let first = wait_up(&socket, &mut daemon);
    for i in &first.interfaces {
        assert_eq!(i.attach_mode, "native", "{i:?}");
    }
    // It runs as the unprivileged user with exactly the unit's capabilities.
    let proc_status = fs::read_to_string(format!("/proc/{}/status", daemon.pid())).expect("proc");
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {name} in /proc status"))
            .to_string()
    };
    assert!(
        field("Uid:").starts_with(&NOBODY.to_string()),
        "{proc_status}"
    );
    assert_eq!(field("NoNewPrivs:"), "1");
    let want: u64 = caps
        .iter()
        .map(|c| match c.as_str() {
            "CAP_NET_ADMIN" => 1 << 12,
            "CAP_PERFMON" => 1 << 38,
            "CAP_BPF" => 1 << 39,
            other => panic!("unexpected capability {other} in the unit"),
        })
        .sum();
    assert_eq!(
        u64::from_str_radix(&field("CapEff:"), 16).expect("hex"),
        want,
        "{proc_status}"
    );
    // Everything works with those: forwarding, conntrack events and timeout refreshes
    // (ctnetlink updates), the metrics endpoint.
    let transfer = Transfer::start(
        &tb,
        SocketAddr::new(WAN_HOST_V4.into(), 5303),
        Plan {
            bytes: 48 << 20,
            rate: Some(16 << 20),
        },
    );
    let res = transfer.finish();
    assert_eq!(res.sent, res.received);
    let st = status(&socket, &daemon);
    assert!(
        counter(&st, LAN_IF, "forwarded_original").0 > 1000,
        "{:?}",
        st.counters
    );
    assert!(st.conntrack.refreshes > 0, "{:?}", st.conntrack);
    assert_eq!(
        st.conntrack.errors,
        0,
        "{:?}\n{}",
        st.conntrack,
        daemon.log()
    );
    let metrics = curl(&tb.router, &[&format!("http://{METRICS}/metrics")]);
    assert!(metrics.is_some_and(|m| m.contains("xdp_router_fastpath_packets_total{")));
    daemon.signal(libc::SIGTERM);
    let st = daemon.wait_exit(Duration::from_secs(2));
    assert!(st.is_some_and(|s| s.success()), "{st:?}: {}", daemon.log());
    assert!(!socket.exists(), "the control socket is removed on exit");

    // Least: without any one of the capabilities the daemon does not come up.
    for dropped in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != dropped).cloned().collect();
        let mut p = run(&start, &fewer, &format!("without-{dropped}.log"));
        let st = p.wait_exit(Duration::from_secs(15));
        assert!(
            st.is_some_and(|s| !s.success()),
            "the daemon must fail without {dropped} ({st:?}); log:\n{}",
            p.log()
        );
        let xdp = tb.router.exec_ok("ip", &["-d", "link", "show"]);
        assert!(!xdp.contains("prog/xdp"), "left XDP attached: {xdp}");
        let log = p.log();
        let why = log
            .lines()
            .find(|l| l.starts_with("xdp-routerd: "))
            .unwrap_or_else(|| panic!("no one-line error without {dropped}:\n{log}"));
        assert!(why.contains("capabilities"), "{why}");
        eprintln!("without {dropped}: {why}");
    }
}
