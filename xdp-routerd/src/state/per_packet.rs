//! Rules that must see every packet (see [`crate::flows::per_packet`]): what the last read of
//! the ruleset found, and what follows from it: the datapath's hold (`SETTINGS_F_HOLD_ALL`)
//! for a rule nothing narrows, the connections narrowed rules can match
//! ([`crate::flows::FlowManager::set_held`]) otherwise.
//!
//! A ruleset change is applied in two steps by `tasks::ruleset`: [`State::ruleset_changed`]
//! bumps the ruleset generation and, under `per_packet_rules = "hold"`, holds every packet in
//! the kernel in the same map write; the task then reads the new ruleset (no lock held) and
//! [`State::apply_per_packet`] keeps the hold or lifts it. So a flow the kernel re-arms under a
//! new ruleset is never fast-pathed before the daemon knows what that ruleset holds.

use tracing::{debug, info, warn};

use super::State;
use crate::{
    datapath::Datapath,
    flows::{
        accounting::DirTraffic,
        conntrack::CtTuple,
        dscp_rewrite,
        per_packet::{self, PerPacketMode, PerPacketRule, PerPacketRules},
        verdict_expiry,
    },
    status::{DscpRewriteStatus, PerPacketStatus},
};

/// What the state keeps about per-packet rules.
#[derive(Debug, Default)]
pub(super) struct PerPacket {
    /// `per_packet_rules` from the config.
    mode: PerPacketMode,
    /// What the last read found; `None` before the first.
    found: Option<PerPacketRules>,
    /// A ruleset change has not been read yet.
    reading: bool,
}

/// How many rules the log line names before "and N more".
const LOGGED_RULES: usize = 5;

impl State<Datapath> {
    /// Start-up: `per_packet_rules` from the config (before the first
    /// [`State::apply_per_packet`]).
    pub fn set_per_packet_mode(&mut self, mode: PerPacketMode) {
        self.per_packet.mode = mode;
    }

    /// The firewall ruleset changed: every flow direction is disarmed until the kernel forwards
    /// it again (see [`Datapath::bump_ruleset_generation`]) and, under `"hold"`, every packet
    /// stays in the kernel until the new ruleset is read ([`State::apply_per_packet`]).
    pub fn ruleset_changed(&mut self) -> anyhow::Result<()> {
        if self.per_packet.mode == PerPacketMode::Ignore {
            return self.dp.bump_ruleset_generation();
        }
        self.per_packet.reading = true;
        self.dp.bump_ruleset_generation_holding()
    }

    /// The ruleset as just read: holds every packet in the kernel while it has rules that must
    /// see every packet that nothing narrows, or could not be read (under `"hold"`), lifts the
    /// hold otherwise; takes back the offloaded connections narrowed rules can match before
    /// the hold is lifted. Logs what changed, once. Returns the parked connections no rule
    /// holds any more, for a revalidation to offload.
    pub fn apply_per_packet(&mut self, found: PerPacketRules) -> Vec<CtTuple> {
        let hold = per_packet::hold(self.per_packet.mode, &found);
        if self.per_packet.found.as_ref() != Some(&found) {
            log_found(self.per_packet.mode, &found);
        }
        let released = self.flows.set_held(
            per_packet::held_flows(self.per_packet.mode, &found),
            &mut self.dp,
        );
        if let Err(e) = self.dp.set_hold_all(hold) {
            tracing::error!(error = %format!("{e:#}"), hold, "cannot write the per-packet hold");
        }
        let why_expire = verdict_expiry::why_verdicts_expire(&found.expiring, &found.unreadable);
        let expire = why_expire.is_some();
        if expire != self.dp.ruleset_status().verdicts_expire {
            match &why_expire {
                Some(why) => info!(
                    because = %why,
                    "kernel verdicts of offloaded flows expire again at verdict_max_age_ms"
                ),
                None => info!(
                    "no rule that established packets reach can change its answer without a                      ruleset change: kernel verdicts of offloaded flows hold until the ruleset                      changes"
                ),
            }
        }
        if let Err(e) = self.dp.set_verdicts_expire(expire) {
            tracing::error!(error = %format!("{e:#}"), expire, "cannot write the verdict age");
        }
        let rewrite = dscp_rewrite::fast_path_may_rewrite(&found.dscp, found.unreadable.is_empty());
        if let Err(e) = self.dp.set_dscp_rewrite(rewrite) {
            tracing::error!(error = %format!("{e:#}"), rewrite, "cannot write the DSCP rewrite switch");
        }
        self.per_packet.found = Some(found);
        self.per_packet.reading = false;
        released
    }

