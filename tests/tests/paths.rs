//! The rtnetlink side with real traffic: offloaded flows are withdrawn when the routing or the
//! router's addresses invalidate them, and a managed interface that disappears and comes back
//! is attached again. Each test builds its own lan host ⇄ router ⇄ wan host namespaces (see
//! `xdp_router_tests::testbed`) and starts xdp-routerd as a user would. Run as root with one
//! test thread: `cargo xtask test`, or `cargo build --release -p xdp-routerd &&
//! XDP_ROUTERD_BIN=$PWD/target/release/xdp-routerd cargo test -p xdp-router-tests --test paths
//! -- --test-threads=1`.
//!
//! What is asserted is what a user sees: `status --json` (flow counts, withdrawals, skip
//! reasons, per-reason packet counters, interfaces), the router's link counters, what the
//! hosts received.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    process::Stdio,
    thread::sleep,
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        self, Capture, HOST_IF, IfaceStatus, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, ROUTER_LAN_V4,
        ROUTER_LAN_V6, ROUTER_WAN_V4, Snapshot, Status, Testbed, UdpEcho, WAN_HOST_V4, WAN_HOST_V6,
        WAN_IF, any_v4, any_v6, daemon_binary, offload_udp, parse_udp_frame, ping_pong, ready,
        udp_is_fast_pathed, udp_socket, wait_until, wan_v4, wan_v6,
    },
};

/// How fast a withdrawal must show in `status` (the brief's bound).
const WITHDRAW_WITHIN: Duration = Duration::from_secs(2);
/// Bytes of the TCP transfers that must be fast-pathed.
const BULK: u64 = 16 << 20;
/// Datagram size of the UDP ping-pong.
const DGRAM: usize = 200;
/// Interval of the UDP ping-pong (50 datagrams per second).
const TICK: Duration = Duration::from_millis(20);

/// A counter of `/sys/class/net/IF/statistics/` in `ns`.
fn link_stat(ns: &Netns, ifname: &str, stat: &str) -> u64 {
    let path = format!("/sys/class/net/{ifname}/statistics/{stat}");
    let s = ns.exec_ok("cat", &[&path]);
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path} in {}: {s:?}: {e}", ns.name()))
}

/// The ifindex of `ifname` in `ns`, from sysfs.
fn sysfs_ifindex(ns: &Netns, ifname: &str) -> u32 {
    let path = format!("/sys/class/net/{ifname}/ifindex");
    let s = ns.exec_ok("cat", &[&path]);
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path} in {}: {s:?}: {e}", ns.name()))
}

/// The `status` row of a managed interface.
fn iface<'a>(st: &'a Status, name: &str) -> &'a IfaceStatus {
    st.interfaces
        .iter()
        .find(|i| i.name == name)
        .unwrap_or_else(|| panic!("status lists no interface {name}: {:?}", st.interfaces))
}

/// A skip/withdrawal counter of `status` (0 while the reason never happened).
fn skipped(st: &Status, reason: &str) -> u64 {
    st.conntrack.skipped.get(reason).copied().unwrap_or(0)
}

/// Waits until `status` shows no offloaded connection; returns how long it took and the status.
/// Panics (with the flows and the log) after [`WITHDRAW_WITHIN`].
fn wait_withdrawn(tb: &Testbed, since: Instant, what: &str) -> (Duration, Status) {
    let (st, ok) = tb.daemon().wait_status(WITHDRAW_WITHIN, |s| {
        s.conntrack.offloaded == 0 && s.flows.ipv4 == 0 && s.flows.ipv6 == 0
    });
    let took = since.elapsed();
    assert!(
        ok,
        "{what}: flows still offloaded {:?} after {took:?} (want 0 within {WITHDRAW_WITHIN:?}): \
         {:?}\nflows: {}\nlog:\n{}",
        st.flows,
        st.conntrack,
        tb.daemon().flows_json(),
        tb.daemon().log_tail()
    );
    (took, st)
}

/// LAN→WAN TCP transfer of [`BULK`] bytes, ≥ 90 % fast-pathed (see
/// [`testbed::bulk_is_fast_pathed`]).
fn bulk_is_fast_pathed(tb: &Testbed, server: SocketAddr, peer: IpAddr) -> (Snapshot, Snapshot) {
    testbed::bulk_is_fast_pathed(tb, server, peer, BULK)
}

