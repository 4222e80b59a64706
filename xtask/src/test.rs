//! `cargo xtask test`: unit tests, the manual's build and link check, the release daemon build, the privileged tests (as root, one
//! thread) and beside them the same kind of tests in a Debian-kernel guest (VLAN, PPPoE, IPsec:
//! modules this kernel lacks), check-system and the core end-to-end tests in a guest on Debian
//! 12's own kernel (6.1) (and, opt-in with `--jammy`, on Ubuntu 22.04's 5.15), the arm64 package and the fixtures and core tests in an arm64
//! guest, the Debian packages (built twice, installed, run and purged in a clean root), the
//! quick benchmark, a 1-minute soak and the small scale benchmark; then a summary.
//! Exits non-zero when any step failed.

use std::{fmt::Write as _, fs, path::PathBuf, time::Instant};

use anyhow::bail;

use crate::{cmd, workspace};

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip the unprivileged unit tests.
    #[arg(long)]
    no_unit: bool,
    /// Skip the quick benchmark, the soak and the small scale benchmark.
    #[arg(long)]
    no_bench: bool,
    /// Skip the tests that run in the amd64 Debian-kernel guest (VLAN, PPPoE, IPsec; see
    /// xtask/src/guest/amd64.rs).
    #[arg(long)]
    no_guest: bool,
    /// Skip the arm64 guest (the arm64 package, fixtures and core tests under
    /// qemu-system-aarch64; see xtask/src/guest/arm64.rs).
    #[arg(long)]
    no_arm64: bool,
    /// Skip the Debian 12 guest (check-system and the core end-to-end tests on Debian 12's own
    /// 6.1 kernel; see xtask/src/guest/deb12.rs).
    #[arg(long)]
    no_deb12: bool,
    /// Skip the packages step (the Debian packages built, installed in a clean root, purged;
    /// see xtask/src/packages.rs).
    #[arg(long)]
    no_packages: bool,
    /// Only the release daemon build and the guests (`-- <filter>` narrows the amd64 guest's
    /// tests; `--no-deb12` and `--no-arm64` leave the Debian 12 and arm64 guests out,
    /// `--jammy` adds the Ubuntu 22.04 one).
    #[arg(long, conflicts_with = "no_guest")]
    guest_only: bool,
    /// Only these test binaries in the amd64 guest (repeatable, e.g. `--guest-target pppoe`;
    /// all of them by default): to time or debug one.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(
        crate::guest::amd64::TEST_TARGETS.iter().copied()))]
    guest_target: Vec<String>,
    /// Only the release daemon build and the packages step.
    #[arg(long, conflicts_with_all = ["no_packages", "guest_only"])]
    packages_only: bool,
    /// Only the arm64 guest step.
    #[arg(long, conflicts_with_all = ["no_arm64", "guest_only", "packages_only"])]
    arm64_only: bool,
    /// Also boot Ubuntu 22.04's 5.15 kernel (no multi-buffer XDP, no TCX, the oldest verifier)
    /// for check-system and the Debian 12 guest's core end-to-end tests (see
    /// xtask/src/guest/jammy.rs); opt-in, it takes as long as the Debian 12 guest.
    #[arg(long)]
    jammy: bool,
    /// Only the release daemon build and the Ubuntu 22.04 (5.15) guest.
    #[arg(long, conflicts_with_all = ["guest_only", "packages_only", "arm64_only"])]
    jammy_only: bool,
    /// Extra arguments for the privileged test binaries, e.g. a test-name filter.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    privileged_args: Vec<String>,
}

enum Outcome {
    Passed,
    Failed(String),
    NotRun(String),
}

struct Step {
    name: &'static str,
    outcome: Outcome,
    secs: f64,
}

fn timed(name: &'static str, f: impl FnOnce() -> anyhow::Result<()>) -> Step {
    println!("\n==== {name}");
    let t = Instant::now();
    let outcome = match f() {
        Ok(()) => Outcome::Passed,
        Err(e) => Outcome::Failed(format!("{e:#}")),
    };
    Step {
        name,
        outcome,
        secs: t.elapsed().as_secs_f64(),
    }
}

