//! A PPPoE WAN, as most DSL and much fiber is delivered: the WAN host runs an access
//! concentrator (`pppoe-server`, rp-pppoe), the router dials it with pppd's kernel-mode PPPoE
//! plugin, and ppp0 (MTU 1492) carries the router's WAN address. This host kernel has no pppoe
//! module, so these tests are `#[ignore]`d here and `cargo xtask test` runs them in a guest
//! that boots Debian's kernel (see xtask/src/guest.rs).
//!
//! What they hold the daemon to: with the PPP device in the config (`name = "ppp0"`, as the
//! kernel routes it) the fast path carries established flows both ways, removing and adding
//! the PPPoE and PPP headers on the Ethernet port under the session (XDP counters equal to the
//! datagrams sent, netfilter's ESTABLISHED rule not rising, every byte intact), and stops
//! doing so when switched off (the negative control); with only the Ethernet port in the
//! config, session frames stay with the kernel; with CCP (MPPE) negotiated, the TC fast path
//! on the PPP device carries it, or with XDP the kernel does (ccp.rs).

use std::{
    fs,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns::Netns,
    packet::verify_checksums,
    testbed::{
        Capture, HOST_IF, LAN_IF, MACVLAN_LAN_IF, PING_DGRAM, PING_TICK, ROUTER_LAN_V4,
        ROUTER_LAN_V6, ROUTER_WAN_V4, ROUTER_WAN_V6, TempDir, Testbed, UdpEcho, WAN_HOST_V4,
        WAN_HOST_V6, WAN_IF, any_v4, assert_encapsulated_wan_left_to_kernel, interfaces_config,
        measure_udp, offload_udp, offload_udp_family, ping_pong, ready, time_scale,
        traffic_is_fast_pathed, udp_and_tcp_are_intact, udp_payload, udp_socket, wait_until,
        wan_lan_interfaces, wan_v4,
    },
};

mod ccp;
mod tc_lan;
mod unpaired;

/// The router's PPP interface.
const PPP_IF: &str = "ppp0";

/// pppoe-server in the WAN host and pppd in the router; both ended (by PID, client first so
/// that the server's session ends with an LCP terminate) on drop.
struct Session {
    client: Child,
    server: Child,
    dir: TempDir,
    /// pppd's arguments, to dial again.
    client_args: Vec<String>,
}

impl Session {
    /// Ends pppd in the router (its session ends with an LCP terminate and a PADT) and dials
    /// again once the access concentrator has let the old session go (its pool then gives the
    /// router the same IPv4 address): a new session, a new ppp0, its address back within 60 s.
    fn redial(&mut self, tb: &Testbed) {
        end(&mut self.client);
        let released = wait_until(Duration::from_secs(10), || {
            tb.wan
                .exec_ok("ip", &["-o", "link", "show", "type", "ppp"])
                .trim()
                .is_empty()
        });
        assert!(released, "the access concentrator kept the old session");
        let args: Vec<&str> = self.client_args.iter().map(String::as_str).collect();
        self.client = spawn(&tb.router, "pppd", &args);
        if !ppp0_up(tb) {
            panic!(
                "no new PPPoE session within 60 s; pppd's log:\n{}\nrouter links:\n{}",
                self.client_log(),
                tb.router.exec_ok("ip", &["addr"])
            );
        }
    }

    /// What pppd in the router logged (`debug`: LCP, IPCP, CCP negotiation).
    fn client_log(&self) -> String {
        fs::read_to_string(self.dir.path().join(CLIENT_LOG)).unwrap_or_else(|e| e.to_string())
    }
}

/// How long the daemon may take to follow a session change it reads every 2 s (a rebinding
/// after a redial, CCP seen on the session): 10 s, times `XDP_ROUTER_TIME_SCALE`.
fn promptly() -> Duration {
    Duration::from_secs(10 * u64::from(time_scale()))
}

/// pppd's log in the router, in the session's directory.
const CLIENT_LOG: &str = "pppd-client.log";