/// How the router NATs LAN→WAN connections in [`nat_address_removed`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Nat {
    /// `-j MASQUERADE` (the testbed's rule): the kernel drops its own NAT bindings to an
    /// address that goes away (nf_nat_masquerade's inetaddr notifier), so the conntrack entry
    /// is destroyed.
    Masquerade,
    /// `-j SNAT --to-source` the WAN address: the kernel keeps the conntrack entry; only the
    /// daemon's own check (`nat_address_gone`) takes the flow back.
    StaticSnat,
}

/// Test 1 (both NAT flavours): the router loses the address an offloaded connection was
/// NATed to (a DHCP renew with a new lease, say). Within 2 s the connection is withdrawn, and
/// afterwards not one of its packets is forwarded by the fast path. What the kernel does with
/// them is its call.
fn nat_address_removed(test: &str, tag: &str, nat: Nat) {
    if !ready(test) {
        return;
    }
    let mut tb = Testbed::new(tag);
    if nat == Nat::StaticSnat {
        tb.router.exec_ok(
            "iptables",
            &[
                "-w",
                "-t",
                "nat",
                "-R",
                "POSTROUTING",
                "1",
                "-o",
                WAN_IF,
                "-j",
                "SNAT",
                "--to-source",
                &ROUTER_WAN_V4.to_string(),
            ],
        );
    }
    tb.start_daemon();
    let server = wan_v4(7101);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);

    // A second WAN address first, so the WAN stays usable (promoted when the first goes).
    let new_addr = Ipv4Addr::new(10, 0, 2, 3);
    tb.router.sh(&format!(
        "sysctl -qw net.ipv4.conf.{WAN_IF}.promote_secondaries=1
         ip addr add {new_addr}/24 dev {WAN_IF}"
    ));
    // An added address invalidates nothing: the connection stays offloaded.
    sleep(Duration::from_millis(300));
    let st = tb.daemon().status();
    assert_eq!(
        (st.conntrack.offloaded, st.flows.ipv4),
        (1, 2),
        "adding {new_addr} withdrew the flow: {:?}",
        st.conntrack
    );

    let before_del = tb.daemon().status();
    let t0 = Instant::now();
    tb.router.exec_ok(
        "ip",
        &["addr", "del", &format!("{ROUTER_WAN_V4}/24"), "dev", WAN_IF],
    );
    let (took, st) = wait_withdrawn(&tb, t0, &format!("{ROUTER_WAN_V4} removed"));
    let removed = st.conntrack.removed_total - before_del.conntrack.removed_total;
    let nat_gone = skipped(&st, "nat_address_gone") - skipped(&before_del, "nat_address_gone");
    eprintln!(
        "{ROUTER_WAN_V4} removed: withdrawn after {took:?} (removed_total +{removed}, \
         nat_address_gone +{nat_gone})"
    );
    assert!(
        removed >= 1,
        "the flow left the map but removed_total did not grow: {:?}",
        st.conntrack
    );
    assert!(
        tb.router
            .exec_ok("ip", &["-4", "addr", "show", "dev", WAN_IF])
            .contains(&format!("{new_addr}/24")),
        "{new_addr} was not promoted when {ROUTER_WAN_V4} went"
    );
    let old_bindings = || {
        tb.router
            .exec_ok(
                "conntrack",
                &["-L", "-p", "udp", "--reply-dst", &ROUTER_WAN_V4.to_string()],
            )
            .lines()
            .count()
    };
    match nat {
        // Wait for the kernel's cleanup, so that no packet can legitimately leave with the old
        // address: only a stale fast-path entry could still write it. The kernel does it from
        // a work queue: 2 s were not enough on a loaded machine (the daemon's withdrawal, timed
        // above, is what this test bounds).
        Nat::Masquerade => assert!(
            wait_until(Duration::from_secs(10), || old_bindings() == 0),
            "the kernel kept conntrack entries masqueraded to {ROUTER_WAN_V4}:\n{}",
            tb.router.exec_ok("conntrack", &["-L", "-p", "udp"])
        ),
        // The conntrack entry lives on: the daemon alone decided, by its address check.
        Nat::StaticSnat => {
            assert_eq!(
                old_bindings(),
                1,
                "the kernel dropped the SNAT binding itself: this case needs it to stay:\n{}",
                tb.router.exec_ok("conntrack", &["-L", "-p", "udp"])
            );
            assert!(
                nat_gone >= 1,
                "withdrawn, but not as nat_address_gone: {:?}",
                st.conntrack
            );
        }
    }

    // The same socket keeps sending for 1 s (a new conntrack entry cannot become ASSURED, hence
    // offloadable, within its first 2 s).
    let capture = Capture::open(&tb.wan, HOST_IF);
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 50, DGRAM, TICK);
    let after = tb.snapshot();
    let mut from_old = 0;
    let mut from_new = 0;
    while let Some(frame) = capture.next_incoming(Duration::from_millis(200)) {
        match parse_udp_frame(&frame) {
            Some(f) if f.dst == server && f.src.ip() == IpAddr::from(ROUTER_WAN_V4) => {
                from_old += 1
            }
            Some(f) if f.dst == server && f.src.ip() == IpAddr::from(new_addr) => from_new += 1,
            _ => {}
        }
    }
    let seen = echo.finish();
    let wire = after.rx_lan_since(&before);
    let fast = after.forwarded_since(&before);
    let no_flow = after.packets_since(&before, LAN_IF, "no_flow");
    eprintln!(
        "after the removal: {} sent, {} echoed back (kernel's call); {wire} in on {LAN_IF}, \
         {no_flow} no_flow, {fast} fast-pathed; WAN host got {from_old} from {ROUTER_WAN_V4}, \
         {from_new} from {new_addr}; echo peers {:?}",
        pp.sent, pp.good, seen.peers
    );
    assert!(
        wire >= pp.sent && no_flow >= pp.sent,
        "{LAN_IF} received {wire} packets, {no_flow} of them passed as no_flow, want ≥ {} each",
        pp.sent
    );
    assert_eq!(
        fast, 0,
        "the fast path forwarded {fast} packets after the flow was withdrawn"
    );
    if nat == Nat::Masquerade {
        assert_eq!(
            from_old, 0,
            "{from_old} datagrams still reached the WAN host from the lost address \
             {ROUTER_WAN_V4}"
        );
    }
    let st = tb.daemon().status();
    assert_eq!(
        st.conntrack.offloaded, 0,
        "the connection was offloaded again: {:?}",
        st.conntrack
    );
}