/// Runs every step, prints the summary, and fails when a step failed.
pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    // The README's test command must work on a fresh machine: install what is missing first
    // (a few tenths of a second when everything is there).
    crate::setup::run()?;
    let ws = workspace::Workspace::load()?;
    let ci = std::env::var_os("CI").is_some();
    let mut steps = Vec::new();
    // The flag that leaves most steps out, if any.
    let only = if args.guest_only {
        Some("--guest-only")
    } else if args.packages_only {
        Some("--packages-only")
    } else if args.arm64_only {
        Some("--arm64-only")
    } else if args.jammy_only {
        Some("--jammy-only")
    } else {
        None
    };

    // The lint gate: formatting and clippy with warnings as errors, over every host crate
    // and over the eBPF binaries as the build scripts build them (nightly, bpfel-unknown-none).
    if let Some(only) = only {
        steps.push(not_run("lint gate", only));
    } else {
        steps.push(timed("lint gate", || {
            cmd::run(cmd::cargo().args(["fmt", "--all", "--check"]))?;
            cmd::run(cmd::cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))?;
            cmd::run(&mut ebpf_clippy(&ws))
        }));
    }

    if args.no_unit || only.is_some() {
        steps.push(not_run("unit tests", only.unwrap_or("--no-unit")));
    } else {
        steps.push(timed("unit tests", || {
            let mut c = cmd::cargo();
            c.args([
                "test",
                "--no-fail-fast",
                "--workspace",
                "--exclude",
                "xdp-router-tests",
            ]);
            cmd::run(&mut c)
        }));
    }

    // The manual (docs/manual): built by mdbook, its links checked (≈ 0.2 s); its generated
    // reference pages are compared with the code by a unit test above.
    if let Some(only) = only {
        steps.push(not_run("manual", only));
    } else {
        steps.push(timed("manual", crate::docs::book));
    }

    let mut daemon = None;
    if args.arm64_only {
        steps.push(not_run("release daemon build", "--arm64-only"));
    } else {
        steps.push(timed("release daemon build", || {
            daemon = Some(workspace::build_release_daemon()?);
            Ok(())
        }));
    }

    let skip_log = std::env::temp_dir().join(format!("xdp-router-skips-{}", std::process::id()));
    let _ = fs::remove_file(&skip_log);
    // The amd64 guest, then the Debian 12 guest, boot before the privileged tests and run
    // beside them, one after the other (xtask/src/guest/mod.rs): the tests leave the CPUs idle
    // most of the time, which the emulator, in the idle scheduling class, takes (2026-11-27,
    // AMD EPYC host: one after the other 971 s + 811 s, side by side 924 s, the guest done
    // after 869 s of it). Alone, one after the other, with `--guest-only`. Their binaries are
    // built first: cargo holds the build directory while `cargo test` runs.
    let mut deb12_beside = None;
    let guest = match (&daemon, cmd::is_root()) {
        _ if args.no_guest => Guest::NotRun(not_run("guest tests", "--no-guest")),
        _ if args.packages_only || args.arm64_only || args.jammy_only => {
            Guest::NotRun(not_run("guest tests", only.unwrap_or_default()))
        }
        (None, _) => Guest::NotRun(not_run("guest tests", "the daemon did not build")),
        (Some(_), false) => Guest::NotRun(Step {
            name: "guest tests",
            outcome: Outcome::Failed("not root".into()),
            secs: 0.0,
        }),
        (Some(bin), true) if only.is_none() => {
            let t = Instant::now();
            let log = ws.target_dir().join("guest-amd64-console.log");
            let mut guests = vec![(
                crate::guest::amd64::prepare(bin, &args.guest_target, &args.privileged_args),
                log.clone(),
            )];
            if !args.no_deb12 {
                guests.push((
                    crate::guest::deb12::prepare(),
                    ws.target_dir().join("guest-deb12-console.log"),
                ));
            }
            let mut booted = crate::guest::boot_beside(guests, &skip_log).into_iter();
            let amd64 = booted.next().expect("one Beside per guest");
            deb12_beside = booted.next();
            if amd64.is_ok() {
                println!(
                    "guest: running beside the privileged tests (the Debian 12 guest after it); \
                     its console goes to {} and is printed when it ends",
                    log.display()
                );
            }
            Guest::Beside(amd64, t.elapsed().as_secs_f64(), bin)
        }
        (Some(bin), true) => Guest::Alone(bin),
    };
    // The arm64 root (mmdebstrap, ≈ 4 min on a fresh machine, most of it downloading) is made
    // beside the privileged tests too, at the idle class, when the arm64 step will need it.
    let arm64_root_log = ws.target_dir().join("guest-arm64-root.log");
    let arm64_root = (only.is_none() && !args.no_arm64 && daemon.is_some() && cmd::is_root())
        .then(|| crate::guest::arm64::root_beside(arm64_root_log.clone()));
    match (&daemon, cmd::is_root()) {
        _ if only.is_some() => steps.push(not_run("privileged tests", only.unwrap_or_default())),
        (None, _) => steps.push(not_run("privileged tests", "the daemon did not build")),
        (Some(_), false) => steps.push(Step {
            name: "privileged tests",
            outcome: Outcome::Failed(
                "not root: netns/BPF/iptables tests need root; run `sudo -E env \"PATH=$PATH\" \
                 cargo xtask test`"
                    .into(),
            ),
            secs: 0.0,
        }),
        (Some(bin), true) => steps.push(timed("privileged tests", || {
            privileged(bin, &skip_log, &args.privileged_args)
        })),
    }
    // Said in the summary, where CI's shortened output still shows them.
    let mut notes: Vec<String> = Vec::new();
    let boot_alone = |bin: &PathBuf| {
        crate::guest::amd64::prepare(bin, &args.guest_target, &args.privileged_args)
            .and_then(|p| p.boot(&skip_log, &mut std::io::stdout()))
    };
    let guest_step = match guest {
        Guest::NotRun(step) => step,
        Guest::Beside(booted, prepare_secs, bin) => {
            println!("\n==== guest tests (beside the privileged tests)");
            let (outcome, secs) = match booted {
                Ok(b) => b.wait(),
                Err(e) => (Err(e), 0.0),
            };
            let t = Instant::now();
            let outcome = once_more_if_unfinished("amd64", outcome, &mut notes, || boot_alone(bin));
            Step {
                name: "guest tests (beside)",
                outcome: guest_outcome(outcome),
                // Its build, then its boot: the part after the privileged tests ended is
                // what it added to the whole (and a second boot, if it needed one).
                secs: prepare_secs + secs + t.elapsed().as_secs_f64(),
            }
        }
        Guest::Alone(bin) => {
            println!("\n==== guest tests");
            let t = Instant::now();
            let outcome =
                once_more_if_unfinished("amd64", boot_alone(bin), &mut notes, || boot_alone(bin));
            Step {
                name: "guest tests",
                outcome: guest_outcome(outcome),
                secs: t.elapsed().as_secs_f64(),
            }
        }
    };
    steps.push(guest_step);
    // Debian 12's own kernel (6.1: no TCX links, the oldest verifier): check-system and the
    // core end-to-end tests against the release daemon; beside the privileged tests after the
    // amd64 guest (above), or on its own after them (`--guest-only`, `--no-guest`).
    let deb12_step = match (&daemon, cmd::is_root()) {
        _ if args.no_deb12 => not_run(DEB12_STEP, "--no-deb12"),
        _ if args.packages_only || args.arm64_only || args.jammy_only => {
            not_run(DEB12_STEP, only.unwrap_or_default())
        }
        (None, _) => not_run(DEB12_STEP, "the daemon did not build"),
        (Some(_), false) => Step {
            name: DEB12_STEP,
            outcome: Outcome::Failed("not root".into()),
            secs: 0.0,
        },
        (Some(_), true) => {
            let boot = || {
                crate::guest::deb12::prepare()
                    .and_then(|p| p.boot(&skip_log, &mut std::io::stdout()))
            };
            let (name, first, ran) = match deb12_beside {
                Some(beside) => {
                    println!("\n==== {DEB12_STEP} (beside the privileged tests)");
                    let (outcome, secs) = match beside {
                        Ok(b) => b.wait(),
                        Err(e) => (Err(e), 0.0),
                    };
                    (DEB12_BESIDE_STEP, outcome, secs)
                }
                None => {
                    println!("\n==== {DEB12_STEP}");
                    let t = Instant::now();
                    let outcome = boot();
                    (DEB12_STEP, outcome, t.elapsed().as_secs_f64())
                }
            };
            let t = Instant::now();
            let outcome = once_more_if_unfinished("Debian 12", first, &mut notes, boot);
            Step {
                name,
                outcome: guest_outcome(outcome),
                // Its boot (and a second one, if it needed one).
                secs: ran + t.elapsed().as_secs_f64(),
            }
        }
    };
    steps.push(deb12_step);
    // Ubuntu 22.04's own kernel (5.15: no multi-buffer XDP either), the same way; opt-in.
    let jammy_step = match (&daemon, cmd::is_root()) {
        _ if !args.jammy && !args.jammy_only => not_run(JAMMY_STEP, "opt-in: --jammy"),
        _ if args.packages_only || args.arm64_only => not_run(JAMMY_STEP, only.unwrap_or_default()),
        (None, _) => not_run(JAMMY_STEP, "the daemon did not build"),
        (Some(_), false) => Step {
            name: JAMMY_STEP,
            outcome: Outcome::Failed("not root".into()),
            secs: 0.0,
        },
        (Some(_), true) => {
            println!("\n==== {JAMMY_STEP}");
            let t = Instant::now();
            let boot = || {
                crate::guest::jammy::prepare()
                    .and_then(|p| p.boot(&skip_log, &mut std::io::stdout()))
            };
            let outcome = once_more_if_unfinished("Ubuntu 22.04", boot(), &mut notes, boot);
            Step {
                name: JAMMY_STEP,
                outcome: guest_outcome(outcome),
                secs: t.elapsed().as_secs_f64(),
            }
        }
    };
    steps.push(jammy_step);
    // The arm64 guest: its package and tests cross-built (≈ 4 min from a fresh target
    // directory; the first run also makes its root, ≈ 5 min), then booted. After the amd64
    // guest, not beside it: both emulators keep two cores busy (side by side, each took twice
    // as long, and timing checks inside them failed).
    let arm64_built = if args.no_arm64 {
        steps.push(not_run("arm64 guest", "--no-arm64"));
        false
    } else if args.packages_only || args.jammy_only {
        steps.push(not_run("arm64 guest", only.unwrap_or_default()));
        false
    } else if !cmd::is_root() {
        steps.push(Step {
            name: "arm64 guest",
            outcome: Outcome::Failed("not root".into()),
            secs: 0.0,
        });
        false
    } else {
        let mut built = false;
        steps.push(timed("arm64 guest", || {
            if let Some(beside) = arm64_root {
                let made = beside.wait();
                if let Ok(text) = fs::read_to_string(&arm64_root_log) {
                    print!("{text}");
                }
                if let Err(e) = made {
                    println!("arm64 root: not made beside the tests ({e:#}): making it now");
                }
            }
            let prepared = crate::guest::arm64::prepare()?;
            built = true;
            let failed = prepared.boot(&skip_log, &mut std::io::stdout())?;
            if !failed.is_empty() {
                bail!("failed in the arm64 guest: {}", failed.join(", "));
            }
            Ok(())
        }));
        built
    };
    // ≈ 1.5 min when only the packaging changed; the arm64 package's cross build is done by
    // then when the arm64 guest ran (≈ 3 min otherwise, so only `--packages-only` adds it);
    // the first run adds the clean root (≈ 1 min).
    match (&daemon, cmd::is_root()) {
        _ if args.guest_only || args.arm64_only || args.jammy_only => {
            steps.push(not_run("packages", only.unwrap_or_default()))
        }
        _ if args.no_packages => steps.push(not_run("packages", "--no-packages")),
        (None, _) => steps.push(not_run("packages", "the daemon did not build")),
        (Some(_), false) => steps.push(Step {
            name: "packages",
            outcome: Outcome::Failed("not root (the clean root boots in a container)".into()),
            secs: 0.0,
        }),
        (Some(_), true) => steps.push(timed("packages", || {
            crate::packages::run(&skip_log, args.packages_only || arm64_built)
        })),
    }
    // `DEGRADED` lines: tests that checked a degraded path because this kernel lacks a feature
    // (notes, not skips).
    let (degraded, skips): (Vec<String>, Vec<String>) = fs::read_to_string(&skip_log)
        .map(|s| s.lines().map(str::to_owned).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .partition(|l| l.starts_with("DEGRADED "));
    notes.extend(degraded);
    let _ = fs::remove_file(&skip_log);

    if !ws.has_package(workspace::BENCH_PACKAGE) {
        steps.push(not_run(
            "quick benchmark",
            "no xdp-router-bench package in the workspace",
        ));
    } else if args.no_bench || only.is_some() {
        let why = only.unwrap_or("--no-bench");
        steps.push(not_run("quick benchmark", why));
        steps.push(not_run("soak (1 min)", why));
        steps.push(not_run("scale benchmark (small)", why));
    } else if !cmd::is_root() {
        steps.push(Step {
            name: "quick benchmark",
            outcome: Outcome::Failed("not root".into()),
            secs: 0.0,
        });
    } else {
        steps.push(timed("quick benchmark", || run_bench(&["quick"])));
        // Fails on any lost connection or leaked flow. The fast-path run only: the
        // kernel-alone control (`cargo xtask bench soak`) is for the side-by-side figures.
        // A 128 KiB conntrack event buffer (the daemon's default is 16 MiB) makes the event
        // socket overrun under this churn, so the run goes through overruns and resyncs with
        // connections in flight; it fails if none happened.
        steps.push(timed("soak (1 min)", || {
            run_bench(&[
                "soak",
                "--minutes",
                "1",
                "--no-control",
                "--ct-event-buffer",
                "131072",
            ])
        }));
        // Regression checks at 50 k routes and 50 k conntrack entries (≈ 1 min): offload time,
        // keep-alive CPU with no traffic, daemon RSS, no flow left after conntrack -F.
        steps.push(timed("scale benchmark (small)", || {
            run_bench(&["scale", "--small"])
        }));
    }

    let mut failed = 0;
    let mut summary = String::from("\n==== summary\n");
    for s in &steps {
        let (word, detail) = match &s.outcome {
            Outcome::Passed => ("ok", String::new()),
            Outcome::Failed(why) => {
                failed += 1;
                ("FAILED", format!(": {why}"))
            }
            Outcome::NotRun(why) => ("not run", format!(" ({why})")),
        };
        let _ = writeln!(
            summary,
            "  {:<24} {:<8} {:>7.1} s{detail}",
            s.name, word, s.secs
        );
    }
    for s in &skips {
        let _ = writeln!(summary, "  SKIPPED: {s}");
    }
    for n in &notes {
        let _ = writeln!(summary, "  NOTE: {n}");
    }
    print!("{summary}");
    if ci && !skips.is_empty() {
        bail!("{} test(s) skipped and CI is set", skips.len());
    }
    if failed > 0 {
        bail!("{failed} step(s) failed");
    }
    println!("all steps passed");
    Ok(())
}