/// SIGTERM to `c` (our unreaped child), SIGKILL if it has not exited within 3 s.
fn end(c: &mut Child) {
    if let Ok(pid) = i32::try_from(c.id()) {
        // SAFETY: kill has no memory-safety preconditions; `pid` is our unreaped child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    if !wait_until(Duration::from_secs(3), || {
        c.try_wait().ok().flatten().is_some()
    }) {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Whether the router's ppp0 carries its IPv4 WAN address within 60 s.
fn ppp0_up(tb: &Testbed) -> bool {
    wait_until(Duration::from_secs(60), || {
        tb.router
            .exec("ip", &["-4", "addr", "show", "dev", PPP_IF])
            .stdout
            .windows(ROUTER_WAN_V4.to_string().len())
            .any(|w| w == ROUTER_WAN_V4.to_string().as_bytes())
    })
}

impl Drop for Session {
    fn drop(&mut self) {
        end(&mut self.client);
        end(&mut self.server);
    }
}

fn spawn(ns: &Netns, prog: &str, args: &[&str]) -> Child {
    ns.command(prog)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {prog} in {}: {e}", ns.name()))
}

/// Whether CCP runs on the session. pppd's PPPoE plugin refuses Deflate and BSD-Compress
/// itself (`pppoe_check_options` in pppd/plugins/pppoe/plugin.c), so the CCP a pppd PPPoE
/// session can run is MPPE (ppp_mppe: compressor state, counters and all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ccp {
    /// `noccp` on both ends, as the manual asks (docs/manual/src/limitations.md); no
    /// authentication.
    Off,
    /// MPPE-128 required by the access concentrator, which authenticates the router with
    /// MS-CHAPv2 (MPPE's keys come from it).
    Mppe,
}

/// The router's MS-CHAPv2 secret, for [`Ccp::Mppe`].
const SECRET: &str = "xdp-router-test-secret";

impl Ccp {
    /// The access concentrator's pppd options for it.
    fn server_options(self) -> &'static str {
        match self {
            Ccp::Off => "noauth\nnoccp\n",
            Ccp::Mppe => "auth\nrequire-mschap-v2\nrequire-mppe-128\n",
        }
    }

    /// The router's pppd options for it.
    fn client_options(self) -> &'static [&'static str] {
        match self {
            Ccp::Off => &["noccp"],
            Ccp::Mppe => &["password", SECRET, "require-mppe-128"],
        }
    }
}

/// What the router's PPPoE session runs over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Under {
    /// The WAN port itself (DSL, much fiber).
    Port,
    /// A VLAN on the WAN port, as many fiber ISPs deliver it.
    Vlan(u16),
    /// A bridge with the WAN port in it (`br-wan`, as a router whose modem port is bridged
    /// with others has it).
    Bridge,
}

/// The router's WAN bridge for [`Under::Bridge`].
const WAN_BRIDGE: &str = "br-wan";

