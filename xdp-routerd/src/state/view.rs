//! What `xdp-routerd status`, `/metrics` and `xdp-routerd flows` show of the state: the status
//! (one row per managed interface, bridge port, VLAN parent and PPPoE lower device, with the
//! datapath's counters) and the flow rows, built from the state and a few map reads.

use std::net::IpAddr;

use xdp_router_common::{FLOW_F_AWAITING_TRAFFIC, Reason};

use super::{
    Managed, State,
    bridge::{self, Vlans},
    pppoe::PppoeState,
    vlan::vlan_encap,
};
use crate::{
    datapath::{AttachMode, Datapath},
    flows::{
        DirKey, FlowTable, Offloaded,
        accounting::{KernelCounters, Traffic, merge},
    },
    status::{
        BridgeVlanStatus, BridgeVlansStatus, CounterRow, FlowCounts, FlowRow, IfaceStatus, Status,
    },
};

/// A VLAN-filtering device's VLANs for `status`.
pub(super) fn vlans_status(v: &Vlans) -> BridgeVlansStatus {
    BridgeVlansStatus {
        tpid: v.tpid,
        pvid: (v.pvid != 0).then_some(v.pvid),
        vlans: v
            .table
            .iter()
            .map(|(&vid, m)| BridgeVlanStatus {
                vid,
                pvid: m.pvid,
                untagged: m.untagged,
            })
            .collect(),
    }
}

