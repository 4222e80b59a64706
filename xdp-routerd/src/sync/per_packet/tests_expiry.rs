//! Which rules make kernel verdicts expire (see [`crate::flows::verdict_expiry`]), on rulesets
//! captured from nft 1.0.6 and iptables 1.8.9 nf_tables (`testdata/capture_rulesets.sh`).

use super::*;
use crate::flows::verdict_expiry::why_verdicts_expire;

/// iptables-nft: `-m set` DROP before the established accept, a `-m time` DROP after it, and
/// a `--ctstate NEW -m set` DROP after that; `nft -t -j list ruleset`, then the saves.
const IPTABLES: (&str, &str) = (
    include_str!("../testdata/expiring_iptables_nft.json"),
    include_str!("../testdata/expiring_iptables_nft_save.txt"),
);
/// testdata/expiring.nft: a lookup in a set with timeouts, one in a plain set, a `fib` test,
/// `ct state new` with the timeout set, the established accept, then `meta hour`.
const NFT: &str = include_str!("../testdata/expiring_nft.json");

/// Each expiring rule as `status` would name it, with why established packets do not reach
/// it where they do not.
fn named(rules: &[ExpiringRule]) -> Vec<String> {
    rules
        .iter()
        .map(|r| match &r.not_reached_because {
            Some(why) => format!("{r} ({why})"),
            None => r.to_string(),
        })
        .collect()
}

/// The expiring rules of an nftables listing read with iptables-nft's saves, as the daemon
/// reads them.
fn read((json, saves): (&str, &str)) -> Vec<ExpiringRule> {
    let (v4, v6) = saves.split_once("====\n").unwrap();
    let tables = nft_tables(json).unwrap();
    let mut xt = XtOptions::default();
    for (family, listing) in [("ip", v4), ("ip6", v6)] {
        assert_eq!(xt.pair(&tables, family, listing), Vec::<String>::new());
    }
    nft_rules::per_packet_rules(&tables, &xt).expiring
}

#[test]
fn an_ipset_before_the_established_accept_makes_verdicts_expire_a_time_rule_after_it_does_not() {
    let found = read(IPTABLES);
    assert_eq!(
        named(&found),
        vec![
            "ip filter FORWARD rule 1 matches ipset",
            "ip filter FORWARD rule 3 matches the time (after an established accept at ip \
             filter FORWARD rule 2)",
            "ip filter FORWARD rule 4 matches ipset (after an established accept at ip filter \
             FORWARD rule 2)",
        ]
    );
    assert_eq!(
        why_verdicts_expire(&found, &[]).as_deref(),
        Some("ip filter FORWARD rule 1 matches ipset")
    );
    // Without the first rule (the negative control): nothing established packets reach.
    assert_eq!(why_verdicts_expire(&found[1..], &[]), None);
}

#[test]
fn the_same_rules_in_iptables_legacy_save() {
    let (v4, _) = IPTABLES.1.split_once("====\n").unwrap();
    let found = expiring_in_legacy_save(v4, RuleOrigin::LegacyIpv4);
    assert_eq!(
        named(&found),
        vec![
            "iptables-legacy filter FORWARD rule 1 matches ipset",
            "iptables-legacy filter FORWARD rule 3 matches the time (after an established \
             accept at iptables-legacy filter FORWARD rule 2)",
            "iptables-legacy filter FORWARD rule 4 matches ipset (after an established accept \
             at iptables-legacy filter FORWARD rule 2)",
        ]
    );
}

#[test]
fn nft_sets_with_timeouts_fib_and_meta_hour() {
    let found = expiring_in_nft_json(NFT).unwrap();
    assert_eq!(
        named(&found),
        vec![
            // `@plain` (rule 2) changes only by commits: not listed.
            "inet t f rule 1 matches a set with timeouts",
            "inet t f rule 3 matches a route lookup",
            "inet t f rule 4 matches a set with timeouts (matches ct state new only)",
            "inet t f rule 6 matches the time (after an established accept at inet t f rule 5)",
        ]
    );
}