/// The test bed with its WAN moved onto a PPPoE session over the WAN link (or what `under`
/// says; with `ccp`): the WAN host
/// serves 10.0.2.2, the router gets 10.0.2.1 on ppp0, and both move their IPv6 WAN addresses
/// onto their PPP devices (IPV6CP up); NAT and FORWARD rules name ppp0, and TCP's MSS is
/// clamped to the path MTU, as every PPPoE router does.
fn pppoe_testbed(tag: &str, under: Under, ccp: Ccp) -> (Testbed, Session) {
    let started = Instant::now();
    let tb = Testbed::new(tag);
    let testbed_secs = started.elapsed().as_secs_f64();
    tb.router
        .sh(&format!("ip addr flush dev {WAN_IF} scope global"));
    tb.wan
        .sh(&format!("ip addr flush dev {HOST_IF} scope global"));
    // The devices the session runs over; a VLAN's tag is inserted in software (`txvlan off`),
    // so it is in the frames' bytes as on a wire, where XDP sees it.
    let (router_lower, host_lower) = match under {
        Under::Vlan(vid) => {
            for (ns, dev) in [(&tb.router, WAN_IF), (&tb.wan, HOST_IF)] {
                ns.sh(&format!(
                    "ip link add link {dev} name {dev}.{vid} type vlan id {vid}
                     ip link set {dev}.{vid} up
                     ethtool -K {dev}.{vid} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true
                     ethtool -K {dev} txvlan off >/dev/null"
                ));
            }
            (format!("{WAN_IF}.{vid}"), format!("{HOST_IF}.{vid}"))
        }
        Under::Bridge => {
            tb.router.sh(&format!(
                "ip link add {WAN_BRIDGE} type bridge
                 ip link set {WAN_IF} master {WAN_BRIDGE}
                 ip link set {WAN_BRIDGE} up"
            ));
            (WAN_BRIDGE.to_string(), HOST_IF.to_string())
        }
        Under::Port => (WAN_IF.to_string(), HOST_IF.to_string()),
    };
    let dir = TempDir::new();
    let options = dir.path().join("pppoe-server-options");
    // The access concentrator sends no LCP echoes (an emulated guest is slow) and asks for
    // authentication only for MPPE; /etc/ppp/options (`auth`, serial settings) is overridden
    // here.
    fs::write(
        &options,
        format!(
            "{}lcp-echo-interval 0\nnovj\nnodefaultroute\n+ipv6\n",
            ccp.server_options()
        ),
    )
    .unwrap_or_else(|e| panic!("write {}: {e}", options.display()));
    let options = options.to_string_lossy().into_owned();
    // The router's MS-CHAPv2 secret, bound over /etc/ppp/chap-secrets in the access
    // concentrator's own mount namespace (`ip netns exec` makes one; pppd reads no other file).
    let secrets = dir.path().join("chap-secrets");
    fs::write(&secrets, format!("xdp-router-test * {SECRET} *\n"))
        .unwrap_or_else(|e| panic!("write {}: {e}", secrets.display()));
    let secrets = secrets.to_string_lossy().into_owned();
    let script = match ccp {
        Ccp::Off => "exec pppoe-server \"$@\"",
        Ccp::Mppe => "mount --bind \"$0\" /etc/ppp/chap-secrets && exec pppoe-server \"$@\"",
    };
    let server = spawn(
        &tb.wan,
        "sh",
        &[
            "-c",
            script,
            &secrets,
            "-F",
            "-I",
            &host_lower,
            "-L",
            &WAN_HOST_V4.to_string(),
            "-R",
            &ROUTER_WAN_V4.to_string(),
            // One session at a time, so a redial gets 10.0.2.1 again.
            "-N",
            "1",
            "-O",
            &options,
        ],
    );
    let mut client_args = vec![
        "plugin",
        "pppoe.so",
        router_lower.as_str(),
        "nodetach",
        "noauth",
        "user",
        "xdp-router-test",
        "unit",
        "0",
        "mtu",
        "1492",
        "mru",
        "1492",
        "noipdefault",
        "nodefaultroute",
        "lcp-echo-interval",
        "0",
        "novj",
        "+ipv6",
    ];
    client_args.extend(ccp.client_options());
    let log = dir.path().join(CLIENT_LOG).to_string_lossy().into_owned();
    client_args.extend(["debug", "logfile", log.as_str()]);
    let dialled = Instant::now();
    let client = spawn(&tb.router, "pppd", &client_args);
    let session = Session {
        client,
        server,
        dir,
        client_args: client_args.iter().map(|a| a.to_string()).collect(),
    };
    assert!(
        ppp0_up(&tb),
        "no PPPoE session within 60 s: router links:\n{}",
        tb.router.exec_ok("ip", &["addr"])
    );
    let session_secs = dialled.elapsed().as_secs_f64();
    wan_over_ppp0(&tb);
    // Where a PPPoE test's setup time goes (read beside the guest's per-test times).
    println!(
        "pppoe setup: test bed {testbed_secs:.1} s, session up {session_secs:.1} s after pppd \
         started, {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    (tb, session)
}

/// Moves the test bed's WAN onto the router's ppp0, up with its IPv4 address (see
/// [`ppp0_up`]): the global IPv6 addresses on both PPP devices (the peer's is the only PPP
/// device in the WAN host's namespace), NAT and FORWARD rules naming ppp0, TCP's MSS clamped
/// to the path MTU; the LAN host reaches the WAN host both ways.
fn wan_over_ppp0(tb: &Testbed) {
    let host_ppp = tb
        .wan
        .exec_ok("sh", &["-c", "ip -o link show type ppp | cut -d: -f2"])
        .trim()
        .to_string();
    assert!(!host_ppp.is_empty(), "no PPP device in the WAN host");
    tb.wan.sh(&format!(
        "ip addr add {WAN_HOST_V6}/64 dev {host_ppp} nodad
         ip -6 route replace default via {ROUTER_WAN_V6} dev {host_ppp}"
    ));
    tb.router.sh(&format!(
        "ip addr add {ROUTER_WAN_V6}/64 dev {PPP_IF} nodad
         ip6tables -w -A FORWARD -i {LAN_IF} -o {PPP_IF} -j ACCEPT
         iptables -w -t nat -D POSTROUTING -o {WAN_IF} -j MASQUERADE
         iptables -w -t nat -A POSTROUTING -o {PPP_IF} -j MASQUERADE
         iptables -w -A FORWARD -i {LAN_IF} -o {PPP_IF} -j ACCEPT
         iptables -w -t mangle -A FORWARD -o {PPP_IF} -p tcp --tcp-flags SYN,RST SYN \
           -j TCPMSS --clamp-mss-to-pmtu
         ethtool -K {PPP_IF} tx off rx off gro off gso off tso off >/dev/null 2>&1 || true"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN over PPP' >&2; exit 1"
    ));
}

/// With the PPP device as the WAN in the config (`name = "ppp0"`), the daemon finds the
/// session (its ID, the access concentrator's MAC, the device under it, `lower`) in
/// /proc/net/pppoe; UDP over IPv4 and IPv6 and a 2 MiB TCP transfer are forwarded by XDP on
/// eth0 both ways, and the negative control (fast path off) sends the same exchanges through
/// netfilter. `datapath` is the PPP device's setting; `tc_because`, when the TC fast path is to
/// run on ppp0 itself (the kernel's PPPoE code removes and adds the session headers) and
/// nothing on the lower device, what `status` gives as the reason.
fn ppp_traffic_is_fast_pathed(
    tb: &mut Testbed,
    lower: &str,
    lan: &str,
    datapath: &str,
    tc_because: Option<&str>,
) {
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n\
         [[interface]]\nname = \"{PPP_IF}\"\nrole = \"wan\"\ndatapath = \"{datapath}\"\n\
         [[interface]]\nname = \"{lan}\"\nrole = \"lan\"\n"
    ));
    let st = tb.daemon().status();
    let ppp = st
        .interfaces
        .iter()
        .find(|i| i.name == PPP_IF)
        .unwrap_or_else(|| panic!("no status row for {PPP_IF}: {:?}", st.interfaces));
    println!(
        "status: {PPP_IF}: {} ({:?})",
        ppp.attach_mode, ppp.datapath_because
    );
    if let Some(because) = tc_because {
        assert_eq!(ppp.attach_mode, "tc", "{ppp:?}");
        assert!(
            ppp.datapath_because
                .as_deref()
                .is_some_and(|w| w.contains(because)),
            "{ppp:?}"
        );
        if let Some(xdp) = tb.xdp_attached() {
            assert!(
                !xdp.contains(&format!("{lower}(")),
                "no XDP program should run on the session's lower device {lower}: {xdp}"
            );
        }
    } else {
        assert_eq!(ppp.attach_mode, "lower", "{ppp:?}");
    }
    let encap = |name: &str| {
        st.interfaces
            .iter()
            .find(|i| i.name == name)
            .and_then(|i| i.encap.clone())
    };
    println!(
        "status: {PPP_IF}: {:?}; {lower}: {:?}",
        encap(PPP_IF),
        encap(lower)
    );
    let want = format!("PPPoE session 0x0001 over {lower} (peer ");
    assert!(
        encap(PPP_IF).is_some_and(|e| e.starts_with(&want)),
        "{PPP_IF}: {:?}, want {want}…",
        encap(PPP_IF)
    );

    traffic_is_fast_pathed(tb, 6207, LAN_IF, PPP_IF, &format!("over PPPoE ({lower})"));
}

