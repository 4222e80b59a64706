//! A rule that must see every packet holds flows in the kernel only where a packet of an
//! established connection can reach it. Real rulesets, the kernel's own rule counters as the
//! oracle, each run twice on the same traffic, fast path off then on:
//! - the router's ruleset plus `-A FORWARD -j LOG --log-prefix "drop: "` after its established
//!   accept: a NATed TCP transfer ≥ 90 % fast-pathed, the LOG rule's counter 0 in both runs;
//! - ufw's ruleset (captured from ufw 0.36.2: `default deny routed`, `route allow in on eth1
//!   out on eth0`, logging low and medium) loaded into the router: ≥ 90 %, every LOG/limit
//!   rule's counter the same in both runs;
//! - an OpenWrt fw4-style nftables ruleset (verdict map on `ct state` first, zone chains,
//!   limited logs in the reject chains, each given a counter): ≥ 90 %, every log rule's
//!   counter the same in both runs;
//! - firewalld's ruleset for a router (captured from firewalld 1.3: zones external and
//!   internal, a policy between them, `LogDenied=all`), each log given a counter: the same;
//! - the negative controls: the LOG rule first in FORWARD, and a counted log before fw4's
//!   verdict map, hold the flows (nothing fast-pathed, `status` says held) and count the same
//!   packets as with the fast path off.
//!
//! Run as root with one test thread (`cargo xtask test`).

use std::{collections::BTreeMap, time::Duration};

use xdp_router_tests::testbed::{
    LAN_IF, PING_DGRAM, PING_TICK, PerPacketRuleSummary, Plan, ROUTER_WAN_V4, Snapshot, Status,
    Testbed, Transfer, UdpEcho, any_v4, assert_intact, fastpath_fraction, ping_pong, ready,
    rule_packets, udp_socket, wan_v4,
};

/// ufw's rules at logging low and medium (`iptables-save`, `====`, `ip6tables-save`), as
/// `xdp-routerd/src/sync/testdata/capture_rulesets.sh` captured them from ufw itself.
const UFW_LOW: &str = include_str!("../../xdp-routerd/src/sync/testdata/ufw_low_save.txt");
const UFW_MEDIUM: &str = include_str!("../../xdp-routerd/src/sync/testdata/ufw_medium_save.txt");

/// Bytes of each TCP transfer (about 11,000 full-size packets from the LAN host).
const BYTES: u64 = 16 << 20;

/// The iptables-nft per-packet rules the daemon lists and the kernel's counter of each, keyed
/// by place (`ip filter FORWARD rule 3`); native nftables rules are counted by
/// [`nft_rule_packets`].
fn rule_counters(tb: &Testbed, rules: &[PerPacketRuleSummary]) -> BTreeMap<String, u64> {
    rules
        .iter()
        .filter_map(|r| {
            let (family, tool) = match r.origin.as_str() {
                "nft_ip6" => ("ip6", "ip6tables"),
                "nft_ip" => ("ip", "iptables"),
                _ => return None,
            };
            let n = rule_packets(&tb.router, tool, &r.table, &r.chain, r.position);
            Some((
                format!("{family} {} {} rule {}", r.table, r.chain, r.position),
                n,
            ))
        })
        .collect()
}

/// What one run measured.
#[derive(Debug)]
struct Run {
    /// LAN wire packets, of them forwarded by XDP, and the share.
    wire: u64,
    fwd: u64,
    share: f64,
    /// LAN packets counted `per_packet_rule_in_ruleset`.
    held: u64,
    /// Each per-packet rule's packets during the run.
    rules: BTreeMap<String, u64>,
}

