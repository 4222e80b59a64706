//! A host whose MAC address changes is followed.

use super::*;

/// The daemon follows `ip link set dev X address ...`: frames to the interface's new MAC are
/// forwarded by the fast path, frames to its old one are not (the kernel drops them as
/// another host's).
#[test]
fn mac_address_change_is_followed() {
    if !ready("differential::mac_address_change_is_followed") {
        return;
    }
    let mut tb = Testbed::new("dm");
    tb.start_daemon();
    let mut macs = oracle::macs_of(&tb);
    let _live = establish(&tb);
    let old = macs.router_lan;
    let new = [0x02, 0, 0, 0, 0x0e, 0x01];
    tb.router.sh(&format!(
        "ip link set dev {LAN_IF} address 02:00:00:00:0e:01"
    ));
    let (tx, rx) = (
        Capture::open(&tb.lan, HOST_IF),
        Capture::open(&tb.wan, HOST_IF),
    );
    let conn = conns()[1];
    let mut n = 0u16;
    let mut send = |dst: [u8; 6]| {
        macs.router_lan = dst;
        n += 1;
        let marker = [b"MACC".as_slice(), &n.to_be_bytes()].concat();
        let f = spec(&conn, &macs, true, Transport::Udp, 64).marked(&marker);
        let a = tb.daemon().status();
        tx.send(&f);
        let got = rx.arrivals(&marker, Duration::from_millis(200));
        let b = tb.daemon().status();
        (got.len(), moved(&a, &b, LAN_IF))
    };
    let mut last = (0, String::new());
    let followed = wait_until(Duration::from_secs(5), || {
        last = send(new);
        last == (1, "forwarded_original+1".to_owned())
    });
    println!("to the new MAC: {} arrived, {}", last.0, last.1);
    assert!(
        followed,
        "frames to the new MAC were not fast-pathed: {last:?}"
    );
    let to_old = send(old);
    println!("to the old MAC: {} arrived, {}", to_old.0, to_old.1);
    // The host's own background frames (IPv6 multicast after the link change) may be counted
    // under the same reason in the window; nothing may be forwarded and the frame must not arrive.
    assert!(
        to_old.0 == 0
            && to_old.1.starts_with("dst_mac_not_ours+")
            && !to_old.1.contains("forwarded"),
        "a frame to the old MAC was not passed to the kernel: {to_old:?}"
    );
}
