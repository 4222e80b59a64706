//! Checks that share one test bed: where a bed takes long to build (tens of seconds in the
//! guest: VLAN devices, a PPPoE session), one test builds it and runs its checks on it one after
//! the other, each with a daemon of its own.

use std::time::Instant;

use super::topology::Testbed;

/// Runs `check`, one of several checks that share `tb`, after clearing what the check before it
/// left: its daemon stopped (which detaches its programs) and the router's connection tracking
/// flushed (a new daemon would take the old connections up, and the checks count connections
/// and flows). Whatever else a check changes in the bed, its test runs it last or undoes it.
/// Prints the check's name and time; when it fails, says which check failed.
pub fn check(tb: &mut Testbed, name: &str, check: impl FnOnce(&mut Testbed)) {
    tb.daemon = None;
    // `conntrack -F` fails when the table was never used in the namespace.
    tb.router
        .sh("conntrack -F >/dev/null 2>&1; conntrack -F -f ipv6 >/dev/null 2>&1; true");
    println!("---- check {name}");
    let started = Instant::now();
    let named = NamedOnFailure(name);
    check(tb);
    drop(named);
    println!(
        "---- check {name}: ok in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Says which check failed when dropped while the test panics.
struct NamedOnFailure<'a>(&'a str);

impl Drop for NamedOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- check {} FAILED (the panic above is its)", self.0);
        }
    }
}
