//! Rules that must see every packet keep the connections they can match in the kernel: a
//! `hashlimit` rule in FORWARD still limits an offloaded UDP flow, a `quota` rule stops a flow
//! at its quota, and an `NFQUEUE` rule sees every packet of an established flow (a queue reader
//! in the test counts them); a hashlimit on one port leaves the flows to other ports on the
//! fast path (and, for UDP to every port, holds them). Each has its negative control: with `per_packet_rules = "ignore"` the fast path
//! carries the flow past the limit and the quota, and the queue misses it. Each test says from the daemon's counters and the router's wire counters
//! which path the packets took. Run as root with one test thread (`cargo xtask test`).

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread::sleep,
    time::{Duration, Instant},
};

mod first_packets;
mod one_port;

use xdp_router_tests::testbed::{
    LAN_IF, PING_DGRAM, PING_TICK, Snapshot, Status, Testbed, UdpEcho, WAN_IF, any_v4,
    fastpath_fraction, offload_udp, ping_pong, ping_until, ready, udp_payload, udp_socket, wan_v4,
};

/// Datagram payload of the streams (IPv4 packets of 228 bytes).
const PAYLOAD: usize = 200;
/// IP length of one datagram of [`PAYLOAD`] bytes (what `-m quota` counts).
const IP_LEN: u64 = 20 + 8 + PAYLOAD as u64;

/// Sends datagrams from `sock` to `server` at `pps` for `dur`, sequence numbers from `*seq`
/// on; returns how many were sent. Replies are not read (the socket's buffer drops them).
fn blast(sock: &UdpSocket, server: SocketAddr, seq: &mut u64, pps: u64, dur: Duration) -> u64 {
    let t0 = Instant::now();
    let mut sent = 0u64;
    while t0.elapsed() < dur {
        let due = (t0.elapsed().as_secs_f64() * pps as f64) as u64;
        while sent < due {
            // ENOBUFS and the like only mean fewer datagrams left the host.
            if sock.send_to(&udp_payload(*seq, PAYLOAD), server).is_ok() {
                sent += 1;
            }
            *seq += 1;
        }
        sleep(Duration::from_micros(500));
    }
    sent
}

/// Ping-pongs 50 datagrams on the offloaded flow of `sock` and checks the fast path carried
/// them both ways (at least 90 %: with `verdict_max_age_ms` a direction goes through the
/// kernel once per age), so the test can tell the paths apart before the rule.
fn fast_pathed_before_the_rule(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64) {
    let before = tb.snapshot();
    let pp = ping_pong(sock, server, *seq, 50, PING_DGRAM, PING_TICK);
    *seq += pp.sent;
    let after = tb.snapshot();
    assert_eq!((pp.good, pp.lost), (pp.sent, 0), "before the rule: {pp:?}");
    let orig = after.packets_since(&before, LAN_IF, "forwarded_original");
    let reply = after.packets_since(&before, WAN_IF, "forwarded_reply");
    eprintln!(
        "before the rule: {} datagrams each way, {orig} / {reply} forwarded by XDP",
        pp.sent
    );
    assert!(
        orig * 10 >= pp.sent * 9 && reply * 10 >= pp.sent * 9,
        "the flow is not fast-pathed before the rule: {orig} original, {reply} reply of {}",
        pp.sent
    );
}

/// LAN packets XDP handed to the kernel between `before` and `after` because a rule holds
/// them: every packet (`per_packet_rule_in_ruleset`), or their connection is held in the
/// kernel by a narrowed rule and has no flow entry (`no_flow`).
fn held_for_the_rule(after: &Snapshot, before: &Snapshot) -> u64 {
    after.packets_since(before, LAN_IF, "per_packet_rule_in_ruleset")
        + after.packets_since(before, LAN_IF, "no_flow")
}

/// Ping-pongs on `sock` until the daemon holds `held` connections for a narrowed rule, this
/// one among them (8 s at most, times the time scale); every datagram must come back.
fn held_udp(tb: &Testbed, sock: &UdpSocket, server: SocketAddr, seq: &mut u64, held: u64) {
    ping_until(tb, sock, server, seq, "held for the rule", |st| {
        st.per_packet.held_connections == held
    });
}

