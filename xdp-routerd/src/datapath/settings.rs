//! The `SETTINGS` map (the fast-path switch, checksum verification, the FIB cache and
//! ruleset generations, the keep-alive pass) as the daemon writes it, and the per-reason
//! counters of `STATS`.

use std::time::Duration;

use anyhow::Context as _;
use aya::{
    Ebpf,
    maps::{Array, MapData, PerCpuArray},
};
use xdp_router_common::{
    Counter, MAP_SETTINGS, MAP_STATS, Reason, SETTINGS_F_DSCP_REWRITE, SETTINGS_F_FIB_MARK,
    SETTINGS_F_HOLD_ALL, Settings, stats_index, verdict_tick,
};

use super::{Datapath, take};

/// Firewall ruleset tracking, as [`Datapath::ruleset_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ruleset {
    /// Current ruleset generation (starts at 1).
    pub generation: u32,
    /// Successful [`Datapath::bump_ruleset_generation`] calls.
    pub changes: u64,
    /// Interfaces with the TC egress arming program attached.
    pub armed_interfaces: u32,
    /// `bpf_fib_lookup` takes the packet mark (Linux 6.10).
    pub fib_mark: bool,
    /// How long a flow direction is forwarded after the kernel last forwarded it, in ms, as
    /// configured (the datapath counts whole ≈ 1.05 ms ticks, rounding down); 0 = until the
    /// ruleset changes.
    pub verdict_max_age_ms: u64,
    /// Whether verdicts expire at that age now: a rule established packets reach has a match
    /// whose answer can change without a ruleset change, or the ruleset could not be read
    /// (see [`crate::flows::verdict_expiry`]); otherwise they hold until the ruleset changes.
    pub verdicts_expire: bool,
}

/// The per-flow cache of FIB answers, as [`Datapath::fib_cache_status`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FibCache {
    /// Longest an answer is reused, in ms (0: the cache is off).
    pub max_age_ms: u64,
    /// Current generation: answers of older generations are not used.
    pub generation: u32,
    /// Successful [`Datapath::invalidate_fib_cache`] calls.
    pub invalidations: u64,
}

/// `SETTINGS`, what it holds, and `STATS`.
pub(super) struct SettingsMaps {
    map: Array<MapData, Settings>,
    /// What `map` holds (the daemon is its only writer).
    pub(super) current: Settings,
    /// Successful [`Datapath::invalidate_fib_cache`] calls.
    fib_invalidations: u64,
    /// Successful [`Datapath::bump_ruleset_generation`] calls.
    ruleset_changes: u64,
    /// What [`Datapath::set_verdict_max_age`] was last given.
    verdict_max_age: Duration,
    /// What [`Datapath::set_verdicts_expire`] was last given (until then: they do).
    verdicts_expire: bool,
    stats: PerCpuArray<MapData, Counter>,
}

impl SettingsMaps {
    /// Takes `SETTINGS` and `STATS` out of `ebpf`; the settings start as the program should
    /// first see them (not written yet: see [`SettingsMaps::write`]).
    /// `fib_mark`: `bpf_fib_lookup` takes the packet mark (`BPF_FIB_LOOKUP_MARK`); without it,
    /// marked flow directions are never armed (policy routing by mark stays in the kernel).
    pub(super) fn take(ebpf: &mut Ebpf, fib_mark: bool) -> anyhow::Result<SettingsMaps> {
        Ok(SettingsMaps {
            map: take(ebpf, MAP_SETTINGS)?,
            current: Settings {
                // Until the daemon has read nf_conntrack_checksum: verify (the kernel default).
                verify_l4_checksum: 1,
                // Until the config is applied: verdicts hold until the ruleset changes.
                verdict_max_age: 0,
                // Until the first keep-alive pass: record every flow's first packet.
                active_since_ns: 1,
                fastpath_enabled: 1,
                fib_generation: 1,
                fib_cache_ns: 0,
                ruleset_generation: 1,
                flags: if fib_mark { SETTINGS_F_FIB_MARK } else { 0 },
            },
            fib_invalidations: 0,
            ruleset_changes: 0,
            verdict_max_age: Duration::ZERO,
            verdicts_expire: true,
            stats: take(ebpf, MAP_STATS)?,
        })
    }