impl State<Datapath> {
    /// What `xdp-routerd status` and `/metrics` show (a few map reads).
    pub fn status(&self) -> anyhow::Result<Status> {
        let mut counters = Vec::new();
        let mut seen_parents = std::collections::BTreeSet::new();
        let mut slots = Vec::new();
        let configured: Vec<u32> = self.ifaces.iter().filter_map(|m| m.ifindex).collect();
        for m in &self.ifaces {
            slots.push((m.cfg.name.clone(), m.slot));
            for p in m.bridge.iter().flat_map(|b| b.ports.values()) {
                slots.push((p.name.clone(), p.slot));
            }
            // A parent over several VLANs: one row; none for a parent in the config (it
            // counts in its own slot). A bridge parent's ports count in theirs.
            if let Some(v) = &m.vlan
                && m.parent_slot != 0
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && seen_parents.insert(m.parent_slot)
            {
                slots.push((v.parent_name.clone(), m.parent_slot));
                if let Some(pb) = self.parent_bridges.get(&v.link.parent) {
                    for p in pb.bridge.ports.values() {
                        slots.push((p.name.clone(), p.slot));
                    }
                }
            }
            // The devices managed only for a PPPoE session: one row each, like a VLAN parent.
            for d in m.pppoe.iter().flat_map(PppoeState::sides) {
                if let Some(&slot) = self.parent_slots.get(&d.ifindex)
                    && !configured.contains(&d.ifindex)
                    && seen_parents.insert(slot)
                {
                    slots.push((d.name.to_string(), slot));
                }
            }
        }
        for (name, slot) in slots {
            for r in Reason::ALL {
                let c = self.dp.counter(slot, r)?;
                counters.push(CounterRow {
                    interface: name.clone(),
                    reason: r,
                    packets: c.packets,
                    bytes: c.bytes,
                });
            }
        }
        let mut interfaces = Vec::new();
        for m in &self.ifaces {
            interfaces.push(IfaceStatus {
                name: m.cfg.name.clone(),
                ifindex: m.ifindex.unwrap_or(0),
                role: m.cfg.role.to_string(),
                // A PPP device is registered as `lower`, and runs the TC fast path itself
                // once its session is bound on TC.
                attach_mode: match m.ifindex.and_then(|i| self.dp.mode_of(i)) {
                    Some(AttachMode::Tc) if m.is_ppp() => "tc",
                    _ => m.mode.map(AttachMode::as_str).unwrap_or("detached"),
                }
                .into(),
                shaped: m.shaped_by().is_some(),
                shaped_config: m.cfg.shaped.to_string(),
                shaped_by: m.shaped_by(),
                egress_qdisc: m.egress.as_ref().and_then(|e| e.root.clone()),
                xdp_xmit: match &m.pppoe {
                    Some(p) => p.bound.is_some(),
                    None => m.ifindex.is_some() && m.xmit.allowed() && !m.no_link_layer,
                },
                no_xdp_xmit_because: match (&m.bridge, m.ifindex, &m.pppoe) {
                    (_, None, _) => None,
                    (Some(_), Some(_), _) => Some(
                        "a bridge: the fast path sends to the port its FDB names instead".into(),
                    ),
                    (None, Some(_), Some(p)) => p.bound.is_none().then(|| {
                        "a PPP device without an accelerated PPPoE session: packets routed out of it stay in the kernel".into()
                    }),
                    (None, Some(_), None) if m.no_link_layer => Some(
                        "no link-layer header: XDP writes Ethernet frames; the TC fast path sends into it (handed over by native-XDP ports)".into(),
                    ),
                    (None, Some(_), None) => m.xmit.why_not(),
                },
                datapath_because: m
                    .ifindex
                    .and_then(|i| self.dp.datapath_because(i))
                    .map(str::to_string),
                tc_handoff: m.ifindex.is_some_and(|i| self.dp.tc_handoff(i)),
                tc_hook: m
                    .ifindex
                    .and_then(|i| self.dp.tc_hook(i))
                    .map(|h| h.as_str().into()),
                generic_because: m
                    .ifindex
                    .and_then(|i| self.dp.generic_because(i))
                    .map(str::to_string),
                bridge: None,
                fdb_entries: m
                    .bridge
                    .as_ref()
                    .and(m.ifindex)
                    .map(|i| self.dp.fdb_len(i) as u64),
                encap: m.vlan.as_ref().map(vlan_encap).or_else(|| m.pppoe_encap()),
                pppoe: m.pppoe_status(),
                bridge_vlans: m
                    .bridge
                    .as_ref()
                    .filter(|b| b.filtering.is_some())
                    .map(|b| vlans_status(&b.vlans)),
                not_accelerated_because: m.not_accelerated_because(),
            });
            if let (Some(v), Some(_)) = (&m.vlan, m.mode)
                && !self.ifaces.iter().any(|o| o.ifindex == Some(v.link.parent))
                && !interfaces.iter().any(|i| i.ifindex == v.link.parent)
            {
                let pb = self.parent_bridges.get(&v.link.parent);
                interfaces.push(IfaceStatus {
                    name: v.parent_name.clone(),
                    ifindex: v.link.parent,
                    role: m.cfg.role.to_string(),
                    attach_mode: m.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
                    shaped: false,
                    shaped_config: "auto".into(),
                    shaped_by: None,
                    egress_qdisc: None,
                    xdp_xmit: false,
                    no_xdp_xmit_because: Some(
                        if m.is_vlan_over_bridge() {
                            "a bridge managed only as a VLAN parent: only its VLANs' frames are sent, out of the port its FDB names"
                        } else {
                            "managed only as a VLAN parent: only its VLANs' tagged frames are sent"
                        }
                        .into(),
                    ),
                    datapath_because: None,
                    tc_handoff: self.dp.tc_handoff(v.link.parent),
                    tc_hook: self.dp.tc_hook(v.link.parent).map(|h| h.as_str().into()),
                    generic_because: self.dp.generic_because(v.link.parent).map(str::to_string),
                    bridge: None,
                    fdb_entries: pb.map(|_| self.dp.fdb_len(v.link.parent) as u64),
                    // A bridge parent (OpenWrt DSA: br-lan.1, br-lan.2) names all its VLANs.
                    encap: Some(format!(
                        "parent of {}",
                        if pb.is_some() {
                            self.vlans_over(v.link.parent)
                        } else {
                            m.cfg.name.clone()
                        }
                    )),
                    pppoe: None,
                    bridge_vlans: pb
                        .filter(|pb| pb.bridge.filtering.is_some())
                        .map(|pb| vlans_status(&pb.bridge.vlans)),
                    not_accelerated_because: None,
                });
                for (ifindex, p) in pb.iter().flat_map(|pb| pb.bridge.ports.iter()) {
                    let filtering = pb.is_some_and(|pb| pb.bridge.filtering.is_some());
                    interfaces.push(self.port_status(
                        m,
                        pb.map_or("", |pb| &pb.name),
                        *ifindex,
                        p,
                        filtering,
                    ));
                }
            }
            for d in m.pppoe.iter().flat_map(PppoeState::sides) {
                if configured.contains(&d.ifindex) {
                    continue;
                }
                let lower_of = format!("lower device of {}", m.cfg.name);
                if let Some(row) = interfaces.iter_mut().find(|i| i.ifindex == d.ifindex) {
                    // Listed already (a VLAN parent, another session's lower device).
                    if let Some(e) = &mut row.encap
                        && !e.contains(&lower_of)
                    {
                        e.push_str(&format!(", {lower_of}"));
                    }
                    continue;
                }
                let b = m.pppoe.as_ref().and_then(|p| p.bound.as_ref());
                let vlan = b
                    .and_then(|b| b.lower.vlan.as_ref())
                    .filter(|_| d.ifindex == b.map_or(0, |b| b.lower.ifindex));
                let encap = match vlan {
                    Some(v) => format!("{}, {lower_of}", vlan_encap(v)),
                    None if b.is_some_and(|b| b.lower.ifindex == d.ifindex) => lower_of,
                    None => format!("parent of {}", b.map_or("", |b| b.session.lower.as_str())),
                };
                let judged = self.xmit.of(d.ifindex, d.kind);
                let runs_on = vlan.map_or(d.ifindex, |v| v.link.parent);
                interfaces.push(IfaceStatus {
                    name: d.name.to_string(),
                    ifindex: d.ifindex,
                    role: m.cfg.role.to_string(),
                    attach_mode: self
                        .dp
                        .mode_of(runs_on)
                        .map(AttachMode::as_str)
                        .unwrap_or("detached")
                        .into(),
                    shaped: d.side.shaper.is_some(),
                    shaped_config: "auto".into(),
                    shaped_by: d.side.shaper.clone(),
                    egress_qdisc: None,
                    xdp_xmit: vlan.is_none() && judged.allowed(),
                    no_xdp_xmit_because: match vlan {
                        Some(_) => Some("a VLAN device: its parent sends its frames".into()),
                        None => judged.why_not(),
                    },
                    datapath_because: None,
                    tc_handoff: self.dp.tc_handoff(runs_on),
                    tc_hook: self
                        .dp
                        .tc_hook(d.ifindex)
                        .or_else(|| self.dp.tc_hook(runs_on))
                        .map(|h| h.as_str().into()),
                    generic_because: self.dp.generic_because(runs_on).map(str::to_string),
                    bridge: None,
                    fdb_entries: None,
                    encap: Some(encap),
                    pppoe: None,
                    bridge_vlans: None,
                    not_accelerated_because: None,
                });
            }
            for (ifindex, p) in m.bridge.iter().flat_map(|b| b.ports.iter()) {
                let filtering = m.bridge.as_ref().is_some_and(|b| b.filtering.is_some());
                interfaces.push(self.port_status(m, &m.cfg.name, *ifindex, p, filtering));
            }
        }
        let (v4_dirs, v6_dirs) = self.flows.directions();
        let mut ct = self.ct.clone();
        let fs = self.flows.stats();
        ct.offloaded = self.flows.len() as u64;
        ct.offloaded_total = fs.offloaded_total;
        ct.removed_total = fs.removed_total;
        ct.skipped = fs.skipped.clone();
        Ok(Status {
            fastpath: self.dp.fastpath()?,
            interfaces,
            flows: FlowCounts {
                ipv4: v4_dirs,
                ipv6: v6_dirs,
                capacity: self.dp.flow_capacity(),
            },
            counters,
            conntrack: ct,
            fib_cache: self.dp.fib_cache_status().into(),
            ruleset: self.dp.ruleset_status().into(),
            age_ms: 0,
            per_packet: self.per_packet_status(),
            kernel: self.dp.kernel_features().clone(),
        })
    }