/// PPPoE straight over the Ethernet port (DSL, much fiber).
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_ppp_device_is_fast_pathed() {
    if !ready("wan_as_ppp_device_is_fast_pathed") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pd", Under::Port, Ccp::Off);
    ppp_traffic_is_fast_pathed(&mut tb, WAN_IF, LAN_IF, "auto", None);
}

/// PPPoE on the TC datapath (`datapath = "tc"` on ppp0, as where the Ethernet port has no
/// native XDP: a Realtek port): the TC fast path on ppp0 itself, between the kernel's PPPoE
/// decapsulation and encapsulation; the LAN port native XDP, handing what it routes into
/// ppp0 to the TC program behind it.
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_ppp_device_is_fast_pathed_on_tc() {
    if !ready("wan_as_ppp_device_is_fast_pathed_on_tc") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pt", Under::Port, Ccp::Off);
    ppp_traffic_is_fast_pathed(&mut tb, WAN_IF, LAN_IF, "tc", Some("datapath = \"tc\""));
}

/// PPPoE over VLAN 7 on the Ethernet port (many fiber ISPs): tag and session header popped
/// and pushed together on eth0; the VLAN device needs no entry in the config.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_ppp_device_over_vlan_is_fast_pathed() {
    if !ready("wan_as_ppp_device_over_vlan_is_fast_pathed") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pv", Under::Vlan(7), Ccp::Off);
    ppp_traffic_is_fast_pathed(&mut tb, &format!("{WAN_IF}.7"), LAN_IF, "auto", None);
}

