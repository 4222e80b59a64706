//! The kernel as the oracle (issue 9): a corpus of crafted packets of offloaded connections is
//! sent through the netns router (testbed.rs: MASQUERADE, FORWARD policy DROP + ESTABLISHED,
//! RELATED + LAN→WAN, the daemon) once with the fast path off and once on; the frames that
//! arrive on the far side must be the same, byte for byte (nothing is normalised: each half
//! sets up its connections with the same addresses and ports, and every crafted packet carries
//! fixed sequence numbers and a per-case marker in its payload).
//!
//! Before each half the four connections (IPv4/IPv6 × TCP/UDP, LAN host → WAN host) are
//! established and offloaded, and a few valid packets of each direction are sent: with the
//! fast path on they must be counted as forwarded by XDP, off as `fastpath_disabled`, and all
//! must arrive. Cases that change conntrack state (FIN, RST, `conntrack -D`) come last.
//!
//! Run: `cargo xtask test -- differential` (as root).

mod jumbo;
mod mac_change;
mod oracle;

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::FromRawFd,
    time::Duration,
};

use xdp_router_testbed::checksum::internet_checksum;
use xdp_router_tests::{
    netns::Netns,
    packet::{
        ETH_LEN, Spec, Transport, fix_ipv4_checksum,
        tcp_flags::{ACK, FIN, PSH, RST, SYN},
        with_bad_ipv4_checksum, with_bad_l4_checksum, with_eth_dst, with_ipv4_frag,
        with_ipv4_options, with_ipv6_ext, with_tcp_doff, with_tcp_flags, with_trailer,
        with_udp_len, with_zero_udp_checksum,
    },
    testbed::{
        Capture, HOST_IF, LAN_HOST_V4, LAN_HOST_V6, LAN_IF, ROUTER_WAN_V4, Status, Testbed,
        WAN_HOST_V4, WAN_HOST_V6, WAN_IF, ready, wait_until, wan_lan_interfaces,
    },
};

/// One of the four connections.
#[derive(Clone, Copy, Debug)]
struct Conn {
    name: &'static str,
    tcp: bool,
    /// LAN host address and port.
    lan: SocketAddr,
    /// WAN host address and port.
    wan: SocketAddr,
}

impl Conn {
    fn v6(&self) -> bool {
        self.lan.is_ipv6()
    }
}

fn conns() -> [Conn; 4] {
    let v4 = |a: std::net::Ipv4Addr, p| SocketAddr::new(a.into(), p);
    let v6 = |a: std::net::Ipv6Addr, p| SocketAddr::new(a.into(), p);
    [
        Conn {
            name: "v4 tcp",
            tcp: true,
            lan: v4(LAN_HOST_V4, 40_001),
            wan: v4(WAN_HOST_V4, 5_001),
        },
        Conn {
            name: "v4 udp",
            tcp: false,
            lan: v4(LAN_HOST_V4, 40_002),
            wan: v4(WAN_HOST_V4, 5_002),
        },
        Conn {
            name: "v6 tcp",
            tcp: true,
            lan: v6(LAN_HOST_V6, 40_003),
            wan: v6(WAN_HOST_V6, 5_003),
        },
        Conn {
            name: "v6 udp",
            tcp: false,
            lan: v6(LAN_HOST_V6, 40_004),
            wan: v6(WAN_HOST_V6, 5_004),
        },
    ]
}

/// MAC addresses of the four veth ends that frames are crafted between.
#[derive(Clone, Copy)]
struct Macs {
    lan_host: [u8; 6],
    router_lan: [u8; 6],
    wan_host: [u8; 6],
    router_wan: [u8; 6],
}

fn mac_of(ns: &Netns, ifname: &str) -> [u8; 6] {
    let s = ns.exec_ok("cat", &[&format!("/sys/class/net/{ifname}/address")]);
    let v: Vec<u8> = s
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).expect("MAC byte"))
        .collect();
    v.try_into().expect("6-byte MAC")
}

