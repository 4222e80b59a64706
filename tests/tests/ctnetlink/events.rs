//! Events: new, update and destroy; overruns, what is queued at one, and the daemon's own
//! requests kept out of the event buffer.

use super::*;

#[test]
fn events_report_new_update_destroy() {
    if !require_root("events_report_new_update_destroy") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5101).into();
    udp_echo_server(&topo.server, server);
    let sub = open_in(&topo.router, &rt, CtSubscription::new);
    assert!(
        sub.rcvbuf() >= 1 << 20,
        "large receive buffer: {}",
        sub.rcvbuf()
    );
    let mut events = Events::new(sub);

    let sock = udp_client(&topo.client, server);
    let orig = orig_tuple(sock.local_addr().expect("local addr"), server, IPPROTO_UDP);
    udp_round_trip(&sock);

    let new = events.wait(&rt, "NEW", |ev| {
        matches!(ev, CtEvent::New(e) if e.orig == orig && !e.status.contains(CtStatus::SeenReply))
    });
    assert_eq!(
        new.entry().offload_decision(),
        Err(NotOffloadable::Unreplied)
    );
    let update = events.wait(&rt, "UPDATE (reply seen)", |ev| {
        matches!(ev, CtEvent::Update(e) if e.orig == orig && e.status.contains(CtStatus::SeenReply))
    });
    assert_eq!(update.entry().reply.dst, IpAddr::V4(ROUTER_WAN_V4));
    assert_eq!(update.entry().id, new.entry().id, "same entry");

    // Our own updates come back as UPDATE events; those of an ignored socket do not.
    let mut quiet = open_in(&topo.router, &rt, CtNetlink::new);
    let mut loud = open_in(&topo.router, &rt, CtNetlink::new);
    events.sub.ignore_events_from(quiet.port_id());
    assert!(
        rt.block_on(quiet.refresh_timeout(&orig, 0, 100))
            .expect("refresh")
    );
    assert!(
        rt.block_on(loud.refresh_timeout(&orig, 0, 200))
            .expect("refresh")
    );
    let refreshed = events.wait(
        &rt,
        "UPDATE from a refresh",
        |ev| matches!(ev, CtEvent::Update(e) if e.orig == orig),
    );
    assert!(
        refreshed.entry().timeout.is_some_and(|t| t > 150),
        "the first update seen is the non-ignored one: {refreshed:?}"
    );

    topo.router.exec_ok(
        "conntrack",
        &[
            "-D",
            "-p",
            "udp",
            "--orig-src",
            &CLIENT_V4.to_string(),
            "--orig-port-src",
            &orig.sport.to_string(),
        ],
    );
    let destroy = events.wait(
        &rt,
        "DESTROY",
        |ev| matches!(ev, CtEvent::Destroy(e) if e.orig == orig),
    );
    assert_eq!(destroy.entry().id, new.entry().id);
    assert_eq!(destroy.entry().reply, update.entry().reply);
}

#[test]
fn event_overrun_is_reported_and_stream_recovers() {
    if !require_root("event_overrun_is_reported_and_stream_recovers") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5201).into();
    udp_echo_server(&topo.server, server);
    // The smallest buffer the kernel allows: a burst of flows cannot fit.
    let mut events = tiny_subscription(&topo.router, &rt);
    let burst: Vec<UdpSocket> = (0..200).map(|_| udp_client(&topo.client, server)).collect();
    for sock in &burst {
        sock.send(b"x").expect("UDP send");
    }
    thread::sleep(Duration::from_millis(300));
    assert!(
        events.drain(&rt),
        "200 flows into a minimal buffer must report an overrun"
    );

    // Once drained (the daemon would dump and reconcile now), the subscription keeps working.
    // The probe flow gets no reply (dropped at the server), so it makes exactly one event,
    // which the tiny buffer can hold.
    let silent: SocketAddr = (SERVER_V4, 5209).into();
    topo.server
        .sh("iptables -A INPUT -p udp --dport 5209 -j DROP");
    let sock = udp_client(&topo.client, silent);
    let orig = orig_tuple(sock.local_addr().expect("local addr"), silent, IPPROTO_UDP);
    sock.send(b"after").expect("UDP send");
    events.wait(&rt, "NEW after overrun", |ev| ev.entry().orig == orig);
}