/// PPPoE over a bridge the WAN port is in (`br-wan`): XDP cannot take the session's frames
/// there (a bridge's frames are its ports'), so with the default `datapath = "auto"` the TC
/// fast path runs on ppp0 itself, between the kernel's PPPoE code and its IP layer, and
/// nothing on the bridge or the port.
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_ppp_device_over_a_bridge_is_fast_pathed_on_tc() {
    if !ready("wan_as_ppp_device_over_a_bridge_is_fast_pathed_on_tc") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pb", Under::Bridge, Ccp::Off);
    ppp_traffic_is_fast_pathed(
        &mut tb,
        WAN_BRIDGE,
        LAN_IF,
        "auto",
        Some("its session runs over br-wan, a bridge device"),
    );
}

/// pppd redials (its session ends, a new one comes up on a new ppp0): the daemon takes the old
/// session out of the datapath when ppp0 goes, binds the new one, and a connection over it is
/// fast-pathed again, both ways.
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn a_redialled_session_is_followed() {
    if !ready("a_redialled_session_is_followed") {
        return;
    }
    let (mut tb, mut session) = pppoe_testbed("pr", Under::Port, Ccp::Off);
    tb.start_daemon_config(&format!(
        "xdp_mode = \"native\"\n{}",
        wan_lan_interfaces(PPP_IF)
    ));
    let ppp_status = |tb: &Testbed| {
        tb.daemon()
            .status()
            .interfaces
            .into_iter()
            .find(|i| i.name == PPP_IF)
            .and_then(|i| i.encap)
    };
    let before = ppp_status(&tb);
    let ifindex_before = tb
        .router
        .exec_ok("cat", &[&format!("/sys/class/net/{PPP_IF}/ifindex")]);
    session.redial(&tb);
    let ifindex_after = tb
        .router
        .exec_ok("cat", &[&format!("/sys/class/net/{PPP_IF}/ifindex")]);
    assert_ne!(
        ifindex_before, ifindex_after,
        "pppd kept its ppp0: no redial"
    );
    // Bound again: the session line is back (after ppp0 went, it was gone).
    let bound = wait_until(promptly(), || {
        ppp_status(&tb).is_some_and(|e| e.starts_with("PPPoE session 0x"))
    });
    let after = ppp_status(&tb);
    println!(
        "redial: {PPP_IF} ifindex {} -> {}; before: {before:?}; after: {after:?}",
        ifindex_before.trim(),
        ifindex_after.trim()
    );
    assert!(
        bound,
        "the new session was not bound within 10 s: {after:?}"
    );

    let server = wan_v4(6227);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let echo = UdpEcho::start(&tb.wan, server);
    let mut seq = 0;
    offload_udp_family(&tb, &sock, server, &mut seq);
    let m = measure_udp(&tb, &sock, server, &mut seq, LAN_IF, PPP_IF);
    println!(
        "{server} over the redialled session: {} datagrams each way; XDP forwarded {} \
         original, {} reply; FORWARD ESTABLISHED +{}",
        m.sent, m.orig, m.reply, m.established
    );
    assert_eq!(
        (m.orig, m.reply),
        (m.sent, m.sent),
        "every datagram fast-pathed both ways over the new session"
    );
    assert_eq!(echo.finish().corrupt, 0);
}