/// A crafted packet: which connection, which direction, the frame.
struct Case {
    name: String,
    /// Sent by the LAN host (original direction) or the WAN host (reply).
    from_lan: bool,
    frame: Vec<u8>,
    marker: Vec<u8>,
}

/// Payload bytes of every crafted packet (the marker at its start).
const PAYLOAD: usize = 40;

/// The packet of `c` in one direction, with `transport` and `ttl`.
fn spec(c: &Conn, macs: &Macs, from_lan: bool, transport: Transport, ttl: u8) -> Spec {
    let reply_dst = if c.v6() {
        c.lan.ip()
    } else {
        IpAddr::V4(ROUTER_WAN_V4)
    };
    if from_lan {
        Spec {
            eth_src: macs.lan_host,
            eth_dst: macs.router_lan,
            src: c.lan.ip(),
            dst: c.wan.ip(),
            sport: c.lan.port(),
            dport: c.wan.port(),
            ttl,
            transport,
            payload_len: PAYLOAD,
        }
    } else {
        Spec {
            eth_src: macs.wan_host,
            eth_dst: macs.router_wan,
            src: c.wan.ip(),
            dst: reply_dst,
            sport: c.wan.port(),
            // MASQUERADE keeps the LAN port when it is free (checked by the warm-up).
            dport: c.lan.port(),
            ttl,
            transport,
            payload_len: PAYLOAD,
        }
    }
}

/// An ICMP(v6) destination/port unreachable from the WAN host quoting the packet `quoted` (IP
/// header onwards) that the router sent for the connection.
fn icmp_error(c: &Conn, macs: &Macs, quoted: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&macs.router_wan);
    f.extend_from_slice(&macs.wan_host);
    let mut icmp = if c.v6() {
        vec![1, 4, 0, 0]
    } else {
        vec![3, 3, 0, 0]
    };
    icmp.extend_from_slice(&[0; 4]);
    icmp.extend_from_slice(quoted);
    if c.v6() {
        f.extend_from_slice(&0x86ddu16.to_be_bytes());
        let (IpAddr::V6(src), IpAddr::V6(dst)) = (c.wan.ip(), c.lan.ip()) else {
            unreachable!()
        };
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.octets());
        pseudo.extend_from_slice(&dst.octets());
        pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, 58]);
        let sum = internet_checksum(&[&pseudo, &icmp]);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&[58, 64]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
    } else {
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let sum = internet_checksum(&[&icmp]);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let IpAddr::V4(src) = c.wan.ip() else {
            unreachable!()
        };
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&(20 + icmp.len() as u16).to_be_bytes());
        f.extend_from_slice(&[0x12, 0x34, 0, 0, 64, 1, 0, 0]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&ROUTER_WAN_V4.octets());
    }
    f.extend_from_slice(&icmp);
    if !c.v6() {
        fix_ipv4_checksum(&mut f);
    }
    f
}

/// Sets the IPv6 payload length (the frame keeps its bytes).
fn with_ipv6_payload_len(frame: &[u8], len: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[ETH_LEN + 4..ETH_LEN + 6].copy_from_slice(&len.to_be_bytes());
    f
}

/// Sets the IPv4 total length (header checksum fixed).
fn with_ipv4_tot_len(frame: &[u8], len: u16) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&len.to_be_bytes());
    fix_ipv4_checksum(&mut f);
    f
}

