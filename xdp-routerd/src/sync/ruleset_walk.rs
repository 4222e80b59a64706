//! The walk of one table's chains as the kernel runs them for a packet of an established
//! connection (see [`crate::flows::rule_reach`]): which rules such a packet can reach, and for
//! each one it cannot, why. Pure; the rules come from nftables JSON
//! ([`super::per_packet::nft_rules`]) or `iptables-save` ([`super::per_packet::save_rules`]).
//!
//! Each base chain is walked from its top, on its own: an accept ends the base chain only (the
//! next base chain at the hook still runs), so every base chain starts reachable. Rules run in
//! order; a jump walks the chain it names and comes back, a goto does not come back, a return
//! leaves the chain. A rule ends the walk of its chain only when every established packet
//! matches it ([`Match::All`]: no test but a conntrack state test that lets `established`
//! through) and its verdict is final: accept or drop, a return or goto, or a jump to a chain
//! that itself gives every established packet a final verdict (ufw's FORWARD → first rule of
//! `ufw-before-forward`). Anything the walk does not know matches [`Match::Maybe`]: it never
//! ends a walk, so what cannot be proven stays reachable.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::flows::{
    rule_origin::RulePlace,
    rule_reach::{CtStates, EstablishedVerdict, NotHeld},
};

/// What a rule's tests do with a packet of an established connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Match {
    /// Every such packet matches.
    All,
    /// Some may: the walk cannot tell.
    Maybe,
    /// None does: the test lets only these conntrack states through (not `established`).
    Never(CtStates),
}

impl Match {
    /// Both tests, as the matches of one rule (all are required).
    pub(super) fn and(self, other: Match) -> Match {
        match (self, other) {
            (Match::Never(s), _) | (_, Match::Never(s)) => Match::Never(s),
            (Match::All, Match::All) => Match::All,
            _ => Match::Maybe,
        }
    }
}

/// Where a packet that matches a rule goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Action {
    /// On to the next rule (no verdict, or one the walk does not follow: log, mark, queue).
    Continue,
    /// Accepted: the end of the base chain.
    Accept,
    /// Dropped or rejected.
    Drop,
    /// Back to the calling chain.
    Return,
    /// Into a chain, then on with the next rule.
    Jump(String),
    /// Into a chain, then back to the caller of this one.
    Goto(String),
    /// Into any chain of the table (a verdict map listed without its elements).
    AnyChain,
}

/// One way through a rule: the packets that match `test` get `action`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Branch {
    pub(super) test: Match,
    pub(super) action: Action,
}

/// One rule as the walk sees it: a plain rule has one branch, a rule with a verdict map one
/// per element (a packet takes at most one; one that matches none goes on).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct WalkRule {
    pub(super) branches: Vec<Branch>,
}

impl WalkRule {
    /// A rule with one branch.
    pub(super) fn one(test: Match, action: Action) -> WalkRule {
        WalkRule {
            branches: vec![Branch { test, action }],
        }
    }
}

/// Where a rule stands for packets of established connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reached {
    /// Some may reach it.
    Yes,
    /// None can.
    No(NotHeld),
}

/// A table's chains (rules in order) by name.
pub(super) type Chains = BTreeMap<String, Vec<WalkRule>>;

/// Walks `base_chains` of `chains`: the place of every rule in a chain reachable from them
/// (through any jump, goto or verdict map), reached or not. `place(chain, index)` names a
/// rule (index 0-based).
pub(super) fn walk(
    chains: &Chains,
    base_chains: &[String],
    place: impl Fn(&str, usize) -> RulePlace,
) -> BTreeMap<(String, usize), Reached> {
    let mut w = Walker {
        chains,
        place: &place,
        ends: BTreeMap::new(),
        walking: BTreeSet::new(),
        out: BTreeMap::new(),
        seeds: VecDeque::new(),
    };
    for base in base_chains {
        w.chain(base);
    }
    w.unreached_chains();
    w.out
}

/// The verdict that ends the walk of a chain, and the rule that gives it.
#[derive(Debug, Clone)]
struct Cut {
    verdict: EstablishedVerdict,
    at: RulePlace,
}

/// How the walk of a chain from its top ends.
#[derive(Debug, Clone)]
enum End {
    /// Every established packet gets a final verdict (`Cut`) in it or in a chain it calls.
    Final(Cut),
    /// Some may come back out (return, or the end of the chain).
    Open,
}

/// What a branch every established packet takes does to the rest of its chain.
enum Effect {
    /// A final verdict: the rest of the chain and of its callers is out of reach.
    Final(Cut),
    /// Out of the chain, back to its caller.
    Leave(Cut),
}

struct Walker<'a, F> {
    chains: &'a Chains,
    place: &'a F,
    /// How each chain walked so far ends (a chain's walk does not depend on its caller).
    ends: BTreeMap<String, End>,
    /// The chains being walked (a loop, which the kernel refuses, ends as `Open`).
    walking: BTreeSet<String>,
    out: BTreeMap<(String, usize), Reached>,
    /// Chains named by rules no established packet takes, with the reason, in order found.
    seeds: VecDeque<(String, NotHeld)>,
}

