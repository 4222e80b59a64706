//! A bridged LAN as OpenWrt and most mini-PC routers have it, with the config a user writes
//! (`[[interface]] name = "br-lan"`): the program runs on the bridge's ports, routes as the
//! bridge, and redirects traffic to the LAN to the port the bridge FDB names.
//!
//! ```text
//!  h1 eth0 ⇄ p1 ┐
//!               br-lan (10.0.1.1) router eth0 (10.0.2.1) ⇄ eth0 wan host (10.0.2.2)
//!  h2 eth0 ⇄ p2 ┘
//!  10.0.1.2 / 10.0.1.3
//! ```
//! Both LAN hosts are NATed to the WAN (MASQUERADE, FORWARD policy DROP as in the testbed);
//! LAN↔LAN is accepted, as routers do: with `br_netfilter` (built into this kernel) bridged
//! frames pass the FORWARD chain too.
//! Run as root with one test thread (`cargo xtask test`).

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        Daemon, PING_DGRAM, PING_TICK, Status, TempDir, UdpEcho, any_v4, established_packets,
        ping_pong, ready, refuse_native_xdp_behind, udp_socket,
    },
};

mod vlan;

const H1: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 2);
const H2: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 3);
const GW: Ipv4Addr = Ipv4Addr::new(10, 0, 1, 1);
const WAN_HOST: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);

/// The bridged router and its hosts.
struct Bed {
    // Field order is drop order: the daemon stops before its namespace disappears.
    daemon: Option<Daemon>,
    router: Netns,
    h1: Netns,
    h2: Netns,
    wan: Netns,
    dir: TempDir,
    /// Global settings the daemon's config starts with (`datapath = "tc"`), if any.
    global: String,
}

/// Packets received by `ifname` in `ns` (wire packets: GRO is off on the router's veths).
fn rx_packets(ns: &Netns, ifname: &str) -> u64 {
    let path = format!("/sys/class/net/{ifname}/statistics/rx_packets");
    ns.exec_ok("cat", &[&path]).trim().parse().unwrap_or(0)
}

/// The counters of `ifaces` that rose from `before` to `after`: "eth0 forwarded_reply +30, …".
fn counter_deltas(before: &Status, after: &Status, ifaces: &[&str]) -> String {
    let deltas: Vec<String> = after
        .counters
        .iter()
        .filter(|c| ifaces.contains(&c.interface.as_str()))
        .map(|c| (c, c.packets - counter(before, &c.interface, &c.reason)))
        .filter(|(_, n)| *n > 0)
        .map(|(c, n)| format!("{} {} +{n}", c.interface, c.reason))
        .collect();
    deltas.join(", ")
}

/// One counter of `status` (packets).
fn counter(st: &Status, iface: &str, reason: &str) -> u64 {
    st.counters
        .iter()
        .filter(|c| c.interface == iface && c.reason == reason)
        .map(|c| c.packets)
        .sum()
}

impl Bed {
    /// 20 datagrams from h1 (`s1`) to h2 and back within the LAN: all echoed intact and
    /// counted `bridged_by_kernel` on p1 (the kernel bridge carries them, not the fast path).
    fn lan_to_lan_is_bridged(&self, s1: &UdpSocket, what: &str) {
        let before = self.daemon().status();
        let lan_echo = UdpEcho::start(&self.h2, SocketAddr::new(H2.into(), 7777));
        let pp = ping_pong(
            s1,
            SocketAddr::new(H2.into(), 7777),
            5_000_000,
            20,
            100,
            PING_TICK,
        );
        let after = self.daemon().status();
        let bridged = counter(&after, "p1", "bridged_by_kernel")
            - counter(&before, "p1", "bridged_by_kernel");
        println!(
            "{what}: {} of {} echoed; {bridged} frames on p1 bridged by the kernel",
            pp.good, pp.sent
        );
        assert_eq!(
            (pp.good, pp.lost),
            (pp.sent, 0),
            "{what} through the bridge: {pp:?}"
        );
        assert!(
            bridged >= pp.sent,
            "{what} frames should be counted bridged_by_kernel: {bridged}"
        );
        assert_eq!(lan_echo.finish().corrupt, 0);
    }

