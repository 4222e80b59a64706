//! A WAN reached through a tunnel device, as in the kernel flowtable selftest's tunnel cases:
//! the router's WAN addresses live on a VXLAN device (`vxlan0`, VNI 42) over its Ethernet port,
//! whose underlay is 192.168.77.0/24. Whichever way the user names the WAN, every byte arrives
//! intact both ways and nothing is counted as forwarded that did not leave the router.
//!
//! ```text
//!  lan host ⇄ eth1 router eth0 (192.168.77.1) ⇄ eth0 wan host (192.168.77.2)
//!                     vxlan0 (10.0.2.1)  ~~~~~~~~~~  vxlan0 (10.0.2.2)
//! ```
//! And an L3 tunnel (no link-layer header, as WireGuard's `wg0`): the WAN addresses on TUN
//! devices, `tun0` in the router and `tun1` at the WAN host, the test relaying packets between
//! them ([`TunWire`]).

use std::{
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use xdp_router_tests::{
    netns::Netns,
    packet::{
        ETH_LEN, Spec, Transport, with_bad_ipv4_checksum, with_bad_l4_checksum, with_ipv4_frag,
        with_ipv4_options, with_udp_len, with_zero_udp_checksum,
    },
    testbed::{
        Capture, HOST_IF, LAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6, Status, Testbed, UdpEcho,
        WAN_HOST_V4, WAN_HOST_V6, WAN_IF, any_v4, offload_udp_family, ready, route_wan_through,
        traffic_is_fast_pathed, udp_and_tcp_are_intact, udp_socket, wan_lan_interfaces, wan_v4,
    },
};

const TUNNEL: &str = "vxlan0";

/// Connections the daemon skipped because their path leaves through an unmanaged device.
fn path_not_managed(st: &Status) -> u64 {
    st.conntrack
        .skipped
        .get("path_not_managed")
        .copied()
        .unwrap_or(0)
}

/// Moves `ns`'s WAN addresses from `dev` onto a VXLAN device over it, with `underlay` (the
/// last octet of 192.168.77.x) on `dev` and the peer's underlay as the remote.
fn move_onto_vxlan(ns: &Netns, dev: &str, underlay: u8, peer: u8, v4: &str, v6: &str) {
    ns.sh(&format!(
        "ip addr flush dev {dev} scope global
         ip addr add 192.168.77.{underlay}/24 dev {dev}
         ip link add {TUNNEL} type vxlan id 42 local 192.168.77.{underlay} remote 192.168.77.{peer} dstport 4789 dev {dev}
         ip addr add {v4}/24 dev {TUNNEL}
         ip addr add {v6}/64 dev {TUNNEL} nodad
         ip link set {TUNNEL} up
         ethtool -K {TUNNEL} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true"
    ));
}

/// The test bed with the WAN addresses, routes, NAT and FORWARD rules moved onto vxlan0.
fn tunnel_testbed(tag: &str) -> Testbed {
    let tb = Testbed::new(tag);
    move_onto_vxlan(
        &tb.router,
        WAN_IF,
        1,
        2,
        &ROUTER_WAN_V4.to_string(),
        &ROUTER_WAN_V6.to_string(),
    );
    move_onto_vxlan(
        &tb.wan,
        HOST_IF,
        2,
        1,
        &WAN_HOST_V4.to_string(),
        &WAN_HOST_V6.to_string(),
    );
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev {TUNNEL}"
    ));
    route_wan_through(&tb, LAN_IF, TUNNEL, &format!("through {TUNNEL}"));
    tb
}

