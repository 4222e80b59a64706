//! `prog-cost`'s result table: ns per packet per case and object, against the bare redirect.

use crate::{
    cases::BARE_REDIRECT,
    sample::{REPEAT, Summary},
};

/// A row of the result table: a case and its summary per object (one for the baselines), or
/// why the case was not measured on that object.
pub(super) struct Row {
    pub(super) name: &'static str,
    pub(super) bytes: usize,
    pub(super) per_object: Vec<Result<Summary, String>>,
}

pub(super) fn opts_line(samples: usize, calls: u32, threads: usize) -> String {
    format!("{samples} samples x {calls} calls x {REPEAT} runs, {threads} thread(s)")
}

pub(super) fn print_table(
    jit: &str,
    how: &str,
    labels: &[String],
    rows: &[Row],
) -> Result<(), String> {
    let median = |name: &str, object: usize| {
        rows.iter()
            .find(|r| r.name == name)
            .and_then(|r| r.per_object.get(object))
            .and_then(|s| s.as_ref().ok())
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
        let Some(Ok(s)) = r.per_object.first() else {
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
        match r.per_object.get(1) {
            Some(Ok(o)) => print!(
                "  | {:>8.1} {:>+6.1}%",
                o.median,
                100.0 * (s.median - o.median) / o.median
            ),
            Some(Err(_)) => print!("  | {:>8} {:>7}", "n/a", ""),
            None => {}
        }
        println!();
    }
    for r in rows {
        if let (Some(other), Some(Err(why))) = (labels.get(1), r.per_object.get(1)) {
            println!("n/a: {} not measured on {other}: {why}", r.name);
        }
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
