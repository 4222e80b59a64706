//! Reads the firewall ruleset for rules that must see every packet (see
//! [`crate::flows::per_packet`]): `nft -t -j list ruleset` (native nftables rules and the `xt`
//! matches and targets iptables-nft writes, whose conntrack matches' options come from
//! `iptables-nft-save`, see [`xt_options`]) and, while legacy tables exist,
//! `iptables-legacy-save` / `ip6tables-legacy-save`. Read at start and after every ruleset
//! change (`tasks::ruleset`); blocking (child processes), so called off the async runtime.
//!
//! Only chains that established forwarded packets traverse count: nftables base chains of the
//! `ip`, `ip6` and `inet` families at the `prerouting`, `forward`, `postrouting` (and `inet`
//! `ingress`) hooks that are not `nat` chains (those see a connection's first packet only),
//! and the chains they jump or go to, directly or through a verdict map; for iptables-legacy
//! the `PREROUTING`/`FORWARD`/`POSTROUTING` chains of `raw`, `mangle`, `filter` and `security`
//! as the kernel runs them, and the user chains they jump to. An `INPUT` rule that logs or
//! rate-limits traffic to the router itself holds nothing.
//!
//! Each rule found is then judged by the walk of its table ([`super::ruleset_walk`]): one that
//! no packet of an established connection can reach, or whose own match needs a conntrack
//! state other than `established` before it does anything per packet, holds nothing and says
//! why ([`crate::flows::rule_reach::NotHeld`]).

mod flow_tests;
mod nft_rules;
mod save_rules;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_expiry;
#[cfg(test)]
mod tests_narrow;
#[cfg(test)]
mod tests_reach;
mod xt_options;

use std::collections::{BTreeMap, BTreeSet};

use super::{
    ruleset_listing::nft_tables,
    ruleset_walk::{self, Match, Reached, WalkRule},
};
use crate::flows::{
    flow_match::{FlowMatch, FlowTerm},
    per_packet::{PerPacketKind, PerPacketRule, PerPacketRules},
    rule_origin::{RuleOrigin, RulePlace},
    rule_reach::{CtStates, NotHeld},
    verdict_expiry::{ExpiringMatch, ExpiringRule},
};

pub use self::save_rules::{expiring_in_legacy_save, parse_legacy_save};
use self::xt_options::XtOptions;

/// What one rule is to the walk and to the hold.
#[derive(Debug, Default)]
struct RuleFacts {
    walk: WalkRule,
    /// What it does per packet (empty: nothing).
    kinds: BTreeSet<PerPacketKind>,
    /// A conntrack state test without `established` that the kernel evaluates before anything
    /// the rule does per packet: the states it lets through.
    excluded: Option<CtStates>,
    /// Its matches whose answer can change without a ruleset change (see
    /// [`crate::flows::verdict_expiry`]).
    expiring: BTreeSet<ExpiringMatch>,
    /// A conntrack state test without `established` anywhere in it: the states it lets
    /// through. An established packet never matches the rule, whatever its other matches say.
    never_established: Option<CtStates>,
    /// The connections its flow-constant tests before its first per-packet part can match.
    flows: FlowMatch,
    /// It drops every packet it logs, on flow-constant tests (see
    /// [`NotHeld::DropsWhatItLogs`]).
    drops_what_it_logs: bool,
}

/// A rule's parts folded in the order the kernel evaluates them.
#[derive(Debug)]
struct Parts {
    /// All its tests so far.
    test: Match,
    kinds: BTreeSet<PerPacketKind>,
    excluded: Option<CtStates>,
    expiring: BTreeSet<ExpiringMatch>,
    never_established: Option<CtStates>,
    flows: FlowMatch,
}

impl Default for Parts {
    fn default() -> Parts {
        Parts {
            test: Match::All,
            kinds: BTreeSet::new(),
            excluded: None,
            expiring: BTreeSet::new(),
            never_established: None,
            flows: FlowMatch::default(),
        }
    }
}

impl Parts {
    /// The next part: what it tests and what it does per packet.
    fn push(&mut self, test: Match, kinds: impl IntoIterator<Item = PerPacketKind>) {
        let kinds: Vec<PerPacketKind> = kinds.into_iter().collect();
        if let Match::Never(states) = &test {
            if self.excluded.is_none() && self.kinds.is_empty() && kinds.is_empty() {
                self.excluded = Some(states.clone());
            }
            if self.never_established.is_none() {
                self.never_established = Some(states.clone());
            }
        }
        self.test = std::mem::replace(&mut self.test, Match::All).and(test);
        self.kinds.extend(kinds);
    }

