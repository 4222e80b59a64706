//! Verdicts that change without a ruleset change reach offloaded flows: an `ipset add` to a
//! blocklist the FORWARD chain drops, and a `-m time` rule's start time passing. Neither is an
//! nftables commit, so arming alone would keep forwarding the flow; the verdict age
//! (`verdict_max_age_ms`) hands each flow direction's next packet back to the kernel's rules.
//!
//! Every case runs three times on one running flow, each time compared with the same change:
//! - the kernel alone (fast path off): what the flow must do;
//! - the fast path with the default verdict age: must do the same (stop within 1 s, resume
//!   and be fast-pathed again within 2 s once the change is undone);
//! - the fast path with `verdict-age 0` (verdicts kept until the ruleset changes, the kernel
//!   flowtable's semantics): the negative control, which keeps forwarding, so the test can tell.
//!
//! Where no rule that established packets reach can change its answer without a ruleset change
//! (no ipset, set with timeouts, time or route lookup match), verdicts do not expire at all:
//! [`verdicts_hold_where_no_rule_can_change_them`].
//!
//! Run as root with one test thread (`cargo xtask test`).

use std::{
    thread::sleep,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use xdp_router_tests::testbed::{
    LAN_IF, Testbed, UdpFlow, WAN_HOST_V4, lan_fast_share, ready, time_scale, wait_until, wan_v4,
};

/// Datagrams per second each way.
const PPS: u32 = 2000;

/// `verdict_max_age_ms` as shipped (`config/xdp-routerd.toml` and the daemon's default).
const DEFAULT_VERDICT_AGE_MS: u64 = 500;

/// How each round runs the flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Fast path off: the kernel's own behaviour.
    KernelAlone,
    /// Fast path on, the default verdict age.
    FastPath,
    /// Fast path on, `verdict-age 0`: verdicts kept until the ruleset changes.
    VerdictsKept,
}

const MODES: [Mode; 3] = [Mode::KernelAlone, Mode::FastPath, Mode::VerdictsKept];

/// How soon a flow must stop after the change (1 s, times [`time_scale`] on an emulated CPU:
/// there the echoes queued in the LAN host's socket alone arrived for more than 1 s after the
/// kernel dropped the flow, in the Debian 12 guest and in the 6.12 one).
fn stop_limit() -> Duration {
    Duration::from_secs(1) * time_scale()
}

/// Puts the daemon in `mode`; in the fast-path modes, waits until the flow is fast-pathed
/// (≥ 90 % of its LAN packets over 500 ms, within 10 s).
fn enter(tb: &Testbed, mode: Mode, default_age_ms: u64) {
    let d = tb.daemon();
    d.set_fastpath(mode != Mode::KernelAlone);
    let age = if mode == Mode::VerdictsKept {
        0
    } else {
        default_age_ms
    };
    if let Err(e) = d.ctl(&["verdict-age", &age.to_string()]) {
        panic!("verdict-age {age}: {e}");
    }
    assert_eq!(d.status().ruleset.verdict_max_age_ms, age);
    if mode == Mode::KernelAlone {
        return;
    }
    let mut share = (0.0, 0);
    let ok = wait_until(Duration::from_secs(10), || {
        share = lan_fast_share(tb, Duration::from_millis(500));
        share.0 >= 0.9
    });
    assert!(
        ok,
        "{mode:?}: the flow is not fast-pathed: {:.1} % of {} packets; status:\n{}",
        share.0 * 100.0,
        share.1,
        d.ctl(&["status"]).unwrap_or_default()
    );
}

/// What one round saw.
#[derive(Debug)]
struct Round {
    mode: Mode,
    /// From the change to the flow's last echo, if it stopped within 1 s.
    stopped: Option<Duration>,
    /// Whether echoes came back within 2 s of undoing the change.
    resumed: bool,
    /// Whether ≥ 90 % of the flow's LAN packets were fast-pathed again within 2 s of undoing
    /// the change.
    fast_again: bool,
}

/// Starts the daemon and the flow to `port` and waits until it is offloaded; returns the
/// daemon's default verdict age.
fn offloaded_flow(tb: &mut Testbed, port: u16) -> (UdpFlow, u64) {
    tb.verdict_max_age_ms = DEFAULT_VERDICT_AGE_MS;
    tb.start_daemon();
    let age = tb.daemon().status().ruleset.verdict_max_age_ms;
    assert_eq!(age, DEFAULT_VERDICT_AGE_MS);
    let flow = UdpFlow::start(tb, wan_v4(port), PPS);
    enter(tb, Mode::FastPath, age);
    (flow, age)
}