/// Every non-destructive case, in order. Markers are `XDIF` and the case number.
fn corpus(macs: &Macs) -> Vec<Case> {
    type Mutation = Box<dyn Fn(&[u8]) -> Vec<u8>>;
    let mut out = Vec::new();
    let push = |out: &mut Vec<Case>, name: String, from_lan: bool, f: &dyn Fn(&[u8]) -> Vec<u8>| {
        let n = out.len() as u16;
        let marker = [b"XDIF".as_slice(), &n.to_be_bytes()].concat();
        out.push(Case {
            name,
            from_lan,
            frame: f(&marker),
            marker,
        });
    };
    for c in conns() {
        for from_lan in [true, false] {
            let dir = if from_lan { "orig" } else { "reply" };
            let t = if c.tcp {
                Transport::Tcp(ACK | PSH)
            } else {
                Transport::Udp
            };
            let base = move |m: &[u8]| spec(&c, macs, from_lan, t, 64).marked(m);
            let multicast = if c.v6() {
                [0x33, 0x33, 0, 0, 0, 1]
            } else {
                [0x01, 0x00, 0x5e, 0, 0, 1]
            };
            let mut muts: Vec<(&str, Mutation)> = vec![
                ("valid", Box::new(|f| f.to_vec())),
                ("padding 6", Box::new(|f| with_trailer(f, &[0; 6]))),
                ("garbage 40", Box::new(|f| with_trailer(f, &[0xa5; 40]))),
                ("bad l4 checksum", Box::new(with_bad_l4_checksum)),
                (
                    "dst mac broadcast",
                    Box::new(|f| with_eth_dst(f, [0xff; 6])),
                ),
                (
                    "dst mac multicast",
                    Box::new(move |f| with_eth_dst(f, multicast)),
                ),
                (
                    "dst mac other host",
                    Box::new(|f| with_eth_dst(f, [0x02, 0, 0, 0, 0x77, 0x77])),
                ),
                (
                    "frame shorter than ip length",
                    Box::new(|f| f[..f.len() - 4].to_vec()),
                ),
            ];
            if c.v6() {
                muts.push((
                    "ipv6 destination options",
                    Box::new(|f| with_ipv6_ext(f, 60, &[0, 0, 1, 4, 0, 0, 0, 0])),
                ));
                muts.push((
                    "ipv6 payload length 4 short",
                    Box::new(|f| {
                        let plen = u16::from_be_bytes([f[ETH_LEN + 4], f[ETH_LEN + 5]]);
                        with_ipv6_payload_len(f, plen - 4)
                    }),
                ));
            } else {
                muts.push((
                    "ipv4 options",
                    Box::new(|f| with_ipv4_options(f, &[1, 1, 1, 0])),
                ));
                muts.push((
                    "ipv4 more fragments",
                    Box::new(|f| with_ipv4_frag(f, 0x2000)),
                ));
                muts.push(("bad ipv4 header checksum", Box::new(with_bad_ipv4_checksum)));
                muts.push((
                    "ipv4 total length 4 short",
                    Box::new(|f| {
                        let tot = u16::from_be_bytes([f[ETH_LEN + 2], f[ETH_LEN + 3]]);
                        with_ipv4_tot_len(f, tot - 4)
                    }),
                ));
            }
            if c.tcp {
                for (name, flags) in [
                    ("tcp psh only", PSH),
                    ("tcp no flags", 0),
                    ("tcp urg ack", 0x20 | ACK),
                    ("tcp ece cwr ack", 0x40 | 0x80 | ACK),
                    ("tcp all flags", 0xff),
                    ("tcp syn", SYN),
                ] {
                    muts.push((name, Box::new(move |f| with_tcp_flags(f, flags))));
                }
                muts.push(("tcp doff 4", Box::new(|f| with_tcp_doff(f, 4))));
                muts.push(("tcp doff past end", Box::new(|f| with_tcp_doff(f, 15))));
            } else {
                muts.push((
                    "udp length 2 short",
                    Box::new(|f| with_udp_len(f, (PAYLOAD + 8 - 2) as u16)),
                ));
                muts.push((
                    "udp length 2 long",
                    Box::new(|f| with_udp_len(f, (PAYLOAD + 8 + 2) as u16)),
                ));
                // "No checksum" to conntrack in both families (udp_error()).
                muts.push(("udp zero checksum", Box::new(with_zero_udp_checksum)));
            }
            for (name, m) in muts {
                push(
                    &mut out,
                    format!("{} {dir}: {name}", c.name),
                    from_lan,
                    &|marker| m(&base(marker)),
                );
            }
            for ttl in [1, 0] {
                push(
                    &mut out,
                    format!("{} {dir}: ttl {ttl}", c.name),
                    from_lan,
                    &|marker| spec(&c, macs, from_lan, t, ttl).marked(marker),
                );
            }
        }
        if !c.tcp {
            // ICMP error from the WAN host about a packet the router sent for the connection.
            push(
                &mut out,
                format!("{} reply: icmp error quoting the flow", c.name),
                false,
                &|marker| {
                    let mut sent = spec(&c, macs, true, Transport::Udp, 63);
                    if !c.v6() {
                        sent.src = IpAddr::V4(ROUTER_WAN_V4);
                    }
                    let f = sent.marked(marker);
                    icmp_error(&c, macs, &f[ETH_LEN..])
                },
            );
        }
    }
    out
}

