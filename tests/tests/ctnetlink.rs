//! ctnetlink against the real kernel: client ⇄ router (MASQUERADE) ⇄ server namespaces, real
//! UDP and TCP traffic, and the router's conntrack table read and changed through
//! `xdp_routerd::sync::ctnetlink` from inside the router namespace.
//!
//! Run as root: `cargo test -p xdp-router-tests --test ctnetlink -- --test-threads=1`.

use std::{
    collections::VecDeque,
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    thread,
    time::{Duration, Instant},
};

use tokio::runtime::Runtime;
use xdp_router_tests::netns::{Netns, require_root};
use xdp_routerd::{
    flows::conntrack::{
        CtEntry, CtEvent, CtStatus, CtTuple, IPPROTO_TCP, IPPROTO_UDP, NotOffloadable,
        TCP_FLAG_BE_LIBERAL, TCP_FLAG_MAXACK_SET, tcp_state,
    },
    sync::{
        ctnetlink::{CtNetlink, CtNetlinkError, CtSubscription, CtUpdate},
        sysctl::KernelTimeouts,
    },
};

const CLIENT_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 2);
const ROUTER_WAN_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 1);
const SERVER_V4: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 2);
const ROUTER_WAN_V6: Ipv6Addr = Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 1);
const SERVER_V6: Ipv6Addr = Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 2);

/// How long a UDP flow must live before a packet makes it ASSURED (`stream_ts` in
/// `nf_conntrack_proto_udp.c`: two seconds after the first packet).
const UDP_ASSURE_DELAY: Duration = Duration::from_millis(2200);

/// client ⇄ router ⇄ server, IPv4 and IPv6, with the router masquerading on its WAN side and a
/// FORWARD chain that accepts LAN→WAN and ESTABLISHED only. Namespaces are deleted on drop.
struct Topology {
    client: Netns,
    router: Netns,
    server: Netns,
}

impl Topology {
    /// Builds the topology; `router_sysctls` are applied in the router before any traffic.
    fn new(router_sysctls: &[(&str, &str)]) -> Topology {
        let client = Netns::new("ct-c");
        let router = Netns::new("ct-r");
        let server = Netns::new("ct-s");
        client.veth("c0", &router, "r-lan");
        router.veth("r-wan", &server, "s0");
        client.sh(
            "ip addr add 10.71.1.2/24 dev c0 && ip -6 addr add fd71:1::2/64 dev c0 nodad && \
             ip route add default via 10.71.1.1 && ip -6 route add default via fd71:1::1 && \
             sysctl -qw net.ipv4.ping_group_range='0 2147483647'",
        );
        router.sh(
            "ip addr add 10.71.1.1/24 dev r-lan && ip -6 addr add fd71:1::1/64 dev r-lan nodad && \
             ip addr add 10.71.2.1/24 dev r-wan && ip -6 addr add fd71:2::1/64 dev r-wan nodad && \
             sysctl -qw net.ipv4.ip_forward=1 && sysctl -qw net.ipv6.conf.all.forwarding=1",
        );
        for ipt in ["iptables", "ip6tables"] {
            router.sh(&format!(
                "{ipt} -t nat -A POSTROUTING -o r-wan -j MASQUERADE && \
                 {ipt} -P FORWARD DROP && \
                 {ipt} -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT && \
                 {ipt} -A FORWARD -i r-lan -o r-wan -j ACCEPT"
            ));
        }
        server.sh("ip addr add 10.71.2.2/24 dev s0 && ip -6 addr add fd71:2::2/64 dev s0 nodad");
        for (key, value) in router_sysctls {
            router.exec_ok("sysctl", &["-qw", &format!("{key}={value}")]);
        }
        Topology {
            client,
            router,
            server,
        }
    }
}

/// Creates a value (usually a socket) inside `ns`; the value keeps that namespace.
fn make_in<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    ns.run(f)
}

/// Opens a ctnetlink object inside `ns`, registered with `rt`.
fn open_in<T: Send + 'static>(
    ns: &Netns,
    rt: &Runtime,
    open: fn() -> Result<T, CtNetlinkError>,
) -> T {
    let handle = rt.handle().clone();
    ns.run(move || {
        let _guard = handle.enter();
        open().unwrap_or_else(|e| panic!("{e}"))
    })
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// A UDP echo server in the server namespace (echoes until the test process ends).
fn udp_echo_server(server: &Netns, addr: SocketAddr) {
    let sock = make_in(server, move || {
        UdpSocket::bind(addr).expect("bind UDP echo server")
    });
    thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while let Ok((n, peer)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(&buf[..n], peer);
        }
    });
}