/// A LAN → WAN TCP transfer of [`BYTES`] to `port` with the fast path `on` or off, measured.
fn tcp_run(tb: &Testbed, st: &Status, port: u16, on: bool) -> Run {
    tb.daemon().set_fastpath(on);
    let counters = |tb: &Testbed| rule_counters(tb, &st.per_packet.rules);
    let (before, rules_before): (Snapshot, _) = (tb.snapshot(), counters(tb));
    let plan = Plan {
        bytes: BYTES,
        rate: None,
    };
    let transfer = if on {
        Transfer::start_offloaded(tb, wan_v4(port), plan)
    } else {
        Transfer::start(tb, wan_v4(port), plan)
    };
    let r = transfer.finish();
    let (after, rules_after) = (tb.snapshot(), counters(tb));
    assert_intact(&r);
    assert_eq!(r.peer.ip(), ROUTER_WAN_V4, "the transfer is masqueraded");
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let run = Run {
        wire,
        fwd,
        share: fastpath_fraction(fwd, wire),
        held: after.packets_since(&before, LAN_IF, "per_packet_rule_in_ruleset"),
        rules: rules_after
            .iter()
            .map(|(k, n)| (k.clone(), n - rules_before[k]))
            .collect(),
    };
    eprintln!(
        "TCP {BYTES} B to {port}, fast path {}: {wire} LAN wire packets, {fwd} forwarded by \
         XDP ({:.1} %), {} held for a rule; rule counters {:?}",
        if on { "on" } else { "off" },
        run.share * 100.0,
        run.held,
        run.rules
    );
    run
}

/// Waits until the daemon has read the ruleset and lists a per-packet rule; returns the status
/// and prints `status`'s lines about them.
fn rules_read(tb: &Testbed) -> Status {
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(5), |st| {
        !st.per_packet.reading && !st.per_packet.rules.is_empty()
    });
    assert!(
        ok,
        "the daemon lists no per-packet rule within 5 s: {:?}\n{}",
        st.per_packet,
        tb.daemon().log_tail()
    );
    let text = tb.daemon().ctl(&["status"]).unwrap_or_default();
    for line in text
        .lines()
        .filter(|l| l.starts_with("held in the kernel") || l.starts_with("not holding flows"))
    {
        eprintln!("status: {line}");
    }
    st
}

/// The `status` text line that starts with `prefix` (panics naming the text when none does).
fn status_line(tb: &Testbed, prefix: &str) -> String {
    let text = tb.daemon().ctl(&["status"]).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("`status` has no line starting {prefix:?}:\n{text}"))
        .to_string()
}

/// Checks the fast-path-on run against the fast-path-off run of the same traffic for a ruleset
/// whose per-packet rules hold nothing: ≥ 90 % fast-pathed, nothing held, and every rule
/// counted what it counted with the kernel alone.
fn assert_accelerated_and_equal(what: &str, off: &Run, on: &Run) {
    assert!(
        off.fwd == 0 && off.wire > 0,
        "{what}: with the fast path off XDP forwarded {} of {}",
        off.fwd,
        off.wire
    );
    assert!(
        on.share >= 0.9,
        "{what}: only {} of {} LAN packets ({:.1} %) fast-pathed (want ≥ 90 %)",
        on.fwd,
        on.wire,
        on.share * 100.0
    );
    assert_eq!(on.held, 0, "{what}: packets held for a rule");
    assert_eq!(
        on.rules, off.rules,
        "{what}: rule counters with the fast path on differ from the kernel alone"
    );
}

