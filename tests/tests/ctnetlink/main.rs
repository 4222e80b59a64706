//! ctnetlink against the real kernel: client ⇄ router (MASQUERADE) ⇄ server namespaces, real
//! UDP and TCP traffic, and the router's conntrack table read and changed through
//! `xdp_routerd::sync::ctnetlink` from inside the router namespace.
//!
//! Run as root: `cargo test -p xdp-router-tests --test ctnetlink -- --test-threads=1`.

mod dump;
mod events;
mod updates;

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
