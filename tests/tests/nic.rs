//! A real NIC driver without native XDP, in the amd64 guest: qemu gives it two emulated Intel
//! e1000e NICs wired to each other (`xtask/src/guest/amd64.rs`), found here by their MACs. The
//! e1000e driver has no XDP at all, like Realtek `r8169`, Wi-Fi and many 1G NICs of home routers,
//! so this is the driver path those ports take (NAPI, GRO, the driver's checksum offload). This
//! machine's kernel has no NIC drivers, so the test is `#[ignore]`d here and `cargo xtask test`
//! runs it in the guest; by hand: `cargo xtask test --guest-only --no-arm64 -- nic`.

use std::process::Command;

use xdp_router_tests::testbed::{
    HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, ROUTER_LAN_V4, ROUTER_LAN_V6, Testbed, WAN_IF,
    ready, traffic_is_fast_pathed,
};

/// MAC of the e1000e NIC the router's LAN port is (`xtask/src/guest/amd64.rs` sets it).
const ROUTER_NIC_MAC: &str = "52:54:00:e1:00:01";
/// MAC of the e1000e NIC wired to it, the LAN host's.
const HOST_NIC_MAC: &str = "52:54:00:e1:00:02";
/// The router's e1000e LAN port, renamed in its namespace.
const NIC: &str = "lan0";