/// What arrived for one case, and (fast path on) which counters moved on the ingress.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outcome {
    frames: Vec<Vec<u8>>,
}

/// The established connections of one half.
struct Live {
    tcp: Vec<(TcpStream, TcpStream)>,
    udp: Vec<(UdpSocket, UdpSocket)>,
}

/// A TCP socket bound to `local` and connected to `remote`, made in `ns`.
fn tcp_connect(ns: &Netns, local: SocketAddr, remote: SocketAddr) -> TcpStream {
    ns.run(move || {
        let fam = if local.is_ipv6() {
            libc::AF_INET6
        } else {
            libc::AF_INET
        };
        // SAFETY: plain socket(2); the fd is owned by the TcpStream below.
        let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a fresh socket nothing else owns.
        let stream = unsafe { TcpStream::from_raw_fd(fd) };
        let one: libc::c_int = 1;
        // SAFETY: valid fd and option.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                (&one as *const libc::c_int).cast(),
                4,
            )
        };
        let (sa, len) = sockaddr(local);
        // SAFETY: sockaddr storage valid for `len`.
        let rc = unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
        assert_eq!(rc, 0, "bind {local}: {}", std::io::Error::last_os_error());
        let (sa, len) = sockaddr(remote);
        // SAFETY: as above.
        let rc = unsafe { libc::connect(fd, (&sa as *const libc::sockaddr_storage).cast(), len) };
        assert_eq!(
            rc,
            0,
            "connect {remote}: {}",
            std::io::Error::last_os_error()
        );
        stream
    })
}

fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            (ss, std::mem::size_of::<libc::sockaddr_in>() as u32)
        }
        SocketAddr::V6(a) => {
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            let sin = unsafe {
                &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            sin.sin6_family = libc::AF_INET6 as u16;
            sin.sin6_port = a.port().to_be();
            sin.sin6_addr.s6_addr = a.ip().octets();
            (ss, std::mem::size_of::<libc::sockaddr_in6>() as u32)
        }
    }
}

/// Establishes the four connections and waits until the daemon offloaded all of them.
fn establish(tb: &Testbed) -> Live {
    let mut live = Live {
        tcp: Vec::new(),
        udp: Vec::new(),
    };
    for c in conns() {
        if c.tcp {
            let wan = c.wan;
            let listener = tb.wan.run(move || TcpListener::bind(wan).expect("listen"));
            let mut client = tcp_connect(&tb.lan, c.lan, c.wan);
            let (mut server, _) = listener.accept().expect("accept");
            client.write_all(b"hello").expect("write");
            let mut buf = [0u8; 5];
            server.read_exact(&mut buf).expect("read");
            server.write_all(b"world").expect("write");
            client.read_exact(&mut buf).expect("read");
            live.tcp.push((client, server));
        } else {
            let (lan, wan) = (c.lan, c.wan);
            let a = tb.lan.run(move || UdpSocket::bind(lan).expect("bind"));
            let b = tb.wan.run(move || UdpSocket::bind(wan).expect("bind"));
            b.set_read_timeout(Some(Duration::from_secs(2))).ok();
            a.set_read_timeout(Some(Duration::from_secs(2))).ok();
            live.udp.push((a, b));
        }
    }
    // UDP is offloaded once conntrack saw it both ways for a while (ASSURED).
    let udp_conns: Vec<Conn> = conns().into_iter().filter(|c| !c.tcp).collect();
    let ok = wait_until(Duration::from_secs(20), || {
        for ((a, b), c) in live.udp.iter().zip(&udp_conns) {
            a.send_to(b"ping", c.wan).expect("send");
            let mut buf = [0u8; 16];
            if let Ok((_, from)) = b.recv_from(&mut buf) {
                b.send_to(b"pong", from).expect("send");
                let _ = a.recv_from(&mut buf);
            }
        }
        std::thread::sleep(Duration::from_millis(300));
        let st = tb.daemon().status();
        st.flows.ipv4 >= 4 && st.flows.ipv6 >= 4
    });
    assert!(
        ok,
        "the four connections were not offloaded: {:?}\n{}",
        tb.daemon().status().flows,
        tb.router.exec_ok("conntrack", &["-L"])
    );
    live
}

