//! The router's NAT address removed: the flows that use it are withdrawn.

use super::*;

/// Test 1a: MASQUERADE (the kernel destroys the connection; the daemon follows).
#[test]
fn masquerade_address_removed_withdraws_the_flow() {
    nat_address_removed(
        "masquerade_address_removed_withdraws_the_flow",
        "pa1",
        Nat::Masquerade,
    );
}

/// Test 1b: static SNAT (the kernel keeps the connection; the daemon withdraws it as
/// `nat_address_gone`).
#[test]
fn snat_address_removed_withdraws_the_flow() {
    nat_address_removed(
        "snat_address_removed_withdraws_the_flow",
        "pa1s",
        Nat::StaticSnat,
    );
}