/// Test 1a: MASQUERADE (the kernel destroys the connection; the daemon follows).
#[test]
fn masquerade_address_removed_withdraws_the_flow() {
    nat_address_removed(
        "masquerade_address_removed_withdraws_the_flow",
        "pa1",
        Nat::Masquerade,
    );
}

/// Test 1b: static SNAT (the kernel keeps the connection; the daemon withdraws it as
/// `nat_address_gone`).
#[test]
fn snat_address_removed_withdraws_the_flow() {
    nat_address_removed(
        "snat_address_removed_withdraws_the_flow",
        "pa1s",
        Nat::StaticSnat,
    );
}

/// Test 2: the route to the WAN host moves to a third, unmanaged interface. The offloaded
/// connection is withdrawn within 2 s and keeps working through the kernel (counted on the new
/// interface; its replies, still arriving on the managed WAN interface, are not fast-pathed
/// either). With the route put back, a new connection is offloaded again.
///
/// IPv6, routed without NAT: for a masqueraded IPv4 connection the kernel itself kills the
/// conntrack entry and drops the packet when its output interface changes
/// (`nf_nat_oif_changed`), so only IPv6 shows one connection carrying on over the new path.
#[test]
fn route_via_unmanaged_interface_withdraws_the_flow() {
    if !ready("route_via_unmanaged_interface_withdraws_the_flow") {
        return;
    }
    let mut tb = Testbed::new("pa2");
    // router eth2 (fd00:3::1, unmanaged) ⇄ eth1 (fd00:3::2) of the WAN host: a second path.
    const ALT_IF: &str = "eth2";
    const ALT_HOST_IF: &str = "eth1";
    let alt_gw = Ipv6Addr::new(0xfd00, 3, 0, 0, 0, 0, 0, 2);
    tb.router.veth(ALT_IF, &tb.wan, ALT_HOST_IF);
    tb.router.sh(&format!(
        "ip addr add fd00:3::1/64 dev {ALT_IF} nodad
         ethtool -K {ALT_IF} tx off rx off gro off gso off tso off >/dev/null"
    ));
    tb.wan.sh(&format!(
        "ip addr add {alt_gw}/64 dev {ALT_HOST_IF} nodad
         ethtool -K {ALT_HOST_IF} tx off rx off gro on >/dev/null"
    ));
    tb.start_daemon();
    let server = wan_v6(7102);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v6(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);

    let host_route = format!("{WAN_HOST_V6}/128");
    let before_move = tb.daemon().status();
    let t0 = Instant::now();
    tb.router.exec_ok(
        "ip",
        &[
            "-6",
            "route",
            "replace",
            &host_route,
            "via",
            &alt_gw.to_string(),
            "dev",
            ALT_IF,
        ],
    );
    let (took, st) = wait_withdrawn(&tb, t0, &format!("route to {WAN_HOST_V6} via {ALT_IF}"));
    let not_managed = skipped(&st, "path_not_managed") - skipped(&before_move, "path_not_managed");
    eprintln!(
        "route via {ALT_IF}: withdrawn after {took:?} (removed_total +{}, path_not_managed \
         +{not_managed})",
        st.conntrack.removed_total - before_move.conntrack.removed_total
    );
    assert!(
        not_managed >= 1,
        "withdrawn, but not as path_not_managed: {:?}",
        st.conntrack
    );

    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets");
    let alt_host_rx = link_stat(&tb.wan, ALT_HOST_IF, "rx_packets");
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 50, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets") - alt_tx;
    let alt_host_rx = link_stat(&tb.wan, ALT_HOST_IF, "rx_packets") - alt_host_rx;
    let fast = after.forwarded_since(&before);
    let no_flow_wan = after.packets_since(&before, WAN_IF, "no_flow");
    eprintln!(
        "through the kernel: {} sent, {} good; {ALT_IF} sent {alt_tx}, the WAN host's \
         {ALT_HOST_IF} got {alt_host_rx}; replies in on {WAN_IF}: {} ({no_flow_wan} no_flow); \
         fast path {fast}",
        pp.sent,
        pp.good,
        after.rx_wan_since(&before)
    );
    assert_eq!(
        (pp.good, pp.lost, pp.corrupt),
        (pp.sent, 0, 0),
        "the connection should keep working through the kernel: {pp:?}"
    );
    assert!(
        alt_tx >= pp.sent && alt_host_rx >= pp.sent,
        "{ALT_IF} sent {alt_tx} and the WAN host's {ALT_HOST_IF} received {alt_host_rx}, want \
         ≥ {} each",
        pp.sent
    );
    assert_eq!(
        fast, 0,
        "the fast path forwarded {fast} packets after withdrawal"
    );
    assert!(
        no_flow_wan >= pp.sent,
        "{no_flow_wan} replies on {WAN_IF} counted no_flow, want ≥ {}",
        pp.sent
    );

    // Route back: the connection that was taken back returns to the fast path by itself (the
    // daemon re-checks withdrawn connections after every routing change), and new connections
    // go through the managed WAN and are offloaded too.
    let t1 = Instant::now();
    tb.router
        .exec_ok("ip", &["-6", "route", "del", &host_route]);
    loop {
        let st = tb.daemon().status();
        if st.flows.ipv6 >= 2 {
            eprintln!(
                "route back: the same connection offloaded again after {:?}",
                t1.elapsed()
            );
            break;
        }
        assert!(
            t1.elapsed() < WITHDRAW_WITHIN,
            "the withdrawn connection was not offloaded again within {WITHDRAW_WITHIN:?}: {:?}",
            st.conntrack
        );
        sleep(Duration::from_millis(20));
    }
    // Re-offloaded: each direction is armed by one kernel-forwarded packet first.
    let arm = ping_pong(&sock, server, seq, 1, DGRAM, TICK);
    seq += arm.sent;
    assert_eq!(
        arm.good, arm.sent,
        "arming after the route came back: {arm:?}"
    );
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 20, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let fast = after.forwarded_since(&before);
    eprintln!(
        "after the route came back: {} sent, {} good, fast path {fast}",
        pp.sent, pp.good
    );
    assert_eq!(pp.good, pp.sent, "after the route came back: {pp:?}");
    assert!(
        fast >= 2 * pp.sent,
        "the re-offloaded connection carried {fast} fast-path packets for {} round trips",
        pp.sent
    );
    let _ = seq;
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets");
    let (before, after) = bulk_is_fast_pathed(&tb, wan_v6(5102), LAN_HOST_V6.into());
    let alt_tx = link_stat(&tb.router, ALT_IF, "tx_packets") - alt_tx;
    let offloaded =
        after.status.conntrack.offloaded_total - before.status.conntrack.offloaded_total;
    assert!(
        offloaded >= 1,
        "no new connection offloaded after the route came back: {:?}",
        after.status.conntrack
    );
    assert!(
        alt_tx < 10,
        "{ALT_IF} sent {alt_tx} packets during the transfer: the route did not come back"
    );
    drop(echo);
}