fn counter(st: &Status, iface: &str, reason: &str) -> u64 {
    st.packets(iface, reason)
}

/// Reasons whose counters moved between two snapshots, on `iface`.
fn moved(a: &Status, b: &Status, iface: &str) -> String {
    let mut out = Vec::new();
    for row in &b.counters {
        if row.interface != iface {
            continue;
        }
        let d = row.packets - counter(a, iface, &row.reason);
        if d > 0 {
            out.push(format!("{}+{d}", row.reason));
        }
    }
    out.join(",")
}

/// One half: connections, warm-up, corpus, destructive cases, teardown. Returns per case the
/// frames that arrived and the reasons counted on the router's ingress.
/// What one half found: per case number, its name, what arrived and (fast path on) the reasons
/// whose counters moved on its ingress.
type Found = BTreeMap<usize, (String, Outcome, String)>;

/// The cases of `corpus` (then, with `destructive`, the FIN/RST/`conntrack -D` cases) with the
/// fast path `on` or off.
fn half(
    tb: &Testbed,
    macs: &Macs,
    on: bool,
    corpus: fn(&Macs) -> Vec<Case>,
    destructive: bool,
) -> Found {
    let live = establish(tb);
    tb.daemon().set_fastpath(on);
    let send_lan = Capture::open(&tb.lan, HOST_IF);
    let send_wan = Capture::open(&tb.wan, HOST_IF);
    let short = Duration::from_millis(200);

    // Warm-up: valid packets of every connection, both ways, arrive and take the expected path.
    let before = tb.daemon().status();
    for (i, c) in conns().iter().enumerate() {
        for from_lan in [true, false] {
            let t = if c.tcp {
                Transport::Tcp(ACK | PSH)
            } else {
                Transport::Udp
            };
            for k in 0..3u8 {
                let marker = [b"WARM".as_slice(), &[i as u8, from_lan as u8, k]].concat();
                let f = spec(c, macs, from_lan, t, 64).marked(&marker);
                let (tx, rx) = if from_lan {
                    (&send_lan, &send_wan)
                } else {
                    (&send_wan, &send_lan)
                };
                tx.send(&f);
                let got = rx.arrivals(&marker, short);
                assert_eq!(
                    got.len(),
                    1,
                    "warm-up {} {}: {} frames arrived (NAT port not kept?)",
                    c.name,
                    if from_lan { "orig" } else { "reply" },
                    got.len()
                );
            }
        }
    }
    let after = tb.daemon().status();
    let fwd = counter(&after, LAN_IF, "forwarded_original")
        - counter(&before, LAN_IF, "forwarded_original")
        + counter(&after, WAN_IF, "forwarded_reply")
        - counter(&before, WAN_IF, "forwarded_reply");
    let disabled = counter(&after, LAN_IF, "fastpath_disabled")
        - counter(&before, LAN_IF, "fastpath_disabled")
        + counter(&after, WAN_IF, "fastpath_disabled")
        - counter(&before, WAN_IF, "fastpath_disabled");
    eprintln!(
        "fast path {}: warm-up 24 valid packets, {fwd} forwarded by XDP, {disabled} passed as fastpath_disabled",
        if on { "on" } else { "off" }
    );
    if on {
        assert!(
            fwd >= 24,
            "warm-up: only {fwd} of 24 valid packets fast-pathed"
        );
    } else {
        assert_eq!(
            fwd, 0,
            "warm-up: fast path off but {fwd} packets forwarded by XDP"
        );
    }

    let mut results = BTreeMap::new();
    let run = |name: String, from_lan: bool, frame: &[u8], marker: &[u8]| {
        let (tx, rx, ingress) = if from_lan {
            (&send_lan, &send_wan, LAN_IF)
        } else {
            (&send_wan, &send_lan, WAN_IF)
        };
        while rx.next_incoming(Duration::from_millis(20)).is_some() {}
        let a = tb.daemon().status();
        tx.send(frame);
        let got = rx.arrivals(marker, short);
        let b = tb.daemon().status();
        (name, Outcome { frames: got }, moved(&a, &b, ingress))
    };
    let cases = corpus(macs);
    for (n, c) in cases.iter().enumerate() {
        results.insert(n, run(c.name.clone(), c.from_lan, &c.frame, &c.marker));
    }
    if destructive {
        destructive_cases(tb, macs, &run, cases.len(), &mut results);
    }
    teardown(tb, live);
    results
}

