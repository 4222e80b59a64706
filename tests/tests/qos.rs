//! QoS-aware offload, end to end: with `shaped = "auto"` (the default, which the test bed's
//! config relies on) the daemon notices an HTB shaper added on the router's WAN egress and
//! stops sending fast-path packets out of it, live: uploads go through the shaper (rate capped,
//! counted under `egress_shaped`, seen by the qdisc) while downloads, whose egress is the LAN
//! side, stay on the fast path. Deleting the shaper hands uploads back to the fast path, even in
//! the middle of a connection.
//!
//! Run as root with one test thread: `cargo test -p xdp-router-tests --test qos --
//! --test-threads=1` after building the daemon (`cargo xtask test` does both).

use std::{
    net::SocketAddr,
    process::Command,
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns,
    testbed::{
        LAN_IF, Plan, Snapshot, Testbed, Transfer, TransferResult, WAN_HOST_V4, WAN_IF,
        assert_intact, download, fastpath_fraction, ready, wait_until,
    },
};

/// The shaper's rate, in bit/s.
const SHAPER_BPS: f64 = 20e6;
/// How much faster than the shaper rate a shaped upload may appear (HTB bursts, the queue
/// draining after the sender stops, timing of a short run).
const SHAPER_MARGIN: f64 = 1.25;
/// The WAN egress shaper: HTB with one default class and a FIFO leaf, as a user would set it up.
const HTB: &str = "set -e
     tc qdisc add dev eth0 root handle 1: htb default 10
     tc class add dev eth0 parent 1: classid 1:10 htb rate 20mbit ceil 20mbit burst 15k
     tc qdisc add dev eth0 parent 1:10 handle 10: pfifo limit 1000";

fn wan(port: u16) -> SocketAddr {
    SocketAddr::new(WAN_HOST_V4.into(), port)
}

/// `status --json` of one interface, with the fields this test is about.
#[derive(Debug)]
struct Shaping {
    shaped: bool,
    shaped_config: String,
    shaped_by: Option<String>,
    egress_qdisc: Option<String>,
}

fn shaping(tb: &Testbed, ifname: &str) -> Shaping {
    let out = tb
        .daemon()
        .ctl(&["status", "--json"])
        .unwrap_or_else(|e| panic!("{e}"));
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"));
    let i = v["interfaces"]
        .as_array()
        .and_then(|a| a.iter().find(|i| i["name"] == ifname))
        .unwrap_or_else(|| panic!("status lists no interface {ifname}: {out}"));
    let text = |k: &str| i[k].as_str().map(str::to_owned);
    Shaping {
        shaped: i["shaped"]
            .as_bool()
            .unwrap_or_else(|| panic!("no `shaped` in {i}")),
        shaped_config: text("shaped_config").unwrap_or_default(),
        shaped_by: text("shaped_by"),
        egress_qdisc: text("egress_qdisc"),
    }
}

/// Waits (5 s at most) until the daemon reports the WAN interface shaped (`Some(kind)`) or not
/// (`None`), and until the log line it writes for that appears.
fn wait_wan_shaping(tb: &Testbed, by: Option<&str>, log_line: &str) {
    let ok = wait_until(Duration::from_secs(5), || {
        let s = shaping(tb, WAN_IF);
        s.shaped == by.is_some() && s.shaped_by.as_deref() == by
    });
    assert!(
        ok,
        "{WAN_IF} should be shaped by {by:?} within 5 s: {:?}; qdiscs:\n{}",
        shaping(tb, WAN_IF),
        tb.router.exec_ok("tc", &["qdisc", "show"])
    );
    let logged = wait_until(Duration::from_secs(2), || {
        tb.daemon().log_tail().contains(log_line)
    });
    assert!(
        logged,
        "the daemon log lacks {log_line:?}:\n{}",
        tb.daemon().log_tail()
    );
}

/// Packets the root qdisc of the router's WAN interface has handled: sent plus dropped
/// (`tc -s qdisc`).
fn qdisc_packets(tb: &Testbed) -> u64 {
    let out = tb
        .router
        .exec_ok("tc", &["-s", "qdisc", "show", "dev", WAN_IF]);
    parse_qdisc_packets(&out)
        .unwrap_or_else(|| panic!("no `Sent … pkt (dropped …` in tc -s output:\n{out}"))
}

