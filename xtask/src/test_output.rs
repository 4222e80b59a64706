//! Reading `cargo test` output (or a guest console running test binaries) line by line: the
//! tests that failed, each with the first line of its panic message, and the last lines seen,
//! for a run that failed without naming a test (a crashed test binary, a guest kernel that
//! panicked); [`Tail`] keeps the last lines of any command. CI shows the head and the tail of a
//! run's output: the step summary at the end has to say why on its own.

use std::collections::{HashMap, VecDeque};

/// Lines kept for a failure that names no test.
const TAIL_LINES: usize = 40;
/// The longest panic message kept for the summary, in characters.
const MESSAGE_CHARS: usize = 300;

/// What the lines of one run said so far.
#[derive(Default)]
pub struct TestOutput {
    /// Tests reported `test NAME ... FAILED` (with `--report-time`, `... FAILED <1.234s>`), in
    /// order.
    failed: Vec<String>,
    /// The first line of each thread's panic message, by thread (= test) name.
    messages: HashMap<String, String>,
    /// A thread whose `panicked at LOCATION:` line was the last one seen, with its location.
    panicking: Option<(String, String)>,
    tail: Tail,
}

/// The last lines of a command's output (or of its stderr), kept for its error message.
#[derive(Default)]
pub struct Tail(VecDeque<String>);

impl Tail {
    /// Takes one line (trailing blanks and CR dropped).
    pub fn push(&mut self, line: &str) {
        if self.0.len() == TAIL_LINES {
            self.0.pop_front();
        }
        self.0.push_back(line.trim_end().to_owned());
    }

    /// The lines kept, each on a new indented line, for an error message.
    pub fn indented(&self) -> String {
        let mut s = String::new();
        for l in &self.0 {
            s.push_str("\n    ");
            s.push_str(l);
        }
        s
    }
}

/// What follows `(ID) panicked at ` in a panic's first line: Rust 1.91 and later print the
/// thread's id after its name (`thread 'NAME' (1234) panicked at LOCATION:`).
fn thread_id_then_panicked(after_name: &str) -> Option<&str> {
    let (id, rest) = after_name.strip_prefix('(')?.split_once(") ")?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rest.strip_prefix("panicked at ")
}

impl TestOutput {
    /// Takes one line (a console may pad lines and end them with CR).
    pub fn line(&mut self, line: &str) {
        self.tail.push(line);
        let line = line.trim();
        if let Some((thread, location)) = self.panicking.take() {
            let mut message: String = line.chars().take(MESSAGE_CHARS).collect();
            if message.len() < line.len() {
                message.push('…');
            }
            self.messages
                .entry(thread)
                .or_insert(format!("{location}: {message}"));
        }
        if let Some(name) = line.strip_prefix("test ").and_then(|l| {
            l.strip_suffix(" ... FAILED")
                .or_else(|| l.split_once(" ... FAILED <").map(|(name, _)| name))
        }) {
            self.failed.push(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("thread '")
            && let Some((thread, after)) = rest.split_once("' ")
            && let Some(after) = after
                .strip_prefix("panicked at ")
                .or_else(|| thread_id_then_panicked(after))
        {
            let location = after.strip_suffix(':').unwrap_or(after);
            self.panicking = Some((thread.to_owned(), location.to_owned()));
        }
    }

    /// The failed tests, each as `NAME (LOCATION: MESSAGE)` when its panic was seen.
    pub fn failures(&self) -> Vec<String> {
        self.failed
            .iter()
            .map(|name| {
                // libtest names a test's thread after the test's path without the crate.
                match self.messages.get(name) {
                    Some(why) => format!("{name} ({why})"),
                    None => name.clone(),
                }
            })
            .collect()
    }

    /// The last lines seen, indented, for an error message.
    pub fn tail(&self) -> String {
        self.tail.indented()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> TestOutput {
        let mut out = TestOutput::default();
        for l in text.lines() {
            out.line(l);
        }
        out
    }

    #[test]
    fn a_failed_test_is_named_with_its_panic_message() {
        let out = read(
            "test a ... ok\n\
             test acc::b ... FAILED\n\
             test c ... FAILED <12.034s>\n\
             \n\
             failures:\n\
             \n\
             ---- acc::b stdout ----\n\
             fast path on: wire 10 packets\n\
             \n\
             thread 'acc::b' panicked at tests/tests/accounting.rs:211:9:\n\
             only 1 of 10 packets were fast-pathed\n\
             second line of the message\n\
             note: run with `RUST_BACKTRACE=1`\n",
        );
        assert_eq!(
            out.failures(),
            [
                "acc::b (tests/tests/accounting.rs:211:9: only 1 of 10 packets were fast-pathed)",
                "c"
            ]
        );
    }

    #[test]
    fn a_panic_line_with_the_thread_id_is_read() {
        // As rustc 1.91 and later print it (the privileged tests' and the guest's binaries).
        let out = read(
            "test vlan_test ... FAILED\n\
             thread 'vlan_test' (4242) panicked at tests/tests/vlan.rs:12:5:\n\
             no status row for eth0.7\n\
             thread 'other' (7) panicked at nowhere\n",
        );
        assert_eq!(
            out.failures(),
            ["vlan_test (tests/tests/vlan.rs:12:5: no status row for eth0.7)"]
        );
        assert!(
            read("thread 'x' (y) panicked at a.rs:1:1:\nz\ntest x ... FAILED\n")
                .messages
                .is_empty()
        );
    }

    #[test]
    fn a_long_message_is_cut_and_a_console_line_trimmed() {
        let long = "x".repeat(MESSAGE_CHARS + 5);
        let out = read(&format!(
            "test t ... FAILED   \r\n   thread 't' panicked at a.rs:1:2:\r\n{long}\r\n"
        ));
        let [f] = &out.failures()[..] else {
            panic!("{:?}", out.failures())
        };
        assert_eq!(f, &format!("t (a.rs:1:2: {}…)", "x".repeat(MESSAGE_CHARS)));
    }

    #[test]
    fn the_tail_keeps_the_last_lines() {
        let text: String = (0..TAIL_LINES + 3)
            .map(|i| format!("line {i}\r\n"))
            .collect();
        let tail = read(&text).tail();
        assert!(tail.starts_with("\n    line 3\n"), "{tail}");
        assert!(
            tail.ends_with(&format!("line {}", TAIL_LINES + 2)),
            "{tail}"
        );
        assert_eq!(tail.lines().count(), TAIL_LINES + 1);
    }
}