/// A client UDP socket in the client namespace, connected to `server`.
fn udp_client(client: &Netns, server: SocketAddr) -> UdpSocket {
    let bind: SocketAddr = match server {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let sock = make_in(client, move || {
        UdpSocket::bind(bind).expect("bind UDP client")
    });
    sock.connect(server).expect("connect UDP client");
    sock.set_read_timeout(Some(Duration::from_secs(3)))
        .expect("set UDP read timeout");
    sock
}

/// One request/reply round trip through the router.
fn udp_round_trip(sock: &UdpSocket) {
    sock.send(b"ping").expect("UDP send");
    let mut buf = [0u8; 16];
    let n = sock
        .recv(&mut buf)
        .expect("UDP echo reply through the router");
    assert_eq!(&buf[..n], b"ping");
}

/// A TCP echo server in the server namespace (one thread per connection).
fn tcp_echo_server(server: &Netns, addr: SocketAddr) {
    let listener = make_in(server, move || {
        TcpListener::bind(addr).expect("bind TCP server")
    });
    thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while let Ok(n) = conn.read(&mut buf) {
                    if n == 0 || conn.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

/// An established TCP connection from the client namespace, after one echo round trip.
fn tcp_client(client: &Netns, server: SocketAddr) -> TcpStream {
    let mut stream = make_in(client, move || {
        TcpStream::connect_timeout(&server, Duration::from_secs(3)).expect("TCP connect")
    });
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .expect("set TCP read timeout");
    stream.write_all(b"hello").expect("TCP write");
    let mut buf = [0u8; 5];
    stream
        .read_exact(&mut buf)
        .expect("TCP echo through the router");
    assert_eq!(&buf, b"hello");
    stream
}

/// The conntrack original tuple of a client socket talking to `server`.
fn orig_tuple(local: SocketAddr, server: SocketAddr, proto: u8) -> CtTuple {
    CtTuple {
        src: local.ip(),
        dst: server.ip(),
        proto,
        sport: local.port(),
        dport: server.port(),
    }
}

fn find<'a>(entries: &'a [CtEntry], orig: &CtTuple) -> Option<&'a CtEntry> {
    entries.iter().find(|e| e.orig == *orig)
}

/// Asserts the router masqueraded `entry` behind `wan` and that the fast path may carry it.
fn assert_snat_offloadable(entry: &CtEntry, wan: IpAddr) {
    let orig = entry.orig;
    assert_eq!(
        entry.reply.src, orig.dst,
        "reply source is the server: {entry:?}"
    );
    assert_eq!(entry.reply.sport, orig.dport, "{entry:?}");
    assert_eq!(
        entry.reply.dst, wan,
        "reply destination is the masquerade address: {entry:?}"
    );
    assert_eq!(entry.reply.proto, orig.proto);
    assert!(entry.status.contains(CtStatus::SrcNat), "{entry:?}");
    assert!(entry.status.contains(CtStatus::Assured), "{entry:?}");
    assert!(entry.id.is_some(), "CTA_ID decoded: {entry:?}");
    assert!(entry.timeout.is_some_and(|t| t > 0), "{entry:?}");
    assert_eq!(entry.offload_decision(), Ok(()), "{entry:?}");
}

#[test]
fn dump_sees_masqueraded_udp_and_tcp_v4_v6() {
    if !require_root("dump_sees_masqueraded_udp_and_tcp_v4_v6") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let udp4: SocketAddr = (SERVER_V4, 5001).into();
    let udp6: SocketAddr = (SERVER_V6, 5001).into();
    let tcp4: SocketAddr = (SERVER_V4, 5002).into();
    let tcp6: SocketAddr = (SERVER_V6, 5002).into();
    let unreplied: SocketAddr = (SERVER_V4, 5009).into();
    for addr in [udp4, udp6] {
        udp_echo_server(&topo.server, addr);
    }
    for addr in [tcp4, tcp6] {
        tcp_echo_server(&topo.server, addr);
    }
    topo.server
        .sh("iptables -A INPUT -p udp --dport 5009 -j DROP");

    let u4 = udp_client(&topo.client, udp4);
    let u6 = udp_client(&topo.client, udp6);
    let lost = udp_client(&topo.client, unreplied);
    udp_round_trip(&u4);
    udp_round_trip(&u6);
    lost.send(b"anyone?").expect("UDP send");
    thread::sleep(UDP_ASSURE_DELAY);
    udp_round_trip(&u4);
    udp_round_trip(&u6);
    let t4 = tcp_client(&topo.client, tcp4);
    let t6 = tcp_client(&topo.client, tcp6);

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let entries = rt.block_on(ct.dump()).expect("dump");

    let local = |s: &UdpSocket| s.local_addr().expect("local addr");
    let cases = [
        (
            orig_tuple(local(&u4), udp4, IPPROTO_UDP),
            IpAddr::V4(ROUTER_WAN_V4),
        ),
        (
            orig_tuple(local(&u6), udp6, IPPROTO_UDP),
            IpAddr::V6(ROUTER_WAN_V6),
        ),
        (
            orig_tuple(t4.local_addr().expect("local addr"), tcp4, IPPROTO_TCP),
            IpAddr::V4(ROUTER_WAN_V4),
        ),
        (
            orig_tuple(t6.local_addr().expect("local addr"), tcp6, IPPROTO_TCP),
            IpAddr::V6(ROUTER_WAN_V6),
        ),
    ];
    for (orig, wan) in &cases {
        let entry = find(&entries, orig)
            .unwrap_or_else(|| panic!("no conntrack entry for {orig} in {entries:#?}"));
        assert_snat_offloadable(entry, *wan);
        if orig.proto == IPPROTO_TCP {
            assert_eq!(entry.tcp_state, Some(tcp_state::ESTABLISHED), "{entry:?}");
        }
        // get() finds the same entry by its original tuple.
        let got = rt
            .block_on(ct.get(orig, 0))
            .expect("get")
            .unwrap_or_else(|| panic!("get({orig}) found nothing"));
        assert_eq!(got.id, entry.id);
        assert_eq!(got.reply, entry.reply);
    }
    let lost_tuple = orig_tuple(local(&lost), unreplied, IPPROTO_UDP);
    let lost_entry = find(&entries, &lost_tuple)
        .unwrap_or_else(|| panic!("no conntrack entry for {lost_tuple}"));
    assert!(!lost_entry.status.contains(CtStatus::SeenReply));
    assert_eq!(
        lost_entry.offload_decision(),
        Err(NotOffloadable::Unreplied)
    );

    // A tuple that does not exist is "None", not an error.
    let mut absent = lost_tuple;
    absent.dport = 5999;
    assert_eq!(rt.block_on(ct.get(&absent, 0)).expect("get"), None);
}

/// A subscription plus the events of its last batch not yet looked at.
struct Events {
    sub: CtSubscription,
    pending: VecDeque<CtEvent>,
}

impl Events {
    fn new(sub: CtSubscription) -> Events {
        Events {
            sub,
            pending: VecDeque::new(),
        }
    }

    /// Returns the first event (in arrival order) matching `pred`, waiting at most five
    /// seconds; the events before it are consumed.
    fn wait(&mut self, rt: &Runtime, what: &str, pred: impl Fn(&CtEvent) -> bool) -> CtEvent {
        rt.block_on(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
            loop {
                while let Some(ev) = self.pending.pop_front() {
                    if pred(&ev) {
                        return ev;
                    }
                }
                let batch = tokio::time::timeout_at(deadline, self.sub.next_batch())
                    .await
                    .unwrap_or_else(|_| panic!("no {what} event within 5 s"))
                    .unwrap_or_else(|e| panic!("event stream: {e}"));
                self.pending.extend(batch);
            }
        })
    }

    /// Reads until nothing arrives for 300 ms; true when an overrun was reported meanwhile.
    fn drain(&mut self, rt: &Runtime) -> bool {
        self.pending.clear();
        let mut overrun = false;
        rt.block_on(async {
            loop {
                match tokio::time::timeout(Duration::from_millis(300), self.sub.next_batch()).await
                {
                    Ok(Ok(_)) => {}
                    Ok(Err(CtNetlinkError::Overrun)) => overrun = true,
                    Ok(Err(e)) => panic!("event stream: {e}"),
                    Err(_) => return,
                }
            }
        });
        overrun
    }
}

