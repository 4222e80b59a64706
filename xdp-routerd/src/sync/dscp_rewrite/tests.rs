use super::*;
use crate::sync::ruleset_listing::nft_tables;

/// nft 1.0.6, Linux 6.18: an inet forward chain with MSS clamping on SYNs, an established
/// counter, `oifname "eth0" ip saddr 10.0.0.0/8 udp dport { 53, 5060 } ip dscp set cs3`, a
/// jump on `tcp dport 443` to `web` (`ip6 dscp set af41`), and an output chain that sets EF on
/// short packets (not in the forward path).
const CONSTANT: &str = include_str!("../testdata/nft_dscp_constant.json");
/// nft 1.0.6: a forward chain with `oifname "eth0" ip dscp set cs3` and `meta length 0-128 ip
/// dscp set ef`; a netdev ingress chain with `ip dscp cs1 ip dscp set cs3`.
const PER_PACKET: &str = include_str!("../testdata/nft_dscp_per_packet.json");
/// iptables-legacy-save v1.8.9, twice (split at `====`): mangle with TCPMSS on SYNs, DSCP on
/// `-o eth0 -p udp --dport 5060`, a jump to `qos` (DSCP on ports 80,443), a length match in
/// INPUT; then the same plus `qos` setting EF on short packets and a filter FORWARD rule on
/// `! --tcp-flags FIN,SYN,RST,ACK SYN`.
const LEGACY: &str = include_str!("../testdata/legacy_dscp_save.txt");

fn from_nft_text(text: &str) -> DscpRewrites {
    let mut out = DscpRewrites::default();
    from_nft(&nft_tables(text).expect("nft JSON"), &mut out);
    out
}

/// The setters found, sorted (legacy chains are walked in jump order).
fn places(found: &DscpRewrites) -> Vec<String> {
    let mut places: Vec<String> = found.setters.iter().map(ToString::to_string).collect();
    places.sort();
    places
}

#[test]
fn constant_rewrites_on_flow_matches_are_proven() {
    let found = from_nft_text(CONSTANT);
    assert_eq!(found.blocker, None, "{:?}", found.blocker);
    assert_eq!(
        places(&found),
        ["inet mangle forward_qos rule 3", "inet mangle web rule 1"]
    );
}

#[test]
fn a_length_match_or_a_dscp_match_blocks_the_proof() {
    let found = from_nft_text(PER_PACKET);
    let blocker = found.blocker.clone().expect("a blocker").to_string();
    // Tables in name order: inet before netdev.
    assert_eq!(
        blocker,
        "inet mangle forward_qos rule 3 matches meta length"
    );
    assert_eq!(
        places(&found),
        [
            "inet mangle forward_qos rule 2",
            "inet mangle forward_qos rule 3",
            "netdev nd lan_in rule 1"
        ]
    );
    // The netdev chain alone: its DSCP match blocks on its own.
    let netdev_only = r#"{"nftables": [
        {"table": {"family": "netdev", "name": "nd"}},
        {"chain": {"family": "netdev", "table": "nd", "name": "lan_in", "type": "filter",
                   "hook": "ingress", "dev": "lo", "prio": 0}},
        {"rule": {"family": "netdev", "table": "nd", "chain": "lan_in", "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ip", "field": "dscp"}},
                       "right": "cs1"}},
            {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}},
                        "value": "cs3"}}]}}]}"#;
    assert_eq!(
        from_nft_text(netdev_only).blocker.unwrap().to_string(),
        "netdev nd lan_in rule 1 matches ip dscp"
    );
}

#[test]
fn a_dscp_set_from_an_expression_and_unknown_xt_matches_block() {
    let expr = r#"{"nftables": [
        {"chain": {"family": "ip", "table": "t", "name": "f", "type": "filter",
                   "hook": "forward", "prio": 0}},
        {"rule": {"family": "ip", "table": "t", "chain": "f", "expr": [
            {"mangle": {"key": {"payload": {"protocol": "ip", "field": "dscp"}},
                        "value": {"map": {"key": {"meta": {"key": "mark"}}, "data": "@m"}}}}]}},
        {"rule": {"family": "ip", "table": "t", "chain": "f", "expr": [
            {"xt": {"type": "match", "name": "u32"}}, {"accept": null}]}}]}"#;
    let found = from_nft_text(expr);
    assert_eq!(
        found.blocker.unwrap().to_string(),
        "ip t f rule 1 sets the DSCP from an expression"
    );
    let xt = r#"{"nftables": [
        {"chain": {"family": "ip", "table": "mangle", "name": "FORWARD", "type": "filter",
                   "hook": "forward", "prio": -150}},
        {"rule": {"family": "ip", "table": "mangle", "chain": "FORWARD", "expr": [
            {"xt": {"type": "match", "name": "conntrack"}},
            {"xt": {"type": "target", "name": "DSCP"}}]}},
        {"rule": {"family": "ip", "table": "mangle", "chain": "FORWARD", "expr": [
            {"xt": {"type": "match", "name": "string"}}, {"drop": null}]}},
        {"rule": {"family": "ip", "table": "mangle", "chain": "FORWARD", "expr": [
            {"xt": {"type": "target", "name": "TOS"}}]}}]}"#;
    let found = from_nft_text(xt);
    assert_eq!(
        found.blocker.unwrap().to_string(),
        "ip mangle FORWARD rule 2 matches string"
    );
    assert_eq!(found.setters.len(), 2, "DSCP and TOS both set a DSCP");
}

#[test]
fn legacy_rules_follow_jumps_and_skip_syn_only_flag_tests() {
    let (first, second) = LEGACY.split_once("====").expect("two listings");
    let mut found = DscpRewrites::default();
    from_legacy_save(first, RuleOrigin::LegacyIpv4, &mut found);
    assert_eq!(found.blocker, None, "{:?}", found.blocker);
    assert_eq!(
        places(&found),
        [
            "iptables-legacy mangle FORWARD rule 2",
            "iptables-legacy mangle qos rule 1"
        ],
        "INPUT's rule is not in the forward path"
    );
    let mut found = DscpRewrites::default();
    from_legacy_save(second, RuleOrigin::LegacyIpv4, &mut found);
    // Tables in name order: filter's negated SYN test comes first.
    assert_eq!(
        found.blocker.unwrap().to_string(),
        "iptables-legacy filter FORWARD rule 1 matches TCP flags"
    );
    assert_eq!(found.setters.len(), 3);
}
