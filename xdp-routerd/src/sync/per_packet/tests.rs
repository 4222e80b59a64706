//! The readers of per-packet rules on listings captured from nft 1.0.6 and iptables 1.8.9.

use super::*;
use PerPacketKind::*;

/// `nft -j list ruleset` (nft 1.0.6, Linux 6.18) after iptables-nft rules: FORWARD has
/// hashlimit, limit + LOG, quota, NFQUEUE, NFLOG (native `log group`), connbytes,
/// statistic, recent, connlimit, a jump to `sub` (conntrack only); INPUT has limit + LOG;
/// nat POSTROUTING MASQUERADE.
const IPTABLES_NFT: &str = include_str!("../testdata/iptables_nft.json");
/// nft 1.0.6, a native inet table: forward has established accept, limit, quota, log,
/// meter, `update @seen`, `ct bytes`, `ct packets`, numgen, `vmap @vm` (→ viachain:
/// quota), an anonymous vmap (→ other: ct count); `unreached` (limit) is jumped to by
/// nobody; a nat postrouting chain (limit, log) and an input chain (log).
const NFT_NATIVE: &str = include_str!("../testdata/nft_native.json");
/// `nft -t -j list ruleset` (terse: no elements) of a table whose forward chain drops a
/// set's addresses and dispatches through `vmap @vm` (→ viachain: quota); `other` has a
/// counter only.
const NFT_TERSE: &str = include_str!("../testdata/nft_terse.json");
/// iptables-legacy-save and ip6tables-legacy-save v1.8.9 (separated by `====`).
const LEGACY: &str = include_str!("../testdata/legacy_save.txt");

fn summary(rules: &[PerPacketRule]) -> Vec<(String, u32, Vec<PerPacketKind>)> {
    rules
        .iter()
        .map(|r| {
            (
                format!("{} {} {}", r.origin.name(), r.table, r.chain),
                r.position,
                r.kinds.clone(),
            )
        })
        .collect()
}

/// Why each rule of `rules` holds nothing (`None`: it holds flows), as `status` says it.
fn reasons(rules: &[PerPacketRule]) -> Vec<Option<String>> {
    rules
        .iter()
        .map(|r| r.not_held_because.as_ref().map(ToString::to_string))
        .collect()
}

/// nft 1.0.6 listings also used by `sync::dscp_rewrite`'s tests: MSS clamping on SYNs,
/// `ct state`, addresses, ports and DSCP sets (no content match); then `meta length 0-128`
/// in a forward chain.
const NFT_DSCP_CONSTANT: &str = include_str!("../testdata/nft_dscp_constant.json");
const NFT_DSCP_PER_PACKET: &str = include_str!("../testdata/nft_dscp_per_packet.json");
/// iptables-legacy-save v1.8.9, two listings split at `====` (see `sync::dscp_rewrite`).
const LEGACY_DSCP: &str = include_str!("../testdata/legacy_dscp_save.txt");

#[test]
fn matches_on_what_differs_between_packets_hold_but_syn_tests_do_not() {
    assert_eq!(parse_nft_json(NFT_DSCP_CONSTANT).unwrap(), vec![]);
    assert_eq!(
        summary(&parse_nft_json(NFT_DSCP_PER_PACKET).unwrap()),
        vec![("inet mangle forward_qos".into(), 3, vec![ContentMatch])]
    );
    let (first, second) = LEGACY_DSCP.split_once("====").unwrap();
    // `--tcp-flags SYN,RST SYN` (MSS clamping) and INPUT's length match hold nothing.
    assert_eq!(parse_legacy_save(first, RuleOrigin::LegacyIpv4), vec![]);
    assert_eq!(
        summary(&parse_legacy_save(second, RuleOrigin::LegacyIpv4)),
        vec![
            // `! --tcp-flags FIN,SYN,RST,ACK SYN`: every segment but a SYN.
            (
                "iptables-legacy filter FORWARD".into(),
                1,
                vec![ContentMatch]
            ),
            // `-m length` in the chain POSTROUTING jumps to.
            ("iptables-legacy mangle qos".into(), 2, vec![ContentMatch]),
        ]
    );
    // A MAC filter, a vmap on the packet length, an xt `string` match.
    let rules = r#"{"nftables": [
        {"chain": {"family": "inet", "table": "t", "name": "f", "type": "filter",
                   "hook": "forward", "prio": 0}},
        {"rule": {"family": "inet", "table": "t", "chain": "f", "expr": [
            {"match": {"op": "==", "left": {"payload": {"protocol": "ether",
                       "field": "saddr"}}, "right": "02:00:00:00:00:01"}},
            {"drop": null}]}},
        {"rule": {"family": "inet", "table": "t", "chain": "f", "expr": [
            {"vmap": {"key": {"meta": {"key": "length"}}, "data": {"set": []}}}]}},
        {"rule": {"family": "inet", "table": "t", "chain": "f", "expr": [
            {"xt": {"type": "match", "name": "string"}}, {"drop": null}]}}]}"#;
    assert_eq!(
        summary(&parse_nft_json(rules).unwrap()),
        vec![
            ("inet t f".into(), 2, vec![ContentMatch]),
            ("inet t f".into(), 3, vec![ContentMatch]),
        ]
    );
}