/// A subscription in `ns` with the smallest receive buffer the kernel allows (a few events
/// overrun it).
fn tiny_subscription(ns: &Netns, rt: &Runtime) -> Events {
    let sub = open_in(ns, rt, || CtSubscription::with_rcvbuf(1));
    assert!(
        sub.rcvbuf() < 16 << 10,
        "tiny receive buffer: {}",
        sub.rcvbuf()
    );
    Events::new(sub)
}

#[test]
fn events_report_new_update_destroy() {
    if !require_root("events_report_new_update_destroy") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5101).into();
    udp_echo_server(&topo.server, server);
    let sub = open_in(&topo.router, &rt, CtSubscription::new);
    assert!(
        sub.rcvbuf() >= 1 << 20,
        "large receive buffer: {}",
        sub.rcvbuf()
    );
    let mut events = Events::new(sub);

    let sock = udp_client(&topo.client, server);
    let orig = orig_tuple(sock.local_addr().expect("local addr"), server, IPPROTO_UDP);
    udp_round_trip(&sock);

    let new = events.wait(&rt, "NEW", |ev| {
        matches!(ev, CtEvent::New(e) if e.orig == orig && !e.status.contains(CtStatus::SeenReply))
    });
    assert_eq!(
        new.entry().offload_decision(),
        Err(NotOffloadable::Unreplied)
    );
    let update = events.wait(&rt, "UPDATE (reply seen)", |ev| {
        matches!(ev, CtEvent::Update(e) if e.orig == orig && e.status.contains(CtStatus::SeenReply))
    });
    assert_eq!(update.entry().reply.dst, IpAddr::V4(ROUTER_WAN_V4));
    assert_eq!(update.entry().id, new.entry().id, "same entry");

    // Our own updates come back as UPDATE events; those of an ignored socket do not.
    let mut quiet = open_in(&topo.router, &rt, CtNetlink::new);
    let mut loud = open_in(&topo.router, &rt, CtNetlink::new);
    events.sub.ignore_events_from(quiet.port_id());
    assert!(
        rt.block_on(quiet.refresh_timeout(&orig, 0, 100))
            .expect("refresh")
    );
    assert!(
        rt.block_on(loud.refresh_timeout(&orig, 0, 200))
            .expect("refresh")
    );
    let refreshed = events.wait(
        &rt,
        "UPDATE from a refresh",
        |ev| matches!(ev, CtEvent::Update(e) if e.orig == orig),
    );
    assert!(
        refreshed.entry().timeout.is_some_and(|t| t > 150),
        "the first update seen is the non-ignored one: {refreshed:?}"
    );

    topo.router.exec_ok(
        "conntrack",
        &[
            "-D",
            "-p",
            "udp",
            "--orig-src",
            &CLIENT_V4.to_string(),
            "--orig-port-src",
            &orig.sport.to_string(),
        ],
    );
    let destroy = events.wait(
        &rt,
        "DESTROY",
        |ev| matches!(ev, CtEvent::Destroy(e) if e.orig == orig),
    );
    assert_eq!(destroy.entry().id, new.entry().id);
    assert_eq!(destroy.entry().reply, update.entry().reply);
}