    /// Writes `current` into the map.
    pub(super) fn write(&mut self) -> anyhow::Result<()> {
        self.map
            .set(0, self.current, 0)
            .context("cannot write the settings map")
    }

    /// Moves the generation `field` picks out of `current` to the next one, skipping 0 on
    /// wrap-around, and writes the settings.
    fn next_generation(&mut self, field: fn(&mut Settings) -> &mut u32) -> anyhow::Result<()> {
        let generation = field(&mut self.current);
        *generation = generation.checked_add(1).unwrap_or(1);
        self.write()
    }
}

impl Datapath {
    /// Whether the program verifies L4 checksums (see [`Datapath::set_verify_l4_checksum`]).
    pub fn verify_l4_checksum(&self) -> bool {
        self.settings.current.verify_l4_checksum != 0
    }

    /// Whether TCP/UDP checksums are verified before forwarding: the daemon mirrors
    /// `net.netfilter.nf_conntrack_checksum` (conntrack marks bad ones INVALID while it is 1).
    pub fn set_verify_l4_checksum(&mut self, on: bool) -> anyhow::Result<()> {
        if self.settings.current.verify_l4_checksum == u32::from(on) {
            return Ok(());
        }
        self.settings.current.verify_l4_checksum = u32::from(on);
        self.settings.write()
    }

    /// Switches the fast path on or off (a map flag; nothing is detached).
    pub fn set_fastpath(&mut self, on: bool) -> anyhow::Result<()> {
        self.settings.current.fastpath_enabled = on as u32;
        self.settings.write()
    }

    /// How long a flow may reuse its last FIB answer (`fib_cache_ms`); zero disables the
    /// cache. Starts at zero.
    pub fn set_fib_cache(&mut self, max_age: Duration) -> anyhow::Result<()> {
        self.settings.current.fib_cache_ns = u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        self.settings.write()
    }

    /// How long a flow direction is forwarded after the kernel last forwarded one of its
    /// packets (`verdict_max_age_ms`; zero: until the ruleset changes), while verdicts expire
    /// at all ([`Datapath::set_verdicts_expire`]). Starts at zero.
    pub fn set_verdict_max_age(&mut self, max_age: Duration) -> anyhow::Result<()> {
        self.write_verdict_age(max_age, self.settings.verdicts_expire)
    }

    /// Whether verdicts expire at the configured age (a rule established packets reach can
    /// change its answer without a ruleset change: see [`crate::flows::verdict_expiry`]) or
    /// hold until the ruleset changes. Starts expiring.
    pub fn set_verdicts_expire(&mut self, expire: bool) -> anyhow::Result<()> {
        if expire == self.settings.verdicts_expire {
            return Ok(());
        }
        self.write_verdict_age(self.settings.verdict_max_age, expire)
    }