/// Runs `cmd` in the router; on failure (a match or target this kernel lacks) skips `test`.
fn rule_or_skip(tb: &Testbed, test: &str, cmd: &str) -> bool {
    let out = tb.router.exec("sh", &["-c", cmd]);
    if out.status.success() {
        return true;
    }
    xdp_router_tests::netns::skip(
        test,
        &format!(
            "`{cmd}` failed (kernel without the match or target?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    )
}

/// Waits until the daemon lists a per-packet rule of `kind` (narrowed to the connections its
/// protocol and port tests can match: every rule here tests the stream's UDP port), holding
/// those connections under `hold`; returns the status.
fn rule_seen(tb: &Testbed, kind: &str, hold: bool) -> Status {
    let (st, ok) = tb.daemon().wait_status(Duration::from_secs(5), |st| {
        !st.per_packet.reading
            && !st.per_packet.held
            && st.per_packet.rules.iter().any(|r| {
                r.kinds.iter().any(|k| k == kind)
                    && r.flows.is_some()
                    && r.not_held_because.is_none()
            })
            && (!hold || st.conntrack.offloaded == 0 || st.per_packet.held_connections >= 1)
    });
    assert!(
        ok,
        "the daemon does not list the {kind} rule narrowed (holding = {hold}) within 5 s: {:?}\n{}",
        st.per_packet,
        tb.daemon().log_tail()
    );
    let line = tb.daemon().ctl(&["status"]).unwrap_or_default();
    let line = line
        .lines()
        .find(|l| l.contains(&format!("uses {kind}")))
        .unwrap_or_else(|| panic!("`status` shows no line with the {kind} rule:\n{line}"));
    eprintln!("status: {line}");
    st
}

/// What [`hashlimit_run`] measured while the stream ran with the rule in place.
struct Limited {
    /// Datagrams per second the WAN host received.
    delivered_pps: f64,
    /// Datagrams per second sent.
    sent_pps: f64,
    /// Share of the LAN wire packets the fast path forwarded.
    fast_share: f64,
    /// LAN packets handed to the kernel for the rule (see [`held_for_the_rule`]).
    held: u64,
    /// LAN wire packets.
    wire: u64,
}

/// Limit of the hashlimit rule, in packets per second, and its burst.
const LIMIT: u64 = 500;
const BURST: u64 = 5;
/// Rate and duration of the stream.
const RATE: u64 = 3000;
const SECS: u64 = 3;

/// Checks that a stream sent at `sent_pps` exceeded the hashlimit rule's [`LIMIT`] and that at
/// most the limit got through (`delivered_pps`).
fn assert_limited(sent_pps: f64, delivered_pps: f64) {
    assert!(
        sent_pps > 2.0 * LIMIT as f64,
        "the stream must exceed the limit for the test to mean anything"
    );
    // hashlimit lets LIMIT per second plus the burst through; 10 % for the timing of a
    // 3 s measurement on a loaded machine.
    let allowed = (LIMIT as f64 * SECS as f64 + BURST as f64) * 1.1 / SECS as f64;
    assert!(
        delivered_pps <= allowed,
        "{delivered_pps:.0} pkt/s delivered, the limit allows {allowed:.0}"
    );
}

/// Offloads a UDP flow (fast-pathed both ways first), inserts a hashlimit DROP rule at the top
/// of FORWARD (before the ESTABLISHED accept), then sends [`RATE`] pkt/s for [`SECS`] s.
/// `None` when the test cannot run here.
fn hashlimit_run(test: &str, tag: &str, port: u16, mode: &str) -> Option<Limited> {
    let mut tb = Testbed::new(tag);
    tb.start_daemon_with(&format!("per_packet_rules = \"{mode}\"\n"));
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0u64;
    offload_udp(&tb, &sock, server, &mut seq);
    fast_pathed_before_the_rule(&tb, &sock, server, &mut seq);
    let before_rule = seq;
    if !rule_or_skip(
        &tb,
        test,
        &format!(
            "iptables -w -I FORWARD 1 -p udp --dport {port} -m hashlimit --hashlimit-above \
             {LIMIT}/sec --hashlimit-burst {BURST} --hashlimit-mode srcip --hashlimit-name t \
             -j DROP"
        ),
    ) {
        return None;
    }
    rule_seen(&tb, "hashlimit", mode == "hold");
    let before: Snapshot = tb.snapshot();
    let t0 = Instant::now();
    let sent = blast(&sock, server, &mut seq, RATE, Duration::from_secs(SECS));
    let elapsed = t0.elapsed().as_secs_f64();
    // Let the last datagrams arrive.
    sleep(Duration::from_millis(200));
    let after = tb.snapshot();
    // Every datagram before the rule came back (offload_udp and fast_pathed_before_the_rule check it).
    let delivered = echo.finish().received.saturating_sub(before_rule);
    let wire = after.rx_lan_since(&before);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    let r = Limited {
        delivered_pps: delivered as f64 / elapsed,
        sent_pps: sent as f64 / elapsed,
        fast_share: fastpath_fraction(fwd, wire),
        held: held_for_the_rule(&after, &before),
        wire,
    };
    eprintln!(
        "hashlimit {LIMIT}/s (burst {BURST}), per_packet_rules = {mode}: sent {sent} in \
         {elapsed:.2} s ({:.0} pkt/s), delivered {delivered} ({:.0} pkt/s); LAN wire {wire}, \
         {fwd} forwarded by XDP ({:.1} %), {} held for the rule",
        r.sent_pps,
        r.delivered_pps,
        r.fast_share * 100.0,
        r.held
    );
    Some(r)
}

/// `-m hashlimit --hashlimit-above 500/sec … -j DROP` before the ESTABLISHED accept: the
/// offloaded flow's packets go back to the kernel and get at most the limit (+ burst) through.
#[test]
fn hashlimit_in_forward_limits_an_offloaded_flow() {
    let test = "hashlimit_in_forward_limits_an_offloaded_flow";
    if !ready(test) {
        return;
    }
    let Some(r) = hashlimit_run(test, "pph", 6101, "hold") else {
        return;
    };
    assert_limited(r.sent_pps, r.delivered_pps);
    assert_eq!(r.fast_share, 0.0, "no packet may be fast-pathed while held");
    assert!(
        r.held >= r.wire * 9 / 10 && r.held > 0,
        "{} of {} LAN wire packets handed to the kernel for the rule",
        r.held,
        r.wire
    );
}

/// The negative control: the same rule with `per_packet_rules = "ignore"` (flowtable
/// semantics) lets the fast path carry the flow far past the limit, so the test above can
/// fail.
#[test]
fn hashlimit_is_bypassed_with_per_packet_rules_ignore() {
    let test = "hashlimit_is_bypassed_with_per_packet_rules_ignore";
    if !ready(test) {
        return;
    }
    let Some(r) = hashlimit_run(test, "ppi", 6104, "ignore") else {
        return;
    };
    assert!(
        r.delivered_pps > 2.0 * LIMIT as f64,
        "with the rule ignored the fast path should carry the stream past the limit: {:.0} pkt/s",
        r.delivered_pps
    );
    assert!(
        r.fast_share >= 0.8,
        "{:.1} % fast-pathed",
        r.fast_share * 100.0
    );
    assert_eq!(r.held, 0);
}

/// Quota of the quota rule, in bytes of IP (about 650 datagrams).
const QUOTA: u64 = 150_000;

/// What [`quota_run`] measured.
struct QuotaRun {
    /// Bytes of IP the WAN host received (the whole flow).
    delivered: u64,
    /// Bytes of IP sent (the whole flow).
    sent: u64,
    /// In the burst: LAN wire packets, forwarded by XDP, held for the rule.
    wire: u64,
    fwd: u64,
    held: u64,
}

/// `-m quota --quota Q -j ACCEPT`, then DROP, for the flow's port, in place before the daemon
/// starts (the start-up read); a UDP flow offloaded, then a burst of more than the quota.
/// `None` when the test cannot run here.
fn quota_run(test: &str, tag: &str, port: u16, mode: &str) -> Option<QuotaRun> {
    let mut tb = Testbed::new(tag);
    if !rule_or_skip(
        &tb,
        test,
        &format!(
            "iptables -w -I FORWARD 1 -p udp --dport {port} -m quota --quota {QUOTA} -j ACCEPT
             iptables -w -I FORWARD 2 -p udp --dport {port} -j DROP"
        ),
    ) {
        return None;
    }
    tb.start_daemon_with(&format!("per_packet_rules = \"{mode}\"\n"));
    rule_seen(&tb, "quota", mode == "hold");
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0u64;
    // Offloaded, or held for the rule (~2 s of 50 datagrams a second at most, well inside the
    // quota).
    if mode == "hold" {
        held_udp(&tb, &sock, server, &mut seq, 1);
    } else {
        offload_udp(&tb, &sock, server, &mut seq);
    }
    let before = tb.snapshot();
    // Twice the quota and more.
    let burst = blast(&sock, server, &mut seq, 2000, Duration::from_secs(1));
    sleep(Duration::from_millis(200));
    let after = tb.snapshot();
    let delivered = echo.finish().received;
    let r = QuotaRun {
        delivered: delivered * IP_LEN,
        sent: seq * IP_LEN,
        wire: after.rx_lan_since(&before),
        fwd: after.packets_since(&before, LAN_IF, "forwarded_original"),
        held: held_for_the_rule(&after, &before),
    };
    eprintln!(
        "quota {QUOTA} B, per_packet_rules = {mode}: {seq} datagrams sent in all ({burst} in \
         the burst), {delivered} delivered = {} B of IP; burst: LAN wire {}, {} forwarded by \
         XDP, {} held for the rule",
        r.delivered, r.wire, r.fwd, r.held
    );
    assert!(
        r.sent > QUOTA + 10 * IP_LEN,
        "the test must send more than the quota"
    );
    Some(r)
}

/// A quota rule stops an offloaded flow at its quota, within one packet.
#[test]
fn quota_rule_stops_an_offloaded_flow_at_its_quota() {
    let test = "quota_rule_stops_an_offloaded_flow_at_its_quota";
    if !ready(test) {
        return;
    }
    let Some(r) = quota_run(test, "ppq", 6102, "hold") else {
        return;
    };
    assert!(
        r.delivered <= QUOTA + IP_LEN,
        "{} B delivered, more than the quota ({QUOTA} B) and one packet",
        r.delivered
    );
    assert!(
        r.delivered + IP_LEN > QUOTA,
        "{} B delivered: the flow stopped before its quota ({QUOTA} B)",
        r.delivered
    );
    assert_eq!(r.fwd, 0, "no packet may be fast-pathed while held");
    assert!(
        r.held >= r.wire * 9 / 10 && r.held > 0,
        "{} of {} held",
        r.held,
        r.wire
    );
}

/// The negative control: with `per_packet_rules = "ignore"` the fast path carries the flow
/// past its quota.
#[test]
fn quota_is_exceeded_with_per_packet_rules_ignore() {
    let test = "quota_is_exceeded_with_per_packet_rules_ignore";
    if !ready(test) {
        return;
    }
    let Some(r) = quota_run(test, "ppj", 6105, "ignore") else {
        return;
    };
    assert!(
        r.delivered > 2 * QUOTA,
        "with the rule ignored the flow should run past its quota: {} B delivered",
        r.delivered
    );
    assert!(
        r.fwd * 10 >= r.wire * 8,
        "{} of {} fast-pathed",
        r.fwd,
        r.wire
    );
    assert_eq!(r.held, 0);
}

/// An NFQUEUE reader in the router: counts the queued IPv4 UDP packets to `port` and accepts
/// every packet.
struct QueueReader {
    counted: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl QueueReader {
    /// Binds queue `num` in the router's namespace; `Err` when this kernel has no NFQUEUE.
    fn start(tb: &Testbed, num: u16, port: u16) -> std::io::Result<QueueReader> {
        Self::start_ports(tb, num, &[port])
    }

    /// [`QueueReader::start`] counting the packets to any of `ports`.
    fn start_ports(tb: &Testbed, num: u16, ports: &[u16]) -> std::io::Result<QueueReader> {
        let ports = ports.to_vec();
        let mut queue = tb.router.run(move || -> std::io::Result<nfq::Queue> {
            let mut q = nfq::Queue::open()?;
            q.bind(num)?;
            Ok(q)
        })?;
        queue.set_nonblocking(true);
        let counted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (counted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match queue.recv() {
                    Ok(mut msg) => {
                        let p = msg.get_payload();
                        // IPv4, UDP, destination port (no options: IHL 5).
                        if p.len() >= 28
                            && p[0] == 0x45
                            && p[9] == 17
                            && ports.contains(&u16::from_be_bytes([p[22], p[23]]))
                        {
                            c.fetch_add(1, Ordering::SeqCst);
                        }
                        msg.set_verdict(nfq::Verdict::Accept);
                        if let Err(e) = queue.verdict(msg) {
                            eprintln!("NFQUEUE verdict failed: {e}");
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        sleep(Duration::from_millis(1));
                    }
                    Err(e) => {
                        eprintln!("NFQUEUE read failed: {e}");
                        return;
                    }
                }
            }
        });
        Ok(QueueReader {
            counted,
            stop,
            thread: Some(thread),
        })
    }

    fn counted(&self) -> u64 {
        self.counted.load(Ordering::SeqCst)
    }
}

impl Drop for QueueReader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What [`nfqueue_run`] measured after the rule.
struct Queued {
    sent: u64,
    /// Datagrams of the flow the queue reader saw.
    queued: u64,
    /// Datagrams the WAN host received.
    delivered: u64,
    /// LAN packets forwarded by XDP, held for the rule.
    fwd: u64,
    held: u64,
}

/// `-j NFQUEUE` (an IDS's rule) added while a UDP flow is fast-pathed, a queue reader
/// accepting every packet; then 1,000 datagrams. `None` when the test cannot run here.
fn nfqueue_run(test: &str, tag: &str, port: u16, mode: &str) -> Option<Queued> {
    let mut tb = Testbed::new(tag);
    let reader = match QueueReader::start(&tb, 7, port) {
        Ok(r) => r,
        Err(e) => {
            xdp_router_tests::netns::skip(test, &format!("cannot bind NFQUEUE 7: {e}"));
            return None;
        }
    };
    tb.start_daemon_with(&format!("per_packet_rules = \"{mode}\"\n"));
    let server = wan_v4(port);
    let echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let mut seq = 0u64;
    offload_udp(&tb, &sock, server, &mut seq);
    fast_pathed_before_the_rule(&tb, &sock, server, &mut seq);
    assert_eq!(reader.counted(), 0, "no rule yet: nothing queued");
    if !rule_or_skip(
        &tb,
        test,
        &format!("iptables -w -I FORWARD 1 -p udp --dport {port} -j NFQUEUE --queue-num 7"),
    ) {
        return None;
    }
    rule_seen(&tb, "queue", mode == "hold");
    let before_rule = seq;
    let before = tb.snapshot();
    let sent = blast(&sock, server, &mut seq, 1000, Duration::from_secs(1));
    sleep(Duration::from_millis(300));
    let after = tb.snapshot();
    let r = Queued {
        sent,
        queued: reader.counted(),
        delivered: echo.finish().received.saturating_sub(before_rule),
        fwd: after.packets_since(&before, LAN_IF, "forwarded_original"),
        held: held_for_the_rule(&after, &before),
    };
    eprintln!(
        "NFQUEUE, per_packet_rules = {mode}: {sent} datagrams sent, {} seen by the queue \
         reader, {} delivered; LAN wire {}, {} forwarded by XDP, {} held for the rule",
        r.queued,
        r.delivered,
        after.rx_lan_since(&before),
        r.fwd,
        r.held
    );
    Some(r)
}

/// From the rule on, the queue reader sees every packet of the flow, and every one reaches
/// the WAN host.
#[test]
fn nfqueue_rule_sees_every_packet_of_an_established_flow() {
    let test = "nfqueue_rule_sees_every_packet_of_an_established_flow";
    if !ready(test) {
        return;
    }
    let Some(r) = nfqueue_run(test, "ppn", 6103, "hold") else {
        return;
    };
    assert_eq!(
        r.queued, r.sent,
        "the queue must see every packet of the flow"
    );
    assert_eq!(r.delivered, r.sent, "every accepted packet must arrive");
    assert_eq!(r.fwd, 0, "no packet may be fast-pathed while held");
    assert!(r.held >= r.sent, "{} held, {} sent", r.held, r.sent);
}

/// The negative control: with `per_packet_rules = "ignore"` the queue sees (almost) none of
/// the flow's packets.
#[test]
fn nfqueue_misses_the_flow_with_per_packet_rules_ignore() {
    let test = "nfqueue_misses_the_flow_with_per_packet_rules_ignore";
    if !ready(test) {
        return;
    }
    let Some(r) = nfqueue_run(test, "ppm", 6106, "ignore") else {
        return;
    };
    assert!(
        r.queued * 10 < r.sent,
        "with the rule ignored the queue should miss the fast-pathed flow: {} of {} queued",
        r.queued,
        r.sent
    );
    assert_eq!(r.delivered, r.sent, "every datagram still arrives");
    assert!(
        r.fwd * 10 >= r.sent * 9,
        "{} of {} fast-pathed",
        r.fwd,
        r.sent
    );
}

/// What [`length_run`] saw after the length rule went in.
#[derive(Debug)]
struct LengthRun {
    /// Datagrams of 1,200 bytes (over the rule's 1,000) echoed back, of [`BIG`].
    big_echoed: u64,
    /// Datagrams of [`PAYLOAD`] bytes echoed back, of [`BIG`].
    small_echoed: u64,
}

/// Datagrams of each size sent after the rule.
const BIG: u64 = 100;

/// Sends `n` datagrams of `len` bytes one by one, each waiting up to 50 ms for its echo;
/// returns how many came back.
fn echoed(sock: &UdpSocket, server: SocketAddr, seq: &mut u64, n: u64, len: usize) -> u64 {
    let mut buf = [0u8; 2048];
    let mut back = 0;
    for _ in 0..n {
        sock.send_to(&udp_payload(*seq, len), server).expect("send");
        *seq += 1;
        if sock.recv_from(&mut buf).is_ok_and(|(got, _)| got == len) {
            back += 1;
        }
    }
    back
}

/// Offloads a UDP flow, inserts `-m length --length 1000:65535 -j DROP` for its port at the
/// top of FORWARD, lets a few small datagrams re-arm the flow, then sends [`BIG`] datagrams
/// over the limit and [`BIG`] under it. `None` when the test cannot run here.
fn length_run(test: &str, tag: &str, port: u16, mode: &str) -> Option<LengthRun> {
    let mut tb = Testbed::new(tag);
    tb.start_daemon_with(&format!("per_packet_rules = \"{mode}\"\n"));
    let server = wan_v4(port);
    let _echo = UdpEcho::start(&tb.wan, server);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .expect("timeout");
    let mut seq = 0u64;
    offload_udp(&tb, &sock, server, &mut seq);
    fast_pathed_before_the_rule(&tb, &sock, server, &mut seq);
    if !rule_or_skip(
        &tb,
        test,
        &format!(
            "iptables -w -I FORWARD 1 -p udp --dport {port} -m length --length 1000:65535 -j DROP"
        ),
    ) {
        return None;
    }
    rule_seen(&tb, "content_match", mode == "hold");
    // Small datagrams pass the rule: the kernel re-arms the flow with one of them.
    echoed(&sock, server, &mut seq, 10, PAYLOAD);
    let before = tb.snapshot();
    let r = LengthRun {
        big_echoed: echoed(&sock, server, &mut seq, BIG, 1200),
        small_echoed: echoed(&sock, server, &mut seq, BIG, PAYLOAD),
    };
    let after = tb.snapshot();
    eprintln!(
        "length DROP over 1000 bytes, per_packet_rules = {mode}: {r:?}; {} forwarded by XDP, {} \
         held for the rule",
        after.packets_since(&before, LAN_IF, "forwarded_original"),
        held_for_the_rule(&after, &before),
    );
    Some(r)
}

/// `-m length --length 1000:65535 -j DROP` before the ESTABLISHED accept gives each packet of
/// a flow its own verdict: the kernel drops every big datagram and passes every small one,
/// as without the fast path.
#[test]
fn a_length_drop_rule_drops_the_big_packets_of_an_offloaded_flow() {
    let test = "a_length_drop_rule_drops_the_big_packets_of_an_offloaded_flow";
    if !ready(test) {
        return;
    }
    let Some(r) = length_run(test, "ppl1", 6301, "hold") else {
        return;
    };
    assert_eq!(
        r.big_echoed, 0,
        "datagrams over the length limit got through"
    );
    assert_eq!(r.small_echoed, BIG, "datagrams under the limit were lost");
}

/// The negative control: with `per_packet_rules = "ignore"` the kernel re-arms the flow with a
/// small datagram and the fast path then carries the big ones past the rule.
#[test]
fn a_length_drop_rule_is_bypassed_with_per_packet_rules_ignore() {
    let test = "a_length_drop_rule_is_bypassed_with_per_packet_rules_ignore";
    if !ready(test) {
        return;
    }
    let Some(r) = length_run(test, "ppl2", 6302, "ignore") else {
        return;
    };
    assert!(
        r.big_echoed >= BIG * 9 / 10,
        "with flowtable semantics the fast path should carry the big datagrams: {r:?}"
    );
}
