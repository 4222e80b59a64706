//! Whether a packet of an established connection can reach a firewall rule, and why not.
//!
//! The fast path carries only packets of established connections: TCP in ESTABLISHED and
//! ASSURED, UDP once a reply was seen (see [`super::conntrack`]), so conntrack gives each of
//! their packets the state `established`. A rule that must see every packet (see
//! [`super::per_packet`]) loses nothing to the fast path when no such packet can reach it:
//! every established packet gets its verdict before it (`ct state established,related accept`
//! first in the chain, as nearly every router firewall has), or its own match needs another
//! state (ufw's `-m conntrack --ctstate NEW … -j LOG`). `sync::ruleset_walk` proves this by
//! walking the chains as the kernel runs them; whatever it cannot prove holds flows as before.

use std::{collections::BTreeSet, fmt};

use serde::{Deserialize, Serialize};

use super::rule_origin::RulePlace;

/// A conntrack state, as `ct state` and `-m conntrack --ctstate` name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CtState {
    New,
    Established,
    Related,
    Invalid,
    Untracked,
}

impl CtState {
    /// Every state.
    pub const ALL: [CtState; 5] = [
        CtState::New,
        CtState::Established,
        CtState::Related,
        CtState::Invalid,
        CtState::Untracked,
    ];

    /// As nftables writes it (`new`).
    pub fn name(self) -> &'static str {
        match self {
            CtState::New => "new",
            CtState::Established => "established",
            CtState::Related => "related",
            CtState::Invalid => "invalid",
            CtState::Untracked => "untracked",
        }
    }

    /// The state nftables (`established`) or iptables (`ESTABLISHED`) names, if any.
    pub fn parse(word: &str) -> Option<CtState> {
        CtState::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(word))
    }
}

/// The conntrack states a match lets through (sorted, no duplicates).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CtStates(pub BTreeSet<CtState>);

impl CtStates {
    /// The states not in `self`.
    pub fn complement(&self) -> CtStates {
        CtStates(
            CtState::ALL
                .into_iter()
                .filter(|s| !self.0.contains(s))
                .collect(),
        )
    }

    /// Whether `state` is one of them.
    pub fn contains(&self, state: CtState) -> bool {
        self.0.contains(&state)
    }
}

impl FromIterator<CtState> for CtStates {
    fn from_iter<I: IntoIterator<Item = CtState>>(iter: I) -> Self {
        CtStates(iter.into_iter().collect())
    }
}

impl fmt::Display for CtStates {
    /// `invalid,new` (nftables' names, comma-separated).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.0.iter().map(|s| s.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// What a rule does to every established packet that reaches it, when it ends the walk of its
/// chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstablishedVerdict {
    /// Accepted: final for the base chain (later base chains at the hook still run).
    Accept,
    /// Dropped or rejected.
    Drop,
    /// Back to the calling chain.
    Return,
    /// Gone to another chain, which returns to this chain's caller.
    Goto,
}

impl EstablishedVerdict {
    /// `accept`, `drop`, `return`, `goto`.
    pub fn name(self) -> &'static str {
        match self {
            EstablishedVerdict::Accept => "accept",
            EstablishedVerdict::Drop => "drop",
            EstablishedVerdict::Return => "return",
            EstablishedVerdict::Goto => "goto",
        }
    }
}

/// Why a rule that must see every packet holds no flow: no packet of an established
/// connection reaches what it does per packet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum NotHeld {
    /// Every established packet gets `verdict` at `at` before it reaches the rule.
    AfterVerdict {
        verdict: EstablishedVerdict,
        at: RulePlace,
    },
    /// The rule's own match needs one of `states` (not `established`), tested before what it
    /// does per packet.
    CtState { states: CtStates },
    /// Its chain is reached only through the rule at `through`, whose match needs one of
    /// `states` (not `established`).
    Through {
        through: RulePlace,
        states: CtStates,
    },
    /// The rule drops (or rejects) every packet it logs, and its tests before the log are the
    /// same for every packet of a connection's direction (addresses, ports, protocols,
    /// interfaces, a route lookup): the kernel drops a direction whose packets reach the log,
    /// so the fast path never carries one, and a direction it carries never reaches the log.
    DropsWhatItLogs,
}

impl fmt::Display for NotHeld {
    /// `after an established accept at ip filter FORWARD rule 1`, `matches ct state new only`,
    /// `reached only through ip filter FORWARD rule 3, which matches ct state new only`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotHeld::AfterVerdict { verdict, at } => {
                write!(f, "after an established {} at {at}", verdict.name())
            }
            NotHeld::CtState { states } => write!(f, "matches ct state {states} only"),
            NotHeld::Through { through, states } => write!(
                f,
                "reached only through {through}, which matches ct state {states} only"
            ),
            NotHeld::DropsWhatItLogs => write!(
                f,
                "drops what it logs, on tests that are the same for a whole connection"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::rule_origin::RuleOrigin;

    fn place(chain: &str, position: u32) -> RulePlace {
        RulePlace {
            origin: RuleOrigin::NftIp,
            table: "filter".into(),
            chain: chain.into(),
            position,
        }
    }

    #[test]
    fn reasons_read_as_an_admin_finds_the_rules() {
        let after = NotHeld::AfterVerdict {
            verdict: EstablishedVerdict::Accept,
            at: place("ufw-before-forward", 1),
        };
        assert_eq!(
            after.to_string(),
            "after an established accept at ip filter ufw-before-forward rule 1"
        );
        let new: CtStates = [CtState::New].into_iter().collect();
        assert_eq!(
            NotHeld::CtState {
                states: new.clone()
            }
            .to_string(),
            "matches ct state new only"
        );
        let through = NotHeld::Through {
            through: place("FORWARD", 3),
            states: [CtState::Invalid, CtState::New].into_iter().collect(),
        };
        assert_eq!(
            through.to_string(),
            "reached only through ip filter FORWARD rule 3, which matches ct state new,invalid only"
        );
        assert_eq!(
            new.complement().to_string(),
            "established,related,invalid,untracked"
        );
    }

    #[test]
    fn the_json_form_is_tagged_and_round_trips() {
        let r = NotHeld::AfterVerdict {
            verdict: EstablishedVerdict::Return,
            at: place("sub", 2),
        };
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"why": "after_verdict", "verdict": "return", "at": {
                "origin": "nft_ip", "table": "filter", "chain": "sub", "position": 2}})
        );
        assert_eq!(serde_json::from_value::<NotHeld>(json).unwrap(), r);
        let s = NotHeld::CtState {
            states: [CtState::New, CtState::Invalid].into_iter().collect(),
        };
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            serde_json::json!({"why": "ct_state", "states": ["new", "invalid"]})
        );
        assert_eq!(CtState::parse("ESTABLISHED"), Some(CtState::Established));
        assert_eq!(CtState::parse("SNAT"), None);
    }
}