/// The WAN named as the Ethernet port under the tunnel (`name = "eth0"`): connections whose
/// path leaves through vxlan0, which the daemon does not manage, are not offloaded
/// (`path_not_managed`), the tunnel's UDP goes to the kernel (it is addressed to the router),
/// and nothing is counted as forwarded.
#[test]
fn wan_under_a_tunnel_is_left_to_the_kernel() {
    if !ready("tunnel::wan_under_a_tunnel_is_left_to_the_kernel") {
        return;
    }
    let mut tb = tunnel_testbed("tu");
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6301, "a VXLAN tunnel");
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let forwarded = d(LAN_IF, "forwarded_original") + d(WAN_IF, "forwarded_reply");
    let skipped = path_not_managed(&after);
    println!(
        "WAN under {TUNNEL}: forwarded by XDP {forwarded}; connections skipped as \
         path_not_managed {skipped}"
    );
    assert_eq!(
        forwarded, 0,
        "packets counted as forwarded although the tunnel's path is not managed"
    );
    assert!(
        skipped > 0,
        "connections through {TUNNEL} should be skipped as path_not_managed: {:?}",
        after.conntrack
    );
}

/// The WAN named as the tunnel device (`name = "vxlan0"`) with `datapath = "xdp"`: a VXLAN
/// device has no native XDP, so the program runs in generic (skb) mode there, and it cannot
/// transmit XDP frames. LAN →
/// WAN packets go to the kernel (`egress_no_xdp_xmit`), and so do replies received on vxlan0
/// (`generic_xdp`): the kernel validated their checksum in software while decapsulating, a
/// rewrite in generic XDP would leave that state stale, and the LAN host's stack would drop
/// them (before this, 199 of 200 replies redirected from vxlan0 into the LAN veth were lost
/// as UDP checksum errors at the LAN host, although their bytes were right).
#[test]
fn wan_as_a_tunnel_device_is_left_to_the_kernel() {
    if !ready("tunnel::wan_as_a_tunnel_device_is_left_to_the_kernel") {
        return;
    }
    let mut tb = tunnel_testbed("tv");
    tb.start_daemon_config(&format!(
        "datapath = \"xdp\"\n{}",
        wan_lan_interfaces(TUNNEL)
    ));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6303, "a VXLAN tunnel");
    let d =
        |iface: &str, reason: &str| after.packets(iface, reason) - before.packets(iface, reason);
    let (orig, no_xmit, reply, generic) = (
        d(LAN_IF, "forwarded_original"),
        d(LAN_IF, "egress_no_xdp_xmit"),
        d(TUNNEL, "forwarded_reply"),
        d(TUNNEL, "generic_xdp"),
    );
    let vx = after.interfaces.iter().find(|i| i.name == TUNNEL);
    println!(
        "WAN as {TUNNEL} (attached {:?}): LAN → WAN forwarded by XDP {orig}, to the kernel as \
         egress_no_xdp_xmit {no_xmit}; WAN → LAN forwarded by XDP {reply}, to the kernel as \
         generic_xdp {generic}",
        vx.map(|i| &i.attach_mode)
    );
    assert_eq!(
        vx.map(|i| i.attach_mode.as_str()),
        Some("generic"),
        "{:?}",
        after.interfaces
    );
    assert_eq!(
        (orig, reply),
        (0, 0),
        "nothing may be forwarded into or out of {TUNNEL} by XDP"
    );
    assert!(
        no_xmit > 0 && generic > 0,
        "LAN packets should be counted egress_no_xdp_xmit and WAN packets generic_xdp: \
         {after:?}"
    );
}

/// The WAN named as the tunnel device with the default `datapath = "auto"`: vxlan0 refuses
/// native XDP, so the TC fast path runs on it (on the decapsulated skbs, with the kernel's
/// checksum state, which generic XDP could not keep right), and behind native XDP on the LAN
/// veth for the packets routed into vxlan0 (no XDP transmit there). UDP both ways and TCP are
/// fast-pathed through the tunnel, intact, with the fast path off left to netfilter (the
/// negative control in `traffic_is_fast_pathed`).
#[test]
fn wan_as_a_tunnel_device_runs_the_tc_fast_path() {
    if !ready("tunnel::wan_as_a_tunnel_device_runs_the_tc_fast_path") {
        return;
    }
    let mut tb = tunnel_testbed("tw");
    tb.start_daemon_config(&wan_lan_interfaces(TUNNEL));
    let st = tb.daemon().status();
    let mode = |name: &str| {
        let i = st.iface(name);
        (i.attach_mode.clone(), i.tc_handoff)
    };
    println!(
        "{TUNNEL}: {:?}; {LAN_IF}: {:?} (mode, TC hand-over)",
        mode(TUNNEL),
        mode(LAN_IF)
    );
    assert_eq!(mode(TUNNEL), ("tc".into(), false), "{st:?}");
    assert_eq!(mode(LAN_IF), ("native".into(), true), "{st:?}");
    st.note_unmarked_handoff("tunnel::wan_as_a_tunnel_device_runs_the_tc_fast_path");
    traffic_is_fast_pathed(&tb, 6305, LAN_IF, TUNNEL, "through a VXLAN WAN on TC");
}