    /// The flow-constant tests of the next part: they narrow the connections the rule can do
    /// something per packet for while nothing per packet came before them.
    fn narrow(&mut self, terms: impl IntoIterator<Item = FlowTerm>) {
        if self.kinds.is_empty() {
            self.flows.terms.extend(terms);
        }
    }

    /// Matches of the next part whose answer can change without a ruleset change.
    fn expiring(&mut self, matches: impl IntoIterator<Item = ExpiringMatch>) {
        self.expiring.extend(matches);
    }

    /// The rule these parts make, with `walk` for the walk.
    fn into_facts(self, walk: WalkRule) -> RuleFacts {
        RuleFacts {
            walk,
            kinds: self.kinds,
            excluded: self.excluded,
            expiring: self.expiring,
            never_established: self.never_established,
            flows: self.flows,
            drops_what_it_logs: false,
        }
    }
}

/// What the walk of one or more tables found.
#[derive(Debug, Default)]
struct Judged {
    /// The rules that do something per packet.
    rules: Vec<PerPacketRule>,
    /// The rules with a match whose answer can change without a ruleset change.
    expiring: Vec<ExpiringRule>,
}

impl Judged {
    fn extend(&mut self, other: Judged) {
        self.rules.extend(other.rules);
        self.expiring.extend(other.expiring);
    }
}

/// The per-packet and expiring rules of one table: walks its `base` chains through `chains`
/// and lists every rule that does something per packet (or has a match whose answer can
/// change without a ruleset change), in (chain, position) order, with why it holds nothing
/// (is not reached) where it does not.
fn judge(
    origin: RuleOrigin,
    table: &str,
    chains: &BTreeMap<String, Vec<RuleFacts>>,
    base: &[String],
) -> Judged {
    let walk_chains: ruleset_walk::Chains = chains
        .iter()
        .map(|(name, rules)| (name.clone(), rules.iter().map(|r| r.walk.clone()).collect()))
        .collect();
    let place = |chain: &str, i: usize| RulePlace {
        origin,
        table: table.to_string(),
        chain: chain.to_string(),
        position: i as u32 + 1,
    };
    let reached = ruleset_walk::walk(&walk_chains, base, place);
    let mut out = Judged::default();
    for ((chain, i), reach) in reached {
        let Some(facts) = chains.get(&chain).and_then(|rules| rules.get(i)) else {
            continue;
        };
        let why = |states: &Option<CtStates>| match (&reach, states) {
            (Reached::No(why), _) => Some(why.clone()),
            (Reached::Yes, Some(states)) => Some(NotHeld::CtState {
                states: states.clone(),
            }),
            (Reached::Yes, None) => None,
        };
        if !facts.expiring.is_empty() {
            out.expiring.push(ExpiringRule {
                at: place(&chain, i),
                matches: facts.expiring.iter().copied().collect(),
                not_reached_because: why(&facts.never_established),
            });
        }
        if !facts.kinds.is_empty() {
            out.rules.push(PerPacketRule {
                origin,
                table: table.to_string(),
                chain,
                position: i as u32 + 1,
                kinds: facts.kinds.iter().copied().collect(),
                not_held_because: why(&facts.excluded)
                    .or_else(|| facts.drops_what_it_logs.then_some(NotHeld::DropsWhatItLogs)),
                flows: facts.flows.clone(),
                held_connections: None,
            });
        }
    }
    out
}

/// The per-packet rules in the output of `nft -j list ruleset` (pure; tested on output of nft
/// 1.0.6 on Linux 6.18), iptables-nft's conntrack matches unread. `Err` says why the text is
/// not an nftables JSON listing.
pub fn parse_nft_json(text: &str) -> Result<Vec<PerPacketRule>, String> {
    Ok(nft_rules::per_packet_rules(&nft_tables(text)?, &XtOptions::default()).rules)
}

/// The rules with a match whose answer can change without a ruleset change in the output of
/// `nft -j list ruleset` (pure), in (table, chain, position) order.
pub fn expiring_in_nft_json(text: &str) -> Result<Vec<ExpiringRule>, String> {
    Ok(nft_rules::per_packet_rules(&nft_tables(text)?, &XtOptions::default()).expiring)
}