    fn new(tag: &str) -> Bed {
        let bed = Bed {
            daemon: None,
            router: Netns::new(&format!("{tag}r")),
            h1: Netns::new(&format!("{tag}1")),
            h2: Netns::new(&format!("{tag}2")),
            wan: Netns::new(&format!("{tag}w")),
            dir: TempDir::new(),
            global: String::new(),
        };
        bed.router.veth("p1", &bed.h1, "eth0");
        bed.router.veth("p2", &bed.h2, "eth0");
        bed.router.veth("eth0", &bed.wan, "eth0");
        for (h, a) in [(&bed.h1, H1), (&bed.h2, H2)] {
            host_on(h, "eth0", a);
        }
        bed.wan.sh(&format!(
            "ip addr add {WAN_HOST}/24 dev eth0
             ethtool -K eth0 tx off rx off gro on >/dev/null"
        ));
        bed.router.sh(&format!(
            "sysctl -qw net.ipv4.ip_forward=1
             ip link add br-lan type bridge
             ip link set br-lan address 02:00:00:00:01:01
             for p in p1 p2; do ip link set $p master br-lan; done
             ip addr add {GW}/24 dev br-lan
             ip addr add 10.0.2.1/24 dev eth0
             ip link set br-lan up
             for i in p1 p2 eth0; do ethtool -K $i tx off rx off gro off gso off tso off >/dev/null; done
             iptables -w -t nat -A POSTROUTING -o eth0 -j MASQUERADE
             iptables -w -P FORWARD DROP
             iptables -w -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
             iptables -w -A FORWARD -i br-lan -o eth0 -j ACCEPT
             iptables -w -A FORWARD -i br-lan -o br-lan -j ACCEPT"
        ));
        for h in [&bed.h1, &bed.h2] {
            h.sh(&format!("ping -c1 -W2 {WAN_HOST} >/dev/null"));
        }
        bed
    }

    fn start_daemon(&mut self) -> &Daemon {
        self.start_daemon_with("")
    }

    /// The daemon with `extra` appended to the config (more `[[interface]]` tables).
    fn start_daemon_with(&mut self, extra: &str) -> &Daemon {
        self.start_daemon_lan(&format!(
            "[[interface]]\nname = \"br-lan\"\nrole = \"lan\"\n{extra}"
        ))
    }

    /// The daemon with the WAN (eth0) and the `[[interface]]` tables `lan` in its config.
    fn start_daemon_lan(&mut self, lan: &str) -> &Daemon {
        let socket = self.dir.path().join("control.sock");
        let config = self.dir.path().join("xdp-routerd.toml");
        fs::write(
            &config,
            format!(
                "{}control_socket = \"{}\"\nxdp_mode = \"native\"\nflow_capacity = 4096\n\
                 keepalive_interval_ms = 2000\nlog_level = \"debug\"\n\
                 verdict_max_age_ms = {}\n\
                 [[interface]]\nname = \"eth0\"\nrole = \"wan\"\n\
                 {lan}",
                self.global,
                socket.display(),
                // Verdicts kept, as on the `Testbed` (see `Testbed::verdict_max_age_ms`): the
                // tests count every packet's reason.
                0
            ),
        )
        .expect("write config");
        let d = Daemon::start(&self.router, &config, &socket, Path::new(self.dir.path()));
        self.daemon.insert(d)
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("daemon started")
    }

    /// Waits until the port `port` of br-lan is attached natively.
    fn wait_port(&self, port: &str) {
        self.wait_port_on(port, "native");
    }