/// The kernel reports an overrun ahead of the events still queued, and those are older than the
/// events it dropped: applied after the resync's dump, they would bring a connection that has
/// closed meanwhile back as ESTABLISHED, its closing events lost (the daemon offloaded such
/// connections again and left their flows in the maps; a later connection on the same ports
/// had its first packets carried by that stale flow, unseen by its new conntrack entry, and
/// the router's stack answered the server's FIN with a reset). The subscription discards them
/// with the overrun.
#[test]
fn events_queued_at_an_overrun_are_discarded_with_it() {
    if !require_root("events_queued_at_an_overrun_are_discarded_with_it") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5301).into();
    let udp_server: SocketAddr = (SERVER_V4, 5302).into();
    tcp_echo_server(&topo.server, server);
    udp_echo_server(&topo.server, udp_server);
    // Room for a connection's handshake events, not for a burst of 500 flows.
    let sub = open_in(&topo.router, &rt, || CtSubscription::with_rcvbuf(32 << 10));
    let mut ct = open_in(&topo.router, &rt, CtNetlink::new);

    // Queued: the connection's NEW and its UPDATEs up to ESTABLISHED.
    let stream = tcp_client(&topo.client, server);
    let orig = orig_tuple(
        stream.local_addr().expect("local addr"),
        server,
        IPPROTO_TCP,
    );
    // Overflow, then close the connection: its closing events are dropped.
    let burst: Vec<UdpSocket> = (0..500)
        .map(|_| udp_client(&topo.client, udp_server))
        .collect();
    for sock in &burst {
        sock.send(b"x").expect("UDP send");
    }
    thread::sleep(Duration::from_millis(200));
    stream
        .shutdown(std::net::Shutdown::Both)
        .expect("TCP shutdown");
    drop(stream);
    thread::sleep(Duration::from_millis(300));
    let dump = rt.block_on(ct.dump()).expect("dump");
    let now = find(&dump, &orig).expect("the closed connection is still in conntrack");
    assert_ne!(
        now.tcp_state,
        Some(tcp_state::ESTABLISHED),
        "the connection has closed: {now:?}"
    );

    let mut events = Events::new(sub);
    let first = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(2), events.sub.next_batch()).await
        })
        .expect("an event or the overrun within 2 s");
    assert!(
        matches!(first, Err(CtNetlinkError::Overrun)),
        "the overrun is reported first: {first:?}"
    );
    assert!(
        events.sub.stale_discarded() > 0,
        "the events queued before the overrun were discarded with it"
    );
    // After the overrun (where the daemon dumps and reconciles), nothing older than the dump
    // may arrive: no event of the connection says ESTABLISHED any more.
    let mut stale = Vec::new();
    rt.block_on(async {
        while let Ok(batch) =
            tokio::time::timeout(Duration::from_millis(300), events.sub.next_batch()).await
        {
            let batch = batch.unwrap_or_default();
            stale.extend(batch.into_iter().filter(|ev| {
                ev.entry().orig == orig && ev.entry().tcp_state == Some(tcp_state::ESTABLISHED)
            }));
        }
    });
    assert!(
        stale.is_empty(),
        "events older than the overrun replayed after it: {stale:?}"
    );
}

/// The daemon's own marks and refreshes take no room in the event socket's buffer: the kernel
/// drops their UPDATE events before queuing them (the subscription's socket filter). With the
/// smallest buffer the kernel allows, 200 marks from an ignored socket cause no overrun (each
/// event queued would overrun it after a few), while one update from another socket still
/// arrives.
#[test]
fn ignored_sockets_events_never_reach_the_event_buffer() {
    if !require_root("ignored_sockets_events_never_reach_the_event_buffer") {
        return;
    }
    let topo = Topology::new(&[]);
    let rt = runtime();
    let server: SocketAddr = (SERVER_V4, 5601).into();
    tcp_echo_server(&topo.server, server);
    // Subscribed before the connections are made: with `nf_conntrack_events = 2` (the
    // default) conntrack gives a connection events only if someone listened when it began.
    let mut events = tiny_subscription(&topo.router, &rt);
    let streams: Vec<TcpStream> = (0..200).map(|_| tcp_client(&topo.client, server)).collect();
    let live: Vec<CtTuple> = streams
        .iter()
        .map(|s| orig_tuple(s.local_addr().expect("local addr"), server, IPPROTO_TCP))
        .collect();
    // Their own events overran the tiny buffer; once drained, the stream is quiet.
    events.drain(&rt);
    let mut marker = open_in(&topo.router, &rt, CtNetlink::new);
    events.sub.ignore_events_from(marker.port_id());

    let marks: Vec<CtUpdate> = live
        .iter()
        .map(|o| CtUpdate::new(*o, 0).tcp_liberal().timeout(300))
        .collect();
    let results = rt
        .block_on(marker.update_many(&marks))
        .expect("update_many");
    assert!(
        results.iter().all(|r| matches!(r, Ok(true))),
        "every connection marked: {results:?}"
    );
    assert!(
        !events.drain(&rt),
        "200 ignored updates into a minimal buffer must not overrun it"
    );

    let mut loud = open_in(&topo.router, &rt, CtNetlink::new);
    assert!(
        rt.block_on(loud.refresh_timeout(&live[7], 0, 400))
            .expect("refresh")
    );
    let seen = events.wait(
        &rt,
        "UPDATE from a socket not ignored",
        |ev| matches!(ev, CtEvent::Update(e) if e.orig == live[7]),
    );
    assert!(
        seen.entry().timeout.is_some_and(|t| t > 300),
        "the other socket's refresh: {seen:?}"
    );
}