/// The frames carrying one datagram's payload on the WAN wire and on the LAN wire.
type Wires = (Vec<Vec<u8>>, Vec<Vec<u8>>);

/// The kernel as the oracle over PPPoE over VLAN 7: the same datagrams (same connection, same
/// payloads) sent with the fast path off and on leave the router byte for byte the same, on
/// the WAN wire (encapsulated: MACs, PPPoE header, PPP protocol, IP header, NAT, checksums)
/// and on the LAN wire (the decapsulated replies); with it on, every one of them was forwarded
/// by XDP, with it off none. The one thing that differs between the halves is what the
/// sending hosts put in the IPv4 identification (a counter of their own), so that field and
/// the header checksum covering it are compared as zero, after every frame's checksums are
/// checked in full.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn fast_path_sends_what_the_kernel_sends_over_pppoe() {
    if !ready("fast_path_sends_what_the_kernel_sends_over_pppoe") {
        return;
    }
    pppoe_differential("pk", "", LAN_IF);
}

/// [`fast_path_sends_what_the_kernel_sends_over_pppoe`] with `datapath = "tc"`: the TC fast path
/// on the LAN port and on ppp0 itself (the kernel's PPPoE and VLAN code encapsulating what it
/// redirects into ppp0) sends what the kernel sends, byte for byte.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn fast_path_sends_what_the_kernel_sends_over_pppoe_on_tc() {
    if !ready("fast_path_sends_what_the_kernel_sends_over_pppoe_on_tc") {
        return;
    }
    pppoe_differential("pq", "datapath = \"tc\"\n", LAN_IF);
}

/// [`fast_path_sends_what_the_kernel_sends_over_pppoe`] with a LAN port that has neither native
/// XDP nor XDP transmit (a macvlan, as a Wi-Fi or Realtek port is) and `datapath = "auto"`:
/// uploads leave the macvlan's TC program into ppp0; replies arrive as session frames on the
/// native eth0, whose XDP hands them to the TC program behind it, which takes the session
/// header and the VLAN tag off the skb and redirects it through the macvlan. Both wires' bytes
/// are the kernel's.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn fast_path_sends_what_the_kernel_sends_from_pppoe_into_a_port_without_xdp_transmit() {
    if !ready("fast_path_sends_what_the_kernel_sends_from_pppoe_into_a_port_without_xdp_transmit") {
        return;
    }
    pppoe_differential("pr", "", MACVLAN_LAN_IF);
}