    /// Waits until the port `port` of br-lan runs the fast path in `mode` ("native", "tc").
    fn wait_port_on(&self, port: &str, mode: &str) {
        let (st, ok) = self.daemon().wait_status(Duration::from_secs(5), |s| {
            s.interfaces.iter().any(|i| {
                i.name == port && i.bridge.as_deref() == Some("br-lan") && i.attach_mode == mode
            })
        });
        assert!(
            ok,
            "port {port} of br-lan should be attached {mode}: {:?}\n{}",
            st.interfaces,
            self.daemon().log_tail()
        );
    }

    /// Ping-pongs from `sock` until the daemon offloads `n` connections (8 s at most).
    fn offload(&self, sock: &UdpSocket, server: SocketAddr, seq: &mut u64, n: u64) {
        let deadline = Instant::now() + Duration::from_secs(8);
        loop {
            let pp = ping_pong(sock, server, *seq, 10, PING_DGRAM, PING_TICK);
            *seq += pp.sent;
            assert_eq!((pp.good, pp.lost), (pp.sent, 0), "before offload: {pp:?}");
            let st = self.daemon().status();
            if st.conntrack.offloaded >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not offloaded within 8 s: {:?}\n{}",
                st.conntrack,
                self.router.exec_ok("conntrack", &["-L", "-p", "udp"])
            );
        }
    }

    /// A UDP echo server on the WAN host at `port`, and one connection to it from each LAN
    /// host (h2's bound to `h2_src`), offloaded: the server, the echo, the sockets and their
    /// next sequence numbers (apart, so the two never collide).
    fn two_offloaded(
        &self,
        port: u16,
        h2_src: SocketAddr,
    ) -> (SocketAddr, UdpEcho, [UdpSocket; 2], [u64; 2]) {
        let server = SocketAddr::new(WAN_HOST.into(), port);
        let echo = UdpEcho::start(&self.wan, server);
        let s1 = udp_socket(&self.h1, any_v4(), 64);
        let s2 = udp_socket(&self.h2, h2_src, 64);
        let mut seqs = [0, 1_000_000];
        self.offload(&s1, server, &mut seqs[0], 1);
        self.offload(&s2, server, &mut seqs[1], 2);
        (server, echo, [s1, s2], seqs)
    }
}

/// A LAN host on `ifname` with address `addr`, default route via the bridge, GRO on (so the
/// router's redirects into the veth are accepted), checksum offload off.
fn host_on(h: &Netns, ifname: &str, addr: Ipv4Addr) {
    h.sh(&format!(
        "ip addr add {addr}/24 dev {ifname}
         ip link set {ifname} up
         ethtool -K {ifname} tx off rx off gro on >/dev/null
         ip route replace default via {GW}"
    ));
}

/// Sends 30 datagrams from `sock` (on a LAN host behind `port`) and checks what the fast path
/// did: returns (sent, forwarded original on `port`, forwarded reply on eth0, wire packets on
/// `port`, ESTABLISHED rule delta).
fn measure(bed: &Bed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64, port: &str) -> [u64; 5] {
    measure_on(bed, sock, server, seq, port, port)
}

/// [`measure`], with the originals counted on `counted_on` (a VLAN device over the bridge
/// counts the frames it takes from the port).
fn measure_on(
    bed: &Bed,
    sock: &UdpSocket,
    server: SocketAddr,
    seq: &mut u64,
    port: &str,
    counted_on: &str,
) -> [u64; 5] {
    // Arm both directions (the kernel forwards their next packets).
    let arm = ping_pong(sock, server, *seq, 2, PING_DGRAM, PING_TICK);
    *seq += arm.sent;
    let before = bed.daemon().status();
    let (rx0, est0) = (
        rx_packets(&bed.router, port),
        established_packets(&bed.router, "iptables"),
    );
    let pp = ping_pong(sock, server, *seq, 30, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = bed.daemon().status();
    let (rx1, est1) = (
        rx_packets(&bed.router, port),
        established_packets(&bed.router, "iptables"),
    );
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "every datagram must come back intact: {pp:?}"
    );
    let d = |i: &str, r: &str| counter(&after, i, r) - counter(&before, i, r);
    println!(
        "counters: {}",
        counter_deltas(&before, &after, &[port, counted_on, "eth0"])
    );
    [
        pp.sent,
        d(counted_on, "forwarded_original"),
        d("eth0", "forwarded_reply"),
        rx1 - rx0,
        est1 - est0,
    ]
}

