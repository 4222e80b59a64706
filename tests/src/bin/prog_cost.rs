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
//!   (`fib_cache_ms = 0`: every packet takes a full `bpf_fib_lookup`);
//! - `--only TEXT`: only the cases whose name contains TEXT (e.g. under `perf record`).
//!
//! Results and their analysis: `docs/datapath.md`.

use std::{
    mem::size_of,
    net::IpAddr,
    path::PathBuf,
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
};

use aya::{
    Ebpf,
    programs::{TestRun, TestRunOptions, Xdp, XdpMode},
};
use xdp_router_common::{FIB_LOOKUP_DIRECT, IFACE_F_SHAPED, PROG_NAME, Reason, stats_index};
use xdp_router_tests::{
    fixture_net::{
        Bed, CLIENT_MAC, FlowEntry, GW_MAC, LAN_SLOT, Maps, Setup, WAN_MAC, WAN_SLOT, XDP_PASS,
        XDP_REDIRECT, build_topology, flow, ifindex, lan_pkt, load, load_object, mac, v4, v6,
        wan_pkt, xdp_md,
    },
    netns::{Netns, is_root},
    packet::{
        Spec, Transport,
        tcp_flags::{ACK, PSH},
    },
};
use xdp_routerd::datapath::EBPF_OBJECT;

/// Program runs per BPF_PROG_RUN call: below the 254 TTL decrements a 255 frame allows.
const REPEAT: u32 = 250;
/// TTL / hop limit of the benchmark frames.
const START_TTL: u8 = 255;
/// Second LAN host (permanent neighbour added on top of the fixture topology): the "public"
/// address of the reply case, see the module docs.
const LAN_HOST2: &str = "192.0.2.11";

/// Name of the bare-redirect row.
const BARE_REDIRECT: &str = "baseline: bare redirect";

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

/// Command-line options.
struct Opts {
    /// Samples per case (the median is reported).
    samples: usize,
    /// BPF_PROG_RUN calls per sample (each `REPEAT` runs).
    calls: u32,
    /// Threads measuring each case at once, on the same flow (CPU n for thread n).
    threads: usize,
    /// Another `xdp_router` object file to measure side by side (A/B).
    compare: Option<PathBuf>,
    /// Compare with this build loaded with `FIB_LOOKUP_DIRECT` instead.
    compare_fib_direct: bool,
    /// Compare with this build with the FIB cache off.
    compare_no_fib_cache: bool,
    /// Only the cases whose name contains this (the baselines always run), e.g. to profile one
    /// path with `perf record`.
    only: Option<String>,
}

impl Opts {
    fn parse() -> Result<Opts, String> {
        let mut opts = Opts {
            samples: 15,
            calls: 1000,
            threads: 1,
            compare: None,
            compare_fib_direct: false,
            compare_no_fib_cache: false,
            only: None,
        };
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = |name: &str| {
                args.next()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|v| *v > 0)
                    .ok_or_else(|| format!("{name} needs a positive integer"))
            };
            match arg.as_str() {
                "--samples" => opts.samples = value("--samples")? as usize,
                "--calls" => opts.calls = value("--calls")?,
                "--threads" => opts.threads = value("--threads")? as usize,
                "--compare-fib-direct" => opts.compare_fib_direct = true,
                "--compare-no-fib-cache" => opts.compare_no_fib_cache = true,
                "--only" => opts.only = Some(args.next().ok_or("--only needs a case name part")?),
                "--compare" => {
                    opts.compare = Some(
                        args.next()
                            .ok_or("--compare needs the path of an xdp-router object")?
                            .into(),
                    );
                }
                "-h" | "--help" => {
                    return Err(
                        "usage: prog-cost [--samples N (15)] [--calls N (1000)] [--threads N (1)] \
                         [--compare OBJECT | --compare-fib-direct | --compare-no-fib-cache] [--only TEXT]"
                            .to_owned(),
                    );
                }
                other => return Err(format!("unknown argument {other} (try --help)")),
            }
        }
        Ok(opts)
    }
}