#[test]
fn iptables_nft_xt_matches_are_found_in_forward_only() {
    let rules = parse_nft_json(IPTABLES_NFT).unwrap();
    let f = |p, k: Vec<PerPacketKind>| ("ip filter FORWARD".to_string(), p, k);
    assert_eq!(
        summary(&rules),
        vec![
            f(1, vec![Hashlimit]),
            f(2, vec![Limit, Log]),
            f(3, vec![Quota]),
            f(4, vec![Queue]),
            f(5, vec![Log]),
            f(6, vec![Connbytes]),
            f(7, vec![Statistic]),
            f(8, vec![Recent]),
            f(9, vec![Connlimit]),
        ]
    );
    assert_eq!(
        rules[0].to_string(),
        "ip filter FORWARD rule 1 uses hashlimit"
    );
}

#[test]
fn native_nft_statements_in_reachable_chains_are_found() {
    let rules = parse_nft_json(NFT_NATIVE).unwrap();
    let c = |chain: &str, p, k: Vec<PerPacketKind>| (format!("inet fw {chain}"), p, k);
    assert_eq!(
        summary(&rules),
        vec![
            c("forward", 2, vec![Limit]),
            c("forward", 3, vec![Quota]),
            c("forward", 4, vec![Log]),
            c("forward", 5, vec![Meter]),
            c("forward", 6, vec![SetUpdate]),
            c("forward", 7, vec![Connbytes]),
            c("forward", 8, vec![Connbytes]),
            c("forward", 9, vec![Statistic]),
            // Through the anonymous vmap (goto) and the named one (jump).
            c("other", 1, vec![Connlimit]),
            c("viachain", 1, vec![Quota]),
        ]
    );
    // All after `ct state established,related accept`, forward's first rule (the chains the
    // verdict maps lead to too); without it, every one holds.
    let after = "after an established accept at inet fw forward rule 1";
    assert_eq!(reasons(&rules), vec![Some(after.to_string()); 10]);
    let without = NFT_NATIVE.replace(
        r#"{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"accept": null}"#,
        r#"{"counter": null}"#,
    );
    let rules = parse_nft_json(&without).unwrap();
    assert_eq!(rules.len(), 10);
    assert_eq!(reasons(&rules), vec![None; 10]);
}

#[test]
fn a_verdict_map_listed_without_elements_reaches_every_chain_of_its_table() {
    let rules = parse_nft_json(NFT_TERSE).unwrap();
    assert_eq!(
        summary(&rules),
        vec![("inet fw viachain".to_string(), 1, vec![Quota])]
    );
    // The same without the vmap rule: viachain is reached by nothing.
    let without = NFT_TERSE.replace(
        r#"{"vmap": {"key": {"payload": {"protocol": "ip", "field": "daddr"}}, "data": "@vm"}}"#,
        r#"{"counter": null}"#,
    );
    assert_eq!(parse_nft_json(&without), Ok(vec![]));
}