/// Clippy over the eBPF crate's binaries for BPF, with the `bpf_target_arch` cfg aya-build
/// sets, in a target directory of its own (the host build's fingerprints stay untouched).
fn ebpf_clippy(ws: &workspace::Workspace) -> std::process::Command {
    let mut c = std::process::Command::new("rustup");
    c.current_dir(workspace::root())
        .args(["run", "nightly", "cargo", "clippy", "-p", "xdp-router-ebpf"])
        .args(["--bins", "--features", "bpf-bins", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", ws.target_dir().join("ebpf-clippy"))
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{}\"", std::env::consts::ARCH),
        )
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTUP_TOOLCHAIN");
    c
}

/// `cargo run --release -p xdp-router-bench -- ARGS`.
fn run_bench(args: &[&str]) -> anyhow::Result<()> {
    let mut c = cmd::cargo();
    c.args(["run", "--release", "-p", workspace::BENCH_PACKAGE, "--"])
        .args(args);
    cmd::run_keeping_tail(&mut c)
}

/// The Debian 12 guest step's name in the summary.
const DEB12_STEP: &str = "Debian 12 guest (6.1)";
const JAMMY_STEP: &str = "Ubuntu 22.04 guest (5.15)";
/// Its name when it ran beside the privileged tests.
const DEB12_BESIDE_STEP: &str = "Debian 12 (6.1, beside)";