/// What runs a case and what it must do.
enum Subject {
    /// `xdp_router` with these maps; every run must be counted under `reason` in `slot`, and,
    /// when forwarded, on the flow entries of the setup.
    Router {
        setup: Setup,
        slot: u32,
        reason: Reason,
        verdict: u32,
    },
    /// A raw baseline program (index into the baselines) that must return `verdict`.
    Baseline { index: usize, verdict: u32 },
}

/// One row of the table.
struct Case {
    name: &'static str,
    frame: Vec<u8>,
    ingress: u32,
    subject: Subject,
}

/// The flows that keep `pkt` forwarded across repeats: its flow (translating it to `new_src` →
/// `new_dst`) and, when that changes the tuple, the flow of the translated packet back.
fn flow_pair(
    ingress: u32,
    pkt: &Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
) -> Vec<FlowEntry> {
    let there = flow(ingress, pkt, new_src, new_dst, reply);
    if new_src == (pkt.src, pkt.sport) && new_dst == (pkt.dst, pkt.dport) {
        return vec![there];
    }
    let translated = Spec {
        src: new_src.0,
        sport: new_src.1,
        dst: new_dst.0,
        dport: new_dst.1,
        ..pkt.clone()
    };
    let back = flow(
        ingress,
        &translated,
        (pkt.src, pkt.sport),
        (pkt.dst, pkt.dport),
        reply,
    );
    vec![there, back]
}

/// A forwarding case.
fn forward(
    bed: &Bed,
    name: &'static str,
    ingress: u32,
    pkt: Spec,
    new_src: (IpAddr, u16),
    new_dst: (IpAddr, u16),
    reply: bool,
) -> Case {
    let slot = if ingress == bed.lan {
        LAN_SLOT
    } else {
        WAN_SLOT
    };
    // Where the forwarded frame goes, hence where the next run's frame is addressed to.
    let next_hop = if ingress == bed.lan {
        GW_MAC
    } else {
        CLIENT_MAC
    };
    let pkt = Spec {
        eth_dst: next_hop,
        ..pkt
    };
    Case {
        name,
        frame: pkt.frame(),
        ingress,
        subject: Subject::Router {
            setup: Setup::managed(bed, flow_pair(ingress, &pkt, new_src, new_dst, reply))
                .with_iface_mac(ingress, next_hop),
            slot,
            reason: if reply {
                Reason::ForwardedReply
            } else {
                Reason::ForwardedOriginal
            },
            verdict: XDP_REDIRECT,
        },
    }
}

/// `case` with TCP/UDP checksums not verified (`nf_conntrack_checksum = 0`).
fn unverified(mut case: Case) -> Case {
    if let Subject::Router { setup, .. } = &mut case.subject {
        setup.verify_l4_checksum = false;
    }
    case
}

/// A case passed to the kernel from `lan0` under `reason`.
fn pass(name: &'static str, pkt: &Spec, ingress: u32, setup: Setup, reason: Reason) -> Case {
    Case {
        name,
        frame: pkt.frame(),
        ingress,
        subject: Subject::Router {
            setup,
            slot: LAN_SLOT,
            reason,
            verdict: XDP_PASS,
        },
    }
}

