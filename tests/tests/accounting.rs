//! Counting what was forwarded (issue 19): with `nf_conntrack_acct = 1` in the router, a
//! 100 MB LAN→WAN TCP transfer shows in `xdp-routerd flows --json` (fast path + conntrack) and
//! in the LAN host's Prometheus counters as the IP bytes that crossed the router's LAN port,
//! within 1 %, with the fast path on and with it off; the negative control is conntrack's own
//! counter alone, which misses what the fast path carried. Run as root with one test thread:
//! `cargo xtask test` (or `XDP_ROUTERD_BIN=... cargo test -p xdp-router-tests --test
//! accounting -- --test-threads=1` after building the daemon).
//!
//! The reference is the wire: the daemon's per-reason counters on the LAN port count every
//! frame it received (forwarded or passed), so their bytes minus 14 per frame (the Ethernet
//! header; GRO is off on the router's veths) are the IP bytes of the LAN host's packets.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::mpsc,
    thread,
    time::Duration,
};

use serde_json::Value;
use xdp_router_tests::testbed::{
    LAN_HOST_V4, LAN_IF, Snapshot, Testbed, fastpath_fraction, ready, wait_until, wan_v4,
};

/// The payload of the transfer.
const PAYLOAD: u64 = 100_000_000;
/// Ethernet header of the frames on the router's LAN port (no VLAN tag).
const ETH_HLEN: u64 = 14;

/// IP bytes and packets of everything the router's LAN port received between two snapshots.
fn lan_wire(before: &Snapshot, after: &Snapshot) -> (u64, u64) {
    let sum = |s: &Snapshot| {
        s.status
            .counters
            .iter()
            .filter(|r| r.interface == LAN_IF)
            .fold((0u64, 0u64), |(b, p), r| (b + r.bytes, p + r.packets))
    };
    let ((b1, p1), (b0, p0)) = (sum(after), sum(before));
    let packets = p1 - p0;
    ((b1 - b0) - ETH_HLEN * packets, packets)
}

/// A TCP connection LAN host → WAN host `server` that has sent `PAYLOAD` bytes, all of them
/// read by the server, and is still open (so its flow is still offloaded and listed).
struct OpenTransfer {
    client: TcpStream,
    server: thread::JoinHandle<u64>,
}

impl OpenTransfer {
    fn run(tb: &Testbed, addr: SocketAddr) -> OpenTransfer {
        let listener = tb.wan.run(|| TcpListener::bind(addr)).expect("bind");
        let (read_tx, read_rx) = mpsc::channel();
        let server = thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut buf = vec![0u8; 1 << 16];
            let mut total = 0u64;
            loop {
                let n = s.read(&mut buf).expect("server read");
                if n == 0 {
                    return total;
                }
                total += n as u64;
                if total == PAYLOAD {
                    read_tx.send(()).expect("report");
                }
            }
        });
        let mut client = tb
            .lan
            .run(|| TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
            .expect("connect");
        let chunk = vec![0x5au8; 1 << 16];
        let mut sent = 0u64;
        while sent < PAYLOAD {
            let n = (PAYLOAD - sent).min(chunk.len() as u64) as usize;
            client.write_all(&chunk[..n]).expect("client write");
            sent += n as u64;
            if sent == n as u64 {
                // The rest waits until the daemon lists the connection: what is counted must
                // not depend on how fast a loaded machine schedules the daemon (a transfer
                // that outran it went mostly through the kernel in a CI run).
                assert!(
                    wait_until(Duration::from_secs(10), || tb
                        .daemon()
                        .original_flow(addr.port())
                        .is_some()),
                    "the connection to {addr} was not listed within 10 s: {}",
                    tb.daemon().flows_json()
                );
            }
        }
        read_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server read the whole payload");
        // The last ACKs and the daemon's keep-alive settle.
        thread::sleep(Duration::from_millis(300));
        OpenTransfer { client, server }
    }

    fn close(self) {
        drop(self.client);
        assert_eq!(self.server.join().expect("server"), PAYLOAD);
    }
}

/// The original direction's row of the connection to `port` in `flows --json`.
fn flow_row(tb: &Testbed, port: u16) -> Value {
    tb.daemon().original_flow(port).unwrap_or_else(|| {
        panic!(
            "no original row to port {port} in {}",
            tb.daemon().flows_json()
        )
    })
}

/// The LAN host's `xdp_router_host_transmit_bytes_total` in /metrics (an HTTP/1.0 GET from
/// inside the router namespace); 0 while the host has no series (no connection offloaded yet).
fn host_transmit_bytes(tb: &Testbed) -> u64 {
    let out = tb.metrics();
    let prefix = format!("xdp_router_host_transmit_bytes_total{{host=\"{LAN_HOST_V4}\"}} ");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.trim().parse().expect("a number"))
}

/// `conntrack -L` of the connection to `port`: the original direction's `bytes=` (the
/// counter as the kernel's own tool shows it).
fn conntrack_tool_bytes(tb: &Testbed, port: u16) -> u64 {
    let out = tb.router.exec_ok(
        "conntrack",
        &["-L", "-p", "tcp", "--dport", &port.to_string()],
    );
    out.split_whitespace()
        .find_map(|w| w.strip_prefix("bytes="))
        .unwrap_or_else(|| panic!("no bytes= in conntrack -L (acct off?):\n{out}"))
        .parse()
        .expect("a number")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("{v} is not a counter"))
}

