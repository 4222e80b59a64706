//! The TC table on `CHECKSUM_COMPLETE` skbs: see [`fixture_table_on_tc_with_checksum_complete`].

use xdp_router_tests::fixture_net::{Bed, load, run_tc, try_run_tc_checksum_complete};

use crate::{
    cases, fixture_namespaces, load_tc,
    runner::{assert_all_ok, hex},
    tc_cases,
};

/// The TC table's cases again on skbs with `CHECKSUM_COMPLETE`, as drivers like mlx5 or
/// virtio-net deliver them (a sum over the packet in `skb->csum`, which the kernel checks
/// instead of the transport checksum): the same verdict and frame as on a `CHECKSUM_NONE` skb,
/// and `skb->csum` still the sum of the packet after the program: the NAT through the checksum
/// helpers, the IPv6 header changes (`complete_fix`), a session header taken off
/// (`pop_session`), an Ethernet header pushed in front of a PPP device's packet, and the probe
/// for `CHECKSUM_PARTIAL` on a bad checksum, which gives back what it moved. The kernel sums
/// the packet again after each run and fails it with `EBADMSG` where `skb->csum` is stale.
///
/// Not checked, and listed: cases whose frame the program shortens. A trim
/// (`bpf_skb_change_tail`) turns a `CHECKSUM_COMPLETE` skb into `CHECKSUM_NONE`
/// (`__skb_trim_rcsum`), whose sum nobody reads, but the check after the run compares it all
/// the same; and the session header comes off with the VLAN helpers, which at TC ingress count
/// the MAC header into the sum and out again around their work (`bpf_push_mac_rcsum`), while a
/// BPF_PROG_RUN skb is not marked as at TC ingress.
#[test]
fn fixture_table_on_tc_with_checksum_complete() {
    let Some((router, _hosts)) = fixture_namespaces(
        "prog_run::fixture_table_on_tc_with_checksum_complete",
        "dpc",
    ) else {
        return;
    };
    let outcome = router.run(|| {
        let bed = Bed::here();
        let (mut ebpf, mut maps) = load();
        let prog = load_tc(&mut ebpf);
        let tc = tc_cases(prog, &cases(&bed));
        let probe = &tc.first().expect("TC cases").frame;
        if let Err(e) = try_run_tc_checksum_complete(prog, probe, bed.lan)
            && e.raw_os_error() == Some(libc::EINVAL)
        {
            return Err(format!(
                "this kernel ({}) has no BPF_F_TEST_SKB_CHECKSUM_COMPLETE (Linux 6.11): {e}",
                kernel_release()
            ));
        }
        let results = tc
            .iter()
            .map(|case| {
                maps.apply(&case.setup);
                let none = run_tc(prog, &case.frame, case.ingress);
                if none.1.len() < case.frame.len() {
                    return (case.name.to_owned(), None);
                }
                maps.apply(&case.setup);
                let result = match try_run_tc_checksum_complete(prog, &case.frame, case.ingress) {
                    Ok(complete) if complete == none => Ok(()),
                    Ok((verdict, out)) => Err(format!(
                        "CHECKSUM_COMPLETE: verdict {verdict}, frame\n      {}\n    \
                         CHECKSUM_NONE: verdict {}, frame\n      {}",
                        hex(&out),
                        none.0,
                        hex(&none.1)
                    )),
                    Err(e) if e.raw_os_error() == Some(libc::EBADMSG) => Err(
                        "skb->csum is not the sum of the packet after the run (EBADMSG)".to_owned(),
                    ),
                    Err(e) => Err(format!("BPF_PROG_RUN with CHECKSUM_COMPLETE: {e}")),
                };
                (
                    format!("{} ({})", case.name, case.reason().name()),
                    Some(result),
                )
            })
            .collect::<Vec<_>>();
        Ok(results)
    });
    match outcome {
        Ok(all) => {
            let (checked, shorter): (Vec<_>, Vec<_>) =
                all.into_iter().partition(|(_, r)| r.is_some());
            let results: Vec<_> = checked
                .into_iter()
                .map(|(n, r)| (n, r.unwrap_or(Ok(()))))
                .collect();
            println!(
                "{} cases on TC with CHECKSUM_COMPLETE; not checked, {} cases whose frame the \
                 program shortens: {:?}",
                results.len(),
                shorter.len(),
                shorter.iter().map(|(n, _)| n).collect::<Vec<_>>()
            );
            assert_all_ok(&results);
        }
        Err(why) => println!("prog_run::fixture_table_on_tc_with_checksum_complete skipped: {why}"),
    }
}

/// `uname -r`.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|e| format!("? ({e})"), |s| s.trim().to_owned())
}
