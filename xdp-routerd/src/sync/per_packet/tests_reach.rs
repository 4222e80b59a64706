//! Which per-packet rules hold flows, on rulesets captured from the real tools (nft 1.0.6,
//! iptables 1.8.9 nf_tables, ufw 0.36.2; `testdata/capture_rulesets.sh`), each with its
//! negative control: the same kind of rule before the established accept holds again.

use super::*;
use crate::flows::per_packet::{PerPacketMode, hold};

/// The test bed's router (FORWARD: ESTABLISHED,RELATED accept, LAN → WAN accept, policy DROP;
/// MASQUERADE) plus `-A FORWARD -j LOG --log-prefix "drop: "`.
const LOG_END: (&str, &str) = (
    include_str!("../testdata/router_log_end.json"),
    include_str!("../testdata/router_log_end_save.txt"),
);
/// The same with the LOG rule inserted first (`-I FORWARD 1`).
const LOG_FIRST: (&str, &str) = (
    include_str!("../testdata/router_log_first.json"),
    include_str!("../testdata/router_log_first_save.txt"),
);
/// ufw: `default deny routed`, `route allow in on eth1 out on eth0`, logging low.
const UFW_LOW: (&str, &str) = (
    include_str!("../testdata/ufw_low.json"),
    include_str!("../testdata/ufw_low_save.txt"),
);
/// The same at logging medium: a `--ctstate NEW` LOG first in `ufw-before-logging-forward`.
const UFW_MEDIUM: (&str, &str) = (
    include_str!("../testdata/ufw_medium.json"),
    include_str!("../testdata/ufw_medium_save.txt"),
);
/// The same at logging high: a rate-limited LOG of every packet there instead.
const UFW_HIGH: (&str, &str) = (
    include_str!("../testdata/ufw_high.json"),
    include_str!("../testdata/ufw_high_save.txt"),
);
/// `testdata/fw4_style.nft`: OpenWrt fw4's shape, `ct state vmap { established : accept,
/// related : accept, invalid : drop }` first in forward, logging and limits in the zone chains.
const FW4: &str = include_str!("../testdata/fw4_style.json");
/// The same with `limit name "wan.log_limit" log` inserted before the verdict map.
const FW4_LOG_FIRST: &str = include_str!("../testdata/fw4_log_first.json");

/// The rules found in `(json, saves)` read as the daemon reads them, as `status` names them
/// (`… uses log (why)` where a rule holds nothing), and whether flows are held.
fn read(listing: (&str, &str)) -> (Vec<String>, bool) {
    let (json, saves) = listing;
    let (v4, v6) = saves.split_once("====\n").unwrap();
    let (rules, unproven) = parse_nft_json_with_saves(json, Some(v4), Some(v6)).unwrap();
    assert_eq!(unproven, Vec::<String>::new(), "both listings agree");
    named(rules)
}

fn named(rules: Vec<PerPacketRule>) -> (Vec<String>, bool) {
    let found = PerPacketRules {
        rules,
        ..Default::default()
    };
    let names = found
        .rules
        .iter()
        .map(|r| match &r.not_held_because {
            Some(why) => format!("{r} ({why})"),
            None => r.to_string(),
        })
        .collect();
    (names, hold(PerPacketMode::Hold, &found))
}

#[test]
fn a_log_rule_after_the_established_accept_holds_nothing() {
    let (rules, held) = read(LOG_END);
    assert_eq!(
        rules,
        vec![
            "ip filter FORWARD rule 3 uses log (after an established accept at ip filter \
             FORWARD rule 1)"
        ]
    );
    assert!(!held);
    // Negative control: first in FORWARD it sees every packet.
    let (rules, held) = read(LOG_FIRST);
    assert_eq!(rules, vec!["ip filter FORWARD rule 1 uses log"]);
    assert!(held);
    // Without iptables-nft-save, `-m conntrack` is unread: nothing is proven, the rule holds.
    let (rules, held) = named(parse_nft_json(LOG_END.0).unwrap());
    assert_eq!(rules, vec!["ip filter FORWARD rule 3 uses log"]);
    assert!(held);
}

#[test]
fn ufw_logging_low_holds_nothing() {
    let (rules, held) = read(UFW_LOW);
    assert_eq!(
        rules,
        vec![
            "ip filter ufw-after-logging-forward rule 1 uses limit and log (after an \
             established accept at ip filter ufw-before-forward rule 1)",
            "ip6 filter ufw6-after-logging-forward rule 1 uses limit and log (after an \
             established accept at ip6 filter ufw6-before-forward rule 2)",
        ]
    );
    assert!(!held);
}