/// A point-to-point link without a link-layer header, like WireGuard's `wg0` (which this
/// host's kernel lacks): a TUN device (`IFF_TUN`, no packet information) in each of two
/// namespaces, and a thread that copies every packet written to one into the other.
struct TunWire {
    stop: Arc<AtomicBool>,
    relay: Option<thread::JoinHandle<u64>>,
    /// The first device's descriptor: a packet written here is received by that device.
    a: Arc<OwnedFd>,
}

/// Opens the TUN device `name` in `ns` (created there, removed when the descriptor closes).
fn open_tun(ns: &Netns, name: &str) -> OwnedFd {
    ns.run(|| {
        // SAFETY: a plain open of the TUN clone device.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "/dev/net/tun: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just opened and is owned from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ifreq is plain old data; all zero is a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: fd is a TUN clone descriptor, req a valid ifreq.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &req) };
        assert_eq!(
            rc,
            0,
            "TUNSETIFF {name}: {}",
            std::io::Error::last_os_error()
        );
        fd
    })
}

impl TunWire {
    /// `a_name` in `a` ⇄ `b_name` in `b`, both down until the caller sets them up.
    fn new(a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> TunWire {
        let (fa, fb) = (Arc::new(open_tun(a, a_name)), open_tun(b, b_name));
        let a = fa.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let relay = thread::spawn(move || {
            let mut copied = 0u64;
            let mut buf = vec![0u8; 65536];
            while !flag.load(Ordering::Relaxed) {
                let mut fds = [
                    libc::pollfd {
                        fd: fa.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                    libc::pollfd {
                        fd: fb.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    },
                ];
                // SAFETY: two valid pollfds.
                if unsafe { libc::poll(fds.as_mut_ptr(), 2, 50) } <= 0 {
                    continue;
                }
                for (from, to) in [(&*fa, &fb), (&fb, &*fa)] {
                    loop {
                        // SAFETY: buf is writable for its length.
                        let n = unsafe {
                            libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len())
                        };
                        if n <= 0 {
                            break;
                        }
                        // SAFETY: the first n bytes of buf were just read.
                        unsafe { libc::write(to.as_raw_fd(), buf.as_ptr().cast(), n as usize) };
                        copied += 1;
                    }
                }
            }
            copied
        });
        TunWire {
            stop,
            relay: Some(relay),
            a,
        }
    }

    /// Hands the IP packet `packet` to the first device as received from the wire.
    fn receive_on_a(&self, packet: &[u8]) {
        // SAFETY: a valid TUN descriptor; the buffer is valid for its length.
        let n = unsafe { libc::write(self.a.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
        assert_eq!(
            n,
            packet.len() as isize,
            "write to the TUN device: {}",
            std::io::Error::last_os_error()
        );
    }
}

impl TunWire {
    /// Stops the relay; the packets it copied.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.relay
            .take()
            .map_or(0, |t| t.join().expect("the TUN relay panicked"))
    }
}

impl Drop for TunWire {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.relay.take() {
            let _ = t.join();
        }
    }
}

/// The test bed with the WAN addresses moved from the veth onto `tun0` (router) and `tun1`
/// (WAN host), an L3 point-to-point link, and the router's NAT and FORWARD rules onto `tun0`.
fn l3_testbed(tag: &str) -> (Testbed, TunWire) {
    let tb = Testbed::new(tag);
    let wire = TunWire::new(&tb.router, "tun0", &tb.wan, "tun1");
    for (ns, dev, v4, v6) in [
        (&tb.router, "tun0", ROUTER_WAN_V4, ROUTER_WAN_V6),
        (&tb.wan, "tun1", WAN_HOST_V4, WAN_HOST_V6),
    ] {
        let eth = if dev == "tun0" { WAN_IF } else { HOST_IF };
        ns.sh(&format!(
            "ip addr flush dev {eth} scope global
             ip addr add {v4}/24 dev {dev}
             ip addr add {v6}/64 dev {dev} nodad
             ip link set {dev} up"
        ));
    }
    tb.wan.sh(&format!(
        "ip -6 route replace default via {ROUTER_WAN_V6} dev tun1"
    ));
    route_wan_through(&tb, LAN_IF, "tun0", "through tun0");
    (tb, wire)
}

/// The WAN named as an L3 device (`tun0`, standing in for WireGuard's `wg0`: no link-layer
/// header): the daemon runs the TC fast path on it whatever `datapath` says and says why in
/// `status`; its received packets start with the IP header (the family from the skb), and those
/// forwarded to the LAN get an Ethernet header pushed (`bpf_skb_change_head`). The LAN veth
/// stays native XDP and hands the packets routed into tun0 to TC behind it, whose redirect
/// into tun0 drops the Ethernet header. UDP v4/v6 and TCP are fast-pathed both ways, intact,
/// with the wire packets counted on the LAN veth and on tun0, and with the fast path off left
/// to netfilter (the negative control in `traffic_is_fast_pathed`). (Before, the daemon left
/// such a device unattached and its connections with the kernel, `path_not_managed`.)
#[test]
fn wan_as_an_l3_device_is_fast_pathed() {
    if !ready("tunnel::wan_as_an_l3_device_is_fast_pathed") {
        return;
    }
    let (mut tb, wire) = l3_testbed("tl");
    tb.wan_wire = "tun0".into();
    tb.start_daemon_config(&format!(
        "datapath = \"xdp\"\n{}",
        wan_lan_interfaces("tun0")
    ));
    let st = tb.daemon().status();
    let tun = st.iface("tun0");
    let lan = st.iface(LAN_IF);
    println!(
        "tun0: attach mode {}, because {:?}; {LAN_IF}: {} (TC hand-over {})",
        tun.attach_mode, tun.datapath_because, lan.attach_mode, lan.tc_handoff
    );
    assert_eq!(tun.attach_mode, "tc", "{st:?}");
    assert!(
        tun.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("no link-layer header")),
        "{st:?}"
    );
    assert_eq!(
        (lan.attach_mode.as_str(), lan.tc_handoff),
        ("native", true),
        "{st:?}"
    );
    st.note_unmarked_handoff("tunnel::wan_as_an_l3_device_is_fast_pathed");
    traffic_is_fast_pathed(&tb, 6307, LAN_IF, "tun0", "through an L3 WAN (TUN)");
    let skipped = path_not_managed(&tb.snapshot().status);
    drop(tb);
    let relayed = wire.finish();
    println!(
        "packets across the TUN wire {relayed}; connections skipped as path_not_managed {skipped}"
    );
    assert!(relayed > 0, "nothing crossed the TUN wire");
    assert_eq!(
        skipped, 0,
        "connections through tun0 must not be path_not_managed"
    );
}

