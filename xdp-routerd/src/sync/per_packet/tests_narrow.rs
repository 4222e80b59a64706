//! Rules narrowed by their flow-constant tests, on listings captured from nft 1.0.6 and
//! iptables 1.8.9 (`testdata/capture_rulesets.sh`).

use super::*;
use crate::flows::per_packet::{PerPacketMode, held_flows, hold};

/// The test bed's router ruleset with a hashlimit on TCP port 22 first in FORWARD
/// (iptables-nft).
const IPTABLES_NFT: &str = include_str!("../testdata/narrowed_iptables_nft.json");
const IPTABLES_SAVE: &str = include_str!("../testdata/narrowed_iptables_nft_save.txt");
/// The same, plus `narrowed.nft` (a limit on TCP ports 22 and 2222, a log on UDP port 53 from
/// 10.9.0.0/16, a log on `th dport != 1000-2000` from eth1) and `narrowed_log_first.nft` (a
/// log before `tcp dport 23`).
const NFT: &str = include_str!("../testdata/narrowed_nft.json");

fn lines(rules: &[PerPacketRule]) -> Vec<String> {
    rules.iter().map(ToString::to_string).collect()
}

#[test]
fn a_hashlimit_on_one_port_holds_only_that_ports_connections() {
    let rules = parse_nft_json(IPTABLES_NFT).unwrap();
    assert_eq!(
        lines(&rules),
        ["ip filter FORWARD rule 1 uses hashlimit on l4proto tcp dport 22"]
    );
    // The same from iptables-save's words, as legacy tables are read.
    let (v4, _) = IPTABLES_SAVE.split_once("====").unwrap();
    let legacy = parse_legacy_save(v4, RuleOrigin::LegacyIpv4);
    assert_eq!(legacy[0].flows, rules[0].flows);
    let found = PerPacketRules {
        rules,
        ..Default::default()
    };
    // Not every packet: only the connections the rule can match.
    assert!(!hold(PerPacketMode::Hold, &found));
    assert_eq!(
        held_flows(PerPacketMode::Hold, &found),
        vec![found.rules[0].flows.clone()]
    );
    assert!(held_flows(PerPacketMode::Ignore, &found).is_empty());
}

#[test]
fn tests_after_what_a_rule_does_per_packet_do_not_narrow_it() {
    let rules: Vec<_> = parse_nft_json(NFT)
        .unwrap()
        .into_iter()
        .filter(|r| r.origin == RuleOrigin::NftInet)
        .collect();
    assert_eq!(
        lines(&rules),
        [
            "inet narrow forward rule 1 uses limit on l4proto tcp dport 22,2222",
            "inet narrow forward rule 2 uses log on saddr 10.9.0.0-10.9.255.255 l4proto udp dport 53",
            // The interface narrows nothing; the port test does.
            "inet narrow forward rule 3 uses log on dport != 1000-2000",
            // `log … tcp dport 23`: the log sees every packet.
            "inet narrow forward rule 4 uses log",
        ]
    );
    let found = PerPacketRules {
        rules,
        ..Default::default()
    };
    assert!(hold(PerPacketMode::Hold, &found));
    // Held entirely: nothing to narrow to.
    assert!(held_flows(PerPacketMode::Hold, &found).is_empty());
}

/// A DPI setup's first-six-packets rules: iptables-nft's `-p udp -m connbytes --connbytes 1:6
/// --connbytes-dir original --connbytes-mode packets -j NFQUEUE` first in FORWARD, and native
/// `ct original packets 1-6 counter` and `ct packets > 100 counter` in an inet table.
const CONNBYTES: &str = include_str!("../testdata/narrowed_connbytes.json");
const CONNBYTES_SAVE: &str = include_str!("../testdata/narrowed_connbytes_save.txt");

#[test]
fn an_upper_bound_on_conntrack_counters_holds_connections_until_it_is_passed() {
    let (v4, v6) = CONNBYTES_SAVE.split_once("====").unwrap();
    let (rules, unproven) = parse_nft_json_with_saves(CONNBYTES, Some(v4), Some(v6)).unwrap();
    assert_eq!(unproven, Vec::<String>::new());
    assert_eq!(
        lines(&rules),
        [
            "inet dpi f rule 1 uses connbytes on ct original packets <= 6",
            // A lower bound: the verdict changes once the counter passes it.
            "inet dpi f rule 2 uses connbytes",
            "ip filter FORWARD rule 1 uses connbytes and queue on l4proto udp ct original packets <= 6",
        ]
    );
    assert!(rules[2].flows.is_bounded());
    // Without iptables-nft-save's options the connbytes match narrows nothing.
    assert_eq!(
        lines(&parse_nft_json(CONNBYTES).unwrap())[2],
        "ip filter FORWARD rule 1 uses connbytes and queue on l4proto udp"
    );
    // Legacy tables: the same from iptables-save's words.
    let legacy = parse_legacy_save(v4, RuleOrigin::LegacyIpv4);
    assert_eq!(legacy[0].flows, rules[2].flows);
    let found = PerPacketRules {
        rules: vec![rules[0].clone(), rules[2].clone()],
        ..Default::default()
    };
    assert!(!hold(PerPacketMode::Hold, &found));
    assert_eq!(held_flows(PerPacketMode::Hold, &found).len(), 2);
}