#[test]
fn an_empty_ruleset_has_none_and_garbage_is_an_error() {
    let empty = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}]}"#;
    assert_eq!(parse_nft_json(empty), Ok(vec![]));
    assert!(parse_nft_json("").is_err());
    assert!(parse_nft_json("{\"other\": 1}").is_err());
    // The established-accept / MASQUERADE ruleset of a plain home router: nothing.
    let plain = r#"{"nftables": [
 {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "handle": 1, "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
 {"rule": {"family": "ip", "table": "filter", "chain": "FORWARD", "handle": 4, "expr": [{"xt": {"type": "match", "name": "conntrack"}}, {"counter": {"packets": 10, "bytes": 900}}, {"accept": null}]}},
 {"chain": {"family": "ip", "table": "nat", "name": "POSTROUTING", "handle": 1, "type": "nat", "hook": "postrouting", "prio": 100, "policy": "accept"}},
 {"rule": {"family": "ip", "table": "nat", "chain": "POSTROUTING", "handle": 2, "expr": [{"counter": {"packets": 1, "bytes": 60}}, {"xt": {"type": "target", "name": "MASQUERADE"}}]}}
]}"#;
    assert_eq!(parse_nft_json(plain), Ok(vec![]));
}

/// The forms this kernel cannot load (no `nft_queue`; nft's `dup`), as libnftables-json(5)
/// writes them, and an `xt` TEE target.
#[test]
fn queue_and_dup_statements_are_found() {
    let text = r#"{"nftables": [
 {"chain": {"family": "ip6", "table": "t", "name": "post", "type": "filter", "hook": "postrouting", "prio": 0}},
 {"rule": {"family": "ip6", "table": "t", "chain": "post", "expr": [{"queue": {"num": 3, "flags": "bypass"}}]}},
 {"rule": {"family": "ip6", "table": "t", "chain": "post", "expr": [{"dup": {"addr": "fd00::1"}}]}},
 {"rule": {"family": "ip6", "table": "t", "chain": "post", "expr": [{"xt": {"type": "target", "name": "TEE"}}]}},
 {"rule": {"family": "ip6", "table": "t", "chain": "post", "expr": [{"counter": null}]}}
]}"#;
    let rules = parse_nft_json(text).unwrap();
    let c = |p, k| ("ip6 t post".to_string(), p, vec![k]);
    assert_eq!(summary(&rules), vec![c(1, Queue), c(2, Dup), c(3, Dup)]);
}

#[test]
fn legacy_rules_in_forward_path_chains_and_their_user_chains_are_found() {
    let (v4, v6) = LEGACY.split_once("====\n").unwrap();
    let rules = parse_legacy_save(v4, RuleOrigin::LegacyIpv4);
    let c = |t: &str, p, k: Vec<PerPacketKind>| (format!("iptables-legacy {t}"), p, k);
    assert_eq!(
        summary(&rules),
        vec![
            c("filter FORWARD", 1, vec![Hashlimit]),
            c("filter sub", 1, vec![Quota]),
            c("mangle POSTROUTING", 1, vec![Statistic]),
            c("raw PREROUTING", 1, vec![Recent]),
        ],
        "INPUT, OUTPUT, nat and the unreferenced chain hold nothing"
    );
    // The quota in `sub` comes after FORWARD's ESTABLISHED,RELATED accept; the hashlimit
    // before it, and the other tables' rules, hold.
    assert_eq!(
        reasons(&rules),
        vec![
            None,
            Some("after an established accept at iptables-legacy filter FORWARD rule 2".into()),
            None,
            None
        ]
    );
    let rules = parse_legacy_save(v6, RuleOrigin::LegacyIpv6);
    assert_eq!(
        summary(&rules),
        vec![
            (
                "ip6tables-legacy filter FORWARD".to_string(),
                1,
                vec![Queue]
            ),
            (
                "ip6tables-legacy filter FORWARD".to_string(),
                2,
                vec![Connlimit]
            ),
        ]
    );
}

