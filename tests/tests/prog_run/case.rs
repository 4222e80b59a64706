//! One case of the fixture table (input frame, map setup, expected verdict, output frame and
//! `STATS` slot) and the constructors the subject modules build their cases with.

use std::net::IpAddr;

use xdp_router_common::{IFACE_F_EGRESS_HOOK, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED, Reason};
use xdp_router_tests::{
    fixture_net::{
        Bed, GW_MAC, LAN_SLOT, MTU_SLOT, Setup, WAN_MAC, WAN_SLOT, flow, lan_pkt, v4, v6,
    },
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
    },
};

#[derive(Clone, Debug)]
pub enum Expect {
    /// XDP_PASS, frame unchanged, counted under this reason.
    Pass(Reason),
    /// XDP_REDIRECT with exactly this output frame, counted under this reason; `Setup::flows[0]`
    /// is the flow that must count the packet.
    Redirect(Reason, Vec<u8>),
}

#[derive(Clone, Debug)]
pub struct Case {
    pub name: String,
    pub ingress: u32,
    /// STATS slot the packet must be counted in.
    pub slot: u32,
    pub frame: Vec<u8>,
    pub setup: Setup,
    pub expect: Expect,
}

impl Case {
    pub fn reason(&self) -> Reason {
        match &self.expect {
            Expect::Pass(r) | Expect::Redirect(r, _) => *r,
        }
    }
}

fn slot_of(bed: &Bed, ingress: u32) -> u32 {
    match ingress {
        i if i == bed.lan => LAN_SLOT,
        i if i == bed.wan => WAN_SLOT,
        i if i == bed.mtu => MTU_SLOT,
        _ => 0,
    }
}

pub fn pass(bed: &Bed, name: &str, ingress: u32, frame: Vec<u8>, setup: Setup, r: Reason) -> Case {
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame,
        setup,
        expect: Expect::Pass(r),
    }
}

/// A forwarding case: `pkt` arrives on `ingress`, its flow translates it to `new_src` →
/// `new_dst`, and it must leave with `egress_macs` (router MAC, next-hop MAC) and TTL - 1.
#[expect(clippy::too_many_arguments, reason = "one row of the fixture table")]
pub fn forward(
    bed: &Bed,
    name: &str,
    ingress: u32,
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
    (smac, dmac): ([u8; 6], [u8; 6]),
) -> Case {
    let out = pkt.forwarded(smac, dmac, new_src, new_dst).frame();
    let reason = if reply {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Case {
        name: name.to_owned(),
        ingress,
        slot: slot_of(bed, ingress),
        frame: pkt.frame(),
        setup: Setup::managed(bed, vec![flow(ingress, pkt, new_src, new_dst, reply)]),
        expect: Expect::Redirect(reason, out),
    }
}

/// A forwarding case whose frames carry VLAN tags or PPPoE headers: `pkt` arrives as `input`
/// on `ingress` (counted in `slot`), its flow direction is keyed on `flow_iif` (the VLAN or
/// PPP device the frame belongs to), and it must leave as `output` of the forwarded packet.
#[expect(clippy::too_many_arguments, reason = "one row of the fixture table")]
pub fn encap_forward(
    name: &str,
    (ingress, slot, flow_iif): (u32, u32, u32),
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
    (smac, dmac): ([u8; 6], [u8; 6]),
    setup: impl Fn(Setup) -> Setup,
    input: impl Fn(&[u8]) -> Vec<u8>,
    output: impl Fn(&[u8]) -> Vec<u8>,
    bed: &Bed,
) -> Case {
    let out = pkt.forwarded(smac, dmac, new_src, new_dst).frame();
    let reason = if reply {
        Reason::ForwardedReply
    } else {
        Reason::ForwardedOriginal
    };
    Case {
        name: name.to_owned(),
        ingress,
        slot,
        frame: input(&pkt.frame()),
        setup: setup(Setup::managed(
            bed,
            vec![flow(flow_iif, pkt, new_src, new_dst, reply)],
        )),
        expect: Expect::Redirect(reason, output(&out)),
    }
}

/// A forwarding case of a flow that routes `pkt` without NAT, with the input and expected
/// output frames changed by `input` and `output`.
pub fn routed_forward(
    b: &Bed,
    name: &str,
    pkt: &Spec,
    input: impl Fn(&[u8]) -> Vec<u8>,
    output: impl Fn(&[u8]) -> Vec<u8>,
) -> Case {
    let mut case = forward(
        b,
        name,
        b.lan,
        pkt,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        false,
        (WAN_MAC, GW_MAC),
    );
    case.frame = input(&case.frame);
    if let Expect::Redirect(_, out) = &mut case.expect {
        *out = output(out);
    }
    case
}

/// Egress through a device that transmits through another (`wan0`, a VLAN or PPP device, over
/// `mtu0`, its parent or lower device; `names` says which): the device's own egress and the
/// other's must both allow a redirect. `setup` routes `frame` (from the LAN) out of `wan0`.
pub fn lower_egress_cases(
    b: &Bed,
    prefix: &str,
    (device, lower): (&str, &str),
    setup: impl Fn() -> Setup,
    frame: &[u8],
) -> Vec<Case> {
    [
        (
            format!("{device} shaped"),
            setup().with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        (
            format!("{lower} shaped"),
            setup().with_iface_flags(b.mtu, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        (
            format!("egress hook on the {device}"),
            setup().with_iface_flags(b.wan, IFACE_F_EGRESS_HOOK),
            Reason::PassEgressHook,
        ),
        (
            format!("{lower} cannot transmit XDP frames"),
            setup().with_iface_flags(b.mtu, IFACE_F_NO_XDP_XMIT),
            Reason::PassEgressNoXdpXmit,
        ),
        (
            format!("{lower} not managed"),
            setup().without_iface(b.mtu),
            Reason::PassEgressNotManaged,
        ),
        (
            format!("{lower} not a redirect target"),
            setup().without_tx_port(b.mtu),
            Reason::PassEgressNotManaged,
        ),
    ]
    .into_iter()
    .map(|(what, setup, r)| {
        pass(
            b,
            &format!("{prefix}: {what}"),
            b.lan,
            frame.to_vec(),
            setup,
            r,
        )
    })
    .collect()
}

/// The packets the refusal cases start from: TCP from the client to the server, IPv4 and IPv6;
/// a routed flow forwards each unless the case changes something.
pub fn good_packets() -> (Spec, Spec) {
    let tcp = Transport::Tcp(ACK | PSH);
    (
        lan_pkt(v4("192.0.2.10"), v4("198.18.0.7"), tcp, 100),
        lan_pkt(v6("2001:db8:1::10"), v6("2001:db8:ff::7"), tcp, 100),
    )
}