/// Sent plus dropped packets of the first ` Sent N bytes M pkt (dropped D, …` line (the root
/// qdisc's).
fn parse_qdisc_packets(tc_stats: &str) -> Option<u64> {
    let line = tc_stats
        .lines()
        .find(|l| l.trim_start().starts_with("Sent "))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |w: &str| {
        let i = words.iter().position(|x| *x == w)?;
        words.get(i + 1)?.trim_end_matches(',').parse::<u64>().ok()
    };
    Some(after("bytes")? + after("(dropped")?)
}

/// An upload (LAN host → WAN host) stopped after `secs`; returns the result and the rate the
/// receiver saw, in bit/s.
fn timed_upload(tb: &Testbed, port: u16, secs: f64) -> (TransferResult, f64) {
    let t0 = Instant::now();
    let t = Transfer::start(
        tb,
        wan(port),
        Plan {
            bytes: 1 << 40,
            rate: None,
        },
    );
    sleep(Duration::from_secs_f64(secs));
    t.stop();
    let r = t.finish();
    let bps = r.received.bytes as f64 * 8.0 / t0.elapsed().as_secs_f64();
    assert_intact(&r);
    (r, bps)
}

/// Share of the LAN host's packets in `[a, b]` that `reason` counted on the router's LAN side.
fn lan_share(a: &Snapshot, b: &Snapshot, reason: &str) -> (u64, u64, f64) {
    let wire = b.rx_lan_since(a);
    let n = b.packets_since(a, LAN_IF, reason);
    (n, wire, fastpath_fraction(n, wire))
}

fn tc_available(test: &str) -> bool {
    match Command::new("tc").arg("-V").output() {
        Ok(o) if o.status.success() => true,
        _ => netns::skip(test, "`tc` (iproute2) not found"),
    }
}

