//! iptables rules (the words of an `iptables-save` line) as the walk and the hold see them:
//! the legacy tables, and the options of iptables-nft's conntrack matches.

use std::collections::{BTreeMap, BTreeSet};

use super::{Judged, Parts, RuleFacts, judge};
use crate::{
    flows::{
        per_packet::{PerPacketKind, PerPacketRule},
        rule_origin::RuleOrigin,
        verdict_expiry::{ExpiringMatch, ExpiringRule},
    },
    sync::{
        ct_state,
        ruleset_listing::{legacy_entry_chains, legacy_tcp_test, save_tables, xt_content_match},
        ruleset_walk::{Action, Match, WalkRule},
    },
};

/// One part of an iptables rule, in the order iptables-save writes (and the kernel
/// evaluates) them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SavePart<'a> {
    /// The tests before the first match: `-s`, `-d`, `-i`, `-o`, `-p`, `-f`, negated or not.
    Lead(&'a [String]),
    /// `-m NAME` and its options.
    Match(&'a str, &'a [String]),
    /// `-j NAME` (a chain, a verdict or a target extension) and its options.
    Jump(&'a str, &'a [String]),
    /// `-g CHAIN`.
    Goto(&'a str),
}

impl<'a> SavePart<'a> {
    /// `-m conntrack` or `-m state` (name and options).
    pub(super) fn conntrack_match(self) -> Option<(&'a str, &'a [String])> {
        match self {
            SavePart::Match(name @ ("conntrack" | "state"), options) => Some((name, options)),
            _ => None,
        }
    }
}

/// The parts of a rule's words (after the chain name); `None` when they cannot be split for
/// sure: iptables-save writes an option value of one word without quotes, so `--comment -m`
/// is indistinguishable from a match here; a name starting with `-`, a second target or a
/// match after the target tells.
pub(super) fn parts(words: &[String]) -> Option<Vec<SavePart<'_>>> {
    let starts = |w: &str| matches!(w, "-m" | "--match" | "-j" | "--jump" | "-g" | "--goto");
    let mut out = Vec::new();
    let lead = words.iter().position(|w| starts(w)).unwrap_or(words.len());
    if lead > 0 {
        out.push(SavePart::Lead(&words[..lead]));
    }
    let mut i = lead;
    let mut targets = 0;
    while i < words.len() {
        let name = words.get(i + 1)?.as_str();
        if name.starts_with('-') || targets > 0 {
            return None;
        }
        let end = words[i + 2..]
            .iter()
            .position(|w| starts(w))
            .map_or(words.len(), |p| i + 2 + p);
        let options = &words[i + 2..end];
        out.push(match words[i].as_str() {
            "-m" | "--match" => SavePart::Match(name, options),
            "-j" | "--jump" => {
                targets += 1;
                SavePart::Jump(name, options)
            }
            _ if options.is_empty() => {
                targets += 1;
                SavePart::Goto(name)
            }
            _ => return None,
        });
        i = end;
    }
    Some(out)
}

/// One rule of a table whose chains are `is_chain`; `ct_known`: conntrack has seen the packet
/// (else a state test is `Maybe`).
fn save_rule(words: &[String], is_chain: impl Fn(&str) -> bool, ct_known: bool) -> RuleFacts {
    let Some(split) = parts(words) else {
        return unsplit_rule(words, is_chain);
    };
    let mut p = Parts::default();
    let mut action = Action::Continue;
    for part in split {
        match part {
            SavePart::Lead(lead) => {
                p.narrow(super::flow_tests::save_lead(lead));
                let content = legacy_tcp_test(lead).map(|_| PerPacketKind::ContentMatch);
                p.push(Match::Maybe, content);
            }
            SavePart::Match(name, options) => {
                let test = match ct_state::iptables_match(name, options) {
                    Some(t) if ct_known => t,
                    Some(_) => Match::Maybe,
                    None if name == "comment" => Match::All,
                    None => Match::Maybe,
                };
                let mut kinds = BTreeSet::new();
                if xt_content_match(name) || legacy_tcp_test(options).is_some() {
                    kinds.insert(PerPacketKind::ContentMatch);
                }
                kinds.extend(PerPacketKind::of_xtables(name));
                if kinds.is_empty() {
                    p.narrow(super::flow_tests::save_ports(name, options));
                }
                if name == "connbytes" {
                    p.narrow(super::flow_tests::save_connbytes_bound(options));
                }
                p.expiring(ExpiringMatch::of_xtables(name));
                p.push(test, kinds);
            }
            SavePart::Jump(name, _) => {
                p.push(Match::All, PerPacketKind::of_xtables(name));
                action = match name {
                    "ACCEPT" => Action::Accept,
                    "DROP" | "REJECT" => Action::Drop,
                    "RETURN" => Action::Return,
                    chain if is_chain(chain) => Action::Jump(chain.to_string()),
                    _ => Action::Continue,
                };
            }
            SavePart::Goto(chain) => action = Action::Goto(chain.to_string()),
        }
    }
    let walk = WalkRule::one(p.test.clone(), action);
    p.into_facts(walk)
}

