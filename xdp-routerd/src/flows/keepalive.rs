//! Keep-alive: which offloaded connections carried traffic since the previous pass, so their
//! conntrack timeouts can be refreshed, and the connections found at start that did so taken
//! in ([`FlowManager::joined_on_traffic`]).

use tracing::debug;
use xdp_router_common::FLOW_F_AWAITING_TRAFFIC;

use super::conntrack::CtTuple;
use super::map_entries::{DirKey, Plan, words_to_bytes};
use super::stored::{Packed, TupleV4, TupleV6};
use super::{FlowManager, FlowTable};

/// A connection the keep-alive should refresh: what a conntrack update needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Active {
    /// Original tuple.
    pub orig: CtTuple,
    /// Conntrack zone.
    pub zone: u16,
}

impl FlowManager {
    /// Connections that carried fast-path traffic since the previous call (their conntrack
    /// timeout must be refreshed), and starts the next pass at `now_ns`. Costs what the active
    /// connections cost: the datapath records them (see [`FlowTable::take_active`]), and so
    /// does the arming program for the packets the kernel forwarded of a connection not marked
    /// liberal yet ([`xdp_router_common::FLOW_F_AWAITING_TRAFFIC`]); entries for connections no longer
    /// offloaded are dropped.
    pub fn active_since_last_pass(
        &mut self,
        table: &mut impl FlowTable,
        now_ns: u64,
    ) -> Vec<Active> {
        let (v4, v6) = table.take_active(now_ns);
        let v4 = v4.iter().map(|k| TupleV4 {
            src: k.src_be.to_ne_bytes(),
            dst: k.dst_be.to_ne_bytes(),
            sport: u16::from_be(k.sport_be),
            dport: u16::from_be(k.dport_be),
            proto: k.proto,
        });
        let v6 = v6.iter().map(|k| TupleV6 {
            src: words_to_bytes(k.src_be),
            dst: words_to_bytes(k.dst_be),
            sport: u16::from_be(k.sport_be),
            dport: u16::from_be(k.dport_be),
            proto: k.proto,
        });
        let v4 = v4.filter_map(|t| {
            let s = self.conns_v4.0.get(&t)?;
            Some(Active {
                orig: t.unpack(),
                zone: s.zone,
            })
        });
        let v6 = v6.filter_map(|t| {
            let s = self.conns_v6.0.get(&t)?;
            Some(Active {
                orig: t.unpack(),
                zone: s.zone,
            })
        });
        v4.chain(v6).collect()
    }
}

impl FlowManager {
    /// The keep-alive refreshed the connections `refreshed` in conntrack (marking the TCP ones
    /// liberal in the same message). Those awaiting traffic (found at the daemon's start, see
    /// `Stored::awaiting_traffic`) lose [`FLOW_F_AWAITING_TRAFFIC`] in both flow entries,
    /// rewritten from what they hold (counters included), and get their arming index entries,
    /// so the next packet the kernel forwards arms them. Returns how many.
    pub fn joined_on_traffic(
        &mut self,
        refreshed: &[CtTuple],
        table: &mut impl FlowTable,
    ) -> usize {
        let mut cleared = 0;
        for orig in refreshed {
            let Some(mut conn) = self.get(orig) else {
                continue;
            };
            if !conn.awaiting_traffic {
                continue;
            }
            conn.awaiting_traffic = false;
            let plan = Plan::new(orig, &conn.reply, conn.ingress[0], conn.ingress[1], false);
            for key in &plan.keys {
                let written = match key {
                    DirKey::V4(k) => table.get_v4(k).map(|mut v| {
                        v.flags &= !FLOW_F_AWAITING_TRAFFIC;
                        table.insert_v4(k, &v)
                    }),
                    DirKey::V6(k) => table.get_v6(k).map(|mut v| {
                        v.flags &= !FLOW_F_AWAITING_TRAFFIC;
                        table.insert_v6(k, &v)
                    }),
                };
                if let Some(Err(e)) = written {
                    // The direction stays unarmed (with the kernel) until its entry is written
                    // again.
                    debug!(error = %e, "cannot clear a flow entry's awaiting-traffic flag");
                }
            }
            // After the flags: an arming index entry makes a direction armable.
            if let Err(e) = plan.write_arms(table) {
                // Unarmable (with the kernel) until its entries are written again.
                debug!(error = %e, "cannot write a connection's arming index entries");
            }
            self.insert(orig, &conn);
            cleared += 1;
        }
        cleared
    }
}
