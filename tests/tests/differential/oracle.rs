//! The corpus through the router with the fast path off and on: the same frames arrive.

use super::*;

#[test]
fn fast_path_forwards_exactly_what_the_kernel_forwards() {
    if !ready("differential::fast_path_forwards_exactly_what_the_kernel_forwards") {
        return;
    }
    let mut tb = Testbed::new("df");
    tb.start_daemon();
    same_with_the_fast_path_off_and_on(&tb);
}

/// The same corpus with the TC fast path on both ports (`datapath = "tc"`, the path `auto`
/// gives ports without native XDP): the skb path must hold to the kernel exactly as XDP does.
#[test]
fn tc_fast_path_forwards_exactly_what_the_kernel_forwards() {
    if !ready("differential::tc_fast_path_forwards_exactly_what_the_kernel_forwards") {
        return;
    }
    let mut tb = Testbed::new("dt");
    start_daemon_on_tc(&mut tb);
    same_with_the_fast_path_off_and_on(&tb);
}

/// Starts the daemon with `datapath = "tc"` and checks both ports run the TC fast path.
fn start_daemon_on_tc(tb: &mut Testbed) {
    tb.start_daemon_config(&format!(
        "datapath = \"tc\"\n{}",
        wan_lan_interfaces(WAN_IF)
    ));
    for ifname in [LAN_IF, WAN_IF] {
        let st = tb.daemon().status();
        assert_eq!(st.iface(ifname).attach_mode, "tc", "{ifname}: {st:?}");
    }
}

/// [`tc_fast_path_forwards_exactly_what_the_kernel_forwards`] with GRO on the router's ports:
/// GRO verifies the transport checksum of what it receives and marks the packet
/// `CHECKSUM_UNNECESSARY` (`skb_gro_incr_csum_unnecessary`), as a NIC does for a checksum it
/// verified (r8169, e1000e, igb, mt7621: the ports the TC fast path is for); a bad one it leaves
/// `CHECKSUM_NONE`. The kernel checks no transport checksum of such a packet (conntrack takes
/// the mark), neither does the TC fast path, whose NAT writes the checksum field directly: the
/// same frames must arrive.
#[test]
fn tc_fast_path_forwards_exactly_what_the_kernel_forwards_on_verified_checksums() {
    if !ready(
        "differential::tc_fast_path_forwards_exactly_what_the_kernel_forwards_on_verified_\
         checksums",
    ) {
        return;
    }
    let mut tb = Testbed::new("du");
    tb.router.sh(&format!(
        "ethtool -K {LAN_IF} gro on >/dev/null && ethtool -K {WAN_IF} gro on >/dev/null"
    ));
    start_daemon_on_tc(&mut tb);
    for ifname in [LAN_IF, WAN_IF] {
        let features = tb.router.exec_ok("ethtool", &["-k", ifname]);
        assert!(
            features.contains("generic-receive-offload: on"),
            "{ifname}: GRO should be on:\n{features}"
        );
    }
    same_with_the_fast_path_off_and_on(&tb);
}

/// The corpus with the fast path off, then on, on the running daemon: every case must arrive
/// the same (frames and bytes).
fn same_with_the_fast_path_off_and_on(tb: &Testbed) {
    the_same_off_and_on(tb, corpus, true);
}

/// The MAC addresses of the test bed's four veth ends.
pub(crate) fn macs_of(tb: &Testbed) -> Macs {
    Macs {
        lan_host: mac_of(&tb.lan, HOST_IF),
        router_lan: mac_of(&tb.router, LAN_IF),
        wan_host: mac_of(&tb.wan, HOST_IF),
        router_wan: mac_of(&tb.router, WAN_IF),
    }
}

/// The cases of `corpus` (and, with `destructive`, those that change conntrack state) with the
/// fast path off, then on, on the running daemon: every case must arrive the same (frames and
/// bytes). Returns what the fast-path-on half found (with the reasons counted per case).
pub(crate) fn the_same_off_and_on(
    tb: &Testbed,
    corpus: fn(&Macs) -> Vec<Case>,
    destructive: bool,
) -> Found {
    let macs = macs_of(tb);
    let off = half(tb, &macs, false, corpus, destructive);
    let on = half(tb, &macs, true, corpus, destructive);

    let summary = |o: &Outcome| {
        if o.frames.is_empty() {
            "-".to_owned()
        } else {
            o.frames
                .iter()
                .map(|f| format!("{}B", f.len()))
                .collect::<Vec<_>>()
                .join("+")
        }
    };
    println!(
        "{:<52} {:>9} {:>9}  {:<6} reasons (fast path on)",
        "case", "off", "on", "same"
    );
    let mut differ = Vec::new();
    for (n, (name, o_off, _)) in &off {
        let (_, o_on, reasons) = &on[n];
        let same = o_off == o_on;
        println!(
            "{name:<52} {:>9} {:>9}  {:<6} {reasons}",
            summary(o_off),
            summary(o_on),
            if same { "yes" } else { "NO" }
        );
        if !same {
            for (i, (a, b)) in o_off.frames.iter().zip(&o_on.frames).enumerate() {
                if a != b {
                    let at = a
                        .iter()
                        .zip(b)
                        .position(|(x, y)| x != y)
                        .unwrap_or(a.len().min(b.len()));
                    println!(
                        "    frame {i}: first difference at byte {at} (off {} B, on {} B)",
                        a.len(),
                        b.len()
                    );
                }
            }
            differ.push(name.clone());
        }
    }
    assert!(
        differ.is_empty(),
        "{} of {} cases arrived differently with the fast path on: {differ:?}",
        differ.len(),
        off.len()
    );
    on
}
