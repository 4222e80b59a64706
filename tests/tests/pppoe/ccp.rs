//! PPPoE sessions on which CCP runs (MPPE here: pppd's PPPoE plugin refuses Deflate and
//! BSD-Compress): their compressor and decompressor must see every packet, so XDP never
//! carries them and the TC fast path on the PPP device, between the kernel's PPP layer and
//! its IP layer, does.

use xdp_router_tests::testbed::{
    LAN_IF, Status, Testbed, check, ready, udp_and_tcp_are_intact, wait_until, wan_lan_interfaces,
};

use super::bed::{Ccp, PPP_IF, Session, Under, pppoe_testbed, promptly};

/// An MPPE session over the Ethernet port, for both checks: left to the kernel by XDP, then
/// fast-pathed on TC.
#[test]
#[ignore = "needs the pppoe and ppp_mppe modules: cargo xtask test runs it in a Debian-kernel guest"]
fn session_with_mppe() {
    if !ready("ccp::session_with_mppe") {
        return;
    }
    let (mut tb, session) = pppoe_testbed("pc", Under::Port, Ccp::Mppe);
    let tb = &mut tb;
    check(
        tb,
        "ccp::ppp_device_with_compression_is_left_to_the_kernel_by_xdp",
        |tb| ppp_device_with_compression_is_left_to_the_kernel_by_xdp(tb, &session),
    );
    check(
        tb,
        "ccp::ppp_device_with_compression_is_fast_pathed_on_tc",
        |tb| ppp_device_with_compression_is_fast_pathed_on_tc(tb, &session),
    );
}

/// `pppstats -z` of the router's PPP device, on one line.
fn pppstats(tb: &Testbed) -> String {
    tb.router
        .exec_ok("pppstats", &["-z", "-c", "1", PPP_IF])
        .replace('\n', " | ")
}

/// The fast path's originals (on the LAN) and replies (on the PPP device) from `before` to
/// `after`.
fn ppp_forwarded(before: &Status, after: &Status) -> (u64, u64) {
    let since = |iface: &str, reason: &str| {
        after
            .packets(iface, reason)
            .saturating_sub(before.packets(iface, reason))
    };
    (
        since(LAN_IF, "forwarded_original"),
        since(PPP_IF, "forwarded_reply"),
    )
}

/// Why the fast path carries nothing of the PPP device, per `status`.
fn ppp_not_accelerated_because(tb: &Testbed) -> Option<String> {
    tb.daemon()
        .status()
        .interfaces
        .iter()
        .find(|i| i.name == PPP_IF)
        .and_then(|i| i.pppoe.as_ref())
        .and_then(|p| p.not_accelerated_because.clone())
}

/// With MPPE negotiated on the session (CCP) and `datapath = "xdp"` on ppp0, the daemon leaves
/// ppp0 to the kernel once its compressor has run (`SIOCGPPPCSTATS`): the status gives the
/// reason, and UDP and TCP are intact with nothing forwarded by XDP; the kernel's compressor
/// and decompressor see every packet (and nothing leaves unencrypted).
fn ppp_device_with_compression_is_left_to_the_kernel_by_xdp(tb: &mut Testbed, session: &Session) {
    println!("router: pppstats -z {PPP_IF}: {}", pppstats(tb));
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{PPP_IF}\"\nrole = \"wan\"\ndatapath = \"xdp\"\n\
         [[interface]]\nname = \"{LAN_IF}\"\nrole = \"lan\"\n"
    ));
    // Traffic both ways through the kernel's compressor (the set-up's pings ran it already).
    let (first_before, first_after) = udp_and_tcp_are_intact(tb, 6221, "PPPoE with MPPE");
    let (orig, reply) = ppp_forwarded(&first_before, &first_after);
    println!(
        "PPPoE with MPPE, from the daemon's start: UDP and TCP intact; XDP forwarded {orig} \
         original (on {LAN_IF}), {reply} reply (on {PPP_IF})"
    );
    let noticed = wait_until(promptly(), || {
        ppp_not_accelerated_because(tb)
            .is_some_and(|w| w.contains("CCP (PPP compression or MPPE) runs on it"))
    });
    println!(
        "status: {PPP_IF}: PPPoE not accelerated: {:?}",
        ppp_not_accelerated_because(tb)
    );
    assert!(
        noticed,
        "{PPP_IF} not left to the kernel within 10 s: {:?}; pppstats -z: {}; pppd log:\n{}",
        ppp_not_accelerated_because(tb),
        pppstats(tb),
        session.client_log()
    );
    let (before, after) = udp_and_tcp_are_intact(tb, 6223, "PPPoE with MPPE, left to the kernel");
    let (orig, reply) = ppp_forwarded(&before, &after);
    println!(
        "PPPoE with MPPE, after the daemon noticed: UDP 205 datagrams each way and TCP 2 MiB \
         intact; XDP forwarded {orig} original (on {LAN_IF}), {reply} reply (on {PPP_IF})"
    );
    assert_eq!(
        (orig, reply),
        (0, 0),
        "XDP forwarded packets of a PPP device running CCP"
    );
}

