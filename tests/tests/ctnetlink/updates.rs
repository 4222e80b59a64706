//! Updates the daemon sends: timeout refreshes, TCP liberal flags, marks in batches.

use super::*;

#[test]
fn refresh_timeout_keeps_flow_alive_and_never_creates() {
    if !require_root("refresh_timeout_keeps_flow_alive_and_never_creates") {
        return;
    }
    // Short UDP timeouts: an idle flow is gone after 4 s.
    let topo = Topology::new(&[
        ("net.netfilter.nf_conntrack_udp_timeout", "4"),
        ("net.netfilter.nf_conntrack_udp_timeout_stream", "4"),
    ]);
    let rt = runtime();
    let timeouts = topo.router.run(KernelTimeouts::read).expect("read sysctls");
    assert_eq!(timeouts.udp_stream, 4);
    assert_eq!(timeouts.for_proto(IPPROTO_UDP), Some(4));
    assert_eq!(timeouts.tcp_established, 432_000, "kernel default");

    let server: SocketAddr = (SERVER_V4, 5301).into();
    udp_echo_server(&topo.server, server);
    let kept = udp_client(&topo.client, server);
    let idle = udp_client(&topo.client, server);
    for sock in [&kept, &idle] {
        udp_round_trip(sock);
    }
    thread::sleep(UDP_ASSURE_DELAY);
    for sock in [&kept, &idle] {
        udp_round_trip(sock);
    }
    let kept_t = orig_tuple(kept.local_addr().expect("local addr"), server, IPPROTO_UDP);
    let idle_t = orig_tuple(idle.local_addr().expect("local addr"), server, IPPROTO_UDP);

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let before = rt
        .block_on(ct.get(&kept_t, 0))
        .expect("get")
        .expect("kept flow");
    assert_eq!(before.offload_decision(), Ok(()));
    assert!(before.timeout.is_some_and(|t| t <= 4), "{before:?}");

    // No traffic for 8 s (the idle flow expires after 4); only the refreshes (3 s each, every
    // second) keep `kept` alive.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(8) {
        assert!(
            rt.block_on(ct.refresh_timeout(&kept_t, 0, timeouts.udp_stream - 1))
                .expect("refresh"),
            "kept flow vanished after {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_secs(1));
    }
    let entries = rt.block_on(ct.dump()).expect("dump");
    assert!(find(&entries, &kept_t).is_some(), "refreshed flow expired");
    assert!(
        find(&entries, &idle_t).is_none(),
        "idle flow should have expired"
    );
    assert!(
        !rt.block_on(ct.refresh_timeout(&idle_t, 0, 60))
            .expect("refresh"),
        "refreshing an expired flow reports it gone"
    );
    assert_eq!(
        rt.block_on(ct.get(&idle_t, 0)).expect("get"),
        None,
        "a refresh must never create an entry"
    );

    // Raising the timeout is visible when read back.
    assert!(
        rt.block_on(ct.refresh_timeout(&kept_t, 0, 300))
            .expect("refresh")
    );
    let after = rt
        .block_on(ct.get(&kept_t, 0))
        .expect("get")
        .expect("kept flow");
    assert!(
        after.timeout.is_some_and(|t| (295..=300).contains(&t)),
        "timeout raised to 300: {after:?}"
    );
}