#[test]
fn ufw_logging_medium_logs_new_connections_only_and_holds_nothing() {
    let (rules, held) = read(UFW_MEDIUM);
    assert_eq!(
        rules,
        vec![
            "ip filter ufw-after-logging-forward rule 1 uses limit and log (after an \
             established accept at ip filter ufw-before-forward rule 1)",
            "ip filter ufw-before-logging-forward rule 1 uses limit and log (matches ct state \
             new only)",
            "ip6 filter ufw6-after-logging-forward rule 1 uses limit and log (after an \
             established accept at ip6 filter ufw6-before-forward rule 2)",
            "ip6 filter ufw6-before-logging-forward rule 1 uses limit and log (matches ct \
             state new only)",
        ]
    );
    assert!(!held);
}

/// Negative control: at logging high, ufw logs every forwarded packet (rate-limited) before
/// its established accept: held.
#[test]
fn ufw_logging_high_logs_every_packet_and_holds() {
    let (rules, held) = read(UFW_HIGH);
    assert_eq!(
        rules,
        vec![
            "ip filter ufw-after-logging-forward rule 1 uses log (after an established accept \
             at ip filter ufw-before-forward rule 1)",
            "ip filter ufw-before-logging-forward rule 1 uses limit and log",
            "ip6 filter ufw6-after-logging-forward rule 1 uses log (after an established \
             accept at ip6 filter ufw6-before-forward rule 2)",
            "ip6 filter ufw6-before-logging-forward rule 1 uses limit and log",
        ]
    );
    assert!(held);
}

/// The save listings alone (the legacy reader: what `iptables-legacy-save` would list for the
/// same rules) give the same answers.
#[test]
fn the_save_listings_alone_give_the_same_answers() {
    for (listing, held) in [
        (LOG_END, false),
        (LOG_FIRST, true),
        (UFW_LOW, false),
        (UFW_MEDIUM, false),
        (UFW_HIGH, true),
    ] {
        let (v4, v6) = listing.1.split_once("====\n").unwrap();
        let mut rules = parse_legacy_save(v4, RuleOrigin::LegacyIpv4);
        rules.extend(parse_legacy_save(v6, RuleOrigin::LegacyIpv6));
        let from_nft = read(listing).0;
        let (names, h) = named(rules);
        assert_eq!(h, held, "{names:?}");
        let strip = |s: &String| {
            s.replace("ip6tables-legacy ", "ip6 ")
                .replace("iptables-legacy ", "ip ")
        };
        assert_eq!(names.iter().map(strip).collect::<Vec<_>>(), from_nft);
    }
}

#[test]
fn fw4_verdict_map_first_holds_nothing() {
    let (rules, held) = named(parse_nft_json(FW4).unwrap());
    let after = "(after an established accept at inet fw4 forward rule 1)";
    assert_eq!(
        rules,
        vec![
            format!("inet fw4 accept_to_wan rule 1 uses limit and log {after}"),
            format!("inet fw4 forward_wan rule 1 uses limit {after}"),
            format!("inet fw4 forward_wan rule 6 uses limit and log {after}"),
            format!("inet fw4 reject_to_lan rule 1 uses limit and log {after}"),
        ]
    );
    assert!(!held);
    // Negative control: a log before the verdict map holds; the others stay out of reach.
    let (rules, held) = named(parse_nft_json(FW4_LOG_FIRST).unwrap());
    let after = "(after an established accept at inet fw4 forward rule 2)";
    assert_eq!(
        rules,
        vec![
            format!("inet fw4 accept_to_wan rule 1 uses limit and log {after}"),
            "inet fw4 forward rule 1 uses limit and log".to_string(),
            format!("inet fw4 forward_wan rule 1 uses limit {after}"),
            format!("inet fw4 forward_wan rule 6 uses limit and log {after}"),
            format!("inet fw4 reject_to_lan rule 1 uses limit and log {after}"),
        ]
    );
    assert!(held);
}

/// `testdata/firewalld_router.nft`, captured from firewalld 1.3 itself (see
/// `capture_rulesets.sh`): eth0 in zone external, eth1 in internal, a policy accepting
/// internal → external, `LogDenied=all`. Its forward chain accepts `ct state { established,
/// related }` first: every log rule there and in the zone and policy chains it jumps to is out
/// of reach.
const FIREWALLD: &str = include_str!("../testdata/firewalld_router.json");