/// Every row of the table; `baselines` are loaded in this order: XDP_PASS, bare redirect.
fn cases(bed: &Bed) -> Vec<Case> {
    let b = bed;
    let udp = Transport::Udp;
    let tcp = Transport::Tcp(ACK | PSH);
    let (client4, client6) = (v4("192.0.2.10"), v6("2001:db8:1::10"));
    let (server4, server6) = (v4("198.18.0.7"), v6("2001:db8:ff::7"));
    let (router4, router6) = (v4("198.51.100.1"), v6("2001:db8:2::1"));
    // Minimum frames: 60 bytes + FCS = 64 on the wire for IPv4; IPv6 + UDP needs at least 62.
    let bench = |mut p: Spec| {
        p.ttl = START_TTL;
        p
    };
    let v4_udp = bench(lan_pkt(client4, server4, udp, 18));
    let v6_udp = bench(lan_pkt(client6, server6, udp, 2));
    // 1500-byte frames (the 1514-byte maximum of a 1500 MTU minus the Ethernet header's 14).
    let v4_1500 = bench(lan_pkt(client4, server4, udp, 1500 - 14 - 20 - 8));
    let v6_1500 = bench(lan_pkt(client6, server6, udp, 1500 - 14 - 40 - 8));
    let mut reply = bench(wan_pkt(server4, v4(LAN_HOST2), 61_000, udp));
    reply.payload_len = 18;
    vec![
        forward(
            b,
            "v4 udp snat original",
            b.lan,
            v4_udp.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v4 udp reverse-nat reply",
            b.wan,
            reply,
            (server4, 443),
            (client4, 40_000),
            true,
        ),
        forward(
            b,
            "v4 tcp snat original",
            b.lan,
            bench(lan_pkt(client4, server4, tcp, 6)),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v4 udp routed",
            b.lan,
            v4_udp.clone(),
            (client4, 40_000),
            (server4, 443),
            false,
        ),
        forward(
            b,
            "v6 udp routed",
            b.lan,
            v6_udp.clone(),
            (client6, 40_000),
            (server6, 443),
            false,
        ),
        forward(
            b,
            "v6 udp snat original",
            b.lan,
            v6_udp.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        ),
        // The TCP/UDP checksum verification (nf_conntrack_checksum = 1) by packet size.
        unverified(forward(
            b,
            "v4 udp snat, no l4 csum check",
            b.lan,
            v4_udp.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        )),
        unverified(forward(
            b,
            "v6 udp snat, no l4 csum check",
            b.lan,
            v6_udp.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        )),
        forward(
            b,
            "v4 udp snat 1500 B",
            b.lan,
            v4_1500.clone(),
            (router4, 61_000),
            (server4, 443),
            false,
        ),
        unverified(forward(
            b,
            "v4 udp snat 1500 B, no l4 check",
            b.lan,
            v4_1500,
            (router4, 61_000),
            (server4, 443),
            false,
        )),
        forward(
            b,
            "v6 udp snat 1500 B",
            b.lan,
            v6_1500.clone(),
            (router6, 61_000),
            (server6, 443),
            false,
        ),
        unverified(forward(
            b,
            "v6 udp snat 1500 B, no l4 check",
            b.lan,
            v6_1500,
            (router6, 61_000),
            (server6, 443),
            false,
        )),
        pass(
            "v4 pass: egress shaped",
            &v4_udp,
            b.lan,
            Setup::managed(
                b,
                flow_pair(b.lan, &v4_udp, (router4, 61_000), (server4, 443), false),
            )
            .with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        pass(
            "v6 pass: egress shaped",
            &v6_udp,
            b.lan,
            Setup::managed(
                b,
                flow_pair(b.lan, &v6_udp, (router6, 61_000), (server6, 443), false),
            )
            .with_iface_flags(b.wan, IFACE_F_SHAPED),
            Reason::PassEgressShaped,
        ),
        pass(
            "v6 pass: no flow",
            &v6_udp,
            b.lan,
            Setup::managed(b, Vec::new()),
            Reason::PassNoFlow,
        ),
        pass(
            "v4 pass: no flow",
            &v4_udp,
            b.lan,
            Setup::managed(b, Vec::new()),
            Reason::PassNoFlow,
        ),
        pass(
            "v4 pass: fast path disabled",
            &v4_udp,
            b.lan,
            Setup {
                fastpath: false,
                ..Setup::managed(b, Vec::new())
            },
            Reason::PassDisabled,
        ),
        Case {
            name: "baseline: XDP_PASS",
            frame: v4_udp.frame(),
            ingress: b.lan,
            subject: Subject::Baseline {
                index: 0,
                verdict: XDP_PASS,
            },
        },
        Case {
            name: BARE_REDIRECT,
            frame: v4_udp.frame(),
            ingress: b.lan,
            subject: Subject::Baseline {
                index: 1,
                verdict: XDP_REDIRECT,
            },
        },
    ]
}

/// One thread's share of a sample: `calls` BPF_PROG_RUN calls of `REPEAT` runs each; returns
/// the total ns the kernel measured.
fn drive(prog: &Xdp, baselines: &[raw::RawXdp], case: &Case, calls: u32) -> Result<u128, String> {
    let ctx = xdp_md(case.ingress, case.frame.len());
    let mut total_ns: u128 = 0;
    for _ in 0..calls {
        let (ret, ns, want) = match &case.subject {
            Subject::Router { verdict, .. } => {
                let res = prog
                    .test_run(TestRunOptions {
                        data_in: Some(&case.frame),
                        ctx_in: Some(&ctx),
                        repeat: REPEAT,
                        ..TestRunOptions::default()
                    })
                    .map_err(|e| format!("BPF_PROG_RUN of {PROG_NAME}: {e}"))?;
                (res.return_value, res.duration.as_nanos(), *verdict)
            }
            Subject::Baseline { index, verdict } => {
                let base = baselines
                    .get(*index)
                    .ok_or_else(|| format!("no baseline program {index}"))?;
                let (ret, ns) = base.test_run(&case.frame, &ctx, REPEAT)?;
                (ret, u128::from(ns), *verdict)
            }
        };
        if ret != want {
            return Err(format!("verdict {ret}, want {want}"));
        }
        total_ns += ns * u128::from(REPEAT);
    }
    Ok(total_ns)
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET stays inside it for cpu < 1024.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "pinning a thread to CPU {cpu}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// One sample of a case: `calls` calls on each of `threads` threads at once (thread n pinned to
/// CPU n when there are several, all on the same flow); returns the mean ns per run. Checks
/// that every run took the case's path and was counted (see the module docs).
fn sample(
    prog: &Xdp,
    baselines: &[raw::RawXdp],
    maps: &mut Maps,
    case: &Case,
    fib_cache: bool,
    calls: u32,
    threads: usize,
) -> Result<f64, String> {
    let runs = u64::from(calls) * u64::from(REPEAT) * threads as u64;
    let counted_before = match &case.subject {
        Subject::Router {
            setup,
            slot,
            reason,
            ..
        } => {
            if fib_cache {
                maps.apply(setup);
            } else {
                maps.apply(&setup.clone().without_fib_cache());
            }
            let idx = stats_index(*slot, *reason) as usize;
            Some(maps.stats().get(idx).map_or(0, |c| c.packets))
        }
        Subject::Baseline { .. } => None,
    };
    let totals: Vec<Result<u128, String>> = if threads == 1 {
        vec![drive(prog, baselines, case, calls)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|cpu| {
                    s.spawn(move || {
                        pin_to(cpu)?;
                        drive(prog, baselines, case, calls)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a measuring thread panicked".to_owned()))
                })
                .collect()
        })
    };
    let mut total_ns = 0;
    for t in totals {
        total_ns += t?;
    }
    if let (
        Some(before),
        Subject::Router {
            setup,
            slot,
            reason,
            verdict,
        },
    ) = (counted_before, &case.subject)
    {
        let idx = stats_index(*slot, *reason) as usize;
        let counted = maps.stats().get(idx).map_or(0, |c| c.packets) - before;
        if counted != runs {
            return Err(format!(
                "{counted} of {runs} runs counted under {}: the case does not stay on its \
                 path across repeats",
                reason.name()
            ));
        }
        if *verdict == XDP_REDIRECT {
            let on_flows: u64 = setup.flows.iter().map(|f| maps.counters(f).packets).sum();
            if on_flows != runs {
                return Err(format!(
                    "flow counters saw {on_flows} of {runs} runs (lost updates?)"
                ));
            }
        }
    }
    Ok(total_ns as f64 / runs as f64)
}

/// Median, min and max of a case's samples.
struct Summary {
    median: f64,
    min: f64,
    max: f64,
}

fn summarize(samples: &mut [f64]) -> Summary {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Summary {
        median,
        min: samples[0],
        max: samples[n - 1],
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

/// One loaded `xdp_router` object under test.
struct Object {
    label: String,
    ebpf: Ebpf,
    maps: Maps,
    /// Run the cases with the FIB cache as configured (else with it off).
    fib_cache: bool,
}

/// A row of the result table: a case and its summary per object (one for the baselines).
struct Row {
    name: &'static str,
    bytes: usize,
    per_object: Vec<Summary>,
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
    ) {
        (Some(path), false, false) => Some((
            path.display().to_string(),
            std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?,
            0,
            true,
        )),
        (None, true, false) => Some((
            "this build, fib direct".to_owned(),
            EBPF_OBJECT.to_vec(),
            FIB_LOOKUP_DIRECT,
            true,
        )),
        (None, false, true) => Some((
            "this build, no fib cache".to_owned(),
            EBPF_OBJECT.to_vec(),
            0,
            false,
        )),
        (None, false, false) => None,
        _ => {
            return Err(
                "--compare, --compare-fib-direct and --compare-no-fib-cache exclude \
                        each other"
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
        if let Some((label, bytes, fib_flags, fib_cache)) = &compare {
            let mut o = Object::new(label, load_object(bytes, *fib_flags));
            o.fib_cache = *fib_cache;
            objects.push(o);
        }
        // See hold_dispatcher(): every measured program stays attached while measured.
        let mut hold = HOLD.iter();
        let mut next_hold = || {
            hold.next()
                .map(|name| ifindex(name))
                .ok_or("not enough idle veths to attach to")
        };
        for o in &mut objects {
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
            for (case, out) in cases.iter().zip(all.iter_mut()) {
                for (o, out) in objects.iter_mut().zip(out.iter_mut()) {
                    if INTERRUPTED.load(Ordering::Relaxed) {
                        return Err("interrupted".to_owned());
                    }
                    let prog: &Xdp = o
                        .ebpf
                        .program(PROG_NAME)
                        .ok_or("program vanished")?
                        .try_into()
                        .map_err(|e| format!("{e}"))?;
                    let ns = sample(
                        prog,
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
            .map(|(c, per)| Row {
                name: c.name,
                bytes: c.frame.len(),
                per_object: per.iter_mut().map(|s| summarize(s)).collect(),
            })
            .collect();
        Ok((labels, rows))
    })?;
    print_table(&jit, &opts_line(samples, calls, threads), &labels, &rows)
}

fn opts_line(samples: usize, calls: u32, threads: usize) -> String {
    format!("{samples} samples x {calls} calls x {REPEAT} runs, {threads} thread(s)")
}

fn print_table(jit: &str, how: &str, labels: &[String], rows: &[Row]) -> Result<(), String> {
    let median = |name: &str, object: usize| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.per_object.get(object))
            .map(|s| s.median)
    };
    let bare = median(BARE_REDIRECT, 0).ok_or("no bare redirect row")?;
    println!("xdp_router per-packet cost, ns (BPF_PROG_RUN, JIT {jit}, {how})");
    print!(
        "{:<28} {:>5} {:>8} {:>7} {:>7} {:>9}",
        "case", "bytes", "median", "min", "max", "vs bare"
    );
    if let Some(other) = labels.get(1) {
        print!("  | compared with {other}: median, change");
    }
    println!();
    for r in rows {
        let Some(s) = r.per_object.first() else {
            continue;
        };
        print!(
            "{:<28} {:>5} {:>8.1} {:>7.1} {:>7.1} {:>+9.1}",
            r.name,
            r.bytes,
            s.median,
            s.min,
            s.max,
            s.median - bare
        );
        if let Some(o) = r.per_object.get(1) {
            print!(
                "  | {:>8.1} {:>+6.1}%",
                o.median,
                100.0 * (s.median - o.median) / o.median
            );
        }
        println!();
    }
    println!(
        "vs bare: extra ns per packet over the bare redirect. On the wire both also pay the \
         driver and redirect path (T ns), so the fast path reaches T / (T + extra) of the bare \
         redirect's packet rate."
    );
    for (object, label) in labels.iter().enumerate() {
        for (what, v4, v6) in [
            ("snat", "v4 udp snat original", "v6 udp snat original"),
            ("routed", "v4 udp routed", "v6 udp routed"),
        ] {
            if let (Some(a), Some(b)) = (median(v4, object), median(v6, object)) {
                println!(
                    "{label}: v6 - v4 udp {what}: {:+.1} ns ({:.2}x)",
                    b - a,
                    b / a
                );
            }
        }
    }
    Ok(())
}

impl Object {
    fn new(label: &str, (ebpf, maps): (Ebpf, Maps)) -> Object {
        Object {
            label: label.to_owned(),
            ebpf,
            maps,
            fib_cache: true,
        }
    }
}

/// The two baseline programs, loaded from raw eBPF instructions with the `bpf(2)` syscall (aya
/// loads ELF objects only). Kept tiny on purpose: they are the floor and the ceiling.
mod raw {
    use std::{
        ffi::CString,
        mem::size_of,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TEST_RUN: libc::c_long = 10;
    const BPF_LINK_CREATE: libc::c_long = 28;
    /// `BPF_XDP` in `enum bpf_attach_type`.
    const BPF_XDP: u32 = 37;
    /// `XDP_FLAGS_DRV_MODE`.
    const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    /// `BPF_FUNC_redirect` in the kernel's helper list (include/uapi/linux/bpf.h).
    const BPF_FUNC_REDIRECT: i32 = 23;
    const XDP_PASS: i32 = 2;

    /// `struct bpf_insn`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Insn {
        code: u8,
        /// dst_reg (low nibble), src_reg (high nibble).
        regs: u8,
        off: i16,
        imm: i32,
    }

    const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            regs: dst | (src << 4),
            off,
            imm,
        }
    }
    /// r_dst = imm (BPF_ALU64 | BPF_MOV | BPF_K).
    const fn mov_imm(dst: u8, imm: i32) -> Insn {
        insn(0xb7, dst, 0, 0, imm)
    }
    /// r_dst = r_src (BPF_ALU64 | BPF_MOV | BPF_X).
    const fn mov_reg(dst: u8, src: u8) -> Insn {
        insn(0xbf, dst, src, 0, 0)
    }
    /// r_dst += imm (BPF_ALU64 | BPF_ADD | BPF_K).
    const fn add_imm(dst: u8, imm: i32) -> Insn {
        insn(0x07, dst, 0, 0, imm)
    }
    /// r_dst = *(u32 *)(r_src + off) (BPF_LDX | BPF_MEM | BPF_W).
    const fn load_u32(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x61, dst, src, off, 0)
    }
    /// *(u32 *)(r_dst + off) = imm (BPF_ST | BPF_MEM | BPF_W).
    const fn store_u32(dst: u8, off: i16, imm: i32) -> Insn {
        insn(0x62, dst, 0, off, imm)
    }
    /// *(u16 *)(r_dst + off) = imm (BPF_ST | BPF_MEM | BPF_H).
    const fn store_u16(dst: u8, off: i16, imm: i32) -> Insn {
        insn(0x6a, dst, 0, off, imm)
    }
    /// if r_dst > r_src goto +off (BPF_JMP | BPF_JGT | BPF_X).
    const fn jgt_reg(dst: u8, src: u8, off: i16) -> Insn {
        insn(0x2d, dst, src, off, 0)
    }
    /// call helper (BPF_JMP | BPF_CALL).
    const fn call(helper: i32) -> Insn {
        insn(0x85, 0, 0, 0, helper)
    }
    /// exit (BPF_JMP | BPF_EXIT).
    const fn exit() -> Insn {
        insn(0x95, 0, 0, 0, 0)
    }

    /// `return XDP_PASS`.
    pub fn pass() -> Vec<Insn> {
        vec![mov_imm(0, XDP_PASS), exit()]
    }

    /// Rewrites both MACs and returns `bpf_redirect(ifindex, 0)`, like the lab's bare redirect
    /// (runt frames: `XDP_PASS`).
    pub fn redirect(ifindex: u32, smac: [u8; 6], dmac: [u8; 6]) -> Vec<Insn> {
        let w = |b: &[u8]| match *b {
            [a, b, c, d] => i32::from_ne_bytes([a, b, c, d]),
            [a, b] => i32::from(i16::from_ne_bytes([a, b])),
            _ => 0,
        };
        vec![
            load_u32(2, 1, 0), // r2 = ctx->data
            load_u32(3, 1, 4), // r3 = ctx->data_end
            mov_reg(4, 2),
            add_imm(4, 14),
            jgt_reg(4, 3, 8), // Ethernet header beyond the end: to the XDP_PASS below
            store_u32(2, 0, w(&dmac[..4])),
            store_u16(2, 4, w(&dmac[4..])),
            store_u32(2, 6, w(&smac[..4])),
            store_u16(2, 10, w(&smac[4..])),
            mov_imm(1, ifindex as i32),
            mov_imm(2, 0),
            call(BPF_FUNC_REDIRECT),
            exit(),
            mov_imm(0, XDP_PASS),
            exit(),
        ]
    }

    /// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`.
    #[repr(C)]
    struct ProgLoadAttr {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }

    /// `union bpf_attr` for BPF_PROG_TEST_RUN (`test`).
    #[repr(C)]
    #[derive(Default)]
    struct TestRunAttr {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        _pad: u32,
    }

    fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
        // SAFETY: `attr` is a live, fully initialised bpf_attr prefix of the size passed.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                attr as *mut T as *mut libc::c_void,
                size_of::<T>() as libc::c_uint,
            )
        };
        if rc < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(rc)
        }
    }

    /// `union bpf_attr` for BPF_LINK_CREATE, up to `flags`.
    #[repr(C)]
    struct LinkCreateAttr {
        prog_fd: u32,
        target_ifindex: u32,
        attach_type: u32,
        flags: u32,
    }

    /// A loaded XDP program (closed on drop).
    pub struct RawXdp {
        fd: OwnedFd,
    }

    impl RawXdp {
        /// Loads `insns` as an XDP program called `name`; errors carry the verifier log.
        pub fn load(name: &str, insns: &[Insn]) -> Result<RawXdp, String> {
            let license = CString::new("GPL").map_err(|e| e.to_string())?;
            let mut log = vec![0u8; 64 * 1024];
            let mut prog_name = [0u8; 16];
            for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
                *d = s;
            }
            let mut attr = ProgLoadAttr {
                prog_type: BPF_PROG_TYPE_XDP,
                insn_cnt: insns.len() as u32,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                log_level: 1,
                log_size: log.len() as u32,
                log_buf: log.as_mut_ptr() as u64,
                kern_version: 0,
                prog_flags: 0,
                prog_name,
                prog_ifindex: 0,
                expected_attach_type: BPF_XDP,
            };
            let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                format!(
                    "loading baseline {name}: {e}\n{}",
                    String::from_utf8_lossy(&log[..end])
                )
            })?;
            // SAFETY: the kernel returned a new program fd that nothing else owns.
            let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            Ok(RawXdp { fd })
        }

        /// Attaches the program in native mode to `ifindex` of the calling thread's namespace;
        /// it stays attached as long as the returned link lives.
        pub fn attach(&self, ifindex: u32) -> Result<OwnedFd, String> {
            let mut attr = LinkCreateAttr {
                prog_fd: self.fd.as_raw_fd() as u32,
                target_ifindex: ifindex,
                attach_type: BPF_XDP,
                flags: XDP_FLAGS_DRV_MODE,
            };
            let fd = bpf(BPF_LINK_CREATE, &mut attr)
                .map_err(|e| format!("attaching a baseline to ifindex {ifindex}: {e}"))?;
            // SAFETY: the kernel returned a new link fd that nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
        }

        /// BPF_PROG_RUN with `repeat` runs: (return value of the last run, mean ns per run).
        pub fn test_run(&self, data: &[u8], ctx: &[u8], repeat: u32) -> Result<(u32, u32), String> {
            let mut attr = TestRunAttr {
                prog_fd: self.fd.as_raw_fd() as u32,
                data_size_in: data.len() as u32,
                data_in: data.as_ptr() as u64,
                repeat,
                ctx_size_in: ctx.len() as u32,
                ctx_in: ctx.as_ptr() as u64,
                ..TestRunAttr::default()
            };
            bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|e| format!("BPF_PROG_RUN: {e}"))?;
            Ok((attr.retval, attr.duration))
        }
    }
}
