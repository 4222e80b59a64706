//! The hand-over from the XDP program to the TC program behind it (`IFACE_F_TC_HANDOFF`,
//! the eBPF crate's `handoff.rs`), with its mark (XDP metadata) where this kernel allows it,
//! and without it (the object loaded with `GLOBAL_XDP_META` 0, as the daemon loads it where
//! the kernel refuses `bpf_xdp_adjust_meta`) on every kernel.

use aya::{
    Ebpf,
    programs::{SchedClassifier, Xdp},
};
use xdp_router_common::{
    Counter, IFACE_F_NO_XDP_XMIT, IFACE_F_SHAPED, IFACE_F_TC_HANDOFF, PROG_NAME, Reason,
    XDP_TC_HANDOFF,
};
use xdp_router_tests::{
    fixture_net::{
        Bed, LAN_SLOT, Maps, Setup, TC_ACT_REDIRECT, TC_ACT_UNSPEC, XDP_PASS, kernel_has_xdp_meta,
        load, load_with, object, routed, run, run_tc,
    },
    netns::degraded,
};

use crate::{case, fixture_namespaces, load_tc, runner::hex};

/// The reasons counted since `before`, as `slot N reason`.
fn counted(maps: &Maps, before: &[Counter]) -> Vec<String> {
    maps.stats()
        .iter()
        .zip(before)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .map(|(i, _)| {
            let r = Reason::from_u32(i as u32 % Reason::COUNT);
            format!(
                "slot {} {}",
                i as u32 / Reason::COUNT,
                r.map_or("?", Reason::name)
            )
        })
        .collect()
}

fn xdp(ebpf: &Ebpf) -> &Xdp {
    ebpf.program(PROG_NAME)
        .expect("program present")
        .try_into()
        .expect("XDP program")
}

/// The flow of the good IPv4 packet, its egress (the WAN port) unable to transmit XDP frames.
fn no_xmit(b: &Bed, good4: &xdp_router_tests::packet::Spec) -> Setup {
    Setup::managed(b, vec![routed(b.lan, good4, false)])
        .with_iface_flags(b.wan, IFACE_F_NO_XDP_XMIT)
}

/// With the mark: a packet of an armed flow whose egress cannot transmit XDP frames leaves XDP
/// untouched, with `XDP_TC_HANDOFF` in front of it as metadata (BPF_PROG_RUN returns the
/// metadata with the frame) and nothing counted; the TC program counts it when it takes it.
/// Without the flag on the ingress, the same packet is counted `egress_no_xdp_xmit` and gets no
/// metadata (the control). The TC program on a hand-over port leaves a packet without the
/// metadata alone, uncounted (XDP counted it): each packet counted once. On a kernel that
/// refuses XDP metadata this says so, and [`xdp_hands_packets_to_tc_without_the_mark`] is
/// what runs there.
#[test]
fn xdp_hands_packets_for_ports_without_xdp_transmit_to_tc() {
    const TEST: &str = "prog_run::xdp_hands_packets_for_ports_without_xdp_transmit_to_tc";
    let Some((router, _hosts)) = fixture_namespaces(TEST, "dpo") else {
        return;
    };
    if !kernel_has_xdp_meta() {
        degraded(
            TEST,
            "this kernel refuses XDP metadata (bpf_xdp_adjust_meta) to XDP programs: the \
             marked hand-over cannot run; the daemon loads it without the mark, checked by \
             xdp_hands_packets_to_tc_without_the_mark",
        );
        return;
    }
    let errs = router.run(|| {
        let b = Bed::here();
        let (mut ebpf, mut maps) = load();
        let (good4, _) = case::good_packets();
        let frame = good4.frame();
        let no_xmit = no_xmit(&b, &good4);
        let mut errs = Vec::new();
        {
            let xdp = xdp(&ebpf);
            // The control: no TC program behind.
            maps.apply(&no_xmit);
            let before = maps.stats();
            let (verdict, out) = run(xdp, &frame, b.lan);
            let moved = counted(&maps, &before);
            let want = vec![format!("slot {LAN_SLOT} egress_no_xdp_xmit")];
            if verdict != XDP_PASS || out != frame || moved != want {
                errs.push(format!(
                    "without the hand-over: verdict {verdict}, frame {}, counted {moved:?}; want \
                     XDP_PASS, unchanged, {want:?}",
                    if out == frame { "unchanged" } else { "changed" }
                ));
            }
            // With the TC program behind.
            maps.apply(&no_xmit.clone().with_iface_flags(b.lan, IFACE_F_TC_HANDOFF));
            let before = maps.stats();
            let (verdict, out) = run(xdp, &frame, b.lan);
            let moved = counted(&maps, &before);
            let mut want_out = XDP_TC_HANDOFF.to_ne_bytes().to_vec();
            want_out.extend_from_slice(&frame);
            if verdict != XDP_PASS || out != want_out || !moved.is_empty() {
                errs.push(format!(
                    "hand-over: verdict {verdict}, counted {moved:?}, out {}; want XDP_PASS, \
                     nothing counted, the mark then the frame unchanged: {}",
                    hex(&out),
                    hex(&want_out)
                ));
            }
        }
        let tc = load_tc(&mut ebpf);
        let before = maps.stats();
        let (verdict, out) = run_tc(tc, &frame, b.lan);
        let moved = counted(&maps, &before);
        if verdict != TC_ACT_UNSPEC || out != frame || !moved.is_empty() {
            errs.push(format!(
                "TC behind XDP, no mark: verdict {verdict}, counted {moved:?}; want \
                 TC_ACT_UNSPEC, nothing counted, frame unchanged"
            ));
        }
        errs
    });
    assert!(errs.is_empty(), "{errs:#?}");
}

