//! DSCP rewrites the fast path may apply itself: whether the DSCP the kernel sends an
//! established flow direction out with is a function of the flow alone.
//!
//! A rule that sets the DSCP (`ip dscp set cs3`, `-j DSCP`) used to keep its flows in the
//! kernel: the arming program saw the kernel send another DSCP than the one that arrived, and
//! XDP passed every such packet up (`dscp_rewritten_by_kernel`). The fast path can set the DSCP
//! itself when two things hold:
//! - per flow direction, the kernel was seen rewriting it: the arming program compares the DSCP
//!   a packet arrived with (stamped at TC ingress) with the one it leaves with
//!   (`FLOW_DSCP_REWRITTEN`), so the kernel stays the oracle of which flows a rule touches;
//! - for the whole ruleset, the daemon proves that such a rewrite is the same for every packet
//!   of a flow: every rule that sets a DSCP sets a constant, and no rule the forward path
//!   traverses matches anything that changes from packet to packet (a length, TCP flags other
//!   than a SYN/FIN/RST test, the DSCP itself, a random number, …), so neither whether a
//!   setting rule is reached nor what it sets can differ between two packets of a flow.
//!   Matches on addresses, ports, protocol, interfaces, conntrack state and marks, set
//!   membership and time qualify: set membership and time change per flow over time, and the
//!   verdict age (`verdict_max_age_ms`) has the kernel re-judge each direction as for any rule.
//!
//! `sync::dscp_rewrite` reads this from the ruleset; `SETTINGS_F_DSCP_REWRITE` carries it to XDP.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::rule_origin::RulePlace;

/// Why the ruleset's DSCP rewrites may differ between packets of one flow: the first rule found
/// that matches per packet, or sets a DSCP that is not a constant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DscpBlocker {
    pub place: RulePlace,
    /// What it does: `matches meta length`, `sets the DSCP from an expression`, `uses TOS`.
    pub what: String,
}

impl fmt::Display for DscpBlocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.place, self.what)
    }
}

/// What one read of the ruleset found about DSCP rewrites.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DscpRewrites {
    /// The rules that set a DSCP, in ruleset order.
    pub setters: Vec<RulePlace>,
    /// Why a rewrite may differ between packets of one flow; `None`: it cannot.
    pub blocker: Option<DscpBlocker>,
}

/// Whether XDP may apply the rewrites the kernel was seen making: the ruleset was read in full
/// (`readable`) and nothing in it makes a rewrite differ between packets of one flow.
pub fn fast_path_may_rewrite(found: &DscpRewrites, readable: bool) -> bool {
    readable && found.blocker.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flows::rule_origin::RuleOrigin;

    fn place(position: u32) -> RulePlace {
        RulePlace {
            origin: RuleOrigin::NftInet,
            table: "mangle".into(),
            chain: "forward".into(),
            position,
        }
    }

    #[test]
    fn only_a_fully_read_ruleset_without_a_blocker_lets_the_fast_path_rewrite() {
        let proven = DscpRewrites {
            setters: vec![place(1)],
            blocker: None,
        };
        assert!(fast_path_may_rewrite(&proven, true));
        assert!(!fast_path_may_rewrite(&proven, false));
        let blocked = DscpRewrites {
            setters: vec![place(1)],
            blocker: Some(DscpBlocker {
                place: place(2),
                what: "matches meta length".into(),
            }),
        };
        assert!(!fast_path_may_rewrite(&blocked, true));
        assert_eq!(
            blocked.blocker.unwrap().to_string(),
            "inet mangle forward rule 2 matches meta length"
        );
    }
}