#[test]
fn event_overrun_is_reported_and_stream_recovers() {
    if !require_root("event_overrun_is_reported_and_stream_recovers") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5201).into();
    udp_echo_server(&topo.server, server);
    // The smallest buffer the kernel allows: a burst of flows cannot fit.
    let mut events = tiny_subscription(&topo.router, &rt);
    let burst: Vec<UdpSocket> = (0..200).map(|_| udp_client(&topo.client, server)).collect();
    for sock in &burst {
        sock.send(b"x").expect("UDP send");
    }
    thread::sleep(Duration::from_millis(300));
    assert!(
        events.drain(&rt),
        "200 flows into a minimal buffer must report an overrun"
    );

    // Once drained (the daemon would dump and reconcile now), the subscription keeps working.
    // The probe flow gets no reply (dropped at the server), so it makes exactly one event,
    // which the tiny buffer can hold.
    let silent: SocketAddr = (SERVER_V4, 5209).into();
    topo.server
        .sh("iptables -A INPUT -p udp --dport 5209 -j DROP");
    let sock = udp_client(&topo.client, silent);
    let orig = orig_tuple(sock.local_addr().expect("local addr"), silent, IPPROTO_UDP);
    sock.send(b"after").expect("UDP send");
    events.wait(&rt, "NEW after overrun", |ev| ev.entry().orig == orig);
}