/// Test 3: the managed LAN veth is deleted while the daemon runs, then created again with the
/// same name (new ifindex) and addresses: `status` shows it detached, then attached natively
/// under the new ifindex, and a new transfer through it is fast-pathed.
#[test]
fn lan_interface_gone_and_back_is_reattached() {
    if !ready("lan_interface_gone_and_back_is_reattached") {
        return;
    }
    let mut tb = Testbed::new("pa3");
    tb.start_daemon();
    let old_ifindex = sysfs_ifindex(&tb.router, LAN_IF);
    assert_eq!(iface(&tb.daemon().status(), LAN_IF).ifindex, old_ifindex);

    // An offloaded TCP connection through the LAN interface.
    let server = wan_v4(5103);
    let listener = tb
        .wan
        .run(move || TcpListener::bind(server))
        .unwrap_or_else(|e| panic!("bind {server}: {e}"));
    let mut client = tb
        .lan
        .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
        .unwrap_or_else(|e| panic!("connect to {server}: {e}"));
    let (mut conn, _) = listener.accept().unwrap_or_else(|e| panic!("accept: {e}"));
    client.write_all(b"ping").expect("write");
    let mut buf = [0u8; 4];
    conn.read_exact(&mut buf).expect("read");
    let (st, ok) = tb
        .daemon()
        .wait_status(Duration::from_secs(5), |s| s.conntrack.offloaded == 1);
    assert!(ok, "TCP connection not offloaded: {:?}", st.conntrack);

    let t0 = Instant::now();
    tb.router.exec_ok("ip", &["link", "del", LAN_IF]);
    let (st, ok) = tb.daemon().wait_status(WITHDRAW_WITHIN, |s| {
        let i = iface(s, LAN_IF);
        i.attach_mode == "detached" && i.ifindex == 0 && s.conntrack.offloaded == 0
    });
    assert!(
        ok,
        "{LAN_IF} deleted, but after {:?}: {:?}, {:?}\nlog:\n{}",
        t0.elapsed(),
        iface(&st, LAN_IF),
        st.conntrack,
        tb.daemon().log_tail()
    );
    eprintln!(
        "{LAN_IF} deleted: detached and its flow withdrawn after {:?}",
        t0.elapsed()
    );
    assert_eq!(
        iface(&st, WAN_IF).attach_mode,
        "native",
        "{WAN_IF} lost its attachment"
    );
    drop((client, conn, listener));

    // Same name, same addresses, new device.
    let t0 = Instant::now();
    tb.router.exec_ok(
        "ip",
        &[
            "link",
            "add",
            LAN_IF,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IF,
            "netns",
            tb.lan.name(),
        ],
    );
    tb.router.sh(&format!(
        "ip addr add {ROUTER_LAN_V4}/24 dev {LAN_IF}
         ip addr add {ROUTER_LAN_V6}/64 dev {LAN_IF} nodad
         ip link set {LAN_IF} up
         ethtool -K {LAN_IF} tx off rx off gro off gso off tso off >/dev/null"
    ));
    tb.lan.sh(&format!(
        "ip addr add {LAN_HOST_V4}/24 dev {HOST_IF}
         ip addr add {LAN_HOST_V6}/64 dev {HOST_IF} nodad
         ip link set {HOST_IF} up
         ethtool -K {HOST_IF} tx off rx off gro on >/dev/null
         ip route add default via {ROUTER_LAN_V4}
         ip -6 route add default via {ROUTER_LAN_V6}"
    ));
    let new_ifindex = sysfs_ifindex(&tb.router, LAN_IF);
    assert_ne!(new_ifindex, old_ifindex, "the kernel reused the ifindex");
    let (st, ok) = tb.daemon().wait_status(WITHDRAW_WITHIN, |s| {
        let i = iface(s, LAN_IF);
        i.attach_mode == "native" && i.ifindex == new_ifindex
    });
    assert!(
        ok,
        "{LAN_IF} recreated as ifindex {new_ifindex}, but after {:?}: {:?}\nlog:\n{}",
        t0.elapsed(),
        iface(&st, LAN_IF),
        tb.daemon().log_tail()
    );
    eprintln!(
        "{LAN_IF} recreated: ifindex {old_ifindex} -> {new_ifindex}, attached natively after {:?}",
        t0.elapsed()
    );
    let link = tb
        .router
        .exec_ok("ip", &["-d", "link", "show", "dev", LAN_IF]);
    assert!(
        link.contains("prog/xdp"),
        "`ip -d link show {LAN_IF}` shows no XDP program:\n{link}"
    );
    tb.lan
        .exec_ok("ping", &["-c1", "-W2", &WAN_HOST_V4.to_string()]);
    let (before, after) = bulk_is_fast_pathed(&tb, wan_v4(5104), ROUTER_WAN_V4.into());
    let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
    assert!(
        reply > 0,
        "no reply (ACK) redirected into the new {LAN_IF} by the fast path"
    );
}

