//! Kernel changes that touch every flow: FIB cache invalidations (and the FIB cache's age
//! limit) and firewall ruleset changes (each disarms every flow); and which optional kernel
//! features the datapath was loaded with.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Unit;

use super::family::{counters, gauges};
use crate::status::Status;

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    counters(
        enc,
        "fib_cache_invalidations",
        "Times every flow's cached FIB answer was dropped (kernel routing, rule, address, link, neighbour or forwarding notifications).",
        None,
        [(vec![], s.fib_cache.invalidations)],
    )?;
    counters(
        enc,
        "ruleset_changes",
        "Firewall ruleset changes (nftables commits, iptables-legacy changes, lost notifications); each disarms every flow until the kernel forwards it again.",
        None,
        [(vec![], s.ruleset.changes)],
    )?;
    gauges(
        enc,
        "fib_cache_max_age",
        "Longest a flow reuses a FIB answer (fib_cache_ms); 0 = every packet is looked up.",
        Some(&Unit::Seconds),
        [(vec![], s.fib_cache.max_age_ms as f64 / 1000.0)],
    )?;
    gauges(
        enc,
        "verdict_max_age",
        "Longest the fast path forwards a flow direction after the kernel last forwarded one of its packets (verdict_max_age_ms); 0 = until the ruleset changes.",
        Some(&Unit::Seconds),
        [(vec![], s.ruleset.verdict_max_age_ms as f64 / 1000.0)],
    )?;
    gauges(
        enc,
        "verdicts_expiring",
        "1 while kernel verdicts expire at verdict_max_age (a rule established packets reach matches an ipset, a set with timeouts, the time or a route lookup, or the ruleset could not be read); 0 while they hold until the ruleset changes.",
        None,
        [(vec![], f64::from(u8::from(s.ruleset.verdicts_expire)))],
    )?;
    gauges(
        enc,
        "kernel_feature",
        "1 when the kernel has the optional feature and the datapath uses it, else 0 (what is lost without it: xdp-routerd status, check-system).",
        None,
        s.kernel.features.iter().map(|(f, a)| {
            (
                vec![("feature", f.name().to_owned())],
                u64::from(a.usable()),
            )
        }),
    )?;
    Ok(())
}
