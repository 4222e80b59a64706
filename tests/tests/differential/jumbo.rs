//! Jumbo frames (MTU 9000 on the four veth ends) through the router with the fast path off and
//! on: the same frames arrive, byte for byte, and each size takes the path it should.
//!
//! A veth gives its XDP program a frame in one buffer up to ≈ 3,500 bytes and in several above
//! (the program is loaded with multi-buffer support, so a jumbo MTU keeps native XDP). Per
//! connection and direction:
//! - 3,000 bytes of payload: one buffer, its transport checksum within what the pipeline
//!   verifies: forwarded by XDP; with a bad checksum, to the kernel (`l4_bad_checksum`), which
//!   drops it or not as it would anyway;
//! - 3,100 bytes: one buffer, a checksum longer than the pipeline verifies: the kernel
//!   (`l4_checksum_too_long`);
//! - 8,000 bytes: several buffers: the kernel (`multi_buffer_frame`), also with a bad checksum.
//!
//! The same corpus runs on the TC fast path (see its test for what differs there).

use super::*;

/// One jumbo case: its payload, whether its transport checksum is broken, and the reason the
/// fast path (on) must count for it on its ingress, at XDP and at TC.
struct Jumbo {
    payload: usize,
    bad_checksum: bool,
    expect: fn(from_lan: bool) -> &'static str,
    expect_tc: fn(from_lan: bool) -> &'static str,
}

fn forwarded(from_lan: bool) -> &'static str {
    if from_lan {
        "forwarded_original"
    } else {
        "forwarded_reply"
    }
}

const JUMBO: [Jumbo; 5] = [
    Jumbo {
        payload: 3000,
        bad_checksum: false,
        expect: forwarded,
        expect_tc: forwarded,
    },
    Jumbo {
        payload: 3000,
        bad_checksum: true,
        expect: |_| "l4_bad_checksum",
        expect_tc: |_| "l4_bad_checksum",
    },
    Jumbo {
        payload: 3100,
        bad_checksum: false,
        expect: |_| "l4_checksum_too_long",
        expect_tc: |_| "l4_checksum_too_long",
    },
    Jumbo {
        payload: 8000,
        bad_checksum: false,
        expect: |_| "multi_buffer_frame",
        expect_tc: |_| "l4_checksum_too_long",
    },
    Jumbo {
        payload: 8000,
        bad_checksum: true,
        expect: |_| "multi_buffer_frame",
        expect_tc: |_| "l4_checksum_too_long",
    },
];

/// Which fast path the router runs: the reasons expected differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Xdp,
    Tc,
}

/// Every jumbo case with the reason expected for it on `path`, in corpus order.
fn jumbo_cases(macs: &Macs, path: Path) -> Vec<(Case, &'static str)> {
    let mut out = Vec::new();
    for c in conns() {
        for from_lan in [true, false] {
            let t = if c.tcp {
                Transport::Tcp(ACK | PSH)
            } else {
                Transport::Udp
            };
            for j in &JUMBO {
                let n = out.len() as u16;
                let marker = [b"XDIF".as_slice(), &n.to_be_bytes()].concat();
                let mut s = spec(&c, macs, from_lan, t, 64);
                s.payload_len = j.payload;
                let frame = s.marked(&marker);
                let frame = if j.bad_checksum {
                    with_bad_l4_checksum(&frame)
                } else {
                    frame
                };
                let dir = if from_lan { "orig" } else { "reply" };
                let bad = if j.bad_checksum {
                    ", bad l4 checksum"
                } else {
                    ""
                };
                let case = Case {
                    name: format!("{} {dir}: payload {}{bad}", c.name, j.payload),
                    from_lan,
                    frame,
                    marker,
                };
                let expect = match path {
                    Path::Xdp => j.expect,
                    Path::Tc => j.expect_tc,
                };
                out.push((case, expect(from_lan)));
            }
        }
    }
    out
}

fn jumbo_corpus(macs: &Macs) -> Vec<Case> {
    // The frames are the same on both paths; only the expected reasons differ.
    jumbo_cases(macs, Path::Xdp)
        .into_iter()
        .map(|(c, _)| c)
        .collect()
}

/// MTU 9000 on the router's two ports and the hosts' ends.
fn jumbo_mtu(tb: &Testbed) {
    tb.router.sh(&format!(
        "ip link set {LAN_IF} mtu 9000 && ip link set {WAN_IF} mtu 9000"
    ));
    tb.lan.sh(&format!("ip link set {HOST_IF} mtu 9000"));
    tb.wan.sh(&format!("ip link set {HOST_IF} mtu 9000"));
}

/// On a jumbo-MTU router with native XDP, frames of one buffer are forwarded by XDP and those
/// of several go to the kernel, and every one arrives exactly as the kernel alone sends it.
#[test]
fn jumbo_frames_arrive_as_the_kernel_sends_them() {
    if !ready("differential::jumbo_frames_arrive_as_the_kernel_sends_them") {
        return;
    }
    let mut tb = Testbed::new("dj");
    jumbo_mtu(&tb);
    tb.start_daemon();
    same_and_on_the_expected_path(&tb, Path::Xdp, "native");
}

/// The same with the TC fast path on both ports. An skb is one packet whatever its length, so
/// no frame is `multi_buffer_frame` there; the crafted frames come from a packet socket
/// without checksum offload state, so the TC program verifies their transport checksums as
/// XDP does and leaves those longer than it verifies (3,100 and 8,000 bytes) to the kernel as
/// `l4_checksum_too_long`. (Real TCP traffic reaches TC as GRO aggregates with the checksum
/// state set and is forwarded at any length: `tc::tc_datapath_handles_partial_checksums_and_gso`.)
#[test]
fn jumbo_frames_arrive_as_the_kernel_sends_them_on_tc() {
    if !ready("differential::jumbo_frames_arrive_as_the_kernel_sends_them_on_tc") {
        return;
    }
    let mut tb = Testbed::new("dk");
    jumbo_mtu(&tb);
    tb.start_daemon_config(&format!(
        "datapath = \"tc\"\n{}",
        wan_lan_interfaces(WAN_IF)
    ));
    same_and_on_the_expected_path(&tb, Path::Tc, "tc");
}

/// Both ports attached as `mode`; the jumbo corpus arrives the same with the fast path off and
/// on, and with it on each case was counted under the reason expected on `path`.
fn same_and_on_the_expected_path(tb: &Testbed, path: Path, mode: &str) {
    for ifname in [LAN_IF, WAN_IF] {
        let st = tb.daemon().status();
        assert_eq!(st.iface(ifname).attach_mode, mode, "{ifname}: {st:?}");
    }
    let on = oracle::the_same_off_and_on(tb, jumbo_corpus, false);
    let cases = jumbo_cases(&oracle::macs_of(tb), path);
    let mut wrong = Vec::new();
    for (n, (case, expect)) in cases.iter().enumerate() {
        let (_, outcome, reasons) = &on[&n];
        let counted = reasons
            .split(',')
            .any(|r| r.split('+').next() == Some(*expect));
        if !counted {
            wrong.push(format!(
                "{}: expected {expect}, counted [{reasons}], {} frame(s) arrived",
                case.name,
                outcome.frames.len()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "jumbo cases that took another path with the fast path on:\n{}",
        wrong.join("\n")
    );
}
