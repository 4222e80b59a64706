//! Whether a kernel verdict can change without a ruleset change, and so must expire.
//!
//! An armed flow direction is forwarded on the kernel's last verdict until the ruleset
//! changes (every nftables commit, `nft add element` included, and every iptables-legacy
//! change bumps the ruleset generation) or, with `verdict_max_age_ms`, until the verdict is
//! that old. The age exists for matches whose answer changes with no commit: an ipset's
//! members (`ipset add` is no nftables transaction), elements of an nftables set that time out,
//! the time of day, and route lookups (`fib`, `rpfilter`, `addrtype`), which follow routes and
//! addresses. Where no rule that a packet of an established connection can reach uses one
//! (judged by the same walk as the per-packet rules, [`super::rule_reach`]), verdicts hold
//! until the ruleset changes: no packet goes back to the kernel only to be judged the same way.
//! Where one does, or the ruleset could not be read, every verdict expires at the configured
//! age.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{rule_origin::RulePlace, rule_reach::NotHeld};

/// A match whose answer for an established flow can change without a ruleset change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiringMatch {
    /// `-m set` (an ipset): `ipset add`/`del` and ipset timeouts change it with no commit.
    Ipset,
    /// An nftables set or map with timeouts (`flags timeout`, a `timeout`), or one the packet
    /// path fills (`flags dynamic`): its elements expire with no commit.
    ExpiringSet,
    /// `-m time`, nft `meta hour` / `meta day` / `meta time`.
    Time,
    /// `-m rpfilter`, `-m addrtype`, nft `fib`: answered from the routes and addresses of now.
    RouteLookup,
}

impl ExpiringMatch {
    /// As `status` and the log name it.
    pub fn name(self) -> &'static str {
        match self {
            ExpiringMatch::Ipset => "ipset",
            ExpiringMatch::ExpiringSet => "a set with timeouts",
            ExpiringMatch::Time => "the time",
            ExpiringMatch::RouteLookup => "a route lookup",
        }
    }

    /// The kind an iptables match extension `-m name` is, if any.
    pub fn of_xtables(name: &str) -> Option<ExpiringMatch> {
        Some(match name {
            "set" => ExpiringMatch::Ipset,
            "time" => ExpiringMatch::Time,
            "rpfilter" | "addrtype" => ExpiringMatch::RouteLookup,
            _ => return None,
        })
    }
}

impl fmt::Display for ExpiringMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A rule with a match whose answer can change without a ruleset change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ExpiringRule {
    /// Where it is.
    pub at: RulePlace,
    /// Its expiring matches (at least one, sorted, no duplicates).
    pub matches: Vec<ExpiringMatch>,
    /// Why no packet of an established connection reaches those matches; `None`: one may,
    /// and verdicts expire.
    #[serde(default)]
    pub not_reached_because: Option<NotHeld>,
}

impl fmt::Display for ExpiringRule {
    /// `ip filter FORWARD rule 1 matches ipset`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let matches: Vec<&str> = self.matches.iter().map(|m| m.name()).collect();
        write!(f, "{} matches {}", self.at, matches.join(" and "))
    }
}

/// Why verdicts must expire after a read of the ruleset that found `expiring` and could not
/// read `unreadable`: the first part that could not be read, or the first rule with an
/// expiring match that established packets reach; `None`: verdicts hold until the ruleset
/// changes.
pub fn why_verdicts_expire(expiring: &[ExpiringRule], unreadable: &[String]) -> Option<String> {
    if let Some(e) = unreadable.first() {
        return Some(format!("the ruleset could not be read: {e}"));
    }
    expiring
        .iter()
        .find(|r| r.not_reached_because.is_none())
        .map(ToString::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::{
        rule_origin::RuleOrigin,
        rule_reach::{CtState, CtStates},
    };

    fn rule(reached: bool) -> ExpiringRule {
        ExpiringRule {
            at: RulePlace {
                origin: RuleOrigin::NftIp,
                table: "filter".into(),
                chain: "FORWARD".into(),
                position: 2,
            },
            matches: vec![ExpiringMatch::Ipset, ExpiringMatch::Time],
            not_reached_because: (!reached).then(|| NotHeld::CtState {
                states: CtStates([CtState::New].into()),
            }),
        }
    }

    #[test]
    fn only_a_reachable_rule_or_an_unreadable_ruleset_makes_verdicts_expire() {
        assert_eq!(why_verdicts_expire(&[], &[]), None);
        assert_eq!(why_verdicts_expire(&[rule(false)], &[]), None);
        assert_eq!(
            why_verdicts_expire(&[rule(false), rule(true)], &[]).as_deref(),
            Some("ip filter FORWARD rule 2 matches ipset and the time")
        );
        assert_eq!(
            why_verdicts_expire(&[], &["cannot run `nft`".into()]).as_deref(),
            Some("the ruleset could not be read: cannot run `nft`")
        );
    }

    #[test]
    fn iptables_extensions_by_name() {
        assert_eq!(ExpiringMatch::of_xtables("set"), Some(ExpiringMatch::Ipset));
        assert_eq!(ExpiringMatch::of_xtables("time"), Some(ExpiringMatch::Time));
        assert_eq!(
            ExpiringMatch::of_xtables("addrtype"),
            Some(ExpiringMatch::RouteLookup)
        );
        assert_eq!(ExpiringMatch::of_xtables("conntrack"), None);
        assert_eq!(ExpiringMatch::of_xtables("SET"), None);
    }
}