/// Test 4: a config in which no interface exists (a typo, the wrong host): `xdp-routerd run`
/// exits non-zero within 2 s with a one-line error naming them, and leaves nothing attached.
/// (One interface missing among existing ones is waited for: see
/// `interface_missing_at_start_is_attached_when_it_appears`.)
#[test]
fn missing_interfaces_fail_fast_and_attach_nothing() {
    if !ready("missing_interfaces_fail_fast_and_attach_nothing") {
        return;
    }
    let tb = Testbed::new("pa4");
    const MISSING: &str = "xr-missing0";
    let socket = tb.dir.path().join("control.sock");
    let config = tb.dir.path().join("xdp-routerd.toml");
    fs::write(
        &config,
        format!(
            "control_socket = \"{}\"\n\
             xdp_mode = \"native\"\n\
             [[interface]]\nname = \"xr-missing1\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"{MISSING}\"\nrole = \"lan\"\n",
            socket.display()
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", config.display()));
    let bin = daemon_binary();
    let t0 = Instant::now();
    let mut child = tb
        .router
        .command(&bin.to_string_lossy())
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let mut status = None;
    while t0.elapsed() < Duration::from_secs(5) {
        if let Some(st) = child.try_wait().expect("wait for xdp-routerd") {
            status = Some(st);
            break;
        }
        sleep(Duration::from_millis(20));
    }
    let took = t0.elapsed();
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child
        .wait_with_output()
        .expect("collect xdp-routerd output");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    eprintln!(
        "xdp-routerd with {MISSING}: {:?} after {took:?}: {lines:?}",
        out.status
    );
    let status = status.unwrap_or_else(|| panic!("still running after 5 s; stderr:\n{stderr}"));
    assert!(
        !status.success(),
        "exited successfully with a missing interface"
    );
    assert!(took < Duration::from_secs(2), "took {took:?} to fail");
    assert!(
        lines.len() == 1 && lines[0].contains(MISSING),
        "want one line naming {MISSING} on stderr, got:\n{stderr}"
    );
    assert_eq!(
        tb.xdp_attached(),
        None,
        "XDP left attached in the router namespace"
    );
    assert!(
        !socket.exists(),
        "control socket {} left behind",
        socket.display()
    );
    // Still a working router, forwarded by the kernel.
    tb.lan
        .exec_ok("ping", &["-c1", "-W2", &WAN_HOST_V4.to_string()]);
}

/// Test 4b: an interface in the config that does not exist when the daemon starts (`ppp0`
/// while pppd still dials; here the LAN, renamed away) does not keep the daemon from starting:
/// it is listed as detached, attached natively once it appears under its name, and its
/// connections are then fast-pathed.
#[test]
fn interface_missing_at_start_is_attached_when_it_appears() {
    if !ready("interface_missing_at_start_is_attached_when_it_appears") {
        return;
    }
    let mut tb = Testbed::new("pa4b");
    tb.router.sh(&format!(
        "ip link set {LAN_IF} down
         ip link set {LAN_IF} name xr-later0"
    ));
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{WAN_IF}\"\nrole = \"wan\"\n\
         [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    assert_eq!(
        iface(&st, LAN_IF).attach_mode,
        "detached",
        "{:?}",
        st.interfaces
    );
    assert_eq!(
        iface(&st, WAN_IF).attach_mode,
        "native",
        "{:?}",
        st.interfaces
    );
    tb.router.sh(&format!(
        "ip link set xr-later0 name {LAN_IF}
         ip link set {LAN_IF} up"
    ));
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(5), |s| {
        iface(s, LAN_IF).attach_mode == "native"
    });
    assert!(
        ok,
        "{LAN_IF} not attached after it appeared: {:?}\n{}",
        st.interfaces,
        tb.daemon().log_tail()
    );
    let server = wan_v4(6400);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    assert_eq!(echo.finish().corrupt, 0);
}