/// How the amd64 guest step runs.
enum Guest<'a> {
    /// It does not (the step says why).
    NotRun(Step),
    /// Booted in the background before the privileged tests (or failed to), after the given
    /// seconds of building (its binaries and the Debian 12 guest's), with this daemon.
    Beside(anyhow::Result<crate::guest::Beside>, f64, &'a PathBuf),
    /// On its own (`--guest-only`), with this daemon.
    Alone(&'a PathBuf),
}

/// The outcome of `first`, or when that guest ended before its tests finished (a guest kernel
/// panic, the emulator's exit: [`crate::guest::Unfinished`]), of booting it `again` once, on
/// its own; the first boot's end goes into `notes`, naming the `which` guest (a test failure or
/// a timeout is not retried).
fn once_more_if_unfinished(
    which: &str,
    first: anyhow::Result<Vec<String>>,
    notes: &mut Vec<String>,
    again: impl FnOnce() -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<Vec<String>> {
    match first {
        Err(e) if e.downcast_ref::<crate::guest::Unfinished>().is_some() => {
            println!("guest: {e:#}\nguest: booting it once more, on its own");
            notes.push(format!(
                "the {which} guest was booted twice; the first boot: {e:#}"
            ));
            again()
        }
        outcome => outcome,
    }
}

/// A guest's outcome as a step's: failed tests named.
fn guest_outcome(outcome: anyhow::Result<Vec<String>>) -> Outcome {
    match outcome {
        Ok(failed) if failed.is_empty() => Outcome::Passed,
        Ok(failed) => Outcome::Failed(format!("failed in the guest: {}", failed.join(", "))),
        Err(e) => Outcome::Failed(format!("{e:#}")),
    }
}

fn not_run(name: &'static str, why: &str) -> Step {
    Step {
        name,
        outcome: Outcome::NotRun(why.into()),
        secs: 0.0,
    }
}

/// `cargo test -p xdp-router-tests -- --test-threads=1`, told which daemon binary to start and
/// where to record skipped tests.
fn privileged(bin: &PathBuf, skip_log: &PathBuf, extra: &[String]) -> anyhow::Result<()> {
    let mut c = cmd::cargo();
    c.env("XDP_ROUTERD_BIN", bin)
        .env("XDP_ROUTER_SKIP_LOG", skip_log)
        .args([
            "test",
            "--no-fail-fast",
            "-p",
            "xdp-router-tests",
            "--",
            "--test-threads=1",
            // The figures the tests print (fast-path shares, counts) belong in the log.
            "--show-output",
        ])
        .args(extra);
    let failed = cmd::run_collecting_failures(&mut c)?;
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}