/// Runs the transfer with the fast path `on` (or off) and checks the merged view and the host
/// counters against the wire.
fn transfer_is_counted(tag: &str, on: bool, port: u16) {
    if !ready(tag) {
        return;
    }
    let mut tb = Testbed::new(tag);
    tb.router.sh("sysctl -qw net.netfilter.nf_conntrack_acct=1");
    tb.start_daemon();
    if !on {
        tb.daemon().set_fastpath(false);
    }
    let host_before = host_transmit_bytes(&tb);
    let kernel_fwd_before = tb.daemon().kernel_forwarded_packets();
    let before = tb.snapshot();
    let transfer = OpenTransfer::run(&tb, wan_v4(port));
    let after = tb.snapshot();
    let kernel_fwd = tb.daemon().kernel_forwarded_packets() - kernel_fwd_before;
    let row = flow_row(&tb, port);
    eprintln!("{}", tb.daemon().ctl(&["flows"]).unwrap_or_else(|e| e));
    let host_tx = host_transmit_bytes(&tb) - host_before;
    let tool = conntrack_tool_bytes(&tb, port);
    transfer.close();

    let (expected, wire) = lan_wire(&before, &after);
    let fast = u(&row["bytes"]);
    let kernel = u(&row["conntrack"]["bytes"]);
    let total = u(&row["total"]["bytes"]);
    let fwd = after.packets_since(&before, LAN_IF, "forwarded_original");
    eprintln!(
        "fast path {}: wire {wire} packets, {expected} IP bytes ({:.2} % over the payload); \
         flows: fast path {fast} + conntrack {kernel} = {total}; conntrack -L {tool}; host \
         transmit {host_tx}; XDP forwarded {fwd} packets ({:.1} %); the kernel forwarded \
         {kernel_fwd} packets of offloaded directions (both ways, GSO segments)",
        if on { "on" } else { "off" },
        (expected as f64 / PAYLOAD as f64 - 1.0) * 100.0,
        fastpath_fraction(fwd, wire) * 100.0
    );
    assert_eq!(total, fast + kernel, "total = fast path + conntrack");
    assert!(
        (PAYLOAD..PAYLOAD + PAYLOAD / 20).contains(&expected),
        "the wire's IP bytes {expected} are the payload plus TCP/IP headers"
    );
    let within = |what: &str, got: u64| {
        let off = got.abs_diff(expected) as f64 / expected as f64;
        assert!(
            off <= 0.01,
            "{what}: {got} bytes, the wire carried {expected} ({:.2} % off, want ≤ 1 %)",
            off * 100.0
        );
    };
    within("merged flow view", total);
    // The kernel's own tool shows the same conntrack counter the daemon read (the connection
    // was idle in between).
    assert!(
        tool.abs_diff(kernel) <= 1500,
        "conntrack -L says {tool} bytes, flows' conntrack part {kernel}"
    );
    if on {
        // The fast path carried it: XDP forwarded nearly every packet the LAN port received.
        assert!(
            fastpath_fraction(fwd, wire) >= 0.9,
            "only {fwd} of {wire} packets were fast-pathed"
        );
        within("host transmit counter", host_tx);
        // The datapath's count of what the kernel forwarded of offloaded directions (the
        // daemon reads whether it moved before it reads any flow entry's arming) saw the few
        // packets before arming, not the transfer.
        assert!(
            (1..wire / 5).contains(&kernel_fwd),
            "the kernel forwarded {kernel_fwd} packets of offloaded directions, want 1..{}",
            wire / 5
        );
        // Negative control: conntrack's counter alone (what nlbwmon reads) misses it.
        assert!(
            kernel < expected / 10,
            "conntrack alone counted {kernel} of {expected} bytes with the fast path on"
        );
    } else {
        assert_eq!(fwd, 0, "the fast path is off");
        assert_eq!(fast, 0, "nothing fast-pathed, nothing counted by XDP");
        within("conntrack alone (fast path off)", kernel);
        // The per-host series count what the kernel forwarded of offloaded connections too
        // (the arming program's kernel counters).
        within("host transmit counter (fast path off)", host_tx);
        // Every packet the LAN port received was forwarded by the kernel and armed its
        // direction, counted per segment (GRO may have merged several wire packets into one).
        assert!(
            kernel_fwd >= wire * 9 / 10,
            "the kernel forwarded {kernel_fwd} packets of offloaded directions, the LAN port \
             received {wire}"
        );
    }
}

#[test]
fn hundred_megabytes_fast_pathed_are_counted_per_flow_and_per_host() {
    transfer_is_counted("ac1", true, 5801);
}

#[test]
fn hundred_megabytes_through_the_kernel_are_counted_by_conntrack_and_per_host() {
    transfer_is_counted("ac2", false, 5802);
}

#[test]
fn per_host_counters_never_go_back_when_flows_end() {
    if !ready("ac3") {
        return;
    }
    let mut tb = Testbed::new("ac3");
    tb.start_daemon();
    let mut last = 0;
    for port in [5803, 5804] {
        let t = OpenTransfer::run(&tb, wan_v4(port));
        let open = host_transmit_bytes(&tb);
        t.close();
        // The connection closes: its flow leaves the maps, its bytes stay in the host's total.
        assert!(wait_until(Duration::from_secs(5), || {
            tb.daemon().status().flows.ipv4 == 0
        }));
        let closed = host_transmit_bytes(&tb);
        eprintln!("port {port}: host transmit {open} while open, {closed} after close");
        assert!(
            open >= last + PAYLOAD * 9 / 10,
            "{open} after {last}: the transfer was counted"
        );
        assert!(closed >= open, "{closed} < {open}: the total went back");
        last = closed;
    }
}