/// Runs `script` with `sh -e` in the namespace the test runs in (the guest's root); its stdout.
fn root_sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-ec", script])
        .output()
        .unwrap_or_else(|e| panic!("sh: {e}"));
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The name of the device with `mac` in the namespace the test runs in (the guest's root).
fn device_with_mac(mac: &str) -> String {
    let out = root_sh(&format!(
        "for d in /sys/class/net/*; do [ \"$(cat $d/address)\" = {mac} ] && basename $d; done; true"
    ));
    let name = out.trim();
    assert!(
        !name.is_empty(),
        "no NIC with MAC {mac}: this test needs the amd64 guest's e1000e NICs (cargo xtask test)"
    );
    name.to_string()
}

/// The router's LAN bridge when the NIC is its port.
const BRIDGE: &str = "br-lan";

/// The test bed with the LAN moved from the veth pair onto the two e1000e NICs: the router's
/// one renamed [`NIC`] (with `bridged`, the port of a bridge [`BRIDGE`] that has the LAN
/// addresses, as on OpenWrt), the LAN host's `nic0`, the addresses, routes and FORWARD rule
/// with them. The NICs go back to the guest's root namespace when the namespaces are deleted.
fn nic_testbed(tag: &str, bridged: bool) -> Testbed {
    let (router_nic, host_nic) = (
        device_with_mac(ROUTER_NIC_MAC),
        device_with_mac(HOST_NIC_MAC),
    );
    let mut tb = Testbed::new(tag);
    root_sh(&format!(
        "ip link set {router_nic} netns {r}
         ip link set {host_nic} netns {l}",
        r = tb.router.name(),
        l = tb.lan.name()
    ));
    let driver = tb.router.sh(&format!(
        "ip link set {router_nic} name {NIC}; ethtool -i {NIC}"
    ));
    assert!(
        driver.contains("driver: e1000e"),
        "{NIC} should be an e1000e NIC: {driver}"
    );
    let l3 = if bridged {
        tb.router.sh(&format!(
            "ip link add {BRIDGE} type bridge
             ip link set {NIC} master {BRIDGE}
             ip link set {BRIDGE} up"
        ));
        BRIDGE
    } else {
        NIC
    };
    tb.router.sh(&format!(
        "ip addr flush dev {LAN_IF}
         ip link set {LAN_IF} down
         ip link set {NIC} up
         ip addr add {ROUTER_LAN_V4}/24 dev {l3}
         ip addr add {ROUTER_LAN_V6}/64 dev {l3} nodad
         for t in iptables ip6tables; do $t -w -A FORWARD -i {l3} -o {WAN_IF} -j ACCEPT; done"
    ));
    tb.lan.sh(&format!(
        "ip addr flush dev {HOST_IF}
         ip link set {HOST_IF} down
         ip link set {host_nic} name nic0
         ip link set nic0 up
         ip addr add {LAN_HOST_V4}/24 dev nic0
         ip addr add {LAN_HOST_V6}/64 dev nic0 nodad
         ip route add default via {ROUTER_LAN_V4}
         ip -6 route add default via {ROUTER_LAN_V6}
         for i in $(seq 20); do ping -c1 -W1 {ROUTER_LAN_V4} >/dev/null && \
           ping -6 -c1 -W1 {ROUTER_LAN_V6} >/dev/null && exit 0; done
         echo 'the router is not reachable over the e1000e NICs' >&2; exit 1"
    ));
    tb.lan_wire = NIC.to_string();
    tb
}

/// The router's LAN port an e1000e NIC, the WAN a veth with native XDP, the default config
/// (`datapath = "auto"`): the NIC refuses native XDP, so the TC fast path runs on it (not
/// generic XDP, which only counts), and the WAN keeps native XDP with the TC program behind it
/// for the replies routed into the NIC (e1000e cannot transmit XDP frames). UDP (v4 with
/// MASQUERADE, v6) and TCP are fast-pathed both ways, intact, while netfilter's ESTABLISHED
/// rule sees none of it; with the fast path off the same exchange goes through netfilter (the
/// negative control in `traffic_is_fast_pathed`). Wire packets are the NIC's own counters.
#[test]
#[ignore = "needs e1000e NICs: cargo xtask test runs it in the amd64 Debian-kernel guest"]
fn e1000e_lan_port_gets_the_tc_fast_path() {
    if !ready("nic::e1000e_lan_port_gets_the_tc_fast_path") {
        return;
    }
    let mut tb = nic_testbed("nic", false);
    tb.start_daemon_config(&format!(
        "[[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{NIC}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    let (nic, wan) = (st.iface(NIC), st.iface(WAN_IF));
    println!(
        "{NIC} (e1000e): {} ({:?}), XDP transmit {}; {WAN_IF}: {}, TC hand-over {}",
        nic.attach_mode, nic.datapath_because, nic.xdp_xmit, wan.attach_mode, wan.tc_handoff
    );
    assert_eq!(nic.attach_mode, "tc", "log:\n{}", tb.daemon().log_tail());
    assert!(
        nic.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("native XDP was refused")),
        "{nic:?}"
    );
    assert_eq!(
        (wan.attach_mode.as_str(), wan.tc_handoff),
        ("native", true),
        "{wan:?}"
    );
    traffic_is_fast_pathed(&tb, 7600, NIC, WAN_IF, "through an e1000e LAN port");
}

/// The OpenWrt layout on a real driver: the LAN a bridge whose port is the e1000e NIC, the WAN a
/// veth with native XDP, the default config. The port gets the TC fast path (the bridge's
/// other layers as on XDP: routed as the bridge, FDB to find the port), and the WAN hands the
/// replies routed into the bridge, whose FDB names the e1000e port (no XDP transmit), to the TC
/// program behind its XDP. UDP v4/v6 and TCP fast-pathed both ways, the negative control as
/// above.
#[test]
#[ignore = "needs e1000e NICs: cargo xtask test runs it in the amd64 Debian-kernel guest"]
fn e1000e_bridge_port_gets_the_tc_fast_path() {
    if !ready("nic::e1000e_bridge_port_gets_the_tc_fast_path") {
        return;
    }
    let mut tb = nic_testbed("nib", true);
    tb.start_daemon_config(&format!(
        "[[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{BRIDGE}\"\nrole = \"lan\"\n"
    ));
    let (st, ok) = tb
        .daemon()
        .wait_status(std::time::Duration::from_secs(5), |s| {
            s.interfaces
                .iter()
                .any(|i| i.name == NIC && i.attach_mode == "tc")
        });
    let (nic, wan) = (st.iface(NIC), st.iface(WAN_IF));
    println!(
        "{NIC} (e1000e, port of {:?}): {} ({:?}); {WAN_IF}: {}, TC hand-over {}",
        nic.bridge, nic.attach_mode, nic.datapath_because, wan.attach_mode, wan.tc_handoff
    );
    assert!(ok, "{NIC} should run TC: log:\n{}", tb.daemon().log_tail());
    assert_eq!(nic.bridge.as_deref(), Some(BRIDGE));
    assert_eq!(
        (wan.attach_mode.as_str(), wan.tc_handoff),
        ("native", true),
        "{wan:?}"
    );
    traffic_is_fast_pathed(&tb, 7700, NIC, WAN_IF, "through a bridge of an e1000e port");
}