/// Test 5: the per-flow FIB cache follows the kernel. With answers kept up to 10 s
/// (`fib_cache_ms = 10000`), an offloaded UDP connection must still see, within a fraction of a
/// second, (a) the next hop's MAC changing (`ip neigh replace`: the fast path must send to the
/// new MAC, here a bogus one the WAN host ignores, then to the real one again) and (b)
/// forwarding switched off on the ingress interface (a netconf notification: the fast path must
/// stop forwarding, as the kernel does, and resume when it is back on). Without the daemon's
/// invalidation the cached answer would be used for 10 s and every check below would fail.
#[test]
fn fib_cache_follows_neighbour_and_forwarding_changes() {
    if !ready("paths::fib_cache_follows_neighbour_and_forwarding_changes") {
        return;
    }
    let mut tb = Testbed::new("xr-pc");
    tb.start_daemon_with("fib_cache_ms = 10000\n");
    let server = wan_v4(7105);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    let st = tb.daemon().status();
    assert_eq!(st.fib_cache.max_age_ms, 10_000, "{:?}", st.fib_cache);
    let real_mac = tb
        .wan
        .exec_ok("cat", &[&format!("/sys/class/net/{HOST_IF}/address")])
        .trim()
        .to_owned();
    // Settle: no notification pending, then the changes one by one.
    sleep(Duration::from_millis(200));

    // (a) The next hop's MAC changes.
    let inval_before = tb.daemon().status().fib_cache.invalidations;
    let set_neigh = |mac: &str| {
        tb.router.exec_ok(
            "ip",
            &[
                "neigh",
                "replace",
                &WAN_HOST_V4.to_string(),
                "lladdr",
                mac,
                "dev",
                WAN_IF,
                "nud",
                "permanent",
            ],
        );
    };
    set_neigh("02:00:5e:00:53:99");
    sleep(Duration::from_millis(150));
    let before = tb.snapshot();
    let wan_rx_before = link_stat(&tb.wan, HOST_IF, "rx_packets");
    let pp = ping_pong(&sock, server, seq, 3, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let wan_rx = link_stat(&tb.wan, HOST_IF, "rx_packets") - wan_rx_before;
    let inval = tb.daemon().status().fib_cache.invalidations - inval_before;
    eprintln!(
        "neighbour MAC changed: {} of {} echoed, {orig} fast-pathed, {wan_rx} frames reached the \
         WAN veth (dropped there as not for its MAC), {inval} invalidations",
        pp.good, pp.sent
    );
    assert!(
        inval >= 1,
        "the neighbour change did not invalidate the FIB cache"
    );
    assert_eq!(
        (pp.good, orig),
        (0, pp.sent),
        "after the next hop's MAC changed, the fast path must send to the new MAC (which the \
         WAN host ignores): {pp:?}"
    );
    set_neigh(&real_mac);
    sleep(Duration::from_millis(150));
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);

    // (b) Forwarding switched off on the ingress interface.
    let sysctl = |on: u8| {
        tb.router.exec_ok(
            "sysctl",
            &["-qw", &format!("net.ipv4.conf.{LAN_IF}.forwarding={on}")],
        );
    };
    sysctl(0);
    sleep(Duration::from_millis(150));
    let before = tb.snapshot();
    let pp = ping_pong(&sock, server, seq, 3, DGRAM, TICK);
    seq += pp.sent;
    let after = tb.snapshot();
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let refused = after.packets_since(&before, LAN_IF, "fib_not_forwardable");
    eprintln!(
        "forwarding off on {LAN_IF}: {} of {} echoed, {orig} fast-pathed, {refused} counted \
         fib_not_forwardable",
        pp.good, pp.sent
    );
    assert_eq!(
        (pp.good, orig, refused),
        (0, 0, pp.sent),
        "with forwarding off the fast path must hand every datagram to the kernel: {pp:?}"
    );
    sysctl(1);
    sleep(Duration::from_millis(150));
    udp_is_fast_pathed(&tb, &sock, server, &mut seq, LAN_IF, WAN_IF);
    drop(echo);
}