#[test]
fn shaped_wan_egress_is_detected_and_followed_live() {
    const TEST: &str = "qos::shaped_wan_egress_is_detected_and_followed_live";
    if !ready(TEST) || !tc_available(TEST) {
        return;
    }
    let mut tb = Testbed::new("qos");
    tb.start_daemon();

    // 1. veth egress has no queue: not shaped, and status says why.
    let s = shaping(&tb, WAN_IF);
    assert_eq!(
        s.shaped_config, "auto",
        "the test bed config relies on the default"
    );
    assert!(!s.shaped, "{s:?}");
    assert_eq!(s.egress_qdisc.as_deref(), Some("noqueue"), "{s:?}");

    // 2. Add the shaper: the daemon notices and says so.
    let added = tb.router.exec("sh", &["-c", HTB]);
    if !added.status.success() {
        let err = String::from_utf8_lossy(&added.stderr);
        if err.contains("Unknown qdisc") || err.contains("No such file") {
            netns::skip(TEST, &format!("no HTB in this kernel: {}", err.trim()));
            return;
        }
        panic!("adding the HTB shaper failed: {err}");
    }
    wait_wan_shaping(
        &tb,
        Some("htb"),
        "eth0: egress shaped by htb: fast path will not send out of it",
    );
    let s = shaping(&tb, WAN_IF);
    assert_eq!(s.egress_qdisc.as_deref(), Some("htb"), "{s:?}");
    assert!(
        !shaping(&tb, LAN_IF).shaped,
        "only the WAN egress is shaped"
    );
    let human = tb
        .daemon()
        .ctl(&["status"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        human.contains("qdisc htb (egress shaped by htb: not used by the fast path)"),
        "status:\n{human}"
    );

    // 3. An upload goes through the shaper: capped, counted as egress_shaped, seen by HTB.
    let before = tb.snapshot();
    let qdisc_before = qdisc_packets(&tb);
    let (_, bps) = timed_upload(&tb, 5201, 3.0);
    let after = tb.snapshot();
    let qdisc_seen = qdisc_packets(&tb) - qdisc_before;
    let (shaped, wire, frac) = lan_share(&before, &after, "egress_shaped");
    let (fwd, _, _) = lan_share(&before, &after, "forwarded_original");
    eprintln!(
        "shaped upload: {:.1} Mbit/s; {wire} LAN packets, {shaped} egress_shaped ({:.1} %), \
         {fwd} fast-pathed; HTB sent or dropped {qdisc_seen}",
        bps / 1e6,
        frac * 100.0
    );
    assert!(
        bps <= SHAPER_BPS * SHAPER_MARGIN,
        "the upload ran at {:.1} Mbit/s through a {:.0} Mbit/s shaper: the fast path bypassed it",
        bps / 1e6,
        SHAPER_BPS / 1e6
    );
    assert!(
        bps >= SHAPER_BPS * 0.25,
        "the shaped upload only reached {:.1} Mbit/s",
        bps / 1e6
    );
    assert!(
        frac >= 0.9,
        "only {shaped} of {wire} LAN packets were passed as egress_shaped"
    );
    assert!(
        fwd * 100 <= wire,
        "{fwd} of {wire} upload packets were fast-pathed past the shaper"
    );
    assert!(
        qdisc_seen >= shaped,
        "HTB saw {qdisc_seen} packets, fewer than the {shaped} the datapath handed to the kernel"
    );

    // 4. A download leaves through the LAN side: still fast-pathed under the WAN shaper.
    let before = tb.snapshot();
    let (sent, received) = download(&tb, wan(5202), 32 << 20);
    let after = tb.snapshot();
    assert_eq!(received, sent, "download bytes and SHA-256");
    let wire = after.rx_wan_since(&before);
    let fwd = after.packets_since(&before, WAN_IF, "forwarded_reply");
    let frac = fastpath_fraction(fwd, wire);
    eprintln!(
        "download: {wire} WAN packets, {fwd} fast-pathed ({:.1} %)",
        frac * 100.0
    );
    assert!(
        frac >= 0.9,
        "only {fwd} of {wire} download packets ({:.1} %) were fast-pathed",
        frac * 100.0
    );

    // 5. Live: delete the shaper in the middle of an upload; the same connection moves to the
    //    fast path.
    let t = Transfer::start(
        &tb,
        wan(5203),
        Plan {
            bytes: 1 << 40,
            rate: None,
        },
    );
    sleep(Duration::from_millis(1500));
    let a = tb.snapshot();
    assert!(
        a.packets_since(&after, LAN_IF, "egress_shaped") > 0,
        "the upload started shaped"
    );
    tb.router
        .exec_ok("tc", &["qdisc", "del", "dev", WAN_IF, "root"]);
    wait_wan_shaping(
        &tb,
        None,
        "eth0: egress no longer shaped (root qdisc noqueue): fast path sends out of it again",
    );
    let b = tb.snapshot();
    sleep(Duration::from_millis(1500));
    let c = tb.snapshot();
    t.stop();
    let r = t.finish();
    assert_intact(&r);
    let (fwd, wire, frac) = lan_share(&b, &c, "forwarded_original");
    let (still_shaped, _, _) = lan_share(&b, &c, "egress_shaped");
    eprintln!(
        "same connection after the shaper went: {wire} LAN packets, {fwd} fast-pathed ({:.1} %), \
         {still_shaped} egress_shaped",
        frac * 100.0
    );
    assert!(
        frac >= 0.9,
        "after the shaper was deleted only {fwd} of {wire} packets of the running upload were \
         fast-pathed"
    );
    assert_eq!(
        still_shaped, 0,
        "egress_shaped after the shaper was deleted"
    );
    assert_eq!(
        shaping(&tb, WAN_IF).egress_qdisc.as_deref(),
        Some("noqueue")
    );

    // 6. A new upload is fast-pathed and faster than the shaper allowed.
    let before = tb.snapshot();
    let (_, bps) = timed_upload(&tb, 5204, 2.0);
    let after = tb.snapshot();
    let (fwd, wire, frac) = lan_share(&before, &after, "forwarded_original");
    eprintln!(
        "unshaped upload: {:.1} Mbit/s; {fwd} of {wire} LAN packets fast-pathed",
        bps / 1e6
    );
    assert!(frac >= 0.9, "only {fwd} of {wire} packets fast-pathed");
    assert!(
        bps > SHAPER_BPS * SHAPER_MARGIN,
        "without the shaper the upload ran at {:.1} Mbit/s, no faster than the shaper allowed",
        bps / 1e6
    );
}

#[test]
fn tc_statistics_are_parsed() {
    let out =
        "qdisc htb 1: root refcnt 2 r2q 10 default 0x10 direct_packets_stat 0 direct_qlen 1000
 Sent 7654321 bytes 5123 pkt (dropped 0, overlimits 800 requeues 0)
 backlog 0b 0p requeues 0
qdisc pfifo 10: parent 1:10 limit 1000p
 Sent 7654321 bytes 5100 pkt (dropped 0, overlimits 0 requeues 0)
";
    assert_eq!(parse_qdisc_packets(out), Some(5123));
    let dropped = out.replace("dropped 0,", "dropped 17,");
    assert_eq!(parse_qdisc_packets(&dropped), Some(5123 + 17));
    assert_eq!(
        parse_qdisc_packets("qdisc noqueue 0: root refcnt 2\n"),
        None
    );
}