/// A LAN connection through the bridge: its socket, the port its host is behind, the interface
/// its originals are counted on, and what it is.
type Via<'a> = (&'a UdpSocket, &'a str, &'a str, &'a str);

/// For each offloaded connection of `cases` (next sequence numbers in `seqs`): all of 30
/// datagrams each way forwarded by the fast path with netfilter seeing none; then, the
/// negative control, with the fast path off none by the fast path and the kernel's
/// ESTABLISHED rule seeing them. The fast path is on again afterwards.
fn on_and_off(bed: &Bed, server: SocketAddr, cases: &[Via], seqs: &mut [u64]) {
    for ((sock, port, counted_on, what), seq) in cases.iter().zip(seqs.iter_mut()) {
        let [sent, orig, reply, wire, est] = measure_on(bed, sock, server, seq, port, counted_on);
        println!(
            "{what}: {sent} datagrams each way; fast path {orig} original (on {counted_on}), \
             {reply} reply (on eth0, redirected to {port}); {wire} packets on {port}'s wire: \
             share {:.0} %; FORWARD ESTABLISHED +{est}",
            100.0 * orig as f64 / wire.max(1) as f64
        );
        assert_eq!((orig, reply), (sent, sent), "{what}: all fast-pathed");
        assert!(
            est <= 2,
            "{what}: netfilter saw {est} packets of offloaded flows"
        );
    }
    bed.daemon().set_fastpath(false);
    for ((sock, port, counted_on, what), seq) in cases.iter().zip(seqs.iter_mut()) {
        let [sent, orig, reply, _, est] = measure_on(bed, sock, server, seq, port, counted_on);
        println!(
            "{what}, fast path off: {orig} original / {reply} reply by the fast path; \
             ESTABLISHED +{est}"
        );
        assert_eq!((orig, reply), (0, 0), "{what}: fast path off");
        assert!(
            est >= sent,
            "{what}: the kernel should carry them: ESTABLISHED +{est}"
        );
    }
    bed.daemon().set_fastpath(true);
}