/// [`parse_nft_json`] with the output of `iptables-nft-save` (`v4`) and `ip6tables-nft-save`
/// (`v6`), for the options of iptables-nft's conntrack matches; also the lines of
/// [`PerPacketRules::unproven`].
pub fn parse_nft_json_with_saves(
    text: &str,
    v4: Option<&str>,
    v6: Option<&str>,
) -> Result<(Vec<PerPacketRule>, Vec<String>), String> {
    let tables = nft_tables(text)?;
    let mut xt = XtOptions::default();
    let mut unproven = Vec::new();
    for (family, listing) in [("ip", v4), ("ip6", v6)] {
        if let Some(listing) = listing {
            unproven.extend(xt.pair(&tables, family, listing));
        }
    }
    Ok((nft_rules::per_packet_rules(&tables, &xt).rules, unproven))
}

/// Output of `cmd args…`, or a one-line reason why there is none.
fn output(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = crate::signals::unblocked_in_std_child(&mut std::process::Command::new(cmd))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{cmd}`: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "`{cmd} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            err.lines().next().unwrap_or("").trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether the `/proc/net/*_tables_names` file at `path` lists a table (legacy tables exist).
fn legacy_tables_in(path: &str) -> bool {
    std::fs::read_to_string(path).is_ok_and(|s| !s.trim().is_empty())
}

/// Reads the whole ruleset (blocking: runs `nft`, `iptables-nft-save` where iptables-nft
/// rules have conntrack matches, and, while legacy tables exist, the legacy save tools). What
/// cannot be read is said in [`PerPacketRules::unreadable`], never taken as "no such rules".
pub fn read() -> PerPacketRules {
    read_with("nft", ["iptables-nft-save", "ip6tables-nft-save"])
}

/// [`read`] with the nftables CLI at `nft` and iptables-nft's save tools at `saves` (IPv4,
/// IPv6).
fn read_with(nft: &str, saves: [&str; 2]) -> PerPacketRules {
    let mut found = PerPacketRules::default();
    // Terse: set and map elements are not listed (a blocklist of 100,000 addresses would cost
    // more than the rules; verdict maps are then taken to reach every chain of their table).
    match output(nft, &["-t", "-j", "list", "ruleset"]).and_then(|t| nft_tables(&t)) {
        Ok(tables) => {
            // Without the options first: iptables-nft-save runs only for a family where a
            // rule holds flows and conntrack matches could prove it does not (a large
            // ruleset without such rules, kube-proxy's, is not listed twice).
            let unread = nft_rules::per_packet_rules(&tables, &XtOptions::default()).rules;
            let holds_in = |origin| unread.iter().any(|r| r.origin == origin && r.holds());
            // Read after nft: a change in between is a new commit, which the ruleset task
            // reads again; the pairing refuses a table whose two listings disagree.
            let mut xt = XtOptions::default();
            let families = [("ip", RuleOrigin::NftIp), ("ip6", RuleOrigin::NftIp6)];
            for ((family, origin), tool) in families.into_iter().zip(saves) {
                if !holds_in(origin) || !xt_options::wanted(&tables, family) {
                    continue;
                }
                match output(tool, &[]) {
                    Ok(listing) => found.unproven.extend(xt.pair(&tables, family, &listing)),
                    Err(e) => found.unproven.push(format!(
                        "{e}: the conntrack matches of iptables-nft's {family} rules are not read"
                    )),
                }
            }
            let judged = nft_rules::per_packet_rules(&tables, &xt);
            found.rules.extend(judged.rules);
            found.expiring.extend(judged.expiring);
            super::dscp_rewrite::from_nft(&tables, &mut found.dscp);
        }
        Err(e) => found.unreadable.push(e),
    }
    for (names, tool, origin) in [
        (
            "/proc/net/ip_tables_names",
            "iptables-legacy-save",
            RuleOrigin::LegacyIpv4,
        ),
        (
            "/proc/net/ip6_tables_names",
            "ip6tables-legacy-save",
            RuleOrigin::LegacyIpv6,
        ),
    ] {
        if !legacy_tables_in(names) {
            continue;
        }
        match output(tool, &[]) {
            Ok(text) => {
                let judged = save_rules::judge_legacy_save(&text, origin);
                found.rules.extend(judged.rules);
                found.expiring.extend(judged.expiring);
                super::dscp_rewrite::from_legacy_save(&text, origin, &mut found.dscp);
            }
            Err(e) => found.unreadable.push(e),
        }
    }
    found
}