/// Sends one case's frame and collects what arrived: `(name, from_lan, frame, marker)` to
/// `(name, outcome, reasons)`.
type RunCase<'a> = dyn Fn(String, bool, &[u8], &[u8]) -> (String, Outcome, String) + 'a;

/// The cases that change conntrack state (FIN, RST, `conntrack -D`), numbered from `n`, each
/// followed by a valid packet both ways once things settled.
fn destructive_cases(
    tb: &Testbed,
    macs: &Macs,
    run: &RunCase<'_>,
    mut n: usize,
    results: &mut Found,
) {
    for c in conns() {
        let t = if c.tcp {
            Transport::Tcp(ACK | PSH)
        } else {
            Transport::Udp
        };
        let steps: Vec<(&str, Option<u8>)> = if c.tcp {
            vec![("fin ack", Some(FIN | ACK)), ("rst", Some(RST))]
        } else {
            vec![("conntrack -D", None)]
        };
        for (what, flags) in steps {
            let marker = [b"XDIF".as_slice(), &(n as u16).to_be_bytes()].concat();
            match flags {
                Some(fl) => {
                    let f = with_tcp_flags(&spec(&c, macs, true, t, 64).marked(&marker), fl);
                    results.insert(
                        n,
                        run(format!("{} orig: {what}", c.name), true, &f, &marker),
                    );
                }
                None => {
                    let fam = if c.v6() { "ipv6" } else { "ipv4" };
                    tb.router.exec(
                        "conntrack",
                        &[
                            "-D",
                            "-f",
                            fam,
                            "-p",
                            "udp",
                            "--orig-port-src",
                            &c.lan.port().to_string(),
                        ],
                    );
                    results.insert(
                        n,
                        (
                            format!("{} : {what}", c.name),
                            Outcome { frames: vec![] },
                            String::new(),
                        ),
                    );
                }
            }
            n += 1;
            std::thread::sleep(Duration::from_millis(1500));
            for from_lan in [true, false] {
                let marker = [b"XDIF".as_slice(), &(n as u16).to_be_bytes()].concat();
                let f = spec(&c, macs, from_lan, t, 64).marked(&marker);
                let dir = if from_lan { "orig" } else { "reply" };
                let name = format!("{} {dir}: valid after {what}", c.name);
                results.insert(n, run(name, from_lan, &f, &marker));
                n += 1;
            }
        }
    }
}

/// Aborts the TCP connections, flushes conntrack and waits until nothing is offloaded.
fn teardown(tb: &Testbed, live: Live) {
    for (client, server) in live.tcp {
        drop(server);
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        use std::os::fd::AsRawFd;
        // SAFETY: valid fd and option.
        unsafe {
            libc::setsockopt(
                client.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as u32,
            )
        };
        drop(client);
    }
    drop(live.udp);
    tb.router.exec("conntrack", &["-F"]);
    let gone = wait_until(Duration::from_secs(10), || {
        let st = tb.daemon().status();
        st.flows.ipv4 == 0 && st.flows.ipv6 == 0
    });
    assert!(gone, "flows still offloaded after conntrack -F");
}
