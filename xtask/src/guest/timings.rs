//! Where a guest's time goes: its script runs each test binary with libtest's `--report-time`
//! (`test NAME ... ok <12.345s>`) after a `guest: running BINARY` line; [`Timings`] passes the
//! console through to its sink, reads those lines on the way, and [`Timings::table`] gives each
//! binary's total and its tests, slowest first, printed after the guest's console.

use std::io::Write;

/// The line the guest's script prints before it starts a test binary (then its file name).
pub const RUNNING: &str = "guest: running ";

/// One test's time as libtest reported it.
#[derive(Debug, PartialEq)]
struct TestTime {
    /// The test binary's name without cargo's hash (`pppoe`, not `pppoe-0123abcd`).
    binary: String,
    test: String,
    /// `ok` or `FAILED`.
    outcome: String,
    secs: f64,
}

/// A console sink that also collects the per-test times passing through it.
pub struct Timings<'a> {
    sink: &'a mut dyn Write,
    partial: Vec<u8>,
    binary: String,
    tests: Vec<TestTime>,
}

/// `pppoe-0123abcdef` → `pppoe` (cargo's hash after the last `-`).
fn without_hash(file_name: &str) -> &str {
    match file_name.rsplit_once('-') {
        Some((name, hash)) if !hash.is_empty() && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name
        }
        _ => file_name,
    }
}

/// `test NAME ... OUTCOME <SECSs>` → (name, outcome, seconds).
fn timed_result(line: &str) -> Option<(&str, &str, f64)> {
    let (name, rest) = line.strip_prefix("test ")?.rsplit_once(" ... ")?;
    let (outcome, time) = rest.split_once(" <")?;
    let secs = time.strip_suffix("s>")?.parse().ok()?;
    Some((name, outcome, secs))
}

impl<'a> Timings<'a> {
    pub fn new(sink: &'a mut dyn Write) -> Timings<'a> {
        Timings {
            sink,
            partial: Vec::new(),
            binary: String::new(),
            tests: Vec::new(),
        }
    }

    fn line(&mut self, line: &str) {
        let line = line.trim();
        if let Some(file) = line.strip_prefix(RUNNING) {
            self.binary = without_hash(file).to_owned();
        } else if let Some((test, outcome, secs)) = timed_result(line) {
            self.tests.push(TestTime {
                binary: self.binary.clone(),
                test: test.to_owned(),
                outcome: outcome.to_owned(),
                secs,
            });
        }
    }

    /// Each binary's total (the sum of its tests' times), then its tests, slowest first; the
    /// binaries in the order they ran. Empty when no timed test was seen.
    pub fn table(&self) -> String {
        if self.tests.is_empty() {
            return String::new();
        }
        let mut s = String::from("guest: time per test binary and per test (libtest's report):\n");
        let mut binaries: Vec<&str> = Vec::new();
        for t in &self.tests {
            if !binaries.contains(&t.binary.as_str()) {
                binaries.push(&t.binary);
            }
        }
        for b in binaries {
            let mut tests: Vec<&TestTime> = self.tests.iter().filter(|t| t.binary == b).collect();
            tests.sort_by(|x, y| y.secs.total_cmp(&x.secs));
            let total: f64 = tests.iter().map(|t| t.secs).sum();
            s.push_str(&format!(
                "guest:   {b:<12} {total:>7.1} s  {} tests\n",
                tests.len()
            ));
            for t in tests {
                s.push_str(&format!(
                    "guest:     {:>7.1} s  {} {}\n",
                    t.secs, t.outcome, t.test
                ));
            }
        }
        s
    }
}

impl Write for Timings<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.sink.write(buf)?;
        self.partial.extend_from_slice(&buf[..n]);
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.line(&String::from_utf8_lossy(&line));
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sink.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_per_binary_and_sorted() {
        let mut out = Vec::new();
        let table = {
            let mut t = Timings::new(&mut out);
            write!(
                t,
                "guest: running vlan-0123abcd\n\
                 test a ... ok <1.500s>\n\
                 test b ... FAILED <20.260s>\n\
                 test c ... ok\n\
                 guest: vlan-0123abcd exited 1 after 30 s\n\
                 guest: running pppoe-fe\n  test p::q ... ok <3.000s>\r\n\
                 test r ... ok <0"
            )
            .unwrap();
            t.table()
        };
        assert!(
            String::from_utf8(out)
                .unwrap()
                .ends_with("test r ... ok <0")
        );
        assert_eq!(
            table,
            "guest: time per test binary and per test (libtest's report):\n\
             guest:   vlan            21.8 s  2 tests\n\
             guest:        20.3 s  FAILED b\n\
             guest:         1.5 s  ok a\n\
             guest:   pppoe            3.0 s  1 tests\n\
             guest:         3.0 s  ok p::q\n"
        );
    }

    #[test]
    fn only_a_hex_suffix_is_a_hash() {
        assert_eq!(without_hash("pppoe-0123abcdef"), "pppoe");
        assert_eq!(without_hash("prog_run-deadbeef"), "prog_run");
        assert_eq!(without_hash("my-test"), "my-test");
        assert_eq!(timed_result("test x ... ignored"), None);
    }
}
