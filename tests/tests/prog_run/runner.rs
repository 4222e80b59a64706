//! Runs a case against the loaded program and checks everything it promises: the verdict, the
//! output frame and its checksums, exactly one `STATS` entry moved, the flow counters and the
//! per-host counters (`HOST_TRAFFIC`).

use aya::programs::{SchedClassifier, Xdp};
use xdp_router_common::{HostCounters, Reason, stats_index};
use xdp_router_tests::{
    fixture_net::{
        HOST_SLOTS, Maps, TC_ACT_REDIRECT, TC_ACT_UNSPEC, XDP_PASS, XDP_REDIRECT,
        coarse_monotonic_ns, run, run_tc,
    },
    packet::{ip_len, verify_checksums},
};

use crate::case::{Case, Expect};

pub fn hex(b: &[u8]) -> String {
    b.chunks(16)
        .map(|c| {
            c.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\n      ")
}

/// The program a case runs on: the XDP program, or the same pipeline at TC ingress.
#[derive(Clone, Copy)]
pub enum Prog<'a> {
    Xdp(&'a Xdp),
    Tc(&'a SchedClassifier),
}

impl Prog<'_> {
    /// One run: (verdict, output frame).
    fn run(self, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
        match self {
            Prog::Xdp(p) => run(p, frame, ingress),
            Prog::Tc(p) => run_tc(p, frame, ingress),
        }
    }

    /// The verdicts of "to the kernel" and "redirected".
    fn verdicts(self) -> (u32, u32) {
        match self {
            Prog::Xdp(_) => (XDP_PASS, XDP_REDIRECT),
            Prog::Tc(_) => (TC_ACT_UNSPEC, TC_ACT_REDIRECT),
        }
    }
}

/// Runs one case; returns what went wrong, if anything.
pub fn check_case(prog: Prog, maps: &mut Maps, case: &Case) -> Result<(), String> {
    let (pass_verdict, redirect_verdict) = prog.verdicts();
    maps.apply(&case.setup);
    let before = maps.stats();
    let flows_before: Vec<_> = case.setup.flows.iter().map(|f| maps.counters(f)).collect();
    let hosts = |maps: &Maps| HOST_SLOTS.map(|slot| maps.host_traffic(slot));
    let hosts_before = hosts(maps);
    let t0 = coarse_monotonic_ns();
    let (verdict, out) = prog.run(&case.frame, case.ingress);
    let t1 = coarse_monotonic_ns();

    let mut errs = Vec::new();
    match &case.expect {
        Expect::Pass(_) => {
            if verdict != pass_verdict {
                errs.push(format!("verdict {verdict}, want {pass_verdict} (pass)"));
            }
            if out != case.frame {
                errs.push(format!(
                    "passed frame was modified:\n  in  {}\n  out {}",
                    hex(&case.frame),
                    hex(&out)
                ));
            }
        }
        Expect::Redirect(_, want) => {
            if verdict != redirect_verdict {
                errs.push(format!(
                    "verdict {verdict}, want {redirect_verdict} (redirect)"
                ));
            }
            if &out != want {
                errs.push(format!(
                    "output frame differs:\n  got  {}\n  want {}",
                    hex(&out),
                    hex(want)
                ));
            }
            // A frame that came in with a wrong checksum (checksums not verified) leaves with it.
            if verify_checksums(&case.frame).is_ok()
                && let Err(e) = verify_checksums(&out)
            {
                errs.push(format!("output checksums: {e}"));
            }
        }
    }

    // STATS: exactly one entry moved, by one packet of the length sent (forwarded: trimmed to
    // the IP datagram) or received (passed).
    let sent = match &case.expect {
        Expect::Pass(_) => case.frame.len(),
        Expect::Redirect(_, want) => want.len(),
    } as u64;
    let after = maps.stats();
    let want_idx = stats_index(case.slot, case.reason()) as usize;
    for (i, (a, b)) in before.iter().zip(&after).enumerate() {
        let delta = (b.packets - a.packets, b.bytes - a.bytes);
        let want = if i == want_idx { (1, sent) } else { (0, 0) };
        if delta != want {
            let (slot, reason) = (
                i as u32 / Reason::COUNT,
                Reason::from_u32(i as u32 % Reason::COUNT),
            );
            errs.push(format!(
                "STATS[slot {slot}, {reason:?}] moved by {delta:?}, want {want:?}"
            ));
        }
    }

    // Flow counters: only the forwarding flow counts (its IP bytes, as conntrack counts them),
    // with a fresh timestamp.
    let datagram = match &case.expect {
        Expect::Pass(_) => 0,
        Expect::Redirect(_, want) => ip_len(want) as u64,
    };
    for (n, (f, old)) in case.setup.flows.iter().zip(&flows_before).enumerate() {
        let now = maps.counters(f);
        let forwarded = n == 0 && matches!(case.expect, Expect::Redirect(..));
        if forwarded {
            if now.packets != old.packets + 1 || now.bytes != old.bytes + datagram {
                errs.push(format!(
                    "flow counters {now:?}, want +1 packet +{datagram} bytes over {old:?}"
                ));
            }
            if !(t0..=t1).contains(&now.last_seen_ns) {
                errs.push(format!(
                    "flow last_seen_ns {} not within the run [{t0}, {t1}]",
                    now.last_seen_ns
                ));
            }
        } else if now != *old {
            errs.push(format!(
                "flow {n} counters changed on a passed packet: {old:?} -> {now:?}"
            ));
        }
    }

    // Per-host counters: a forwarded packet counts for its flow's sender (transmit) and
    // receiver (receive), as many bytes as on the flow; a passed one for nobody.
    if let ([Some(s0), Some(r0)], [Some(s1), Some(r1)]) = (hosts_before, hosts(maps)) {
        let n = u64::from(matches!(case.expect, Expect::Redirect(..)));
        let want = (
            HostCounters {
                transmit_packets: s0.transmit_packets + n,
                transmit_bytes: s0.transmit_bytes + datagram,
                ..s0
            },
            HostCounters {
                receive_packets: r0.receive_packets + n,
                receive_bytes: r0.receive_bytes + datagram,
                ..r0
            },
        );
        if (s1, r1) != want {
            errs.push(format!(
                "HOST_TRAFFIC sender, receiver {:?}, want {want:?}",
                (s1, r1)
            ));
        }
    }

    // A second packet of a forwarded flow advances the counters again.
    if let (Expect::Redirect(_, want), Some(f)) = (&case.expect, case.setup.flows.first()) {
        let first = maps.counters(f);
        let (verdict, out) = prog.run(&case.frame, case.ingress);
        let second = maps.counters(f);
        if verdict != redirect_verdict || &out != want {
            errs.push("second run differs from the first".to_owned());
        }
        if second.packets != first.packets + 1
            || second.bytes != first.bytes + datagram
            || second.last_seen_ns < first.last_seen_ns
        {
            errs.push(format!(
                "counters did not advance on the second packet: {first:?} -> {second:?}"
            ));
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("\n    "))
    }
}

/// Prints one line per named check and fails with the names of those that failed.
pub fn assert_all_ok(results: &[(String, Result<(), String>)]) {
    let failed: Vec<_> = results
        .iter()
        .filter_map(|(name, res)| match res {
            Ok(()) => {
                println!("ok   {name}");
                None
            }
            Err(e) => {
                println!("FAIL {name}\n    {e}");
                Some(name)
            }
        })
        .collect();
    assert!(failed.is_empty(), "failed: {failed:?}");
}