#[test]
fn refresh_timeout_keeps_flow_alive_and_never_creates() {
    if !require_root("refresh_timeout_keeps_flow_alive_and_never_creates") {
        return;
    }
    // Short UDP timeouts: an idle flow is gone after 4 s.
    let topo = Topology::new(&[
        ("net.netfilter.nf_conntrack_udp_timeout", "4"),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", "4"),
    ]);
    let rt = runtime();
    let timeouts = topo.router.run(KernelTimeouts::read).expect("read sysctls");
    assert_eq!(timeouts.udp_stream, 4);
    assert_eq!(timeouts.for_proto(IPPROTO_UDP), Some(4));
    assert_eq!(timeouts.tcp_established, 432_000, "kernel default");

    let server: SocketAddr = (SERVER_V4, 5301).into();
    udp_echo_server(&topo.server, server);
    let kept = udp_client(&topo.client, server);
    let idle = udp_client(&topo.client, server);
    for sock in [&kept, &idle] {
        udp_round_trip(sock);
    }
    thread::sleep(UDP_ASSURE_DELAY);
    for sock in [&kept, &idle] {
        udp_round_trip(sock);
    }
    let kept_t = orig_tuple(kept.local_addr().expect("local addr"), server, IPPROTO_UDP);
    let idle_t = orig_tuple(idle.local_addr().expect("local addr"), server, IPPROTO_UDP);

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let before = rt
        .block_on(ct.get(&kept_t, 0))
        .expect("get")
        .expect("kept flow");
    assert_eq!(before.offload_decision(), Ok(()));
    assert!(before.timeout.is_some_and(|t| t <= 4), "{before:?}");

    // No traffic for 8 s (the idle flow expires after 4); only the refreshes (3 s each, every
    // second) keep `kept` alive.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        assert!(
            rt.block_on(ct.refresh_timeout(&kept_t, 0, timeouts.udp_stream - 1))
                .expect("refresh"),
            "kept flow vanished after {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_secs(1));
    }
    let entries = rt.block_on(ct.dump()).expect("dump");
    assert!(find(&entries, &kept_t).is_some(), "refreshed flow expired");
    assert!(
        find(&entries, &idle_t).is_none(),
        "idle flow should have expired"
    );
    assert!(
        !rt.block_on(ct.refresh_timeout(&idle_t, 0, 60))
            .expect("refresh"),
        "refreshing an expired flow reports it gone"
    );
    assert_eq!(
        rt.block_on(ct.get(&idle_t, 0)).expect("get"),
        None,
        "a refresh must never create an entry"
    );

    // Raising the timeout is visible when read back.
    assert!(
        rt.block_on(ct.refresh_timeout(&kept_t, 0, 300))
            .expect("refresh")
    );
    let after = rt
        .block_on(ct.get(&kept_t, 0))
        .expect("get")
        .expect("kept flow");
    assert!(
        after.timeout.is_some_and(|t| (295..=300).contains(&t)),
        "timeout raised to 300: {after:?}"
    );
}

#[test]
fn tcp_liberal_flags_and_timeout_in_one_update() {
    if !require_root("tcp_liberal_flags_and_timeout_in_one_update") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5401).into();
    tcp_echo_server(&topo.server, server);
    let stream = tcp_client(&topo.client, server);
    let orig = orig_tuple(
        stream.local_addr().expect("local addr"),
        server,
        IPPROTO_TCP,
    );

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let before = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    let flags = before.tcp_flags.expect("TCP flags dumped");
    assert!(
        flags.iter().all(|f| f & TCP_FLAG_BE_LIBERAL == 0),
        "not liberal before: {flags:?}"
    );

    assert!(
        rt.block_on(ct.set_tcp_liberal(&orig, 0))
            .expect("set liberal")
    );
    let after = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    let liberal = after.tcp_flags.expect("TCP flags dumped");
    assert!(
        liberal.iter().all(|f| f & TCP_FLAG_BE_LIBERAL != 0),
        "liberal in both directions: {liberal:?}"
    );
    // MAXACK_SET is cleared (RSTs are not checked against a stale td_maxack); the other flags
    // are untouched.
    assert_eq!(
        [
            (flags[0] | TCP_FLAG_BE_LIBERAL) & !TCP_FLAG_MAXACK_SET,
            (flags[1] | TCP_FLAG_BE_LIBERAL) & !TCP_FLAG_MAXACK_SET
        ],
        liberal
    );
    assert!(
        flags.iter().any(|f| f & TCP_FLAG_MAXACK_SET != 0),
        "the handshake set MAXACK_SET before the update: {flags:?}"
    );
    assert_eq!(after.tcp_state, Some(tcp_state::ESTABLISHED));

    // Timeout and flags in one message; the established default (5 days) drops to 1000 s.
    let update = CtUpdate::for_entry(&after).timeout(1000).tcp_liberal();
    assert!(rt.block_on(ct.update(&update)).expect("update"));
    let updated = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    assert!(
        updated.timeout.is_some_and(|t| (995..=1000).contains(&t)),
        "{updated:?}"
    );

    // The connection still works through the router.
    let mut stream = stream;
    stream.write_all(b"again").expect("TCP write");
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).expect("TCP echo after update");

    // An update of a connection that does not exist is "false" and creates nothing.
    let mut absent = orig;
    absent.sport = absent.sport.wrapping_add(1);
    assert!(!rt.block_on(ct.set_tcp_liberal(&absent, 0)).expect("update"));
    assert_eq!(rt.block_on(ct.get(&absent, 0)).expect("get"), None);
}

