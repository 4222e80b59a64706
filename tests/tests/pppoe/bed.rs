//! The PPPoE tests' test bed: the access concentrator in the WAN host, pppd in the router, the
//! WAN moved onto the session.

use std::{
    fs,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use xdp_router_tests::{
    netns::Netns,
    testbed::{
        HOST_IF, LAN_IF, ROUTER_WAN_V4, ROUTER_WAN_V6, TempDir, Testbed, WAN_HOST_V4, WAN_HOST_V6,
        WAN_IF, time_scale, wait_until,
    },
};

/// The router's PPP interface.
pub(super) const PPP_IF: &str = "ppp0";

/// pppoe-server in the WAN host and pppd in the router; both ended (by PID, client first so
/// that the server's session ends with an LCP terminate) on drop.
pub(super) struct Session {
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
    pub(super) fn redial(&mut self, tb: &Testbed) {
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
    pub(super) fn client_log(&self) -> String {
        fs::read_to_string(self.dir.path().join(CLIENT_LOG)).unwrap_or_else(|e| e.to_string())
    }
}

/// How long the daemon may take to follow a session change it reads every 2 s (a rebinding
/// after a redial, CCP seen on the session): 10 s, times `XDP_ROUTER_TIME_SCALE`.
pub(super) fn promptly() -> Duration {
    Duration::from_secs(10 * u64::from(time_scale()))
}

/// pppd's log in the router, in the session's directory.
const CLIENT_LOG: &str = "pppd-client.log";

/// SIGTERM to `c` (our unreaped child), SIGKILL if it has not exited within 3 s.
pub(super) fn end(c: &mut Child) {
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
pub(super) fn ppp0_up(tb: &Testbed) -> bool {
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

pub(super) fn spawn(ns: &Netns, prog: &str, args: &[&str]) -> Child {
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
pub(super) enum Ccp {
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
pub(super) enum Under {
    /// The WAN port itself (DSL, much fiber).
    Port,
    /// A VLAN on the WAN port, as many fiber ISPs deliver it.
    Vlan(u16),
    /// A bridge with the WAN port in it (`br-wan`, as a router whose modem port is bridged
    /// with others has it).
    Bridge,
}

/// The router's WAN bridge for [`Under::Bridge`].
pub(super) const WAN_BRIDGE: &str = "br-wan";

/// The test bed with its WAN moved onto a PPPoE session over the WAN link (or what `under`
/// says; with `ccp`): the WAN host
/// serves 10.0.2.2, the router gets 10.0.2.1 on ppp0, and both move their IPv6 WAN addresses
/// onto their PPP devices (IPV6CP up); NAT and FORWARD rules name ppp0, and TCP's MSS is
/// clamped to the path MTU, as every PPPoE router does.
pub(super) fn pppoe_testbed(tag: &str, under: Under, ccp: Ccp) -> (Testbed, Session) {
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
pub(super) fn wan_over_ppp0(tb: &Testbed) {
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