/// Two LAN hosts on two ports, both NATed to the WAN: their connections are forwarded by XDP
/// on the ports (LAN→WAN) and redirected to the right port (WAN→LAN, via the bridge FDB),
/// without netfilter seeing them; LAN↔LAN traffic stays with the kernel bridge; a host that
/// moves to a new port (added live) keeps its offloaded connection working.
#[test]
fn bridged_lan_is_fast_pathed() {
    if !ready("bridge::bridged_lan_is_fast_pathed") {
        return;
    }
    let mut bed = Bed::new("br");
    bed.start_daemon();
    bed.wait_port("p1");
    bed.wait_port("p2");
    let st = bed.daemon().status();
    let br = st.interfaces.iter().find(|i| i.name == "br-lan").unwrap();
    assert_eq!(br.attach_mode, "ports", "{:?}", st.interfaces);

    let (server, echo, [s1, s2], [mut q1, mut q2]) = bed.two_offloaded(9999, any_v4());
    for (sock, seq, port) in [(&s1, &mut q1, "p1"), (&s2, &mut q2, "p2")] {
        let [sent, orig, reply, wire, est] = measure(&bed, sock, server, seq, port);
        println!(
            "{port}: {sent} datagrams each way; fast path {orig} original (on {port}), {reply} \
             reply (on eth0, redirected to {port}); {wire} packets on {port}'s wire: share {:.0} %; \
             FORWARD ESTABLISHED +{est}",
            100.0 * orig as f64 / wire.max(1) as f64
        );
        assert_eq!(
            (orig, reply),
            (sent, sent),
            "all of {port}'s datagrams fast-pathed"
        );
        assert!(est <= 2, "netfilter saw {est} packets of offloaded flows");
    }

    // A port whose host has neither XDP nor GRO cannot take redirected frames: replies to h2
    // go through the kernel (egress_no_xdp_xmit), none lost, until GRO is back on.
    bed.h2.sh("ethtool -K eth0 gro off >/dev/null");
    let (st, ok) = bed.daemon().wait_status(Duration::from_secs(3), |s| {
        s.interfaces.iter().any(|i| i.name == "p2" && !i.xdp_xmit)
    });
    assert!(
        ok,
        "p2 should stop being a redirect target: {:?}",
        st.interfaces
    );
    let before = bed.daemon().status();
    let [sent, orig, reply, _, _] = measure(&bed, &s2, server, &mut q2, "p2");
    let after = bed.daemon().status();
    let no_xmit = counter(&after, "eth0", "egress_no_xdp_xmit")
        - counter(&before, "eth0", "egress_no_xdp_xmit");
    println!(
        "p2 without GRO: {sent} datagrams; fast path {orig} original, {reply} reply; {no_xmit} \
         replies to the kernel as egress_no_xdp_xmit"
    );
    assert_eq!((orig, reply), (sent, 0));
    assert!(
        no_xmit >= sent,
        "replies counted egress_no_xdp_xmit: {no_xmit}"
    );
    bed.h2.sh("ethtool -K eth0 gro on >/dev/null");
    let (st, ok) = bed.daemon().wait_status(Duration::from_secs(3), |s| {
        s.interfaces.iter().any(|i| i.name == "p2" && i.xdp_xmit)
    });
    assert!(
        ok,
        "p2 should be a redirect target again: {:?}",
        st.interfaces
    );

    // A shaper added to a port live: replies to h2 stay in the kernel (egress_shaped, through
    // the shaper) until it is removed; a port is judged by its own qdiscs, followed live.
    bed.router
        .sh("tc qdisc replace dev p2 root handle 1: htb default 1
         tc class add dev p2 parent 1: classid 1:1 htb rate 1gbit");
    let (st, ok) = bed.daemon().wait_status(Duration::from_secs(3), |s| {
        s.interfaces.iter().any(|i| i.name == "p2" && i.shaped)
    });
    assert!(ok, "p2 should be shaped: {:?}", st.interfaces);
    let before = bed.daemon().status();
    let [sent, orig, reply, _, _] = measure(&bed, &s2, server, &mut q2, "p2");
    let after = bed.daemon().status();
    let shaped =
        counter(&after, "eth0", "egress_shaped") - counter(&before, "eth0", "egress_shaped");
    println!(
        "p2 shaped by htb: {sent} datagrams; fast path {orig} original, {reply} reply; {shaped} \
         replies to the kernel as egress_shaped"
    );
    assert_eq!((orig, reply), (sent, 0));
    assert!(shaped >= sent, "replies counted egress_shaped: {shaped}");
    bed.router.sh("tc qdisc del dev p2 root");
    let (st, ok) = bed.daemon().wait_status(Duration::from_secs(3), |s| {
        s.interfaces.iter().any(|i| i.name == "p2" && !i.shaped)
    });
    assert!(ok, "p2 should no longer be shaped: {:?}", st.interfaces);

    // The bridge never sees the frames XDP forwards: with a 1 s ageing time h2's FDB entry
    // ages out during the transfer; its next frame goes to the kernel (bridge_learning), the
    // bridge learns it again and the replies are redirected again instead of being flooded
    // by the kernel (bridge_fdb_miss) until the transfer ends.
    bed.router
        .sh("ip link set br-lan type bridge ageing_time 100");
    let arm = ping_pong(&s2, server, q2, 2, PING_DGRAM, PING_TICK);
    q2 += arm.sent;
    let before = bed.daemon().status();
    let pp = ping_pong(&s2, server, q2, 150, PING_DGRAM, PING_TICK);
    let after = bed.daemon().status();
    bed.router
        .sh("ip link set br-lan type bridge ageing_time 30000");
    let d = |i: &str, r: &str| counter(&after, i, r) - counter(&before, i, r);
    let (reply, learning, miss) = (
        d("eth0", "forwarded_reply"),
        d("p2", "bridge_learning"),
        d("eth0", "bridge_fdb_miss"),
    );
    println!(
        "ageing 1 s, {} datagrams over {:.1} s: {reply} replies fast-pathed, {miss} FDB misses, \
         {learning} frames to the kernel bridge to learn from",
        pp.sent,
        pp.sent as f64 * PING_TICK.as_secs_f64()
    );
    assert_eq!((pp.good, pp.lost), (pp.sent, 0), "{pp:?}");
    assert!(
        learning >= 1,
        "h2's aged-out entry should have been learned again"
    );
    assert!(
        reply * 10 >= pp.sent * 9,
        "replies should stay on the fast path across FDB ageing: {reply} of {}",
        pp.sent
    );

    // LAN↔LAN: bridged by the kernel, counted, delivered.
    bed.lan_to_lan_is_bridged(&s1, "LAN↔LAN");

    // h1 moves to a new port p3 (same MAC and address): the port is attached live and the FDB
    // move (RTM_NEWNEIGH) redirects the replies to p3.
    let mac = bed.h1.exec_ok("cat", &["/sys/class/net/eth0/address"]);
    bed.router.veth("p3", &bed.h1, "eth1");
    bed.router.sh(
        "ethtool -K p3 tx off rx off gro off gso off tso off >/dev/null
         ip link set p3 master br-lan",
    );
    bed.wait_port("p3");
    // eth0 stays up with another MAC, so p1 keeps forwarding (STP state) and only the FDB
    // move tells the fast path where h1 is now: a frame still sent to p1 would be dropped by
    // h1's eth0 (not its MAC any more).
    bed.h1.sh(&format!(
        "ip addr flush dev eth0
         ip link set eth0 address 02:00:00:00:0e:01
         ip link set eth1 address {}",
        mac.trim()
    ));
    host_on(&bed.h1, "eth1", H1);
    let [sent, orig, reply, wire, _] = measure(&bed, &s1, server, &mut q1, "p3");
    let fdb = bed
        .router
        .exec_ok("bridge", &["fdb", "show", "br", "br-lan"]);
    println!(
        "after the move to p3: {sent} datagrams; fast path {orig} original (on p3), {reply} reply; \
         {wire} packets on p3's wire"
    );
    assert!(
        fdb.lines()
            .any(|l| l.starts_with(mac.trim()) && l.contains("dev p3")),
        "the kernel should have learned h1 on p3:\n{fdb}"
    );
    assert_eq!(
        (orig, reply),
        (sent, sent),
        "h1's flow fast-pathed through p3 after the move"
    );
    assert_eq!(echo.finish().corrupt, 0);
}

/// nftables `bridge` family chains (what `ebtables-nft` writes) see every frame a port passes
/// up to the IP layer, and XDP on the port jumps over them. A `prerouting` chain that drops
/// h1's large UDP datagrams, added while h1's connection is offloaded: the small ones still
/// reach the WAN (through the kernel, counted `ingress_hook` on p1), the large ones never do,
/// as without the fast path. h2's port is hooked the same way (a bridge chain is not per port);
/// the WAN's own XDP is untouched.
#[test]
fn bridge_family_chains_apply_to_offloaded_flows() {
    if !ready("bridge::bridge_family_chains_apply_to_offloaded_flows") {
        return;
    }
    let mut bed = Bed::new("bf");
    bed.start_daemon();
    bed.wait_port("p1");
    let server = SocketAddr::new(WAN_HOST.into(), 9999);
    let echo = UdpEcho::start(&bed.wan, server);
    let s1 = udp_socket(&bed.h1, any_v4(), 64);
    let mut q1 = 0;
    bed.offload(&s1, server, &mut q1, 1);
    let [sent, orig, ..] = measure(&bed, &s1, server, &mut q1, "p1");
    assert_eq!(
        orig, sent,
        "h1's flow should be fast-pathed before the rule"
    );

    bed.router.sh("nft add table bridge lanfilter
         nft add chain bridge lanfilter pre '{ type filter hook prerouting priority 0; }'
         nft add rule bridge lanfilter pre ip saddr 10.0.1.2 udp length '>' 300 counter drop");
    // The ruleset change withdraws the flow; a frame is judged by the kernel again and the
    // hook is read within the second.
    std::thread::sleep(Duration::from_millis(1000));
    let before = bed.daemon().status();
    let small = ping_pong(&s1, server, q1, 30, PING_DGRAM, PING_TICK);
    q1 += small.sent;
    let large = ping_pong(&s1, server, q1, 5, 600, PING_TICK);
    let after = bed.daemon().status();
    let d = |i: &str, r: &str| counter(&after, i, r) - counter(&before, i, r);
    let (hooked, fast) = (d("p1", "ingress_hook"), d("p1", "forwarded_original"));
    let dropped = bed
        .router
        .exec_ok("nft", &["list", "chain", "bridge", "lanfilter", "pre"]);
    println!(
        "bridge prerouting chain dropping h1's UDP > 300 bytes: {} of {} small datagrams \
         echoed, {} of {} large; on p1 {hooked} to the kernel as ingress_hook, {fast} \
         fast-pathed\n{dropped}",
        small.good, small.sent, large.good, large.sent
    );
    assert_eq!(
        (small.good, small.lost),
        (small.sent, 0),
        "small datagrams pass the rule: {small:?}"
    );
    assert_eq!(
        large.good, 0,
        "the bridge chain must drop h1's large datagrams, as it does without the fast path: \
         {large:?}"
    );
    assert_eq!(fast, 0, "no frame of p1 may jump over the bridge chain");
    assert!(
        hooked >= small.sent + large.sent,
        "p1's frames should be counted ingress_hook: {hooked}"
    );
    assert_eq!(echo.finish().corrupt, 0);
}

/// A bridge port that refuses native XDP (its host's veth transmits on more queues than the
/// port receives on, as a port whose NIC has no XDP would): with the default
/// `datapath = "auto"` the TC fast path runs on it and XDP on the other port. Both hosts'
/// connections are fast-pathed both ways with netfilter seeing none of it (h2's by TC from p2
/// to the WAN and by XDP from the WAN into p2, which can take XDP frames), and with the fast
/// path off the kernel carries them all.
#[test]
fn a_bridge_port_without_native_xdp_gets_the_tc_fast_path() {
    if !ready("bridge::a_bridge_port_without_native_xdp_gets_the_tc_fast_path") {
        return;
    }
    let mut bed = Bed::new("bt");
    refuse_native_xdp_behind(&bed.h2, "eth0");
    bed.start_daemon();
    bed.wait_port("p1");
    let st = bed.daemon().status();
    let p2 = st.iface("p2");
    println!(
        "p2: {} ({:?}), bridge {:?}",
        p2.attach_mode, p2.datapath_because, p2.bridge
    );
    assert_eq!(
        (p2.attach_mode.as_str(), p2.bridge.as_deref()),
        ("tc", Some("br-lan")),
        "{:?}\n{}",
        st.interfaces,
        bed.daemon().log_tail()
    );
    assert!(
        p2.datapath_because
            .as_deref()
            .is_some_and(|w| w.contains("fewer RX queues")),
        "status should say why: {p2:?}"
    );
    st.note_unmarked_handoff("bridge::a_bridge_port_without_native_xdp_gets_the_tc_fast_path");

    let (server, echo, [s1, s2], mut seqs) = bed.two_offloaded(9998, any_v4());
    on_and_off(
        &bed,
        server,
        &[
            (&s1, "p1", "p1", "h1 behind p1 (native XDP)"),
            (&s2, "p2", "p2", "h2 behind p2 (TC)"),
        ],
        &mut seqs,
    );
    assert_eq!(echo.finish().corrupt, 0);
}