/// The kernel reports an overrun ahead of the events still queued, and those are older than the
/// events it dropped: applied after the resync's dump, they would bring a connection that has
/// closed meanwhile back as ESTABLISHED, its closing events lost (the daemon offloaded such
/// connections again and left their flows in the maps; a later connection on the same ports
/// had its first packets carried by that stale flow, unseen by its new conntrack entry, and
/// the router's stack answered the server's FIN with a reset). The subscription discards them
/// with the overrun.
#[test]
fn events_queued_at_an_overrun_are_discarded_with_it() {
    if !require_root("events_queued_at_an_overrun_are_discarded_with_it") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5301).into();
    let udp_server: SocketAddr = (SERVER_V4, 5302).into();
    tcp_echo_server(&topo.server, server);
    udp_echo_server(&topo.server, udp_server);
    // Room for a connection's handshake events, not for a burst of 500 flows.
    let sub = open_in(&topo.router, &rt, || CtSubscription::with_rcvbuf(32 << 10));
    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);

    // Queued: the connection's NEW and its UPDATEs up to ESTABLISHED.
    let stream = tcp_client(&topo.client, server);
    let orig = orig_tuple(
        stream.local_addr().expect("local addr"),
        server,
        IPPROTO_TCP,
    );
    // Overflow, then close the connection: its closing events are dropped.
    let burst: Vec<UdpSocket> = (0..500)
        .map(|_| udp_client(&topo.client, udp_server))
        .collect();
    for sock in &burst {
        sock.send(b"x").expect("UDP send");
    }
    thread::sleep(Duration::from_millis(200));
    stream
        .shutdown(std::net::Shutdown::Both)
        .expect("TCP shutdown");
    drop(stream);
    thread::sleep(Duration::from_millis(300));
    let dump = rt.block_on(ct.dump()).expect("dump");
    let now = find(&dump, &orig).expect("the closed connection is still in conntrack");
    assert_ne!(
        now.tcp_state,
        Some(tcp_state::ESTABLISHED),
        "the connection has closed: {now:?}"
    );

    let mut events = Events::new(sub);
    let first = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(2), events.sub.next_batch()).await
        })
        .expect("an event or the overrun within 2 s");
    assert!(
        matches!(first, Err(CtNetlinkError::Overrun)),
        "the overrun is reported first: {first:?}"
    );
    assert!(
        events.sub.stale_discarded() > 0,
        "the events queued before the overrun were discarded with it"
    );
    // After the overrun (where the daemon dumps and reconciles), nothing older than the dump
    // may arrive: no event of the connection says ESTABLISHED any more.
    let mut stale = Vec::new();
    rt.block_on(async {
        while let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(300), events.sub.next_batch()).await
        {
            let batch = batch.unwrap_or_default();
            stale.extend(batch.into_iter().filter(|ev| {
                ev.entry().orig == orig && ev.entry().tcp_state == Some(tcp_state::ESTABLISHED)
            }));
        }
    });
    assert!(
        stale.is_empty(),
        "events older than the overrun replayed after it: {stale:?}"
    );
}