impl<F: Fn(&str, usize) -> RulePlace> Walker<'_, F> {
    /// Walks `name` from its top.
    fn chain(&mut self, name: &str) -> End {
        if let Some(end) = self.ends.get(name) {
            return end.clone();
        }
        let chains = self.chains;
        let Some(rules) = chains.get(name) else {
            return End::Open;
        };
        if !self.walking.insert(name.to_string()) {
            return End::Open;
        }
        let mut end = End::Open;
        let mut cut: Option<Cut> = None;
        for (i, rule) in rules.iter().enumerate() {
            if let Some(c) = &cut {
                let why = NotHeld::AfterVerdict {
                    verdict: c.verdict,
                    at: c.at.clone(),
                };
                self.seed(rule.branches.iter().map(|b| &b.action), &why);
                self.out.insert((name.to_string(), i), Reached::No(why));
                continue;
            }
            self.out.insert((name.to_string(), i), Reached::Yes);
            match self.rule(name, i, rule) {
                Some(Effect::Final(c)) => {
                    end = End::Final(c.clone());
                    cut = Some(c);
                }
                Some(Effect::Leave(c)) => cut = Some(c),
                None => {}
            }
        }
        self.walking.remove(name);
        self.ends.insert(name.to_string(), end.clone());
        end
    }

    /// Walks the branches of the reached rule `i` of `chain`; what it does to the rest of the
    /// chain, if every established packet takes a branch with a final verdict.
    fn rule(&mut self, chain: &str, i: usize, rule: &WalkRule) -> Option<Effect> {
        let here = (self.place)(chain, i);
        let mut effect = None;
        for b in &rule.branches {
            if let Match::Never(states) = &b.test {
                let why = NotHeld::Through {
                    through: here.clone(),
                    states: states.clone(),
                };
                self.seed([&b.action], &why);
                continue;
            }
            let cut = |verdict| Cut {
                verdict,
                at: here.clone(),
            };
            let e = match &b.action {
                Action::Continue => None,
                Action::Accept => Some(Effect::Final(cut(EstablishedVerdict::Accept))),
                Action::Drop => Some(Effect::Final(cut(EstablishedVerdict::Drop))),
                Action::Return => Some(Effect::Leave(cut(EstablishedVerdict::Return))),
                Action::Jump(target) => match self.chain(target) {
                    End::Final(c) => Some(Effect::Final(c)),
                    End::Open => None,
                },
                Action::Goto(target) => match self.chain(target) {
                    End::Final(c) => Some(Effect::Final(c)),
                    End::Open => Some(Effect::Leave(cut(EstablishedVerdict::Goto))),
                },
                Action::AnyChain => {
                    let chains = self.chains;
                    for target in chains.keys() {
                        self.chain(target);
                    }
                    None
                }
            };
            if b.test == Match::All && effect.is_none() {
                effect = e;
            }
        }
        effect
    }

    /// Notes the chains `actions` lead to as reached, if at all, only for `why`.
    fn seed<'r>(&mut self, actions: impl IntoIterator<Item = &'r Action>, why: &NotHeld) {
        for a in actions {
            match a {
                Action::Jump(t) | Action::Goto(t) => self.seeds.push_back((t.clone(), why.clone())),
                Action::AnyChain => {
                    for t in self.chains.keys() {
                        self.seeds.push_back((t.clone(), why.clone()));
                    }
                }
                _ => {}
            }
        }
    }

    /// The chains no walk entered but an unreached rule leads to: every rule in them (and in
    /// the chains they lead to) takes the reason of the first such rule found.
    fn unreached_chains(&mut self) {
        let mut done: BTreeSet<String> = self.ends.keys().cloned().collect();
        let chains = self.chains;
        while let Some((name, why)) = self.seeds.pop_front() {
            if !done.insert(name.clone()) {
                continue;
            }
            let Some(rules) = chains.get(&name) else {
                continue;
            };
            for (i, rule) in rules.iter().enumerate() {
                self.seed(rule.branches.iter().map(|b| &b.action), &why);
                self.out
                    .entry((name.clone(), i))
                    .or_insert_with(|| Reached::No(why.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::{rule_origin::RuleOrigin, rule_reach::CtState};
    use Action::*;

    fn place(chain: &str, i: usize) -> RulePlace {
        RulePlace {
            origin: RuleOrigin::NftInet,
            table: "t".into(),
            chain: chain.into(),
            position: i as u32 + 1,
        }
    }

    fn chains(list: &[(&str, Vec<WalkRule>)]) -> Chains {
        list.iter()
            .map(|(n, r)| (n.to_string(), r.clone()))
            .collect()
    }

    fn run(c: &Chains, base: &[&str]) -> Vec<String> {
        let base: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        walk(c, &base, place)
            .into_iter()
            .map(|((chain, i), r)| match r {
                Reached::Yes => format!("{chain} {}: yes", i + 1),
                Reached::No(why) => format!("{chain} {}: {why}", i + 1),
            })
            .collect()
    }

    fn new_only() -> CtStates {
        [CtState::New].into_iter().collect()
    }

    #[test]
    fn an_established_accept_ends_the_chain_and_a_jump_to_one_ends_the_caller() {
        // ufw's shape: FORWARD jumps to before (accepts established first), then to after.
        let c = chains(&[
            (
                "FORWARD",
                vec![
                    WalkRule::one(Match::All, Jump("logging".into())),
                    WalkRule::one(Match::All, Jump("before".into())),
                    WalkRule::one(Match::All, Jump("after".into())),
                ],
            ),
            (
                "logging",
                vec![WalkRule::one(Match::Never(new_only()), Continue)],
            ),
            (
                "before",
                vec![
                    WalkRule::one(Match::All, Accept),
                    WalkRule::one(Match::Maybe, Jump("user".into())),
                ],
            ),
            ("user", vec![WalkRule::one(Match::Maybe, Accept)]),
            ("after", vec![WalkRule::one(Match::Maybe, Continue)]),
            ("unused", vec![WalkRule::one(Match::Maybe, Continue)]),
        ]);
        let accept = "after an established accept at inet t before rule 1";
        assert_eq!(
            run(&c, &["FORWARD"]),
            vec![
                "FORWARD 1: yes".to_string(),
                "FORWARD 2: yes".into(),
                format!("FORWARD 3: {accept}"),
                format!("after 1: {accept}"),
                "before 1: yes".into(),
                format!("before 2: {accept}"),
                "logging 1: yes".into(),
                format!("user 1: {accept}"),
            ]
        );
    }

    #[test]
    fn a_conditional_accept_or_an_unknown_test_ends_nothing() {
        let c = chains(&[(
            "f",
            vec![
                WalkRule::one(Match::Maybe, Accept),
                WalkRule::one(Match::Maybe.and(Match::All), Drop),
                WalkRule::one(Match::All, Continue),
            ],
        )]);
        assert_eq!(run(&c, &["f"]), vec!["f 1: yes", "f 2: yes", "f 3: yes"]);
    }

    #[test]
    fn base_chains_are_walked_separately_and_return_and_goto_leave_only_their_chain() {
        let c = chains(&[
            (
                "a",
                vec![
                    WalkRule::one(Match::All, Jump("r".into())),
                    WalkRule::one(Match::All, Goto("g".into())),
                    WalkRule::one(Match::Maybe, Continue),
                ],
            ),
            (
                "r",
                vec![
                    WalkRule::one(Match::All, Return),
                    WalkRule::one(Match::Maybe, Continue),
                ],
            ),
            ("g", vec![WalkRule::one(Match::Maybe, Drop)]),
            ("b", vec![WalkRule::one(Match::Maybe, Continue)]),
        ]);
        assert_eq!(
            run(&c, &["a", "b"]),
            vec![
                "a 1: yes",
                "a 2: yes",
                "a 3: after an established goto at inet t a rule 2",
                "b 1: yes",
                "g 1: yes",
                "r 1: yes",
                "r 2: after an established return at inet t r rule 1",
            ]
        );
    }

    #[test]
    fn verdict_map_branches_and_chains_reached_only_through_a_never_match() {
        let vmap = WalkRule {
            branches: vec![
                Branch {
                    test: Match::Never([CtState::Invalid].into_iter().collect()),
                    action: Drop,
                },
                Branch {
                    test: Match::All,
                    action: Accept,
                },
                Branch {
                    test: Match::Never(new_only()),
                    action: Jump("newonly".into()),
                },
            ],
        };
        let c = chains(&[
            ("fwd", vec![vmap, WalkRule::one(Match::Maybe, AnyChain)]),
            ("newonly", vec![WalkRule::one(Match::Maybe, Continue)]),
            ("other", vec![WalkRule::one(Match::Maybe, Continue)]),
        ]);
        assert_eq!(
            run(&c, &["fwd"]),
            vec![
                "fwd 1: yes",
                "fwd 2: after an established accept at inet t fwd rule 1",
                "newonly 1: reached only through inet t fwd rule 1, which matches ct state new only",
                "other 1: after an established accept at inet t fwd rule 1",
            ]
        );
        // The map without its elements reaches every chain.
        let c = chains(&[
            ("fwd", vec![WalkRule::one(Match::Maybe, AnyChain)]),
            ("x", vec![WalkRule::one(Match::All, Accept)]),
        ]);
        assert_eq!(run(&c, &["fwd"]), vec!["fwd 1: yes", "x 1: yes"]);
    }

    #[test]
    fn a_loop_or_a_missing_chain_is_taken_as_open() {
        let c = chains(&[
            ("a", vec![WalkRule::one(Match::All, Jump("b".into()))]),
            (
                "b",
                vec![
                    WalkRule::one(Match::All, Jump("a".into())),
                    WalkRule::one(Match::All, Jump("missing".into())),
                    WalkRule::one(Match::Maybe, Continue),
                ],
            ),
        ]);
        assert_eq!(
            run(&c, &["a"]),
            vec!["a 1: yes", "b 1: yes", "b 2: yes", "b 3: yes"]
        );
    }
}
