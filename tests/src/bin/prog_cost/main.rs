//! `prog-cost`: what one packet costs the `xdp_router` program, measured with BPF_PROG_RUN.
//!
//! Runs the program (JIT-compiled, as attached) on representative frames in the router
//! namespace of the fixture table (`xdp_router_tests::fixture_net`), so `bpf_fib_lookup` sees a
//! real FIB, next to two minimal programs loaded from raw instructions: `XDP_PASS` (the cost of
//! the BPF_PROG_RUN loop itself) and a bare redirect (rewrite both MACs, `bpf_redirect`), the
//! ceiling the fast path is compared with. Prints ns/packet: median, min and max over several
//! samples, each the kernel's own average over `calls × REPEAT` runs.
//!
//! What a sample measures: the kernel times only its `repeat` loop around the program
//! (`bpf_test_run`), so syscall and copy costs are excluded. In that loop the program sees its
//! own output again (the frame is not reset between repeats), so:
//! - a forwarded frame loses one TTL per run: frames start at TTL 255 and `REPEAT` stays below
//!   254 (every call starts from the original frame again);
//! - a NAT'd frame no longer matches its flow after one run: NAT cases install the flow *pair*
//!   "original → translated" and "translated → original" (same work per run, the two entries
//!   alternate), and the reply case translates to a second LAN host so both directions of the
//!   pair stay forwardable;
//! - a forwarded frame leaves addressed to the next hop, and the program forwards only frames
//!   addressed to the ingress interface: forwarding cases give the ingress interface the
//!   next hop's MAC in `IFACES` and send the first frame to it (the second LAN host is a
//!   second address of the client, so both directions of the reply pair have one next hop).
//!
//! Each sample is then checked: every run must have been counted in `STATS` under the expected
//! reason and on the flow entries, so a case that silently fell back to `XDP_PASS` fails loudly
//! instead of reporting a flattering number.
//!
//! The numbers are CPU time of the program only (BPF_PROG_RUN without live frames: a redirect
//! only records its target). A real forward also pays the driver, the redirect flush and the
//! egress device, T ns per packet, the same for the bare redirect and the fast path; hence the
//! "vs bare" column (extra ns over the bare redirect) rather than a rate ratio: on the wire the
//! fast path reaches T / (T + extra) of the bare redirect's packet rate.
//!
//! Run (as root): `cargo run --release -p xdp-router-tests --bin prog-cost [-- OPTIONS]`:
//! - `--samples N` (15), `--calls N` (1000): samples per case and BPF_PROG_RUN calls per sample;
//! - `--threads N` (1): N threads (pinned to CPUs 0..N) run each case at once on the same flow;
//! - `--compare OBJECT`: measure another `xdp-router` object file side by side (A/B, e.g. the
//!   build of an older commit); `--compare-fib-direct`: this build loaded with
//!   `FIB_LOOKUP_DIRECT`; `--compare-no-fib-cache`: this build with the per-flow FIB cache off
//!   (`fib_cache_ms = 0`: every packet takes a full `bpf_fib_lookup`); `--compare-tc`: this
//!   build's TC program (`xdp_router_tc`, the same pipeline at TC ingress) on the cases that
//!   apply there (a case the TC path treats otherwise, e.g. a shaped egress it forwards, is
//!   listed as not measured, with what it did);
//! - `--only TEXT`: only the cases whose name contains TEXT (e.g. under `perf record`).
//!
//! Results and their analysis: `docs/manual/src/datapath.md`.

//!
//! The parts: [`opts`] (the command line), [`cases`] (the measured frames and what each must
//! do), [`sample`] (running a case and checking its counters), [`raw`] (the two baseline
//! programs), [`table`] (the printed result).

mod cases;
mod opts;
mod raw;
mod sample;
mod table;

use std::{
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{
    Ebpf,
    programs::{SchedClassifier, Xdp, XdpMode},
};
use xdp_router_common::{FIB_LOOKUP_DIRECT, PROG_NAME, TC_PROG_NAME};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, GW_MAC, Maps, WAN_MAC, build_topology, ifindex, load, load_object, mac,
    },
    netns::{Netns, is_root},
};
use xdp_routerd::datapath::EBPF_OBJECT;

use crate::{
    cases::{Case, LAN_HOST2, Subject, cases},
    opts::Opts,
    sample::{Prog, sample, summarize},
    table::{Row, opts_line, print_table},
};

/// Idle veths in the router namespace that the measured programs are attached to.
const HOLD: [&str; 4] = ["hold0", "hold1", "hold2", "hold3"];