/// `update_many` pipelines its requests (several datagrams' worth here: more connections than
/// one datagram carries) and reports each one: every live connection marked liberal, the
/// absent ones interleaved with them reported as gone and not created.
#[test]
fn update_many_marks_every_connection_and_reports_absent_ones() {
    if !require_root("update_many_marks_every_connection_and_reports_absent_ones") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5501).into();
    tcp_echo_server(&topo.server, server);
    let streams: Vec<TcpStream> = (0..150).map(|_| tcp_client(&topo.client, server)).collect();
    let live: Vec<CtTuple> = streams
        .iter()
        .map(|s| orig_tuple(s.local_addr().expect("local addr"), server, IPPROTO_TCP))
        .collect();
    let absent = |o: &CtTuple| CtTuple {
        dport: o.dport + 1,
        ..*o
    };
    let mut updates = Vec::new();
    for (i, o) in live.iter().enumerate() {
        updates.push(CtUpdate::new(*o, 0).tcp_liberal());
        if i % 10 == 0 {
            updates.push(CtUpdate::new(absent(o), 0).tcp_liberal());
        }
    }

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let results = rt.block_on(ct.update_many(&updates)).expect("update_many");
    assert_eq!(results.len(), updates.len());
    for (u, r) in updates.iter().zip(&results) {
        let existed = *r.as_ref().expect("no kernel error");
        assert_eq!(existed, live.contains(&u.orig), "{u:?}");
    }
    let dump = rt.block_on(ct.dump()).expect("dump");
    for o in &live {
        let e = find(&dump, o).expect("live connection in conntrack");
        let flags = e.tcp_flags.expect("TCP flags dumped");
        assert!(
            flags.iter().all(|f| f & TCP_FLAG_BE_LIBERAL != 0),
            "liberal in both directions: {e:?}"
        );
        assert!(
            find(&dump, &absent(o)).is_none(),
            "created: {:?}",
            absent(o)
        );
    }
    // The socket is left clean: a plain request right after gets its own answer.
    assert!(
        rt.block_on(ct.set_tcp_liberal(&live[0], 0))
            .expect("update")
    );
}

/// The daemon's own marks and refreshes take no room in the event socket's buffer: the kernel
/// drops their UPDATE events before queuing them (the subscription's socket filter). With the
/// smallest buffer the kernel allows, 200 marks from an ignored socket cause no overrun (each
/// event queued would overrun it after a few), while one update from another socket still
/// arrives.
#[test]
fn ignored_sockets_events_never_reach_the_event_buffer() {
    if !require_root("ignored_sockets_events_never_reach_the_event_buffer") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5601).into();
    tcp_echo_server(&topo.server, server);
    // Subscribed before the connections are made: with `nf_conntrack_events = 2` (the
    // default) conntrack gives a connection events only if someone listened when it began.
    let mut events = tiny_subscription(&topo.router, &rt);
    let streams: Vec<TcpStream> = (0..200).map(|_| tcp_client(&topo.client, server)).collect();
    let live: Vec<CtTuple> = streams
        .iter()
        .map(|s| orig_tuple(s.local_addr().expect("local addr"), server, IPPROTO_TCP))
        .collect();
    // Their own events overran the tiny buffer; once drained, the stream is quiet.
    events.drain(&rt);
    let mut marker = open_in(&topo.router, &rt, CtNetlink::new);
    events.sub.ignore_events_from(marker.port_id());

    let marks: Vec<CtUpdate> = live
        .iter()
        .map(|o| CtUpdate::new(*o, 0).tcp_liberal().timeout(300))
        .collect();
    let results = rt
        .block_on(marker.update_many(&marks))
        .expect("update_many");
    assert!(
        results.iter().all(|r| matches!(r, Ok(true))),
        "every connection marked: {results:?}"
    );
    assert!(
        !events.drain(&rt),
        "200 ignored updates into a minimal buffer must not overrun it"
    );

    let mut loud = open_in(&topo.router, &rt, CtNetlink::new);
    assert!(
        rt.block_on(loud.refresh_timeout(&live[7], 0, 400))
            .expect("refresh")
    );
    let seen = events.wait(
        &rt,
        "UPDATE from a socket not ignored",
        |ev| matches!(ev, CtEvent::Update(e) if e.orig == live[7]),
    );
    assert!(
        seen.entry().timeout.is_some_and(|t| t > 300),
        "the other socket's refresh: {seen:?}"
    );
}