/// With MPPE negotiated on the session (CCP) and the default `datapath = "auto"`, the daemon
/// binds ppp0 on TC once its compressor has run, although eth0 takes native XDP: the TC fast
/// path on ppp0 receives what the kernel's PPP layer decrypted and redirects into ppp0, whose
/// PPP layer encrypts. UDP and TCP are fast-pathed both ways and intact, the router's MPPE
/// compressor counted at least every packet the fast path sent into ppp0 (nothing left
/// unencrypted), and with the fast path off the kernel carries it all.
fn ppp_device_with_compression_is_fast_pathed_on_tc(tb: &mut Testbed, session: &Session) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        wan_lan_interfaces(PPP_IF)
    ));
    let on_tc = || {
        let st = tb.daemon().status();
        let ppp = st.iface(PPP_IF);
        (ppp.attach_mode == "tc").then(|| ppp.datapath_because.clone())
    };
    let bound = wait_until(promptly(), || on_tc().is_some());
    println!(
        "status: {PPP_IF}: {:?}; not accelerated: {:?}",
        on_tc(),
        ppp_not_accelerated_because(tb)
    );
    assert!(
        bound,
        "{PPP_IF} not bound on TC within 10 s: {:?}; pppstats -z: {}; pppd log:\n{}",
        ppp_not_accelerated_because(tb),
        pppstats(tb),
        session.client_log()
    );
    assert!(
        on_tc()
            .flatten()
            .is_some_and(|w| w.contains("CCP (PPP compression or MPPE) runs on its session")),
        "status should say why {PPP_IF} runs TC: {:?}",
        on_tc()
    );
    let compressed = |tb: &Testbed| {
        tb.router
            .run(|| xdp_routerd::sync::ppp_compression::read(PPP_IF))
            .unwrap_or_else(|e| panic!("SIOCGPPPCSTATS on {PPP_IF}: {e}"))
            .c
            .comp_packets
    };
    for (on, port) in [(true, 6225), (false, 6227)] {
        tb.daemon().set_fastpath(on);
        let c0 = compressed(tb);
        let (before, after) = udp_and_tcp_are_intact(tb, port, "PPPoE with MPPE on TC");
        let sent_encrypted = compressed(tb).wrapping_sub(c0);
        let (orig, reply) = ppp_forwarded(&before, &after);
        let path = if on { "on" } else { "off" };
        println!(
            "PPPoE with MPPE, fast path {path}: UDP 205 datagrams each way and TCP 2 MiB intact; \
             the fast path forwarded {orig} original (on {LAN_IF}, into {PPP_IF}), {reply} reply \
             (on {PPP_IF}); the MPPE compressor sent {sent_encrypted} packets; pppstats -z: {}",
            pppstats(tb)
        );
        if on {
            assert!(
                orig >= 200 && reply >= 200,
                "the TC fast path should carry the session's traffic both ways: {orig} / {reply}"
            );
            assert!(
                u64::from(sent_encrypted) >= orig,
                "every packet sent into {PPP_IF} must pass MPPE: {sent_encrypted} encrypted, \
                 {orig} fast-pathed"
            );
        } else {
            assert_eq!((orig, reply), (0, 0), "fast path off");
        }
    }
}
