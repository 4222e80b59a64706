//! A WAN over a real WireGuard tunnel (a VPN router's `wg0` as its default route), in the amd64
//! guest: this machine's kernel has no WireGuard, so the test is `#[ignore]`d here and
//! `cargo xtask test` runs it in the Debian-kernel guest, which loads `wireguard`; by hand:
//! `cargo xtask test --guest-only --no-arm64 -- wireguard`. The host's tests run the same
//! datapath over a pair of TUN devices (`tunnel::wan_as_an_l3_device_is_fast_pathed`).
//!
//! ```text
//!  lan host ⇄ eth1 router eth0 (192.168.77.1) ⇄ eth0 wan host (192.168.77.2)
//!                     wg0 (10.0.2.1)  ~~~ UDP 51820 ~~~  wg0 (10.0.2.2)
//! ```

use std::{
    io::Write as _,
    process::{Command, Stdio},
};

use xdp_router_tests::{
    netns::{self, Netns},
    testbed::{
        HOST_IF, LAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6, Testbed, WAN_HOST_V4, WAN_HOST_V6, WAN_IF,
        on_path, ready, route_wan_through, traffic_is_fast_pathed, wan_lan_interfaces,
    },
};

const WG: &str = "wg0";
const PORT: u16 = 51820;

/// A WireGuard key pair from `wg genkey` / `wg pubkey`: (private, public), base64.
fn key_pair() -> (String, String) {
    let private = Command::new("wg")
        .arg("genkey")
        .output()
        .expect("wg genkey");
    assert!(private.status.success(), "wg genkey failed");
    let private = String::from_utf8(private.stdout).expect("a base64 key");
    let mut child = Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("wg pubkey");
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(private.as_bytes())
        .expect("write the private key");
    let public = child.wait_with_output().expect("wg pubkey");
    assert!(public.status.success(), "wg pubkey failed");
    (
        private.trim().to_string(),
        String::from_utf8(public.stdout)
            .expect("a base64 key")
            .trim()
            .to_string(),
    )
}

/// Moves `ns`'s WAN addresses from `dev` onto `wg0`, whose UDP goes over `dev` with `underlay`
/// (the last octet of 192.168.77.x), to the peer `peer` with public key `peer_key`, which may
/// send from `allowed` and is reached for everything routed into wg0.
#[expect(clippy::too_many_arguments, reason = "one per end of the tunnel")]
fn move_onto_wireguard(
    tb: &Testbed,
    ns: &Netns,
    dev: &str,
    underlay: u8,
    (v4, v6): (&str, &str),
    private: &str,
    peer: u8,
    (peer_key, allowed): (&str, &str),
) {
    let key_file = tb.dir.path().join(format!("{}.key", ns.name()));
    std::fs::write(&key_file, private).expect("write the private key");
    ns.sh(&format!(
        "set -e
         ip addr flush dev {dev} scope global
         ip addr add 192.168.77.{underlay}/24 dev {dev}
         ip link add {WG} type wireguard
         wg set {WG} private-key {key} listen-port {PORT} \
           peer {peer_key} allowed-ips {allowed} endpoint 192.168.77.{peer}:{PORT}
         ip addr add {v4}/24 dev {WG}
         ip addr add {v6}/64 dev {WG} nodad
         ip link set {WG} up",
        key = key_file.display(),
    ));
}

/// The WAN named as `wg0`, with `datapath = "xdp"`: the daemon runs the TC fast path on it all
/// the same (no link-layer header), the LAN veth keeps native XDP and hands what it routes into
/// wg0 to TC behind it. UDP v4/v6 and TCP between the LAN host and the WAN host, through the
/// encrypting tunnel, are fast-pathed both ways (decrypted packets arrive on wg0 and are sent to
/// the LAN with an Ethernet header pushed; packets to the WAN are redirected into wg0, which
/// encrypts them), intact, and left to netfilter with the fast path off.
#[test]
#[ignore = "needs WireGuard: cargo xtask test runs it in the amd64 Debian-kernel guest"]
fn wan_over_wireguard_is_fast_pathed() {
    let test = "wireguard::wan_over_wireguard_is_fast_pathed";
    if !ready(test) {
        return;
    }
    if !on_path("wg") {
        netns::skip(
            test,
            "`wg` not found (cargo xtask setup installs wireguard-tools)",
        );
        return;
    }
    let mut tb = Testbed::new("wg");
    let (router_key, router_pub) = key_pair();
    let (wan_key, wan_pub) = key_pair();
    move_onto_wireguard(
        &tb,
        &tb.router,
        WAN_IF,
        1,
        (&ROUTER_WAN_V4.to_string(), &ROUTER_WAN_V6.to_string()),
        &router_key,
        2,
        (&wan_pub, "0.0.0.0/0,::/0"),
    );
    move_onto_wireguard(
        &tb,
        &tb.wan,
        HOST_IF,
        2,
        (&WAN_HOST_V4.to_string(), &WAN_HOST_V6.to_string()),
        &wan_key,
        1,
        // IPv4 from the LAN is masqueraded to the router's WAN address; IPv6 is routed.
        (&router_pub, "10.0.2.0/24,fd00:1::/64,fd00:2::/64"),
    );
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {WG}"
    ));
    route_wan_through(&tb, LAN_IF, WG, "through wg0");
    tb.wan_wire = WG.into();
    tb.start_daemon_config(&format!("datapath = \"xdp\"\n{}", wan_lan_interfaces(WG)));
    let st = tb.daemon().status();
    let (wg, lan) = (st.iface(WG), st.iface(LAN_IF));
    println!(
        "{WG}: attach mode {}, because {:?}; {LAN_IF}: {} (TC hand-over {})",
        wg.attach_mode, wg.datapath_because, lan.attach_mode, lan.tc_handoff
    );
    assert_eq!(wg.attach_mode, "tc", "{st:?}");
    assert_eq!(
        (lan.attach_mode.as_str(), lan.tc_handoff),
        ("native", true),
        "{st:?}"
    );
    traffic_is_fast_pathed(&tb, 6311, LAN_IF, WG, "through WireGuard");
    println!(
        "{WG} transfer at the router (peer, bytes received, bytes sent): {}",
        tb.router.exec_ok("wg", &["show", WG, "transfer"]).trim()
    );
}