/// Runs `undo_cmd` in the router, waits (2 s at most) for the flow to come back and, in the
/// fast-path modes, to be fast-pathed again; returns the round.
fn undo(
    tb: &Testbed,
    flow: &UdpFlow,
    mode: Mode,
    stopped: Option<Duration>,
    undo_cmd: &str,
) -> Round {
    let t = Instant::now();
    tb.router.sh(undo_cmd);
    let limit = Duration::from_secs(2) * time_scale();
    let resumed = flow.resumes_within(t, limit);
    let fast_again = mode != Mode::KernelAlone
        && wait_until(limit.saturating_sub(t.elapsed()), || {
            lan_fast_share(tb, Duration::from_millis(300)).0 >= 0.9
        });
    Round {
        mode,
        stopped,
        resumed,
        fast_again,
    }
}

/// The kernel alone and the fast path stop within 1 s and resume within 2 s (the fast path
/// fast-pathed again; both times [`time_scale`]); with verdicts kept the flow does not stop
/// (the negative control).
fn judge(what: &str, rounds: &[Round]) {
    for r in rounds {
        eprintln!("{what}: {r:?}");
    }
    for r in rounds {
        let within = r.stopped.is_some_and(|t| t <= stop_limit());
        match r.mode {
            Mode::KernelAlone | Mode::FastPath => {
                assert!(
                    within,
                    "{what}, {:?}: the flow did not stop within {:?}: {r:?}",
                    r.mode,
                    stop_limit()
                );
                assert!(
                    r.resumed,
                    "{what}, {:?}: the flow did not resume: {r:?}",
                    r.mode
                );
            }
            Mode::VerdictsKept => assert!(
                r.stopped.is_none(),
                "{what}, negative control: with verdicts kept the fast path should have kept \
                 forwarding (the hole this closes); it stopped: {r:?}"
            ),
        }
        if r.mode == Mode::FastPath {
            assert!(
                r.fast_again,
                "{what}: the flow was not fast-pathed again within {:?}: {r:?}",
                Duration::from_secs(2) * time_scale()
            );
        }
    }
}

/// fail2ban / CrowdSec style: `-m set --match-set blk dst -j DROP` exists before the flow;
/// `ipset add blk <WAN host>` under the running flow, then `ipset del`.
#[test]
fn ipset_add_stops_an_offloaded_flow() {
    if !ready("ipset_add_stops_an_offloaded_flow") {
        return;
    }
    let mut tb = Testbed::new("vd1");
    tb.router.sh("ipset create blk hash:ip
         iptables -w -I FORWARD 1 -m set --match-set blk dst -j DROP");
    let (flow, age) = offloaded_flow(&mut tb, 6201);
    let mut rounds = Vec::new();
    for mode in MODES {
        enter(&tb, mode, age);
        let t0 = Instant::now();
        tb.router.sh(&format!("ipset add blk {WAN_HOST_V4}"));
        let stopped = flow.time_to_stop(t0, stop_limit());
        // Still blocked a moment later: the fast path must not leak packets after the stop.
        sleep(Duration::from_millis(300));
        rounds.push(undo(
            &tb,
            &flow,
            mode,
            stopped,
            &format!("ipset del blk {WAN_HOST_V4}"),
        ));
    }
    let st = tb.daemon().status();
    eprintln!(
        "kernel_verdict_expired on {LAN_IF}: {} packets; ruleset changes {}",
        st.packets(LAN_IF, "kernel_verdict_expired"),
        st.ruleset.changes
    );
    judge("ipset add blk <peer>", &rounds);
    assert!(
        st.packets(LAN_IF, "kernel_verdict_expired") > 0,
        "no packet was handed to the kernel for an expired verdict"
    );
}

/// Seconds since midnight UTC (what `-m time` compares with, without `--kerneltz`).
fn utc_second_of_day(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).expect("clock").as_secs() % 86_400
}