    fn write_verdict_age(&mut self, max_age: Duration, expire: bool) -> anyhow::Result<()> {
        let ticks = verdict_tick(u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX));
        // A non-zero age shorter than a tick is one tick, not "never expires".
        self.settings.current.verdict_max_age = if max_age.is_zero() || !expire {
            0
        } else {
            ticks.max(1)
        };
        self.settings.write()?;
        self.settings.verdict_max_age = max_age;
        self.settings.verdicts_expire = expire;
        Ok(())
    }

    /// Invalidates every flow's cached FIB answer: the next packet of each flow takes a full
    /// `bpf_fib_lookup`. Called for every kernel notification that can change an answer.
    pub fn invalidate_fib_cache(&mut self) -> anyhow::Result<()> {
        // 0 means "cache disabled" to the datapath: never a generation.
        self.settings.next_generation(|s| &mut s.fib_generation)?;
        self.settings.fib_invalidations += 1;
        Ok(())
    }

    /// A new firewall ruleset generation: every flow direction is disarmed at once, so the next
    /// packet of each is judged by the kernel's rules as they are now (and re-armed only if the
    /// kernel forwards it). Called for every nftables commit and iptables-legacy change.
    pub fn bump_ruleset_generation(&mut self) -> anyhow::Result<()> {
        // Until the new ruleset is read, its DSCP rewrites are not known to be per flow
        // (`set_dscp_rewrite`): the same map write stops XDP applying them.
        self.settings.current.flags &= !SETTINGS_F_DSCP_REWRITE;
        // 0 is what new flow entries hold: never current.
        self.settings
            .next_generation(|s| &mut s.ruleset_generation)?;
        self.settings.ruleset_changes += 1;
        Ok(())
    }

    /// Ruleset tracking as `status` shows it: generation, changes since start, interfaces with
    /// the arming program, whether the FIB lookup takes marks.
    pub fn ruleset_status(&self) -> Ruleset {
        Ruleset {
            generation: self.settings.current.ruleset_generation,
            changes: self.settings.ruleset_changes,
            armed_interfaces: self.links.armed.len() as u32,
            fib_mark: self.settings.current.flags & SETTINGS_F_FIB_MARK != 0,
            verdict_max_age_ms: u64::try_from(self.settings.verdict_max_age.as_millis())
                .unwrap_or(u64::MAX),
            verdicts_expire: self.settings.verdicts_expire,
        }
    }

    /// The FIB cache as `status` shows it: longest reuse, generation, invalidations.
    pub fn fib_cache_status(&self) -> FibCache {
        FibCache {
            max_age_ms: self.settings.current.fib_cache_ns / 1_000_000,
            generation: self.settings.current.fib_generation,
            invalidations: self.settings.fib_invalidations,
        }
    }

    /// Whether the fast path is on.
    pub fn fastpath(&self) -> anyhow::Result<bool> {
        Ok(self
            .settings
            .map
            .get(&0, 0)
            .context("cannot read the settings map")?
            .fastpath_enabled
            != 0)
    }

    /// Packets/bytes summed over CPUs for one (interface slot, reason).
    pub fn counter(&self, slot: u32, reason: Reason) -> anyhow::Result<Counter> {
        let values = self
            .settings
            .stats
            .get(&stats_index(slot, reason), 0)
            .context("cannot read the stats map")?;
        Ok(values.iter().fold(Counter::default(), |acc, c| Counter {
            packets: acc.packets + c.packets,
            bytes: acc.bytes + c.bytes,
        }))
    }
}

/// Holding every packet in the kernel while the ruleset has rules that must see every packet
/// (`SETTINGS_F_HOLD_ALL`; see [`crate::flows::per_packet`]).
impl Datapath {
    /// Whether every packet goes to the kernel (`per_packet_rule_in_ruleset`).
    pub fn hold_all(&self) -> bool {
        self.settings.current.flags & SETTINGS_F_HOLD_ALL != 0
    }

    /// Sends every packet to the kernel (`hold`) or lets the fast path forward again: one map
    /// write, none when nothing changes.
    pub fn set_hold_all(&mut self, hold: bool) -> anyhow::Result<()> {
        let flags = if hold {
            self.settings.current.flags | SETTINGS_F_HOLD_ALL
        } else {
            self.settings.current.flags & !SETTINGS_F_HOLD_ALL
        };
        if flags == self.settings.current.flags {
            return Ok(());
        }
        self.settings.current.flags = flags;
        self.settings.write()
    }

    /// [`Datapath::bump_ruleset_generation`] with every packet held in the kernel in the same
    /// map write: for a ruleset change whose content is still to be read, so that no flow
    /// re-armed under the new ruleset is fast-pathed before the daemon knows whether it has
    /// rules that must see every packet.
    pub fn bump_ruleset_generation_holding(&mut self) -> anyhow::Result<()> {
        self.settings.current.flags |= SETTINGS_F_HOLD_ALL;
        self.bump_ruleset_generation()
    }

    /// Lets XDP apply the DSCP rewrites the kernel was seen making (`allow`), or not: one map
    /// write, none when nothing changes (`SETTINGS_F_DSCP_REWRITE`; see
    /// [`crate::flows::dscp_rewrite`]).
    pub fn set_dscp_rewrite(&mut self, allow: bool) -> anyhow::Result<()> {
        let flags = if allow {
            self.settings.current.flags | SETTINGS_F_DSCP_REWRITE
        } else {
            self.settings.current.flags & !SETTINGS_F_DSCP_REWRITE
        };
        if flags == self.settings.current.flags {
            return Ok(());
        }
        self.settings.current.flags = flags;
        self.settings.write()
    }

    /// Whether XDP applies DSCP rewrites itself.
    pub fn dscp_rewrite(&self) -> bool {
        self.settings.current.flags & SETTINGS_F_DSCP_REWRITE != 0
    }
}