/// The differential over PPPoE over VLAN 7, with `global` at the top of the config and `lan`
/// as the router's LAN port ([`LAN_IF`], or [`MACVLAN_LAN_IF`] set up over it).
fn pppoe_differential(tag: &str, global: &str, lan: &str) {
    const N: u64 = 10;
    const FIRST: u64 = 1_000_000;
    let (mut tb, _session) = pppoe_testbed(tag, Under::Vlan(7), Ccp::Off);
    if lan == MACVLAN_LAN_IF {
        tb.macvlan_lan_port(PPP_IF);
    }
    tb.start_daemon_config(&format!(
        "{global}xdp_mode = \"native\"\n{}",
        interfaces_config(PPP_IF, lan)
    ));
    let st = tb.daemon().status();
    let expected = match (global.is_empty(), lan == MACVLAN_LAN_IF) {
        (false, _) => ("tc", "tc"),
        (true, true) => ("tc", "lower"),
        (true, false) => ("native", "lower"),
    };
    assert_eq!(
        (
            st.iface(lan).attach_mode.as_str(),
            st.iface(PPP_IF).attach_mode.as_str()
        ),
        expected,
        "{:?}",
        st.interfaces
    );
    let server = wan_v4(6250);
    let sock = udp_socket(&tb.lan, any_v4(), 64);
    let echo = UdpEcho::start(&tb.wan, server);
    let mut seq = 0;
    offload_udp(&tb, &sock, server, &mut seq);
    // What left the router, per half (off, on): for each datagram, the frames carrying its
    // payload on the WAN host's wire and on the LAN host's.
    let mut seen: Vec<Vec<Wires>> = Vec::new();
    for on in [false, true] {
        tb.daemon().set_fastpath(on);
        // (Re-)armed by a packet each way the kernel forwards.
        let arm = ping_pong(&sock, server, seq, 2, PING_DGRAM, PING_TICK);
        seq += arm.sent;
        let wan_cap = Capture::open(&tb.wan, HOST_IF);
        let lan_cap = Capture::open(&tb.lan, HOST_IF);
        let before = tb.snapshot();
        // The same sequence numbers in both halves: the same payloads.
        let pp = ping_pong(&sock, server, FIRST, N, PING_DGRAM, PING_TICK);
        let after = tb.snapshot();
        assert_eq!((pp.good, pp.lost, pp.corrupt), (N, 0, 0), "{pp:?}");
        let (orig, reply) = (
            after.packets_since(&before, lan, "forwarded_original"),
            after.packets_since(&before, PPP_IF, "forwarded_reply"),
        );
        println!(
            "fast path {}: forwarded {orig} original, {reply} reply of {N} each way",
            if on { "on" } else { "off" }
        );
        assert_eq!((orig, reply), if on { (N, N) } else { (0, 0) });
        let frames = |cap: &Capture| {
            let mut got = Vec::new();
            while let Some(f) = cap.next_incoming(Duration::from_millis(300)) {
                got.push(f);
            }
            got
        };
        let (wan, lan) = (frames(&wan_cap), frames(&lan_cap));
        seen.push(
            (FIRST..FIRST + N)
                .map(|s| {
                    let payload = udp_payload(s, PING_DGRAM);
                    let carrying = |all: &[Vec<u8>]| -> Vec<Vec<u8>> {
                        all.iter()
                            .filter(|f| f.windows(payload.len()).any(|w| w == payload))
                            .cloned()
                            .collect()
                    };
                    (carrying(&wan), carrying(&lan))
                })
                .collect(),
        );
    }
    // The sender's identification and the header checksum over it, zeroed (the checksums were
    // verified first).
    let without_ident = |f: &Vec<u8>| {
        verify_checksums(f).unwrap_or_else(|e| panic!("{e}: {f:?}"));
        let ip = match u16::from_be_bytes([f[12], f[13]]) {
            0x8864 => 22,
            _ => 14,
        };
        let mut f = f.clone();
        f[ip + 4..ip + 6].fill(0);
        f[ip + 10..ip + 12].fill(0);
        f
    };
    let seen: Vec<Vec<Wires>> = seen
        .iter()
        .map(|half| {
            half.iter()
                .map(|(wan, lan)| {
                    (
                        wan.iter().map(without_ident).collect(),
                        lan.iter().map(without_ident).collect(),
                    )
                })
                .collect()
        })
        .collect();
    for (i, (off, on)) in seen[0].iter().zip(&seen[1]).enumerate() {
        assert_eq!(
            (off.0.len(), off.1.len()),
            (1, 1),
            "datagram {i}: kernel's frames on the WAN / LAN wire"
        );
        assert_eq!(
            off.0, on.0,
            "datagram {i}: WAN wire frame differs (off, then on)"
        );
        assert_eq!(
            off.1, on.1,
            "datagram {i}: LAN wire frame differs (off, then on)"
        );
    }
    println!(
        "{N} datagrams each way: the same {} WAN-wire and {} LAN-wire bytes with the fast path \
         off and on",
        seen[0].iter().map(|d| d.0[0].len()).sum::<usize>(),
        seen[0].iter().map(|d| d.1[0].len()).sum::<usize>()
    );
    assert_eq!(echo.finish().corrupt, 0);
}