    /// The `status` row of the port `p` (`ifindex`) of the bridge called `bridge`, managed for
    /// `m` (whose role it takes).
    pub(super) fn port_status(
        &self,
        m: &Managed,
        bridge: &str,
        ifindex: u32,
        p: &bridge::Port,
        filtering: bool,
    ) -> IfaceStatus {
        IfaceStatus {
            name: p.name.clone(),
            ifindex,
            role: m.cfg.role.to_string(),
            attach_mode: p.mode.map(AttachMode::as_str).unwrap_or("detached").into(),
            shaped: p.shaped_by().is_some(),
            shaped_config: "auto".into(),
            shaped_by: p.shaped_by(),
            egress_qdisc: p.egress.as_ref().and_then(|e| e.root.clone()),
            xdp_xmit: p.xmit.allowed(),
            no_xdp_xmit_because: p.xmit.why_not(),
            datapath_because: self.dp.datapath_because(ifindex).map(str::to_string),
            tc_handoff: self.dp.tc_handoff(ifindex),
            tc_hook: self.dp.tc_hook(ifindex).map(|h| h.as_str().into()),
            generic_because: self.dp.generic_because(ifindex).map(str::to_string),
            bridge: Some(bridge.to_string()),
            fdb_entries: None,
            encap: None,
            pppoe: None,
            bridge_vlans: filtering.then(|| vlans_status(&p.vlans)),
            not_accelerated_because: None,
        }
    }