/// Creates the [`HOLD`] veths (peers in `hosts`, no traffic on them).
///
/// Why: for `repeat > 1`, `bpf_prog_test_run_xdp()` puts the program into the XDP dispatcher
/// and takes it out again (`bpf_prog_change_xdp`) around every call, and each change waits for
/// an RCU grace period: on a loaded 2-CPU VM that is tens to hundreds of ms per call. A
/// program the dispatcher already holds (attached in native mode somewhere) only has its
/// reference count moved. It is also how an attached program is called on a real interface:
/// directly from the dispatcher, not through an indirect call.
fn hold_dispatcher(router: &Netns, hosts: &Netns) {
    for (n, name) in HOLD.iter().enumerate() {
        router.veth(name, hosts, &format!("hold{n}p"));
    }
}

fn sysctl(name: &str) -> String {
    let path = format!("/proc/sys/{}", name.replace('.', "/"));
    std::fs::read_to_string(&path).map_or_else(|e| format!("? ({e})"), |s| s.trim().to_owned())
}

fn main() -> ExitCode {
    match try_main() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("prog-cost: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Set by SIGINT/SIGTERM: stop between samples so the namespaces are deleted on the way out.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Which program of an object is measured.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Xdp,
    Tc,
}

/// One loaded `xdp_router` object under test.
struct Object {
    label: String,
    ebpf: Ebpf,
    maps: Maps,
    /// Run the cases with the FIB cache as configured (else with it off).
    fib_cache: bool,
    kind: Kind,
}

/// The measured program of `ebpf`.
fn program(ebpf: &Ebpf, kind: Kind) -> Result<Prog<'_>, String> {
    let name = match kind {
        Kind::Xdp => PROG_NAME,
        Kind::Tc => TC_PROG_NAME,
    };
    let p = ebpf
        .program(name)
        .ok_or_else(|| format!("no program {name}"))?;
    Ok(match kind {
        Kind::Xdp => Prog::Xdp(p.try_into().map_err(|e| format!("{name}: {e}"))?),
        Kind::Tc => Prog::Tc(p.try_into().map_err(|e| format!("{name}: {e}"))?),
    })
}

