//! A program the kernel refused, in one line: the load's error and the verifier's own reason
//! (the last line of its log that says what is wrong), with the whole log written to a file.
//! The log runs to hundreds of thousands of characters; nobody can read it in an error line.

use std::path::PathBuf;

use anyhow::anyhow;
use aya::programs::ProgramError;

/// The one-line error for `what` (program `prog`) that failed to load with `e`. A verifier log,
/// if any, is written to [`log_path`]`(prog)` and named in the line.
pub fn refusal(what: &str, prog: &str, e: ProgramError) -> anyhow::Error {
    let ProgramError::LoadError {
        io_error,
        verifier_log,
    } = e
    else {
        return anyhow!("{what}: {e:#}");
    };
    let log = verifier_log.to_string();
    let reason = reason(&log);
    let path = log_path(prog);
    let saved = match std::fs::write(&path, &log) {
        Ok(()) => format!("full verifier log: {}", path.display()),
        Err(w) => format!(
            "the verifier log could not be written to {}: {w}",
            path.display()
        ),
    };
    match reason {
        Some(r) => anyhow!("{what}: {io_error}: {r} ({saved})"),
        None => anyhow!("{what}: {io_error} ({saved})"),
    }
}

/// Where the verifier log of `prog` goes.
pub fn log_path(prog: &str) -> PathBuf {
    std::env::temp_dir().join(format!("xdp-routerd-{prog}.verifier.log"))
}

/// The verifier's reason in `log`: its last line that is not a statistic. Pure.
pub fn reason(log: &str) -> Option<&str> {
    log.lines().map(str::trim).rev().find(|l| {
        !l.is_empty()
            && !l.starts_with("processed ")
            && !l.starts_with("verification time")
            && !l.starts_with("stack depth")
            && !l.starts_with("-- END PROG LOAD LOG --")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_the_last_line_before_the_statistics() {
        let log = "0: R1=ctx() R10=fp0\n; let x = y @ main.rs:1\n12: (79) r1 = *(u64 *)(r10 -296)\n\
                   invalid read from stack R10 off=-296 size=8\n\
                   processed 4096 insns (limit 1000000) max_states_per_insn 4 total_states 200\n\
                   verification time 1234 usec\nstack depth 464+32\n\n";
        assert_eq!(
            reason(log),
            Some("invalid read from stack R10 off=-296 size=8")
        );
        assert_eq!(
            reason("program of this type cannot use helper bpf_xdp_adjust_meta#54\n"),
            Some("program of this type cannot use helper bpf_xdp_adjust_meta#54")
        );
        assert_eq!(reason("processed 1 insns\n\n"), None);
    }
}