#[test]
fn firewalld_as_a_router_holds_nothing() {
    let (rules, held) = named(parse_nft_json(FIREWALLD).unwrap());
    let after = "(after an established accept at inet firewalld filter_FORWARD rule 1)";
    let rfc3964 = "daddr ::-::ffff:ffff,::ffff:0.0.0.0-::ffff:255.255.255.255,\
                   2002::-2002:ff:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:a00::-2002:aff:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:7f00::-2002:7fff:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:a9fe::-2002:a9fe:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:ac10::-2002:ac1f:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:c0a8::-2002:c0a8:ffff:ffff:ffff:ffff:ffff:ffff,\
                   2002:e000::-2002:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
    assert_eq!(
        rules,
        vec![
            format!("inet firewalld filter_FORWARD rule 4 uses log {after}"),
            format!("inet firewalld filter_FORWARD rule 6 uses log on {rfc3964} {after}"),
            format!("inet firewalld filter_FORWARD rule 8 uses log {after}"),
            format!("inet firewalld filter_FWD_external rule 8 uses log {after}"),
            format!("inet firewalld filter_FWD_internal rule 8 uses log {after}"),
            format!("inet firewalld filter_FWD_public rule 8 uses log {after}"),
            // The IPv6 reverse-path filter: `meta nfproto ipv6 fib saddr . mark . iif oif
            // missing log prefix "rpfilter_DROP: " drop`, before any conntrack test.
            "inet firewalld filter_PREROUTING rule 2 uses log (drops what it logs, on tests \
             that are the same for a whole connection)"
                .to_string(),
        ]
    );
    assert!(!held);
}

/// `[tests…] log drop` holds nothing only while every test before the log is the same for a
/// whole connection and nothing after it but a counter lets a packet go on.
#[test]
fn a_log_holds_nothing_only_where_its_rule_drops_every_packet_it_logs() {
    let rule = |exprs: &str| {
        format!(
            r#"{{"nftables": [{{"table": {{"family": "inet", "name": "t", "handle": 1}}}},
            {{"chain": {{"family": "inet", "table": "t", "name": "f", "handle": 1,
              "type": "filter", "hook": "forward", "prio": 0, "policy": "accept"}}}},
            {{"rule": {{"family": "inet", "table": "t", "chain": "f", "handle": 2,
              "expr": [{exprs}]}}}}]}}"#
        )
    };
    let iif = r#"{"match": {"op": "==", "left": {"meta": {"key": "iifname"}}, "right": "eth0"}}"#;
    let saddr = r#"{"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "saddr"}}, "right": "192.0.2.1"}}"#;
    let mark = r#"{"match": {"op": "==", "left": {"meta": {"key": "mark"}}, "right": 1}}"#;
    let (log, counter, drop, reject, accept) = (
        r#"{"log": {"prefix": "x "}}"#,
        r#"{"counter": {"packets": 0, "bytes": 0}}"#,
        r#"{"drop": null}"#,
        r#"{"reject": null}"#,
        r#"{"accept": null}"#,
    );
    let limit = r#"{"limit": {"rate": 1, "per": "second"}}"#;
    let held = |exprs: &[&str]| {
        let rules = parse_nft_json(&rule(&exprs.join(", "))).unwrap();
        assert_eq!(rules.len(), 1, "{exprs:?}");
        rules[0].holds()
    };
    for not_held in [
        vec![iif, log, drop],
        vec![counter, iif, saddr, log, counter, reject],
        vec![log, drop],
    ] {
        assert!(!held(&not_held), "{not_held:?}");
    }
    for holds in [
        vec![iif, log, accept],
        vec![iif, log],
        vec![iif, limit, log, drop],
        vec![iif, log, saddr, drop],
        vec![mark, log, drop],
    ] {
        assert!(held(&holds), "{holds:?}");
    }
}