#[test]
fn a_log_rule_after_the_established_accept_lets_the_fast_path_carry_flows() {
    if !ready("a_log_rule_after_the_established_accept_lets_the_fast_path_carry_flows") {
        return;
    }
    let mut tb = Testbed::new("rch1");
    tb.router
        .sh(r#"iptables -w -A FORWARD -j LOG --log-prefix "drop: ""#);
    tb.start_daemon();
    let st = rules_read(&tb);
    assert!(!st.per_packet.held, "held: {:?}", st.per_packet);
    assert_eq!(
        status_line(&tb, "not holding flows"),
        "not holding flows: ip filter FORWARD rule 3 uses log (after an established accept at \
         ip filter FORWARD rule 1)"
    );
    let off = tcp_run(&tb, &st, 6401, false);
    let on = tcp_run(&tb, &st, 6402, true);
    assert_accelerated_and_equal("LOG at the end of FORWARD", &off, &on);
    assert_eq!(
        on.rules.values().sum::<u64>(),
        0,
        "the LOG rule saw packets of an established connection"
    );
}

/// Loads ufw's rules (`save`) into the router, starts the daemon and runs the same transfer
/// fast path off, then on.
fn ufw(tag: &str, save: &str, port: u16) -> (Run, Run) {
    let mut tb = Testbed::new(tag);
    let (v4, v6) = save.split_once("====\n").expect("two listings");
    tb.router.sh(&format!(
        "iptables-restore -w <<'EOF'\n{v4}EOF\nip6tables-restore -w <<'EOF'\n{v6}EOF"
    ));
    tb.start_daemon();
    let st = rules_read(&tb);
    assert!(!st.per_packet.held, "held: {:?}", st.per_packet);
    assert!(
        st.per_packet
            .rules
            .iter()
            .all(|r| r.not_held_because.is_some()),
        "a ufw rule holds flows: {:?}",
        st.per_packet.rules
    );
    let off = tcp_run(&tb, &st, port, false);
    let on = tcp_run(&tb, &st, port + 1, true);
    (off, on)
}

#[test]
fn ufw_logging_low_lets_the_fast_path_carry_flows() {
    if !ready("ufw_logging_low_lets_the_fast_path_carry_flows") {
        return;
    }
    let (off, on) = ufw("rch2", UFW_LOW, 6411);
    // ufw-after-logging-forward's LOG (v4 and v6).
    assert_eq!(off.rules.len(), 2, "{:?}", off.rules);
    assert_accelerated_and_equal("ufw, logging low", &off, &on);
}

#[test]
fn ufw_logging_medium_logs_each_new_connection_with_the_fast_path_on() {
    if !ready("ufw_logging_medium_logs_each_new_connection_with_the_fast_path_on") {
        return;
    }
    let (off, on) = ufw("rch3", UFW_MEDIUM, 6421);
    assert_eq!(off.rules.len(), 4, "{:?}", off.rules);
    assert_accelerated_and_equal("ufw, logging medium", &off, &on);
    // Its `--ctstate NEW` LOG saw the connection's SYN in both runs.
    let audit = "ip filter ufw-before-logging-forward rule 1";
    assert_eq!((off.rules[audit], on.rules[audit]), (1, 1), "{audit}");
}

/// Negative control: the same LOG rule first in FORWARD sees every packet, so the flows are
/// held; its counter matches the kernel alone's for the same datagrams.
#[test]
fn a_log_rule_before_the_established_accept_holds_the_flows() {
    if !ready("a_log_rule_before_the_established_accept_holds_the_flows") {
        return;
    }
    let mut tb = Testbed::new("rch4");
    tb.router
        .sh(r#"iptables -w -I FORWARD 1 -j LOG --log-prefix "drop: ""#);
    tb.start_daemon();
    let st = rules_read(&tb);
    assert!(st.per_packet.held, "not held: {:?}", st.per_packet);
    assert_eq!(
        status_line(&tb, "held in the kernel"),
        "held in the kernel: ip filter FORWARD rule 1 uses log"
    );
    let off = tcp_run(&tb, &st, 6431, false);
    let on = tcp_run(&tb, &st, 6432, true);
    assert_eq!(on.fwd, 0, "packets fast-pathed past the LOG rule");
    assert!(
        on.held * 10 >= on.wire * 9 && on.held > 0,
        "{} of {} LAN packets held",
        on.held,
        on.wire
    );
    let log = "ip filter FORWARD rule 1";
    assert!(
        on.rules[log] >= on.wire && off.rules[log] >= off.wire,
        "the LOG rule missed packets: {on:?} {off:?}"
    );
    // The same datagrams, fast path off and on: the LOG rule counts each, both ways.
    let server = wan_v4(6433);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut counted = Vec::new();
    for (i, on) in [false, true].into_iter().enumerate() {
        tb.daemon().set_fastpath(on);
        let before = rule_packets(&tb.router, "iptables", "filter", "FORWARD", 1);
        let pp = ping_pong(
            &sock,
            server,
            i as u64 * 1000,
            200,
            PING_DGRAM,
            PING_TICK / 4,
        );
        let n = rule_packets(&tb.router, "iptables", "filter", "FORWARD", 1) - before;
        eprintln!(
            "200 datagrams each way, fast path {}: {pp:?}; the LOG rule counted {n}",
            if on { "on" } else { "off" }
        );
        assert_eq!((pp.good, pp.lost), (200, 0));
        counted.push(n);
    }
    drop(echo);
    assert_eq!(
        counted,
        vec![400, 400],
        "LOG rule counts, fast path off / on"
    );
}

/// An OpenWrt fw4-style ruleset (`xdp-routerd/src/sync/testdata/fw4_style.nft`: `ct state vmap
/// { established : accept, related : accept, invalid : drop }` first in `forward`, zone chains,
/// limited logs in the reject chains, MSS clamping), each log rule given a counter first.
const FW4: &str = include_str!("../../xdp-routerd/src/sync/testdata/fw4_style.nft");

/// firewalld's router ruleset, as firewalld itself wrote it (see
/// [`a_firewalld_ruleset_lets_the_fast_path_carry_flows`]).
const FIREWALLD: &str = include_str!("../../xdp-routerd/src/sync/testdata/firewalld_router.nft");

/// Packets the `counter` statements of rule `position` (1-based) of `chain` in the nftables
/// `family` `table` counted; `None` when it has no counter.
fn nft_rule_packets(
    tb: &Testbed,
    family: &str,
    table: &str,
    chain: &str,
    position: u32,
) -> Option<u64> {
    let out = tb
        .router
        .exec_ok("nft", &["-j", "list", "chain", family, table, chain]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("nft -j output");
    let rule = json["nftables"]
        .as_array()?
        .iter()
        .filter_map(|o| o.get("rule"))
        .nth(position as usize - 1)?;
    let counters: Vec<u64> = rule["expr"]
        .as_array()?
        .iter()
        .filter_map(|e| e.get("counter")?.get("packets")?.as_u64())
        .collect();
    (!counters.is_empty()).then(|| counters.iter().sum())
}

/// Loads the nftables `ruleset` into the router (`tag`), starts the daemon, and runs the same
/// NATed TCP transfer fast path off (to `ports.0`), then on (`ports.1`): ≥ 90 % fast-pathed,
/// and each of its log rules (every one of them holding nothing, at least `min_logs`) counts
/// what it counted with the kernel alone.
fn nft_ruleset_accelerated(
    what: &str,
    tag: &str,
    ruleset: &str,
    min_logs: usize,
    ports: (u16, u16),
) {
    let mut tb = Testbed::new(tag);
    tb.router.sh(&format!("nft -f - <<'EOF'\n{ruleset}EOF"));
    tb.start_daemon();
    let st = rules_read(&tb);
    assert!(!st.per_packet.held, "held: {:?}", st.per_packet);
    let logs: Vec<&PerPacketRuleSummary> = st
        .per_packet
        .rules
        .iter()
        .filter(|r| r.kinds.iter().any(|k| k == "log"))
        .collect();
    assert!(
        logs.len() >= min_logs && logs.iter().all(|r| r.not_held_because.is_some()),
        "{what}'s log rules, each holding nothing: {:?}",
        st.per_packet.rules
    );
    let counters = |tb: &Testbed| -> BTreeMap<String, u64> {
        logs.iter()
            .map(|r| {
                let n = nft_rule_packets(tb, "inet", &r.table, &r.chain, r.position)
                    .unwrap_or_else(|| panic!("{} rule {} has no counter", r.chain, r.position));
                (format!("{} rule {}", r.chain, r.position), n)
            })
            .collect()
    };
    let mut runs = Vec::new();
    for (port, on) in [(ports.0, false), (ports.1, true)] {
        let before = counters(&tb);
        let run = tcp_run(&tb, &st, port, on);
        let after = counters(&tb);
        let seen: BTreeMap<String, u64> = after
            .iter()
            .map(|(k, n)| (k.clone(), n - before[k]))
            .collect();
        eprintln!(
            "{what} log rules, fast path {}: {seen:?}",
            if on { "on" } else { "off" }
        );
        runs.push((run, seen));
    }
    let ((off, off_logs), (on, on_logs)) = (&runs[0], &runs[1]);
    assert_accelerated_and_equal(what, off, on);
    assert_eq!(on_logs, off_logs, "{what}'s log rules, fast path on vs off");
}

/// The fw4-style ruleset: nothing established packets reach must see every packet, so a NATed
/// TCP transfer is ≥ 90 % fast-pathed, and each of its logging rules counts what it counted
/// with the kernel alone (0: they sit behind the verdict map's established accept).
#[test]
fn an_fw4_ruleset_lets_the_fast_path_carry_flows() {
    if !ready("an_fw4_ruleset_lets_the_fast_path_carry_flows") {
        return;
    }
    let ruleset = FW4.replace(
        "limit name \"wan.log_limit\" log",
        "counter limit name \"wan.log_limit\" log",
    );
    nft_ruleset_accelerated("fw4", "rch5", &ruleset, 3, (6441, 6442));
}

/// firewalld's own ruleset for a router (`xdp-routerd/src/sync/testdata/firewalld_router.nft`,
/// captured from Debian 12's firewalld 1.3 by `capture_rulesets.sh`: the WAN in zone external,
/// masquerading, the LAN in internal, a policy accepting internal → external, `LogDenied=all`),
/// each log statement given a counter: its logs sit behind `ct state { established, related }
/// accept`, except the IPv6 reverse-path filter's, which drops what it logs. A NATed TCP
/// transfer is ≥ 90 % fast-pathed, every log rule counts what it counted with the kernel alone.
#[test]
fn a_firewalld_ruleset_lets_the_fast_path_carry_flows() {
    if !ready("a_firewalld_ruleset_lets_the_fast_path_carry_flows") {
        return;
    }
    let ruleset = FIREWALLD.replace("log prefix", "counter log prefix");
    nft_ruleset_accelerated("firewalld", "rch7", &ruleset, 7, (6451, 6452));
}

/// Negative control: fw4's ruleset with a counted, rate-limited log of every forwarded packet
/// before the verdict map (`fw4_log_first.nft`) holds the flows, and the rule counts the same
/// datagrams with the fast path off and on.
#[test]
fn an_fw4_log_before_the_verdict_map_holds_the_flows() {
    if !ready("an_fw4_log_before_the_verdict_map_holds_the_flows") {
        return;
    }
    let mut tb = Testbed::new("rch6");
    tb.router.sh(&format!("nft -f - <<'EOF'\n{FW4}EOF"));
    tb.router.sh(
        "nft insert rule inet fw4 forward counter limit name wan.log_limit log prefix \"forward \"",
    );
    tb.start_daemon();
    let st = rules_read(&tb);
    assert!(st.per_packet.held, "not held: {:?}", st.per_packet);
    assert_eq!(
        status_line(&tb, "held in the kernel"),
        "held in the kernel: inet fw4 forward rule 1 uses limit and log"
    );
    let server = wan_v4(6443);
    let _echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut counted = Vec::new();
    for (i, on) in [false, true].into_iter().enumerate() {
        tb.daemon().set_fastpath(on);
        let before = tb.snapshot();
        let rule_before = nft_rule_packets(&tb, "inet", "fw4", "forward", 1).expect("counter");
        // 50 a second: under the log's limit of 10/s only the counter sees every one.
        let pp = ping_pong(&sock, server, i as u64 * 1000, 100, PING_DGRAM, PING_TICK);
        let n = nft_rule_packets(&tb, "inet", "fw4", "forward", 1).expect("counter") - rule_before;
        let fwd = tb
            .snapshot()
            .packets_since(&before, LAN_IF, "forwarded_original");
        eprintln!(
            "100 datagrams each way, fast path {}: {pp:?}; the rule counted {n}, XDP forwarded {fwd}",
            if on { "on" } else { "off" }
        );
        assert_eq!((pp.good, pp.lost), (100, 0));
        assert_eq!(fwd, 0, "fast-pathed past the log rule");
        counted.push(n);
    }
    assert_eq!(
        counted,
        vec![200, 200],
        "the rule's counts, fast path off / on"
    );
}
