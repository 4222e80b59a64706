//! The router network namespace and map plumbing shared by the BPF_PROG_RUN users: the
//! fixture table (`tests/prog_run/`) and the per-packet cost benchmark (`bin/prog_cost/`).
//!
//! `bpf_fib_lookup` consults the routes and neighbours of the namespace of the thread that runs
//! BPF_PROG_RUN (through the ingress device given in the `xdp_md` context), so both build the
//! same router namespace and run the program from a thread inside it
//! ([`Netns::run`](crate::netns::Netns::run)).
//!
//! Router namespace, interfaces and what is behind them:
//! - `lan0` (MTU 3500: room for the longest checksum-verified segment) 192.0.2.1/24,
//!   2001:db8:1::1/64; client .10 / ::10 (permanent neighbour)
//! - `wan0` (MTU 3500) 198.51.100.1/24, 2001:db8:2::1/64; gateway .254 / ::fe (permanent neighbour);
//!   default routes via the gateway; 203.0.113.192/26 and 2001:db8:beef::/48 via a gateway
//!   without neighbour entry (.253 / ::fd)
//! - `mtu0` (MTU 1280) 203.0.113.129/26, 2001:db8:3::1/64; peer .130 / ::2
//! - blackhole 203.0.113.0/26 and 2001:db8:dead::/48, unreachable 203.0.113.64/26

//!
//! [`topology`] builds the namespace and names its addresses, [`flow`] makes flow map entries,
//! [`setup`] describes a case's map contents, [`maps`] loads the program and writes them,
//! [`frames`] makes the fixtures' frames, [`run`] runs the program on one.

mod flow;
mod frames;
mod maps;
mod run;
mod setup;
mod topology;

pub use self::{flow::*, frames::*, maps::*, run::*, setup::*, topology::*};
