//! Bridges: a bridge port as the ingress (addressed to another host, broadcast, STP state,
//! FDB learning) and a bridge as the egress (FDB miss, the FDB port's checks, the redirect).

use xdp_router_common::{
    IFACE_F_BRIDGE, IFACE_F_NO_XDP_XMIT, IFACE_F_PORT_NOT_FORWARDING, IFACE_F_SHAPED, Reason,
};
use xdp_router_tests::{
    fixture_net::{Bed, CLIENT_MAC, GW_MAC, Setup, routed},
    packet::with_eth_dst,
};

use crate::case::{Case, good_packets, pass, routed_forward};

/// Bridged LAN: the ingress as a bridge port (here a port of a bridge with the LAN's own
/// ifindex, so the flow keyed on it matches), and the egress as a bridge whose FDB points at
/// another interface.
pub fn cases(b: &Bed, c: &mut Vec<Case>) {
    let (good4, _) = good_packets();
    let good4 = &good4;
    let m4 = Setup::managed(b, vec![routed(b.lan, good4, false)]);
    let port = m4.clone().with_bridge_port(b.lan, b.lan);
    let learned = port.clone().with_fdb(b.lan, CLIENT_MAC, b.lan);
    c.push(pass(
        b,
        "bridge port: frame to another host's MAC",
        b.lan,
        with_eth_dst(&good4.frame(), [2, 0, 0, 0, 0, 0x99]),
        learned.clone(),
        Reason::PassBridged,
    ));
    c.push(pass(
        b,
        "bridge port: broadcast",
        b.lan,
        with_eth_dst(&good4.frame(), [0xff; 6]),
        learned.clone(),
        Reason::PassBridged,
    ));
    c.push(pass(
        b,
        "bridge port not in the STP forwarding state",
        b.lan,
        good4.frame(),
        learned
            .clone()
            .with_iface_flags(b.lan, IFACE_F_PORT_NOT_FORWARDING),
        Reason::PassBridgePortNotForwarding,
    ));
    c.push(pass(
        b,
        "bridge port: source MAC not in the FDB",
        b.lan,
        good4.frame(),
        port.clone(),
        Reason::PassBridgeLearning,
    ));
    c.push(pass(
        b,
        "bridge port: source MAC behind another port",
        b.lan,
        good4.frame(),
        port.with_fdb(b.lan, CLIENT_MAC, b.mtu),
        Reason::PassBridgeLearning,
    ));
    let mut from_port = routed_forward(
        b,
        "bridge port: routed as the bridge",
        good4,
        |f| f.to_vec(),
        |f| f.to_vec(),
    );
    from_port.setup = learned;
    c.push(from_port);
    // Egress through a bridge: FIB says WAN; the WAN is a bridge whose FDB has the gateway's MAC
    // behind the MTU interface (a port of it).
    let bridged_wan = m4
        .clone()
        .with_iface_flags(b.wan, IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT)
        .with_bridge_port(b.mtu, b.wan);
    c.push(pass(
        b,
        "egress bridge: destination MAC not in the FDB",
        b.lan,
        good4.frame(),
        bridged_wan.clone(),
        Reason::PassBridgeFdbMiss,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB port shaped",
        b.lan,
        good4.frame(),
        bridged_wan
            .clone()
            .with_fdb(b.wan, GW_MAC, b.mtu)
            .with_iface_flags(b.mtu, IFACE_F_SHAPED),
        Reason::PassEgressShaped,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB port not forwarding",
        b.lan,
        good4.frame(),
        bridged_wan
            .clone()
            .with_fdb(b.wan, GW_MAC, b.mtu)
            .with_iface_flags(b.mtu, IFACE_F_PORT_NOT_FORWARDING),
        Reason::PassBridgePortNotForwarding,
    ));
    c.push(pass(
        b,
        "egress bridge: FDB names an interface that is not its port",
        b.lan,
        good4.frame(),
        bridged_wan.clone().with_fdb(b.wan, GW_MAC, b.lan),
        Reason::PassEgressNotManaged,
    ));
    let mut via_fdb = routed_forward(
        b,
        "egress bridge: redirected to the FDB's port",
        good4,
        |f| f.to_vec(),
        |f| f.to_vec(),
    );
    via_fdb.setup = bridged_wan.with_fdb(b.wan, GW_MAC, b.mtu);
    c.push(via_fdb);
}