/// Without the mark (the object loaded with `GLOBAL_XDP_META` 0; runs on every kernel): XDP
/// passes the packet for a port without XDP transmit untouched, without metadata and uncounted;
/// the TC program behind it runs the fast path on every packet and forwards (and counts) that
/// one. A packet XDP passed for a reason of its own (no flow; an egress that is also shaped,
/// which XDP counts `egress_shaped` before it looks at XDP transmit) is left to the kernel by
/// TC uncounted: XDP counted it. Control: the same object on a port without the hand-over
/// counts `egress_no_xdp_xmit`.
#[test]
fn xdp_hands_packets_to_tc_without_the_mark() {
    let Some((router, _hosts)) =
        fixture_namespaces("prog_run::xdp_hands_packets_to_tc_without_the_mark", "dpu")
    else {
        return;
    };
    let errs = router.run(|| {
        let b = Bed::here();
        let (mut ebpf, mut maps) = load_with(&object(), 0, false);
        let (good4, _) = case::good_packets();
        let frame = good4.frame();
        let no_xmit = no_xmit(&b, &good4);
        let handoff = no_xmit.clone().with_iface_flags(b.lan, IFACE_F_TC_HANDOFF);
        let mut errs = Vec::new();
        let mut xdp_case = |maps: &mut Maps, name: &str, setup: &Setup, want: &[String]| {
            maps.apply(setup);
            let before = maps.stats();
            let (verdict, out) = run(xdp(&ebpf), &frame, b.lan);
            let moved = counted(maps, &before);
            if verdict != XDP_PASS || out != frame || moved != want {
                errs.push(format!(
                    "XDP, {name}: verdict {verdict}, counted {moved:?}, out {}; want XDP_PASS, \
                     {want:?}, the frame unchanged (no metadata)",
                    hex(&out)
                ));
            }
        };
        xdp_case(
            &mut maps,
            "no TC program behind",
            &no_xmit,
            &[format!("slot {LAN_SLOT} egress_no_xdp_xmit")],
        );
        xdp_case(
            &mut maps,
            "shaped egress",
            &handoff.clone().with_iface_flags(b.wan, IFACE_F_SHAPED),
            &[format!("slot {LAN_SLOT} egress_shaped")],
        );
        xdp_case(&mut maps, "hand-over", &handoff, &[]);
        let tc: &mut SchedClassifier = load_tc(&mut ebpf);
        let mut tc_case = |maps: &mut Maps, name: &str, setup: &Setup, forward: bool| {
            maps.apply(setup);
            let before = maps.stats();
            let (verdict, out) = run_tc(tc, &frame, b.lan);
            let moved = counted(maps, &before);
            let ok = if forward {
                verdict == TC_ACT_REDIRECT
                    && out != frame
                    && moved == [format!("slot {LAN_SLOT} forwarded_original")]
            } else {
                verdict == TC_ACT_UNSPEC && out == frame && moved.is_empty()
            };
            if !ok {
                errs.push(format!(
                    "TC behind XDP without the mark, {name}: verdict {verdict}, counted \
                     {moved:?}, frame {}; want {}",
                    if out == frame {
                        "unchanged"
                    } else {
                        "rewritten"
                    },
                    if forward {
                        "TC_ACT_REDIRECT, forwarded_original counted, the frame rewritten"
                    } else {
                        "TC_ACT_UNSPEC, nothing counted, the frame unchanged"
                    }
                ));
            }
        };
        tc_case(&mut maps, "handed over", &handoff, true);
        tc_case(
            &mut maps,
            "shaped egress",
            &handoff.clone().with_iface_flags(b.wan, IFACE_F_SHAPED),
            false,
        );
        tc_case(
            &mut maps,
            "no flow",
            &Setup::managed(&b, vec![])
                .with_iface_flags(b.wan, IFACE_F_NO_XDP_XMIT)
                .with_iface_flags(b.lan, IFACE_F_TC_HANDOFF),
            false,
        );
        errs
    });
    assert!(errs.is_empty(), "{errs:#?}");
}
