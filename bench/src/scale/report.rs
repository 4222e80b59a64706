//! The scale benchmark's figures: each shown alone, against a correctness check (a failed one
//! fails the command) or against a target (reported as met or missed, never an error), and
//! printed as a Markdown table.

use std::fmt::Write as _;

/// What a figure is compared with.
enum Bound {
    /// Shown only.
    None,
    /// Correctness: missing it fails the command.
    Check { goal: String, met: bool },
    /// A time, rate, CPU or memory target: reported, never an error.
    Target { goal: String, met: bool },
}

/// One printed figure and what it is compared with.
struct Figure {
    name: String,
    value: String,
    bound: Bound,
}

#[derive(Default)]
pub(super) struct Report {
    figures: Vec<Figure>,
}

impl Report {
    fn push(&mut self, name: &str, value: String, bound: Bound) {
        match &bound {
            Bound::None => eprintln!("  {name}: {value}"),
            Bound::Check { goal, met } => eprintln!(
                "  {name}: {value} (check {goal}: {})",
                if *met { "passed" } else { "FAILED" }
            ),
            Bound::Target { goal, met } => eprintln!(
                "  {name}: {value} (target {goal}: {})",
                if *met { "met" } else { "missed" }
            ),
        }
        self.figures.push(Figure {
            name: name.into(),
            value,
            bound,
        });
    }

    pub(super) fn add(&mut self, name: &str, value: String) {
        self.push(name, value, Bound::None);
    }

    /// A correctness check: the command fails when it is not met.
    pub(super) fn check(&mut self, name: &str, value: String, goal: String, met: bool) {
        self.push(name, value, Bound::Check { goal, met });
    }

    /// A time, rate, CPU or memory target: reported, never an error.
    pub(super) fn target(&mut self, name: &str, value: String, goal: String, met: bool) {
        self.push(name, value, Bound::Target { goal, met });
    }

    pub(super) fn markdown(&self, command: &str) -> String {
        let mut s = format!(
            "# xdp-router scale benchmark\n\n`{command}`\n\n| figure | value | check or target |\n|---|---|---|\n"
        );
        for f in &self.figures {
            let bound = match &f.bound {
                Bound::None => String::new(),
                Bound::Check { goal, met: true } => format!("check {goal}: passed"),
                Bound::Check { goal, met: false } => format!("check {goal}: **FAILED**"),
                Bound::Target { goal, met: true } => format!("target {goal}: met"),
                Bound::Target { goal, met: false } => format!("target {goal}: **missed**"),
            };
            let _ = writeln!(s, "| {} | {} | {bound} |", f.name, f.value);
        }
        let (failed, missed) = (self.failed(), self.missed_targets());
        let _ = writeln!(
            s,
            "\n{failed} check(s) failed, {missed} target(s) missed (a missed target is a finding, \
             not an error)."
        );
        s
    }

    pub(super) fn failed(&self) -> usize {
        self.figures
            .iter()
            .filter(|f| matches!(f.bound, Bound::Check { met: false, .. }))
            .count()
    }

    fn missed_targets(&self) -> usize {
        self.figures
            .iter()
            .filter(|f| matches!(f.bound, Bound::Target { met: false, .. }))
            .count()
    }
}