    /// Conntrack's counters of held connections, as just read (see
    /// [`crate::flows::FlowManager::counters_read`]): returns the ones no rule holds any more.
    pub fn held_counters_read(&mut self, read: Vec<(CtTuple, DirTraffic)>) -> Vec<CtTuple> {
        self.flows.counters_read(read)
    }

    /// `status`'s view.
    pub(super) fn per_packet_status(&self) -> PerPacketStatus {
        let mut found = self.per_packet.found.clone().unwrap_or_default();
        let held = self.flows.held_counts();
        if !self.dp.hold_all() {
            for r in &mut found.rules {
                if r.holds() && !r.flows.is_every_flow() {
                    r.held_connections = Some(held.of(&r.flows));
                }
            }
        }
        PerPacketStatus {
            mode: self.per_packet.mode,
            held: self.dp.hold_all(),
            held_connections: held.total,
            reading: self.per_packet.reading || self.per_packet.found.is_none(),
            rules: found.rules,
            unreadable: found.unreadable,
            unproven: found.unproven,
            dscp_rewrite: DscpRewriteStatus {
                fast_path: self.dp.dscp_rewrite(),
                setters: found.dscp.setters,
                blocker: found.dscp.blocker,
            },
            expiring: found.expiring,
        }
    }
}

/// The first [`LOGGED_RULES`] of `rules` (with why each holds nothing, where it does not), and
/// how many more.
fn named(rules: &[&PerPacketRule]) -> String {
    let mut names: Vec<String> = rules
        .iter()
        .take(LOGGED_RULES)
        .map(|r| match &r.not_held_because {
            Some(why) => format!("{r} ({why})"),
            None => r.to_string(),
        })
        .collect();
    if rules.len() > LOGGED_RULES {
        names.push(format!("and {} more", rules.len() - LOGGED_RULES));
    }
    names.join(", ")
}

/// One log line for what a read found (called when it differs from the previous read).
fn log_found(mode: PerPacketMode, found: &PerPacketRules) {
    let (holding, not_holding): (Vec<&PerPacketRule>, Vec<&PerPacketRule>) =
        found.rules.iter().partition(|r| r.holds());
    let rules = named(&holding);
    if !not_holding.is_empty() {
        debug!(
            rules = %named(&not_holding),
            "rules that must see every packet but that no packet of an established connection \
             reaches hold no flow"
        );
    }
    if !found.unproven.is_empty() {
        info!(
            unproven = %found.unproven.join("; "),
            "parts of the firewall ruleset were read without their options: the rules after \
             them are taken as reachable by established packets"
        );
    }
    match mode {
        PerPacketMode::Hold if !found.unreadable.is_empty() => warn!(
            unreadable = %found.unreadable.join("; "),
            "the firewall ruleset cannot be read, so it may have rules that must see every \
             packet: every packet goes through the kernel (install nftables, or set \
             per_packet_rules = \"ignore\" to accept flowtable semantics)"
        ),
        PerPacketMode::Hold
            if !holding.is_empty() && holding.iter().all(|r| !r.flows.is_every_flow()) =>
        {
            info!(
                rules,
                "the firewall ruleset has rules that must see every packet, each narrowed by \
                 its protocol, port or address tests: the connections they can match stay in \
                 the kernel, the rest are offloaded"
            )
        }
        PerPacketMode::Hold if !holding.is_empty() => info!(
            rules,
            "the firewall ruleset has rules that must see every packet: every packet goes \
             through the kernel while they exist (per_packet_rules = \"ignore\" accepts \
             flowtable semantics instead)"
        ),
        PerPacketMode::Ignore if !holding.is_empty() || !found.unreadable.is_empty() => {
            warn!(
                rules,
                unreadable = %found.unreadable.join("; "),
                "the firewall ruleset has rules that must see every packet, and \
                 per_packet_rules = \"ignore\": they see only the packets the kernel still \
                 carries"
            )
        }
        _ => debug!(
            "the firewall ruleset has no rule that holds flows (none that must see every packet reachable by established packets)"
        ),
    }
    match &found.dscp.blocker {
        Some(b) if !found.dscp.setters.is_empty() => info!(
            blocker = %b,
            "the firewall ruleset rewrites DSCPs, and {b}: the kernel applies its DSCP rewrites \
             to every packet (flows it rewrites stay in the kernel)"
        ),
        None if !found.dscp.setters.is_empty() => info!(
            rules = found.dscp.setters.len(),
            "the firewall ruleset rewrites DSCPs on flow-constant matches only: the fast path \
             applies the rewrites the kernel makes"
        ),
        _ => {}
    }
}