/// Without the verdict map every zone chain is reached: the logs and limits hold, except the
/// log of `ct state invalid` packets.
#[test]
fn fw4_without_its_verdict_map_holds() {
    let vmap = r#"{"vmap": {"key": {"ct": {"key": "state"}}, "data": {"set": [["invalid", {"drop": null}], ["established", {"accept": null}], ["related", {"accept": null}]]}}}"#;
    assert_eq!(FW4.matches(vmap).count(), 3, "input, forward, output");
    let without = FW4.replace(vmap, r#"{"counter": null}"#);
    let (rules, held) = named(parse_nft_json(&without).unwrap());
    assert_eq!(
        rules,
        vec![
            "inet fw4 accept_to_wan rule 1 uses limit and log (matches ct state invalid only)",
            "inet fw4 forward_wan rule 1 uses limit",
            "inet fw4 forward_wan rule 6 uses limit and log",
            "inet fw4 reject_to_lan rule 1 uses limit and log",
        ]
    );
    assert!(held);
}

/// Listings that disagree (the ruleset changed between the two reads) prove nothing: the
/// conntrack matches stay unread and the LOG rule holds.
#[test]
fn disagreeing_listings_prove_nothing() {
    let (v4, v6) = UFW_LOW.1.split_once("====\n").unwrap();
    let (rules, unproven) = parse_nft_json_with_saves(LOG_END.0, Some(v4), Some(v6)).unwrap();
    assert_eq!(
        unproven,
        vec![
            "ip filter: iptables-nft-save lists it differently (chain FORWARD has 6 rules, not \
             3), its conntrack matches are not read",
            "ip6 filter: ip6tables-nft-save lists it differently (chain FORWARD has 6 rules, not \
             2), its conntrack matches are not read",
        ]
    );
    let (rules, held) = named(rules);
    assert_eq!(rules, vec!["ip filter FORWARD rule 3 uses log"]);
    assert!(held);
}

/// `read` asks `iptables-nft-save` only for a family where a rule holds without the options
/// and a conntrack match could change that, and pairs what it lists (fake tools: shell
/// scripts that print the captured listings and leave a mark when run).
#[test]
fn read_asks_iptables_nft_save_only_where_it_can_prove_something() {
    let dir = std::env::temp_dir().join(format!("xr-read-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = |name: &str, text: &str| {
        let data = dir.join(format!("{name}.out"));
        std::fs::write(&data, text).unwrap();
        let path = dir.join(name);
        let mark = dir.join(format!("{name}.ran"));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\ntouch '{}'\ncat '{}'\n",
                mark.display(),
                data.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path.to_string_lossy().into_owned()
    };
    let ran = |name: &str| dir.join(format!("{name}.ran")).exists();
    for (listing, ran4, ran6, held) in [
        (UFW_LOW, true, true, false),
        // The v6 table has no per-packet rule: nothing to prove there.
        (LOG_END, true, false, false),
        // The LOG rule holds whatever the accept's options say: still read, still held.
        (LOG_FIRST, true, false, true),
    ] {
        for f in std::fs::read_dir(&dir).unwrap() {
            std::fs::remove_file(f.unwrap().path()).unwrap();
        }
        let (v4, v6) = listing.1.split_once("====\n").unwrap();
        let nft = script("nft", listing.0);
        let saves = [script("save4", v4), script("save6", v6)];
        let found = read_with(&nft, [&saves[0], &saves[1]]);
        let nft_rules: Vec<&PerPacketRule> = found
            .rules
            .iter()
            .filter(|r| matches!(r.origin, RuleOrigin::NftIp | RuleOrigin::NftIp6))
            .collect();
        assert!(!nft_rules.is_empty());
        assert_eq!(found.unproven, Vec::<String>::new());
        assert_eq!((ran("save4"), ran("save6")), (ran4, ran6), "{nft_rules:?}");
        assert_eq!(nft_rules.iter().any(|r| r.holds()), held, "{nft_rules:?}");
    }
    // No conntrack match, nothing to pair: fw4 is native nftables.
    for f in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    let nft = script("nft", FW4_LOG_FIRST);
    let saves = [script("save4", ""), script("save6", "")];
    read_with(&nft, [&saves[0], &saves[1]]);
    assert_eq!((ran("save4"), ran("save6")), (false, false));
    // A save tool that cannot run leaves the conntrack matches unread, said once.
    let nft = script("nft", LOG_FIRST.0);
    let found = read_with(&nft, ["/nonexistent/iptables-nft-save", &saves[1]]);
    assert_eq!(found.unproven.len(), 1, "{:?}", found.unproven);
    assert!(
        found.unproven[0].starts_with("cannot run `/nonexistent/iptables-nft-save`"),
        "{:?}",
        found.unproven
    );
    let _ = std::fs::remove_dir_all(&dir);
}