/// A rule [`parts`] cannot split: tested `Maybe`, a `Maybe` jump to every chain a `-j`/`-g`
/// names, and every kind a `-m`/`-j` names.
fn unsplit_rule(words: &[String], is_chain: impl Fn(&str) -> bool) -> RuleFacts {
    let mut kinds = BTreeSet::new();
    let mut expiring = BTreeSet::new();
    let mut walk = WalkRule::default();
    if legacy_tcp_test(words).is_some() {
        kinds.insert(PerPacketKind::ContentMatch);
    }
    for pair in words.windows(2) {
        match pair[0].as_str() {
            "-m" | "--match" if xt_content_match(&pair[1]) => {
                kinds.insert(PerPacketKind::ContentMatch);
            }
            "-m" | "--match" => {
                kinds.extend(PerPacketKind::of_xtables(&pair[1]));
                expiring.extend(ExpiringMatch::of_xtables(&pair[1]));
            }
            "-j" | "--jump" | "-g" | "--goto" => {
                kinds.extend(PerPacketKind::of_xtables(&pair[1]));
                if is_chain(&pair[1]) {
                    walk.branches.push(crate::sync::ruleset_walk::Branch {
                        test: Match::Maybe,
                        action: Action::Jump(pair[1].clone()),
                    });
                }
            }
            _ => {}
        }
    }
    RuleFacts {
        walk,
        kinds,
        excluded: None,
        expiring,
        never_established: None,
        flows: Default::default(),
        drops_what_it_logs: false,
    }
}

/// The per-packet rules in an `iptables-save` / `ip6tables-save` listing (pure; tested on
/// iptables-legacy-save v1.8.9 output), in (table, chain, position) order.
pub fn parse_legacy_save(listing: &str, origin: RuleOrigin) -> Vec<PerPacketRule> {
    judge_legacy_save(listing, origin).rules
}

/// The rules of an `iptables-save` listing with a match whose answer can change without a
/// ruleset change (pure), in (table, chain, position) order.
pub fn expiring_in_legacy_save(listing: &str, origin: RuleOrigin) -> Vec<ExpiringRule> {
    judge_legacy_save(listing, origin).expiring
}

/// The per-packet and expiring rules of an `iptables-save` listing.
pub(super) fn judge_legacy_save(listing: &str, origin: RuleOrigin) -> Judged {
    let mut out = Judged::default();
    for (table, chains) in save_tables(listing) {
        // The raw table's chains run before conntrack (NF_IP_PRI_RAW < NF_IP_PRI_CONNTRACK):
        // `ct state` still reads `invalid` there.
        let ct_known = table != "raw";
        let facts: BTreeMap<String, Vec<RuleFacts>> = chains
            .iter()
            .map(|(name, rules)| {
                let rules = rules
                    .iter()
                    .map(|w| save_rule(w, |c| chains.contains_key(c), ct_known))
                    .collect();
                (name.clone(), rules)
            })
            .collect();
        let base: Vec<String> = legacy_entry_chains(&table)
            .iter()
            .map(|c| c.to_string())
            .filter(|c| chains.contains_key(c))
            .collect();
        out.extend(judge(origin, &table, &facts, &base));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::ruleset_listing::save_words;

    #[test]
    fn rules_split_into_their_parts_unless_a_value_looks_like_an_option() {
        let w = save_words(
            r#"-s 10.0.0.0/8 -p tcp -m tcp --dport 22 -m conntrack ! --ctstate NEW -j LOG --log-prefix "a b""#,
        );
        let p = parts(&w).unwrap();
        assert_eq!(p.len(), 4);
        assert_eq!(p[0], SavePart::Lead(&w[..4]));
        assert_eq!(p[1], SavePart::Match("tcp", &w[6..8]));
        assert_eq!(p[2].conntrack_match(), Some(("conntrack", &w[10..13])));
        assert_eq!(p[3], SavePart::Jump("LOG", &w[15..]));
        assert_eq!(
            parts(&save_words("-g sub")).unwrap(),
            vec![SavePart::Goto("sub")]
        );
        // iptables-save writes `--comment -m` without quotes: ambiguous, not guessed.
        assert_eq!(
            parts(&save_words("-m comment --comment -m -j ACCEPT")),
            None
        );
        assert_eq!(parts(&save_words("-j LOG --log-prefix -j")), None);
        assert_eq!(parts(&save_words("-j ACCEPT -m limit")), None);
        assert_eq!(parts(&save_words("-m")), None);
    }

    #[test]
    fn an_unsplit_rule_still_jumps_and_holds() {
        let f = save_rule(
            &save_words("-m comment --comment -m -m limit --limit 1/s -j sub"),
            |c| c == "sub",
            true,
        );
        assert_eq!(
            f.walk.branches,
            vec![crate::sync::ruleset_walk::Branch {
                test: Match::Maybe,
                action: Action::Jump("sub".into())
            }]
        );
        assert_eq!(f.kinds, BTreeSet::from([PerPacketKind::Limit]));
    }
}