proptest::proptest! {
    /// Fuzz: the real listings with bytes replaced or cut never panic either parser (the
    /// JSON one answers an error or rules; the save one, rules).
    #[test]
    fn mutated_listings_never_panic(
        which in 0..4usize,
        flips in proptest::collection::vec((0usize..5000, 0x20u8..0x7f), 0..8),
        cut in 0usize..5000,
    ) {
        let mut text = [IPTABLES_NFT, NFT_NATIVE, LEGACY, NFT_TERSE][which].as_bytes().to_vec();
        for (at, v) in flips {
            let n = text.len();
            text[at % n] = v;
        }
        text.truncate(cut.max(1).min(text.len()));
        let text = String::from_utf8_lossy(&text);
        let _ = parse_nft_json(&text);
        let _ = parse_legacy_save(&text, RuleOrigin::LegacyIpv4);
    }
}

/// Without `nft` the ruleset is unreadable, which holds (never "no such rules").
#[test]
fn a_missing_nft_is_unreadable_not_empty() {
    let found = read_with(
        "/nonexistent/nft",
        ["iptables-nft-save", "ip6tables-nft-save"],
    );
    assert!(
        found
            .unreadable
            .first()
            .is_some_and(|u| u.starts_with("cannot run `/nonexistent/nft`")),
        "{found:?}"
    );
    assert!(crate::flows::per_packet::hold(
        crate::flows::per_packet::PerPacketMode::Hold,
        &found
    ));
}

#[test]
fn quoted_words_are_one_word() {
    assert_eq!(
        crate::sync::ruleset_listing::save_words(
            r#"FORWARD -j LOG --log-prefix "a -m limit \"b\" " -m quota"#
        ),
        vec![
            "FORWARD",
            "-j",
            "LOG",
            "--log-prefix",
            r#"a -m limit "b" "#,
            "-m",
            "quota"
        ]
    );
    let rules = parse_legacy_save(
        "*filter\n-A FORWARD -j ACCEPT -m comment --comment \"-m hashlimit\"\nCOMMIT\n",
        RuleOrigin::LegacyIpv4,
    );
    assert_eq!(rules, vec![]);
}

/// Before conntrack (a `prerouting` chain at priority raw, the legacy `raw` table) `ct state`
/// reads `invalid` for every packet: a state test there proves nothing either way.
#[test]
fn state_tests_before_conntrack_prove_nothing() {
    let text = r#"{"nftables": [
 {"chain": {"family": "inet", "table": "t", "name": "raw", "type": "filter", "hook": "prerouting", "prio": -300, "policy": "accept"}},
 {"rule": {"family": "inet", "table": "t", "chain": "raw", "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "invalid"}}, {"log": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "raw", "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "established"}}, {"accept": null}]}},
 {"rule": {"family": "inet", "table": "t", "chain": "raw", "expr": [{"limit": {"rate": 1, "per": "second"}}, {"log": null}]}},
 {"chain": {"family": "inet", "table": "t", "name": "mangle", "type": "filter", "hook": "prerouting", "prio": -150, "policy": "accept"}},
 {"rule": {"family": "inet", "table": "t", "chain": "mangle", "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "invalid"}}, {"log": null}]}}
]}"#;
    let rules = parse_nft_json(text).unwrap();
    assert_eq!(
        reasons(&rules),
        vec![Some("matches ct state invalid only".into()), None, None]
    );
    assert_eq!(
        summary(&rules)
            .into_iter()
            .map(|(c, p, _)| format!("{c} {p}"))
            .collect::<Vec<_>>(),
        vec!["inet t mangle 1", "inet t raw 1", "inet t raw 3"]
    );
    let legacy = "*raw\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -m conntrack --ctstate INVALID -j LOG\nCOMMIT\n*mangle\n:FORWARD ACCEPT [0:0]\n-A FORWARD -m conntrack --ctstate INVALID -j LOG\nCOMMIT\n";
    let rules = parse_legacy_save(legacy, RuleOrigin::LegacyIpv4);
    assert_eq!(
        reasons(&rules),
        vec![Some("matches ct state invalid only".into()), None]
    );
    assert_eq!(
        rules[1].to_string(),
        "iptables-legacy raw PREROUTING rule 1 uses log"
    );
}
