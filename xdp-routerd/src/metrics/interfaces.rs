//! Per-interface metrics: attach mode, TC hand-over, egress shaping, XDP transmit, PPPoE
//! session and bridge VLAN membership of each managed interface.

use std::fmt;

use prometheus_client::encoding::DescriptorEncoder;

use super::family::gauges;
use crate::status::Status;

/// The attach modes an interface can be in (`xdp_router_interface_attach_mode{mode}`); one
/// series per mode, 1 for the current one, so a change shows as a 0 → 1 flip.
const ATTACH_MODES: [&str; 6] = ["native", "generic", "ports", "lower", "tc", "detached"];

/// Encodes this subsystem's families of one status snapshot.
pub(super) fn encode(s: &Status, enc: &mut DescriptorEncoder) -> Result<(), fmt::Error> {
    gauges(
        enc,
        "interface_attach_mode",
        "1 for the attach mode each managed interface is in (XDP native or generic, tc for the TC ingress fast path, ports for a bridge, lower for a PPP device, or detached when it is missing), 0 for the others.",
        None,
        s.interfaces.iter().flat_map(|i| {
            ATTACH_MODES.iter().map(move |m| {
                (
                    vec![
                        ("interface", i.name.clone()),
                        ("role", i.role.clone()),
                        ("mode", m.to_string()),
                    ],
                    u64::from(i.attach_mode == *m),
                )
            })
        }),
    )?;
    gauges(
        enc,
        "interface_tc_handoff",
        "1 while the TC fast path runs behind native XDP on a managed interface, for the packets XDP cannot redirect (routed out of a port without XDP transmit, such as one on the TC datapath).",
        None,
        s.interfaces.iter().map(|i| {
            (
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(i.tc_handoff),
            )
        }),
    )?;
    gauges(
        enc,
        "interface_egress_shaped",
        "1 while the egress of a managed interface is shaped (config, or a shaping qdisc found with shaped = \"auto\"): the fast path does not send out of it.",
        None,
        s.interfaces.iter().map(|i| {
            (
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(i.shaped),
            )
        }),
    )?;
    gauges(
        enc,
        "interface_xdp_xmit",
        "1 while the kernel reports that a managed interface transmits XDP frames (NETDEV_XDP_ACT_NDO_XMIT); 0: the fast path does not send out of it (a bridge, a veth whose peer has neither XDP nor GRO) and counts such packets as egress_no_xdp_xmit.",
        None,
        s.interfaces.iter().map(|i| {
            (
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(i.xdp_xmit),
            )
        }),
    )?;
    gauges(
        enc,
        "interface_pppoe_session",
        "1 while the PPPoE session of a managed PPP device is accelerated (the program on its lower device takes its session frames off the wire and sends packets routed out of the PPP device as session frames); 0 while it is not (no session, several sessions and no pppoe_device: see status).",
        None,
        s.interfaces.iter().filter_map(|i| {
            let p = i.pppoe.as_ref()?;
            Some((
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                u64::from(p.session_id.is_some()),
            ))
        }),
    )?;
    gauges(
        enc,
        "interface_bridge_vlans",
        "VLANs a VLAN-filtering bridge (its own, self VLANs) or one of its ports is a member of, as the fast path uses them (bridge vlan show); only for VLAN-filtering bridges and their ports.",
        None,
        s.interfaces.iter().filter_map(|i| {
            let v = i.bridge_vlans.as_ref()?;
            Some((
                vec![("interface", i.name.clone()), ("role", i.role.clone())],
                v.vlans.len() as u64,
            ))
        }),
    )?;
    Ok(())
}