/// Parental-control style: a `-m time --timestart` DROP rule whose start is 3 s away when it is
/// inserted; the flow must stop when the start passes, and resume when the rule is deleted.
#[test]
fn time_rule_stops_an_offloaded_flow() {
    if !ready("time_rule_stops_an_offloaded_flow") {
        return;
    }
    let mut tb = Testbed::new("vd2");
    let port = 6202;
    let (flow, age) = offloaded_flow(&mut tb, port);
    let mut rounds = Vec::new();
    for mode in MODES {
        enter(&tb, mode, age);
        // Not across midnight: --timestart .. --timestop (23:59:59) must not wrap.
        while utc_second_of_day(SystemTime::now()) > 86_400 - 15 {
            sleep(Duration::from_secs(1));
        }
        let now = SystemTime::now();
        let since_second = now
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .subsec_nanos();
        let start = utc_second_of_day(now) + 4;
        // The start as an Instant: the next whole second, plus 3 s.
        let boundary =
            Instant::now() + Duration::from_secs(4) - Duration::from_nanos(u64::from(since_second));
        tb.router.sh(&format!(
            "iptables -w -I FORWARD 1 -p udp --dport {port} -m time --timestart \
             {:02}:{:02}:{:02} -j DROP",
            start / 3600,
            start / 60 % 60,
            start % 60
        ));
        // The insert is a ruleset change: in the fast-path modes the flow re-arms at once.
        sleep(Duration::from_millis(1500));
        let before = if mode == Mode::KernelAlone {
            1.0
        } else {
            lan_fast_share(&tb, Duration::from_millis(500)).0
        };
        assert!(
            before >= 0.9,
            "{mode:?}: the flow is not fast-pathed after the rule insert: {:.1} %",
            before * 100.0
        );
        let wait = boundary.saturating_duration_since(Instant::now());
        sleep(wait.saturating_sub(Duration::from_millis(300)));
        assert!(
            flow.grows_over(Duration::from_millis(250)) > 0,
            "{mode:?}: the flow stopped before the rule's start time"
        );
        sleep(boundary.saturating_duration_since(Instant::now()));
        let stopped = flow.time_to_stop(boundary, stop_limit());
        sleep(Duration::from_millis(300));
        rounds.push(undo(&tb, &flow, mode, stopped, "iptables -w -D FORWARD 1"));
    }
    judge("-m time --timestart", &rounds);
}

/// The packets handed to the kernel for an expired verdict on the LAN port so far.
fn expired(tb: &Testbed) -> u64 {
    tb.daemon()
        .status()
        .packets(LAN_IF, "kernel_verdict_expired")
}

/// The test bed's router ruleset (established accept first, LAN → WAN accept, MASQUERADE) has
/// no rule that can change its answer without a ruleset change: with `verdict_max_age_ms` at
/// its default, verdicts hold until the ruleset changes, and over 10 s of a running flow not
/// one packet is handed to the kernel as `kernel_verdict_expired` (each one would be a trip
/// through the kernel's rules to get the same answer). The negative control: a fail2ban-style
/// ipset match inserted first in FORWARD (an empty set: it drops nothing) makes verdicts
/// expire again, and the flow's packets are handed back at the default age.
#[test]
fn verdicts_hold_where_no_rule_can_change_them() {
    if !ready("verdicts_hold_where_no_rule_can_change_them") {
        return;
    }
    let mut tb = Testbed::new("vd3");
    let (flow, age) = offloaded_flow(&mut tb, 6203);
    let holds = wait_until(Duration::from_secs(10) * time_scale(), || {
        !tb.daemon().status().ruleset.verdicts_expire
    });
    assert!(
        holds,
        "verdicts still expire without an ipset, time or route lookup rule; status:\n{}",
        tb.daemon().ctl(&["status"]).unwrap_or_default()
    );
    let text = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        text.contains("kernel verdicts: kept until the ruleset changes (no rule established"),
        "status should say why verdicts are kept:\n{text}"
    );
    let before = expired(&tb);
    let share = lan_fast_share(&tb, Duration::from_secs(10));
    let held = expired(&tb) - before;
    eprintln!(
        "no expiring rule, verdict age {age} ms: {held} packets handed back over 10 s; {:.1} % \
         of {} LAN packets fast-pathed",
        share.0 * 100.0,
        share.1
    );
    assert_eq!(held, 0, "verdicts expired without a rule that needs it");
    assert!(share.0 >= 0.99, "the flow is not fast-pathed: {share:?}");

    // The negative control: an ipset match established packets reach.
    tb.router.sh("ipset create blk hash:ip
         iptables -w -I FORWARD 1 -m set --match-set blk dst -j DROP");
    let expire = wait_until(Duration::from_secs(10) * time_scale(), || {
        tb.daemon().status().ruleset.verdicts_expire
    });
    let text = tb.daemon().ctl(&["status"]).expect("status");
    assert!(
        expire,
        "an ipset match first in FORWARD: verdicts still kept:\n{text}"
    );
    assert!(
        text.contains(&format!(
            "kernel verdicts: renewed every {age} ms (ip filter FORWARD rule 1 matches ipset)"
        )),
        "status should name the rule:\n{text}"
    );
    enter(&tb, Mode::FastPath, age);
    let before = expired(&tb);
    sleep(Duration::from_secs(2));
    let handed = expired(&tb) - before;
    eprintln!("with the ipset rule: {handed} packets handed back over 2 s");
    assert!(handed > 0, "the ipset rule did not make verdicts expire");
    assert!(
        flow.grows_over(Duration::from_millis(250)) > 0,
        "the flow stopped"
    );
}