    /// The `xdp-routerd flows` rows of `conns`, with their counters read from the maps now
    /// (see [`super::Shared::flows`]) and merged with conntrack's own (`kernel`).
    pub(super) fn flow_rows(
        &self,
        conns: &[Offloaded],
        now: u64,
        kernel: &KernelCounters,
    ) -> Vec<FlowRow> {
        let name = |i: u32| self.flows.iface_name(i).unwrap_or("?").to_string();
        let proto = |p: u8| match p {
            6 => "tcp".to_string(),
            17 => "udp".to_string(),
            p => p.to_string(),
        };
        let ep = |a: IpAddr, port: u16| match a {
            IpAddr::V4(a) => format!("{a}:{port}"),
            IpAddr::V6(a) => format!("[{a}]:{port}"),
        };
        let mut rows = Vec::new();
        for conn in conns {
            let e = &conn.entry;
            let ct = kernel.get(&(e.orig, e.zone));
            for (i, key) in conn.keys.iter().enumerate() {
                let (from, to_src, to_sport, to_dst, to_dport) = if i == 0 {
                    (
                        &e.orig,
                        e.reply.dst,
                        e.reply.dport,
                        e.reply.src,
                        e.reply.sport,
                    )
                } else {
                    (&e.reply, e.orig.dst, e.orig.dport, e.orig.src, e.orig.sport)
                };
                let (ifindex, family, value) = match key {
                    DirKey::V4(k) => (
                        k.ifindex,
                        "ipv4",
                        self.dp.get_v4(k).map(|v| (v.counters, v.flags)),
                    ),
                    DirKey::V6(k) => (
                        k.ifindex,
                        "ipv6",
                        self.dp.get_v6(k).map(|v| (v.counters, v.flags)),
                    ),
                };
                // Removed since it was listed (see `Shared::flows`): left out.
                let Some((c, flags)) = value else {
                    continue;
                };
                let merged = merge(conn.carried[i] + Traffic::from(c), ct.map(|ct| ct[i]));
                rows.push(FlowRow {
                    family: family.into(),
                    ingress: name(ifindex),
                    proto: proto(from.proto),
                    src: ep(from.src, from.sport),
                    dst: ep(from.dst, from.dport),
                    new_src: ep(to_src, to_sport),
                    new_dst: ep(to_dst, to_dport),
                    direction: if i == 0 { "original" } else { "reply" }.into(),
                    packets: merged.fastpath.packets,
                    bytes: merged.fastpath.bytes,
                    conntrack: merged.kernel,
                    total: merged.total,
                    idle_ms: (c.last_seen_ns != 0)
                        .then(|| now.saturating_sub(c.last_seen_ns) / 1_000_000),
                    awaiting_traffic: flags & FLOW_F_AWAITING_TRAFFIC != 0,
                });
            }
        }
        rows
    }
}
