//! Firewall changes take effect on offloaded flows: real iptables-nft / nft rules inserted
//! while a fast-pathed stream runs stop it within a second (the daemon bumps the ruleset
//! generation on the nftables commit, every flow direction is disarmed, and the kernel's rules
//! judge the next packet); `conntrack -D` / `-F` hand the connection back to the kernel; a rule
//! that does not match lets the flow back on the fast path; a rule dropping only replies keeps
//! every reply from the LAN host. Run as root with one test thread (`cargo xtask test`).

use std::{
    collections::BTreeSet,
    io::{self, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::{JoinHandle, sleep},
    time::{Duration, Instant},
};

use xdp_router_tests::testbed::{
    Capture, HOST_IF, LAN_IF, Testbed, UdpEcho, WAN_IF, any_v4, lan_fast_share, ready, time_scale,
    udp_payload, udp_socket, wait_until, wan_v4,
};

/// A LAN→WAN TCP stream at a fixed rate whose receiver counts bytes live.
struct Stream {
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

/// Bytes per second of the stream: ~4000 full-size packets per second.
const RATE: u64 = 6_000_000;

impl Stream {
    fn start(tb: &Testbed, server: SocketAddr) -> Stream {
        let listener = tb
            .wan
            .run(move || TcpListener::bind(server))
            .unwrap_or_else(|e| panic!("bind {server}: {e}"));
        let client = tb
            .lan
            .run(move || TcpStream::connect_timeout(&server, Duration::from_secs(5)))
            .unwrap_or_else(|e| panic!("connect {server}: {e}"));
        let (mut conn, _) = listener.accept().expect("accept");
        let received = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (rx, stop_rx) = (received.clone(), stop.clone());
        let receiver = std::thread::spawn(move || {
            let _ = conn.set_read_timeout(Some(Duration::from_millis(100)));
            let mut buf = vec![0u8; 65536];
            while !stop_rx.load(Ordering::SeqCst) {
                match conn.read(&mut buf) {
                    Ok(0) => return,
                    Ok(n) => {
                        rx.fetch_add(n as u64, Ordering::SeqCst);
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        });
        let stop_tx = stop.clone();
        let mut client = client;
        let sender = std::thread::spawn(move || {
            let _ = client.set_write_timeout(Some(Duration::from_millis(100)));
            let chunk = vec![0x5au8; 16 << 10];
            let start = Instant::now();
            let mut sent = 0u64;
            while !stop_tx.load(Ordering::SeqCst) {
                let due = start.elapsed().as_secs_f64() * RATE as f64;
                if (sent as f64) < due {
                    match client.write(&chunk) {
                        Ok(n) => sent += n as u64,
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                            ) => {}
                        Err(_) => return,
                    }
                } else {
                    sleep(Duration::from_millis(1));
                }
            }
        });
        Stream {
            received,
            stop,
            threads: vec![receiver, sender],
        }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }

    /// Time until the receiver's byte count stays flat for 300 ms (measured from `since`), or
    /// `None` if it still grows after `limit`.
    fn time_to_stop(&self, since: Instant, limit: Duration) -> Option<Duration> {
        let mut last = self.received();
        let mut last_change = Instant::now();
        while since.elapsed() < limit + Duration::from_millis(300) {
            sleep(Duration::from_millis(10));
            let now = self.received();
            if now != last {
                last = now;
                last_change = Instant::now();
            } else if last_change.elapsed() >= Duration::from_millis(300) {
                return Some(last_change - since);
            }
        }
        None
    }

    /// Whether bytes still arrive: growth over `window`.
    fn grows_over(&self, window: Duration) -> u64 {
        let before = self.received();
        sleep(window);
        self.received() - before
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Starts the daemon and a stream to `port`, and waits until the stream is fast-pathed
/// (≥ 90 % of its LAN packets forwarded by XDP over one second), 10 s at most ([`time_scale`]
/// times that on an emulated CPU: there the snapshots' reads of the XDP and the wire counters
/// lie further apart, and one window in the arm64 guest measured 87.7 %).
fn fast_stream(tb: &mut Testbed, port: u16) -> Stream {
    tb.start_daemon();
    let stream = Stream::start(tb, wan_v4(port));
    let mut share = (0.0, 0);
    let ok = wait_until(Duration::from_secs(10) * time_scale(), || {
        share = lan_fast_share(tb, Duration::from_secs(1));
        share.0 >= 0.9
    });
    assert!(
        ok,
        "the stream is not fast-pathed: {:.1} % of {} packets; status:\n{}",
        share.0 * 100.0,
        share.1,
        tb.daemon().ctl(&["status"]).unwrap_or_default()
    );
    eprintln!(
        "stream to {port}: {:.1} % of {} LAN packets fast-pathed before the change",
        share.0 * 100.0,
        share.1
    );
    stream
}

/// Runs `change` in the router and checks the stream stops within 1 s (times
/// [`time_scale`] on an emulated CPU).
fn stops_within_a_second(tb: &Testbed, stream: &Stream, what: &str, change: &str) {
    let changes = tb.daemon().status().ruleset.changes;
    let limit = Duration::from_secs(1) * time_scale();
    let t0 = Instant::now();
    tb.router.sh(change);
    let stopped = stream.time_to_stop(t0, limit);
    eprintln!("{what}: the stream stopped after {stopped:?}");
    let after = tb.daemon().status();
    assert!(
        stopped.is_some_and(|t| t <= limit),
        "{what}: the stream still flows {limit:?} after the change ({} bytes in the last \
         500 ms); ruleset changes {} -> {}",
        stream.grows_over(Duration::from_millis(500)),
        changes,
        after.ruleset.changes
    );
}

#[test]
fn iptables_drop_stops_an_offloaded_stream() {
    if !ready("iptables_drop_stops_an_offloaded_stream") {
        return;
    }
    let mut tb = Testbed::new("fw1");
    let stream = fast_stream(&mut tb, 6001);
    stops_within_a_second(
        &tb,
        &stream,
        "iptables -I FORWARD 1 -j DROP",
        "iptables -w -I FORWARD 1 -p tcp --dport 6001 -j DROP",
    );
}

#[test]
fn nft_rule_stops_an_offloaded_stream() {
    if !ready("nft_rule_stops_an_offloaded_stream") {
        return;
    }
    let mut tb = Testbed::new("fw2");
    // An nft-native table next to iptables-nft's, hooked before its FORWARD chain.
    tb.router.sh("nft add table inet fw
         nft add chain inet fw fw_forward '{ type filter hook forward priority -10; }'
         nft add rule inet fw fw_forward counter");
    let stream = fast_stream(&mut tb, 6002);
    stops_within_a_second(
        &tb,
        &stream,
        "nft insert rule ... drop",
        "nft insert rule inet fw fw_forward tcp dport 6002 drop",
    );
}

/// iptables-legacy sends no notifications: the daemon polls it every 500 ms while legacy tables
/// exist, so a legacy DROP rule stops the stream within about a second too.
#[test]
fn iptables_legacy_drop_stops_an_offloaded_stream() {
    if !ready("iptables_legacy_drop_stops_an_offloaded_stream") {
        return;
    }
    let mut tb = Testbed::new("fw7");
    let stream = fast_stream(&mut tb, 6007);
    stops_within_a_second(
        &tb,
        &stream,
        "iptables-legacy -I FORWARD 1 -j DROP",
        "iptables-legacy -w -I FORWARD 1 -p tcp --dport 6007 -j DROP",
    );
}

/// Drops NEW connections on the forward path (an unrelated change for the running stream,
/// which must return to the fast path), then deletes the stream's conntrack entry with
/// `conntrack_cmd`: its next packets are NEW and must be dropped.
fn conntrack_removal_stops_the_stream(tag: &str, port: u16, conntrack_cmd: &str) {
    let mut tb = Testbed::new(tag);
    let stream = fast_stream(&mut tb, port);
    tb.router
        .sh("iptables -w -I FORWARD 1 -m conntrack --ctstate NEW -j DROP");
    let ok = wait_until(Duration::from_secs(3), || {
        lan_fast_share(&tb, Duration::from_millis(500)).0 >= 0.9
    });
    assert!(
        ok,
        "the stream did not return to the fast path after an unrelated rule"
    );
    stops_within_a_second(&tb, &stream, conntrack_cmd, conntrack_cmd);
}

#[test]
fn conntrack_delete_stops_an_offloaded_stream() {
    if !ready("conntrack_delete_stops_an_offloaded_stream") {
        return;
    }
    conntrack_removal_stops_the_stream(
        "fw3",
        6003,
        "conntrack -D -p tcp --dport 6003 >/dev/null 2>&1",
    );
}

#[test]
fn conntrack_flush_stops_an_offloaded_stream() {
    if !ready("conntrack_flush_stops_an_offloaded_stream") {
        return;
    }
    conntrack_removal_stops_the_stream("fw4", 6004, "conntrack -F >/dev/null 2>&1");
}

#[test]
fn unrelated_rule_change_keeps_the_stream_fast_pathed() {
    if !ready("unrelated_rule_change_keeps_the_stream_fast_pathed") {
        return;
    }
    let mut tb = Testbed::new("fw5");
    let stream = fast_stream(&mut tb, 6005);
    let changes = tb.daemon().status().ruleset.changes;
    tb.router
        .sh("iptables -w -I FORWARD 1 -p tcp --dport 9999 -j DROP");
    let (share, wire) = lan_fast_share(&tb, Duration::from_secs(2));
    let st = tb.daemon().status();
    eprintln!(
        "after an unrelated rule: {:.1} % of {wire} LAN packets fast-pathed over 2 s; ruleset \
         changes {changes} -> {}",
        share * 100.0,
        st.ruleset.changes
    );
    assert!(
        st.ruleset.changes > changes,
        "the daemon saw no ruleset change"
    );
    assert!(
        st.packets(LAN_IF, "awaiting_kernel_verdict") > 0,
        "no packet went through the kernel after the change"
    );
    assert!(share >= 0.9, "only {:.1} % fast-pathed", share * 100.0);
    assert!(stream.grows_over(Duration::from_millis(300)) > 0);
}

/// FORWARD drops only the replies of an offloaded UDP flow: none reaches the LAN host.
#[test]
fn reply_only_drop_keeps_replies_from_the_lan() {
    if !ready("reply_only_drop_keeps_replies_from_the_lan") {
        return;
    }
    let mut tb = Testbed::new("fw6");
    tb.start_daemon();
    let server = wan_v4(6006);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let mut buf = [0u8; 2048];
    let mut seq = 0u64;
    let mut exchange = |n: u64| {
        let mut replies = 0;
        for _ in 0..n {
            sock.send_to(&udp_payload(seq, 200), server).expect("send");
            seq += 1;
            while sock.recv_from(&mut buf).is_ok() {
                replies += 1;
            }
        }
        replies
    };
    // Until conntrack calls it ASSURED and both directions are fast-pathed.
    let ok = wait_until(Duration::from_secs(10), || {
        exchange(20);
        let st = tb.daemon().status();
        st.packets(WAN_IF, "forwarded_reply") > 10 && st.packets(LAN_IF, "forwarded_original") > 10
    });
    assert!(ok, "the UDP flow was not fast-pathed both ways");
    tb.router
        .sh("iptables -w -I FORWARD 1 -i eth0 -p udp --sport 6006 -j DROP");
    // The commit notification reaches the daemon within milliseconds.
    sleep(Duration::from_millis(50));
    let before = tb.snapshot();
    let replies = exchange(200);
    let after = tb.snapshot();
    let echoed = echo.finish().received;
    let fwd_replies = after.packets_since(&before, WAN_IF, "forwarded_reply");
    eprintln!(
        "after the reply-only DROP: {replies} replies reached the LAN host, {fwd_replies} \
         forwarded by XDP; the WAN host received {echoed} datagrams in all"
    );
    assert_eq!(replies, 0, "replies reached the LAN host despite the DROP");
    assert_eq!(fwd_replies, 0);
    assert!(
        after.packets_since(&before, LAN_IF, "forwarded_original") > 100,
        "the original direction should still be fast-pathed"
    );
}

/// What the WAN host received of 100 LAN → WAN datagrams of an offloaded UDP flow, and how the
/// router carried them.
struct HeaderSeen {
    /// Distinct DSCPs of the datagrams captured at the WAN host.
    dscps: BTreeSet<u8>,
    /// Distinct TTLs of the datagrams captured at the WAN host (sent with TTL 64).
    ttls: BTreeSet<u8>,
    /// LAN → WAN datagrams the fast path forwarded.
    fast_pathed: u64,
    /// LAN → WAN datagrams counted under the reason asked for.
    counted: u64,
    /// WAN → LAN replies the fast path forwarded.
    replies_fast_pathed: u64,
}

/// Runs `nft_setup` on the router (a rule that sets DSCP CS3 somewhere), starts the daemon
/// (`lan_extra` in the LAN interface's config), offloads a UDP flow LAN → WAN and sends 100
/// more datagrams, capturing them at the WAN host; `reason` is counted on the LAN interface.
fn seen_at_the_wan_host(
    tag: &str,
    port: u16,
    nft_setup: &str,
    lan_extra: &str,
    reason: &str,
) -> HeaderSeen {
    let mut tb = Testbed::new(tag);
    tb.router.sh(nft_setup);
    tb.start_daemon_with_lan("", lan_extra);
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let mut buf = [0u8; 2048];
    let mut seq = 0u64;
    let mut exchange = |n: u64| {
        for _ in 0..n {
            sock.send_to(&udp_payload(seq, 200), server).expect("send");
            seq += 1;
            while sock.recv_from(&mut buf).is_ok() {}
        }
    };
    // Until conntrack calls it ASSURED and the daemon offloaded it (and armed it, if it can).
    let ok = wait_until(Duration::from_secs(10), || {
        exchange(10);
        let st = tb.daemon().status();
        st.conntrack.offloaded >= 1
            && st.packets(WAN_IF, "forwarded_reply") + st.packets(LAN_IF, reason) > 5
    });
    assert!(ok, "the UDP flow was not offloaded");
    let capture = Capture::open(&tb.wan, HOST_IF);
    let before = tb.snapshot();
    exchange(100);
    let after = tb.snapshot();
    let (mut dscps, mut ttls) = (BTreeSet::new(), BTreeSet::new());
    while let Some(frame) = capture.next_incoming(Duration::from_millis(200)) {
        // IPv4 UDP to the echo port: the DSCP is the top 6 bits of the TOS byte.
        if frame.get(12..14) == Some(&[0x08, 0x00]) && frame.get(23) == Some(&17) {
            dscps.extend(frame.get(15).map(|tos| tos >> 2));
            ttls.extend(frame.get(22).copied());
        }
    }
    drop(echo);
    assert!(
        !dscps.is_empty(),
        "no UDP datagram captured at the WAN host"
    );
    HeaderSeen {
        dscps,
        ttls,
        fast_pathed: after.packets_since(&before, LAN_IF, "forwarded_original"),
        counted: after.packets_since(&before, LAN_IF, reason),
        replies_fast_pathed: after.packets_since(&before, WAN_IF, "forwarded_reply"),
    }
}

/// A netdev ingress chain on the LAN port (`LAN_IF`, eth1) that sets DSCP CS3.
const NETDEV_DSCP: &str = "nft add table netdev dscp_tag
     nft add chain netdev dscp_tag lan_in '{ type filter hook ingress device eth1 priority 0; }'
     nft add rule netdev dscp_tag lan_in ip dscp set cs3";

#[test]
fn netdev_ingress_chain_keeps_its_packets_in_the_kernel() {
    if !ready("netdev_ingress_chain_keeps_its_packets_in_the_kernel") {
        return;
    }
    let seen = seen_at_the_wan_host("fw8", 6008, NETDEV_DSCP, "", "ingress_hook");
    eprintln!(
        "netdev ingress chain (DSCP CS3): WAN host saw DSCP {:?}; LAN: {} fast-pathed, {} \
         ingress_hook",
        seen.dscps, seen.fast_pathed, seen.counted
    );
    assert_eq!(
        seen.dscps,
        BTreeSet::from([24]),
        "the WAN host should see CS3 (24) only"
    );
    assert_eq!(
        seen.fast_pathed, 0,
        "no LAN packet may skip the netdev ingress chain"
    );
    assert!(
        seen.counted >= 100,
        "only {} LAN packets counted ingress_hook",
        seen.counted
    );
}

/// `bypass_hooks = true` stops the daemon from keeping the LAN ingress in the kernel for the
/// netdev chain (nothing is counted `ingress_hook`), but the chain rewrites the DSCP, and a
/// rewrite the kernel applies is still followed: the DSCP stamp (TC ingress, before the netdev
/// chain) and the arming program saw it change, the chain's rule sets a constant on no match
/// at all, so the fast path sets CS3 itself and the WAN host still sees only CS3.
#[test]
fn bypass_hooks_still_follows_a_dscp_rewrite() {
    if !ready("bypass_hooks_still_follows_a_dscp_rewrite") {
        return;
    }
    let seen = seen_at_the_wan_host(
        "fw9",
        6009,
        NETDEV_DSCP,
        "bypass_hooks = true\n",
        "forwarded_original",
    );
    eprintln!(
        "netdev ingress chain with bypass_hooks = true: WAN host saw DSCP {:?}; LAN: {} \
         fast-pathed",
        seen.dscps, seen.fast_pathed
    );
    assert_eq!(
        seen.dscps,
        BTreeSet::from([24]),
        "every datagram must leave with CS3"
    );
    assert!(
        seen.fast_pathed >= 90,
        "only {} of 100 fast-pathed",
        seen.fast_pathed
    );
}

/// A rule in the forward path that sets the TTL (nft `ip ttl set 64` for packets to the WAN)
/// applies to every packet of an offloaded flow: the arming program saw the kernel send TTL 64
/// for datagrams that arrive with 64 (the fast path would send 63), so LAN packets go to the
/// kernel, while the replies, which no rule touches, stay on the fast path.
#[test]
fn forward_chain_ttl_set_applies_to_offloaded_flows() {
    if !ready("forward_chain_ttl_set_applies_to_offloaded_flows") {
        return;
    }
    let seen = seen_at_the_wan_host(
        "fwt",
        6011,
        "nft add table inet mangle
         nft add chain inet mangle ttl_out '{ type filter hook forward priority -150; }'
         nft add rule inet mangle ttl_out oifname eth0 ip ttl set 64",
        "",
        "ttl_rewritten_by_kernel",
    );
    eprintln!(
        "forward chain sets TTL 64: WAN host saw TTL {:?}; LAN: {} fast-pathed, {} \
         ttl_rewritten_by_kernel; replies: {} fast-pathed",
        seen.ttls, seen.fast_pathed, seen.counted, seen.replies_fast_pathed
    );
    assert_eq!(
        seen.ttls,
        BTreeSet::from([64]),
        "every datagram must leave with the rule's TTL 64"
    );
    assert_eq!(
        seen.fast_pathed, 0,
        "no LAN packet may skip the forward chain's TTL rewrite"
    );
    assert!(
        seen.counted >= 100,
        "only {} counted ttl_rewritten_by_kernel",
        seen.counted
    );
    assert!(
        seen.replies_fast_pathed >= 90,
        "the untouched replies should stay fast-pathed: {}",
        seen.replies_fast_pathed
    );
}