#[test]
fn tcp_liberal_flags_and_timeout_in_one_update() {
    if !require_root("tcp_liberal_flags_and_timeout_in_one_update") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5401).into();
    tcp_echo_server(&topo.server, server);
    let stream = tcp_client(&topo.client, server);
    let orig = orig_tuple(
        stream.local_addr().expect("local addr"),
        server,
        IPPROTO_TCP,
    );

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let before = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    let flags = before.tcp_flags.expect("TCP flags dumped");
    assert!(
        flags.iter().all(|f| f & TCP_FLAG_BE_LIBERAL == 0),
        "not liberal before: {flags:?}"
    );

    assert!(
        rt.block_on(ct.set_tcp_liberal(&orig, 0))
            .expect("set liberal")
    );
    let after = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    let liberal = after.tcp_flags.expect("TCP flags dumped");
    assert!(
        liberal.iter().all(|f| f & TCP_FLAG_BE_LIBERAL != 0),
        "liberal in both directions: {liberal:?}"
    );
    // MAXACK_SET is cleared (RSTs are not checked against a stale td_maxack); the other flags
    // are untouched.
    assert_eq!(
        [
            (flags[0] | TCP_FLAG_BE_LIBERAL) & !TCP_FLAG_MAXACK_SET,
            (flags[1] | TCP_FLAG_BE_LIBERAL) & !TCP_FLAG_MAXACK_SET
        ],
        liberal
    );
    assert!(
        flags.iter().any(|f| f & TCP_FLAG_MAXACK_SET != 0),
        "the handshake set MAXACK_SET before the update: {flags:?}"
    );
    assert_eq!(after.tcp_state, Some(tcp_state::ESTABLISHED));

    // Timeout and flags in one message; the established default (5 days) drops to 1000 s.
    let update = CtUpdate::for_entry(&after).timeout(1000).tcp_liberal();
    assert!(rt.block_on(ct.update(&update)).expect("update"));
    let updated = rt
        .block_on(ct.get(&orig, 0))
        .expect("get")
        .expect("TCP flow");
    assert!(
        updated.timeout.is_some_and(|t| (995..=1000).contains(&t)),
        "{updated:?}"
    );

    // The connection still works through the router.
    let mut stream = stream;
    stream.write_all(b"again").expect("TCP write");
    let mut buf = [0u8; 5];
    stream.read_exact(&mut buf).expect("TCP echo after update");

    // An update of a connection that does not exist is "false" and creates nothing.
    let mut absent = orig;
    absent.sport = absent.sport.wrapping_add(1);
    assert!(!rt.block_on(ct.set_tcp_liberal(&absent, 0)).expect("update"));
    assert_eq!(rt.block_on(ct.get(&absent, 0)).expect("get"), None);
}

/// `update_many` pipelines its requests (several datagrams' worth here: more connections than
/// one datagram carries) and reports each one: every live connection marked liberal, the
/// absent ones interleaved with them reported as gone and not created.
#[test]
fn update_many_marks_every_connection_and_reports_absent_ones() {
    if !require_root("update_many_marks_every_connection_and_reports_absent_ones") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5501).into();
    tcp_echo_server(&topo.server, server);
    let streams: Vec<TcpStream> = (0..150).map(|_| tcp_client(&topo.client, server)).collect();
    let live: Vec<CtTuple> = streams
        .iter()
        .map(|s| orig_tuple(s.local_addr().expect("local addr"), server, IPPROTO_TCP))
        .collect();
    let absent = |o: &CtTuple| CtTuple {
        dport: o.dport + 1,
        ..*o
    };
    let mut updates = Vec::new();
    for (i, o) in live.iter().enumerate() {
        updates.push(CtUpdate::new(*o, 0).tcp_liberal());
        if i % 10 == 0 {
            updates.push(CtUpdate::new(absent(o), 0).tcp_liberal());
        }
    }

    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);
    let results = rt.block_on(ct.update_many(&updates)).expect("update_many");
    assert_eq!(results.len(), updates.len());
    for (u, r) in updates.iter().zip(&results) {
        let existed = *r.as_ref().expect("no kernel error");
        assert_eq!(existed, live.contains(&u.orig), "{u:?}");
    }
    let dump = rt.block_on(ct.dump()).expect("dump");
    for o in &live {
        let e = find(&dump, o).expect("live connection in conntrack");
        let flags = e.tcp_flags.expect("TCP flags dumped");
        assert!(
            flags.iter().all(|f| f & TCP_FLAG_BE_LIBERAL != 0),
            "liberal in both directions: {e:?}"
        );
        assert!(
            find(&dump, &absent(o)).is_none(),
            "created: {:?}",
            absent(o)
        );
    }
    // The socket is left clean: a plain request right after gets its own answer.
    assert!(
        rt.block_on(ct.set_tcp_liberal(&live[0], 0))
            .expect("update")
    );
}