/// The manual's home router (docs/manual/src/real-router.md): the LAN a bridge (`br-lan`, the
/// LAN host behind its port eth1), the WAN PPPoE over VLAN 7, the config naming `br-lan` and
/// `ppp0` only. From the port into
/// the tagged session and back, both families, counted on the port (where XDP runs) and on
/// ppp0.
#[test]
#[ignore = "needs the pppoe and 8021q modules: cargo xtask test runs it in a Debian-kernel guest"]
fn home_router_bridged_lan_and_ppp_over_vlan_is_fast_pathed() {
    if !ready("home_router_bridged_lan_and_ppp_over_vlan_is_fast_pathed") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("ph", Under::Vlan(7), Ccp::Off);
    // The LAN port becomes br-lan's; the router's LAN addresses and MAC move to the bridge.
    tb.router.sh(&format!(
        "mac=$(cat /sys/class/net/{LAN_IF}/address)
         ip link add br-lan type bridge
         ip link set br-lan address $mac
         ip addr flush dev {LAN_IF} scope global
         ip link set {LAN_IF} master br-lan
         ip addr add {ROUTER_LAN_V4}/24 dev br-lan
         ip addr add {ROUTER_LAN_V6}/64 dev br-lan nodad
         ip link set br-lan up
         for t in iptables ip6tables; do
           $t -w -A FORWARD -i br-lan -o {PPP_IF} -j ACCEPT
         done"
    ));
    tb.lan.sh(&format!(
        "for i in 1 2 3 4 5; do ping -c1 -W1 {WAN_HOST_V4} >/dev/null && break; done
         for i in 1 2 3 4 5; do ping -6 -c1 -W1 {WAN_HOST_V6} >/dev/null && exit 0; done
         echo 'no path LAN -> WAN through br-lan' >&2; exit 1"
    ));
    ppp_traffic_is_fast_pathed(&mut tb, &format!("{WAN_IF}.7"), "br-lan", "auto", None);
}

/// The WAN named as the Ethernet port under the session (`name = "eth0"`): session frames of
/// a PPP device the daemon does not manage go to the kernel (`pppoe_unknown_session`), and
/// connections whose path leaves through ppp0 are not offloaded (`path_not_managed`); the
/// kernel carries both.
#[test]
#[ignore = "needs the pppoe module: cargo xtask test runs it in a Debian-kernel guest"]
fn wan_as_pppoe_ethernet_leaves_session_frames_to_the_kernel() {
    if !ready("wan_as_pppoe_ethernet_leaves_session_frames_to_the_kernel") {
        return;
    }
    let (mut tb, _session) = pppoe_testbed("pe", Under::Port, Ccp::Off);
    tb.start_daemon_config(&wan_lan_interfaces(WAN_IF));
    let (before, after) = udp_and_tcp_are_intact(&tb, 6217, "PPPoE (Ethernet port managed)");
    assert_encapsulated_wan_left_to_kernel(
        &before,
        &after,
        "PPPoE session",
        "pppoe_unknown_session",
    );
}
