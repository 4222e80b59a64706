//! End-to-end test bed: a home router in network namespaces with xdp-routerd started on it as a
//! user would start it, plus the traffic, counter and capture helpers the e2e tests assert with.
//!
//! ```text
//!  lan host eth0 ⇄ eth1 router eth0 ⇄ eth0 wan host
//!  10.0.1.2        10.0.1.1  10.0.2.1    10.0.2.2
//!  fd00:1::2       fd00:1::1 fd00:2::1   fd00:2::2
//! ```
//! The router runs iptables like a home router (MASQUERADE on the WAN, FORWARD policy DROP,
//! ESTABLISHED,RELATED and LAN→WAN accepted) and the same FORWARD policy in ip6tables without
//! NAT. Hosts keep GRO on (so frames the router XDP_REDIRECTs into their veth are accepted);
//! router veths have GRO/GSO/TSO off so every counter counts wire packets; checksum offload is
//! off everywhere so rewritten packets carry real checksums.
//!
//! One module per part: `addrs` (names and addresses), `topology` (the namespaces and the
//! `Testbed`), `daemon`, `status` (what the tests read off the router), `traffic` and
//! `udp_flow` (a running flow whose stop and resumption tests time), `capture` and `checks`
//! (the assertions the e2e tests share), `shared_bed` (checks that share one test bed).
//! Everything is re-exported here.

mod addrs;
mod capture;
mod checks;
mod daemon;
mod shared_bed;
mod status;
mod topology;
mod traffic;
mod udp_flow;

pub use self::{
    addrs::*, capture::*, checks::*, daemon::*, shared_bed::*, status::*, topology::*, traffic::*,
    udp_flow::*,
};