/// Crafted replies of an offloaded UDP connection received on an L3 device (`tun0`), where the
/// TC program finds the IP header at the start of the packet: the header and checksum checks
/// that hold on Ethernet ports hold here too. Each reply is received on tun0 with the fast path
/// off, then on, and the LAN host must get the same bytes both times (nothing, where the kernel
/// drops it); with the fast path on only the valid ones are counted as forwarded.
#[test]
fn crafted_replies_on_an_l3_device_arrive_as_the_kernel_sends_them() {
    if !ready("tunnel::crafted_replies_on_an_l3_device_arrive_as_the_kernel_sends_them") {
        return;
    }
    let (mut tb, wire) = l3_testbed("tx");
    tb.start_daemon_config(&wan_lan_interfaces("tun0"));
    let server = wan_v4(6321);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp_family(&tb, &sock, server, &mut seq);
    let lan_port = sock.local_addr().expect("local address").port();
    let reply = |ttl: u8, marker: &[u8]| -> Vec<u8> {
        Spec {
            eth_src: [0; 6],
            eth_dst: [0; 6],
            src: IpAddr::V4(WAN_HOST_V4),
            dst: IpAddr::V4(ROUTER_WAN_V4),
            sport: server.port(),
            // MASQUERADE keeps the LAN port when it is free (the valid cases check it).
            dport: lan_port,
            ttl,
            transport: Transport::Udp,
            payload_len: 40,
        }
        .marked(marker)
    };
    type Craft = fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, u8, Craft, bool); 9] = [
        ("valid", 64, |f| f.to_vec(), true),
        ("ttl 1", 1, |f| f.to_vec(), false),
        (
            "bad ipv4 header checksum",
            64,
            with_bad_ipv4_checksum,
            false,
        ),
        ("bad udp checksum", 64, with_bad_l4_checksum, false),
        ("udp checksum 0 (none)", 64, with_zero_udp_checksum, true),
        (
            "ipv4 options",
            64,
            |f| with_ipv4_options(f, &[1, 1, 1, 0]),
            false,
        ),
        ("first fragment", 64, |f| with_ipv4_frag(f, 0x2000), false),
        (
            "udp length past the datagram",
            64,
            |f| with_udp_len(f, 60),
            false,
        ),
        ("valid again", 64, |f| f.to_vec(), true),
    ];
    let capture = Capture::open(&tb.lan, HOST_IF);
    let mut outcomes: Vec<Vec<Vec<Vec<u8>>>> = Vec::new();
    for on in [false, true] {
        tb.daemon().set_fastpath(on);
        let mut got = Vec::new();
        for (n, (name, ttl, craft, forwardable)) in cases.iter().enumerate() {
            // The same in both halves: the frames are compared byte for byte.
            let marker = [b"XL3C".as_slice(), &[n as u8]].concat();
            let packet = craft(&reply(*ttl, &marker))[ETH_LEN..].to_vec();
            while capture.next_incoming(Duration::from_millis(20)).is_some() {}
            let before = tb.snapshot();
            wire.receive_on_a(&packet);
            let arrived = capture.arrivals(&marker, Duration::from_millis(300));
            let after = tb.snapshot();
            let forwarded = after.packets_since(&before, "tun0", "forwarded_reply");
            println!(
                "fast path {}: {name}: {} frame(s) at the LAN host, forwarded by the fast path \
                 {forwarded}; counted: {}",
                if on { "on" } else { "off" },
                arrived.len(),
                after.grown_since(&before)
            );
            let expected = u64::from(on && *forwardable);
            assert_eq!(forwarded, expected, "{name}: forwarded by the fast path");
            got.push(arrived);
        }
        outcomes.push(got);
    }
    let differ: Vec<&str> = cases
        .iter()
        .zip(outcomes[0].iter().zip(&outcomes[1]))
        .filter(|(_, (off, on))| off != on)
        .map(|((name, ..), _)| *name)
        .collect();
    assert!(
        outcomes[0][0].len() == 1 && outcomes[0][8].len() == 1,
        "the valid replies must reach the LAN host (NAT port not kept?)"
    );
    assert!(
        differ.is_empty(),
        "arrived differently with the fast path on: {differ:?}"
    );
    assert_eq!(echo.finish().corrupt, 0);
    drop(tb);
    assert!(wire.finish() > 0, "nothing crossed the TUN wire");
}
