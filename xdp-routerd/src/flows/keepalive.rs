//! Keep-alive: which offloaded connections carried fast-path traffic since the previous pass,
//! so their conntrack timeouts can be refreshed.

use super::conntrack::CtTuple;
use super::map_entries::words_to_bytes;
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
    /// connections cost: the datapath records them (see [`FlowTable::take_active`]); entries
    /// for connections no longer offloaded are dropped.
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