fn try_main() -> Result<(), String> {
    let opts = Opts::parse()?;
    if !is_root() {
        return Err("needs root (network namespace, BPF); run it with sudo".to_owned());
    }
    let compare = match (
        &opts.compare,
        opts.compare_fib_direct,
        opts.compare_no_fib_cache,
        opts.compare_tc,
    ) {
        (Some(path), false, false, false) => Some((
            path.display().to_string(),
            std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?,
            0,
            true,
            Kind::Xdp,
        )),
        (None, true, false, false) => Some((
            "this build, fib direct".to_owned(),
            EBPF_OBJECT.to_vec(),
            FIB_LOOKUP_DIRECT,
            true,
            Kind::Xdp,
        )),
        (None, false, true, false) => Some((
            "this build, no fib cache".to_owned(),
            EBPF_OBJECT.to_vec(),
            0,
            false,
            Kind::Xdp,
        )),
        (None, false, false, true) => Some((
            "this build at TC ingress".to_owned(),
            EBPF_OBJECT.to_vec(),
            0,
            true,
            Kind::Tc,
        )),
        (None, false, false, false) => None,
        _ => {
            return Err(
                "--compare, --compare-fib-direct, --compare-no-fib-cache and --compare-tc \
                 exclude each other"
                    .into(),
            );
        }
    };
    let jit = sysctl("net.core.bpf_jit_enable");
    let stats = sysctl("kernel.bpf_stats_enabled");
    if stats != "0" {
        eprintln!(
            "note: kernel.bpf_stats_enabled={stats}: every run also pays for its own accounting"
        );
    }
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    let router = Netns::new("pc");
    let hosts = Netns::new("pch");
    build_topology(&router, &hosts);
    router.sh(&format!(
        "ip neigh replace {LAN_HOST2} lladdr {} dev lan0 nud permanent",
        mac(CLIENT_MAC)
    ));
    hold_dispatcher(&router, &hosts);
    let Opts {
        samples,
        calls,
        threads,
        only,
        ..
    } = opts;
    let (labels, rows) = router.run(move || -> Result<(Vec<String>, Vec<Row>), String> {
        let bed = Bed::here();
        let mut objects = vec![Object::new("this build", load())];
        if let Some((label, bytes, fib_flags, fib_cache, kind)) = &compare {
            let mut o = Object::new(label, load_object(bytes, *fib_flags));
            o.fib_cache = *fib_cache;
            o.kind = *kind;
            objects.push(o);
        }
        // See hold_dispatcher(): every measured program stays attached while measured.
        let mut hold = HOLD.iter();
        let mut next_hold = || {
            hold.next()
                .map(|name| ifindex(name))
                .ok_or("not enough idle veths to attach to")
        };
        for o in objects.iter_mut().filter(|o| o.kind == Kind::Tc) {
            let prog: &mut SchedClassifier = o
                .ebpf
                .program_mut(TC_PROG_NAME)
                .ok_or_else(|| format!("{}: no program {TC_PROG_NAME}", o.label))?
                .try_into()
                .map_err(|e| format!("{}: {TC_PROG_NAME} is not TC: {e}", o.label))?;
            prog.load()
                .map_err(|e| format!("verifier rejected {TC_PROG_NAME}: {e}"))?;
        }
        for o in objects.iter_mut().filter(|o| o.kind == Kind::Xdp) {
            let prog: &mut Xdp = o
                .ebpf
                .program_mut(PROG_NAME)
                .ok_or_else(|| format!("{}: no program {PROG_NAME}", o.label))?
                .try_into()
                .map_err(|e| format!("{}: {PROG_NAME} is not XDP: {e}", o.label))?;
            prog.attach_to_if_index(next_hold()?, XdpMode::Driver)
                .map_err(|e| format!("attaching {PROG_NAME} of {}: {e}", o.label))?;
        }
        let baselines = [
            raw::RawXdp::load("base_pass", &raw::pass())?,
            raw::RawXdp::load("base_redirect", &raw::redirect(bed.wan, WAN_MAC, GW_MAC))?,
        ];
        let _links = [
            baselines[0].attach(next_hold()?)?,
            baselines[1].attach(next_hold()?)?,
        ];
        let cases: Vec<Case> = cases(&bed)
            .into_iter()
            .filter(|c| {
                matches!(c.subject, Subject::Baseline { .. })
                    || only.as_deref().is_none_or(|o| c.name.contains(o))
            })
            .collect();
        // What the TC program does otherwise than the XDP program on a case (one call, checked
        // as a sample is): not measured on TC, and said below the table.
        // skip[case][object] = why
        let mut skip: Vec<Vec<Option<String>>> = Vec::new();
        for case in &cases {
            let mut per = Vec::new();
            for o in objects.iter_mut() {
                let why = match (o.kind, &case.subject) {
                    (Kind::Tc, Subject::Router { .. }) => sample(
                        program(&o.ebpf, o.kind)?,
                        &baselines,
                        &mut o.maps,
                        case,
                        o.fib_cache,
                        1,
                        1,
                    )
                    .err(),
                    _ => None,
                };
                per.push(why);
            }
            skip.push(per);
        }
        // all[case][object] = samples
        let mut all: Vec<Vec<Vec<f64>>> = cases
            .iter()
            .map(|c| match c.subject {
                Subject::Router { .. } => vec![Vec::with_capacity(samples); objects.len()],
                Subject::Baseline { .. } => vec![Vec::with_capacity(samples)],
            })
            .collect();
        // Round robin over cases and objects, so that load from other processes spreads over
        // all rows and an A/B comparison sees the same conditions.
        for _ in 0..samples {
            for ((case, out), skip) in cases.iter().zip(all.iter_mut()).zip(&skip) {
                for ((o, out), skip) in objects.iter_mut().zip(out.iter_mut()).zip(skip) {
                    if INTERRUPTED.load(Ordering::Relaxed) {
                        return Err("interrupted".to_owned());
                    }
                    if skip.is_some() {
                        continue;
                    }
                    let ns = sample(
                        program(&o.ebpf, o.kind)?,
                        &baselines,
                        &mut o.maps,
                        case,
                        o.fib_cache,
                        calls,
                        threads,
                    )
                    .map_err(|e| format!("{} ({}): {e}", case.name, o.label))?;
                    out.push(ns);
                }
            }
        }
        let labels = objects.iter().map(|o| o.label.clone()).collect();
        let rows = cases
            .iter()
            .zip(all.iter_mut())
            .zip(skip)
            .map(|((c, per), skip)| Row {
                name: c.name,
                bytes: c.frame.len(),
                per_object: per
                    .iter_mut()
                    .zip(skip)
                    .map(|(s, why)| match why {
                        None => Ok(summarize(s)),
                        Some(why) => Err(why),
                    })
                    .collect(),
            })
            .collect();
        Ok((labels, rows))
    })?;
    print_table(&jit, &opts_line(samples, calls, threads), &labels, &rows)
}

impl Object {
    fn new(label: &str, (ebpf, maps): (Ebpf, Maps)) -> Object {
        Object {
            label: label.to_owned(),
            ebpf,
            maps,
            fib_cache: true,
            kind: Kind::Xdp,
        }
    }
}
