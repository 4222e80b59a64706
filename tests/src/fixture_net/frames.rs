//! The fixtures' frames: a LAN client's packet to a WAN server and a WAN server's packet to
//! the LAN.

use std::net::IpAddr;

use crate::packet::{Spec, Transport};

use super::topology::{CLIENT_MAC, GW_MAC, LAN_MAC, WAN_MAC};

/// A LAN client's packet to a server behind the WAN.
pub fn lan_pkt(src: IpAddr, dst: IpAddr, transport: Transport, payload_len: usize) -> Spec {
    Spec {
        eth_src: CLIENT_MAC,
        eth_dst: LAN_MAC,
        src,
        dst,
        sport: 40_000,
        dport: 443,
        ttl: 64,
        transport,
        payload_len,
    }
}

/// A server's reply arriving on the WAN, addressed to the router (after SNAT) or the client.
pub fn wan_pkt(src: IpAddr, dst: IpAddr, dport: u16, transport: Transport) -> Spec {
    Spec {
        eth_src: GW_MAC,
        eth_dst: WAN_MAC,
        src,
        dst,
        sport: 443,
        dport,
        ttl: 57,
        transport,
        payload_len: 120,
    }
}
