//! The map ABI shared by the xdp-router eBPF program and `xdp-routerd`.
//!
//! Everything here is `#[repr(C)]` with fixed-width fields and explicit padding, so the eBPF side
//! and the daemon agree byte for byte. Byte order is named on every field: `_be` fields hold the
//! value exactly as it appears on the wire (network byte order, read from packet memory as a
//! native integer); everything else is host order. A compile-time assert pins each type's size.
#![no_std]

pub mod checksum;
mod iface;
pub mod lab;
pub mod parse;
pub mod reason;

pub use iface::*;
pub use reason::Reason;

/// Name of the XDP program in the object file (multi-buffer: `xdp.frags`).
pub const PROG_NAME: &str = "xdp_router";

/// The same XDP program without multi-buffer support (no `xdp.frags`, no
/// `bpf_xdp_get_buff_len`), attached instead of [`PROG_NAME`] where the kernel refuses
/// [`MULTI_BUFFER_PROBE_PROG_NAME`] (Linux before 5.18).
pub const SINGLE_BUFFER_PROG_NAME: &str = "xdp_router_1buf";

/// Name of the XDP program the daemon loads (and unloads) once to ask whether this kernel
/// takes multi-buffer XDP programs (`xdp.frags` calling `bpf_xdp_get_buff_len`).
pub const MULTI_BUFFER_PROBE_PROG_NAME: &str = "xdp_router_mbp";

/// Map names (at most 15 bytes: the kernel truncates longer ones).
pub const MAP_FLOWS_V4: &str = "FLOWS_V4";
pub const MAP_FLOWS_V6: &str = "FLOWS_V6";
pub const MAP_IFACES: &str = "IFACES";
pub const MAP_TX_PORTS: &str = "TX_PORTS";
pub const MAP_STATS: &str = "STATS";
pub const MAP_SETTINGS: &str = "SETTINGS";
pub const MAP_ARM_V4: &str = "ARM_V4";
pub const MAP_ARM_V6: &str = "ARM_V6";
pub const MAP_BRIDGE_FDB: &str = "BRIDGE_FDB";
pub const MAP_VLANS: &str = "VLANS";
pub const MAP_PPPOE: &str = "PPPOE";
pub const MAP_BRIDGE_VLANS: &str = "BRIDGE_VLANS";
/// Per-CPU count (one `u64`, index 0) of the packets (GSO segments) of offloaded flow
/// directions the kernel forwarded, each of which the arming program armed: summed over the
/// CPUs, unchanged between two reads means the kernel forwarded none of them in between, so
/// no `armed_at` was written.
pub const MAP_KERNEL_FORWARDED: &str = "KERNEL_FWD";
/// Per-CPU [`HostCounters`] by host slot (see [`FlowV4::host_slots`]): what the router
/// forwarded for each LAN host on offloaded connections, counted by the fast path and the
/// arming program as the packets go, so a scrape reads one entry per host, not per flow.
pub const MAP_HOST_TRAFFIC: &str = "HOST_TRAFFIC";

/// [`FlowV4::host_slots`]: the endpoint is not a LAN host; nothing is counted.
pub const HOST_SLOT_NONE: u32 = 0;
/// [`FlowV4::host_slots`]: a LAN host beyond `host_metrics_limit` (the `host="other"` series).
pub const HOST_SLOT_OTHER: u32 = 1;
/// [`FlowV4::host_slots`]: the first slot of a LAN host with a series of its own; the daemon
/// gives the admitted hosts `HOST_SLOT_FIRST..` in the order it admits them.
pub const HOST_SLOT_FIRST: u32 = 2;
/// Default number of [`MAP_HOST_TRAFFIC`] slots; the daemon sets `host_metrics_limit` +
/// [`HOST_SLOT_FIRST`] at load time (`EbpfLoader::map_max_entries`).
pub const DEFAULT_HOST_SLOTS: u32 = 256 + HOST_SLOT_FIRST;

/// Capacity of [`MAP_BRIDGE_FDB`] (MAC addresses behind all managed bridges).
pub const FDB_CAPACITY: u32 = 8192;
/// Connections active in the current keep-alive pass (see [`Settings::active_since_ns`]):
/// keyed by the [`FlowKeyV4`] / [`FlowKeyV6`] of the connection's original direction with
/// `ifindex` 0 (its conntrack original tuple); the value (`u8`) is unused.
pub const MAP_ACTIVE_V4: &str = "ACTIVE_V4";
pub const MAP_ACTIVE_V6: &str = "ACTIVE_V6";

/// Name of the TC egress program that arms flow directions the kernel itself forwarded (see
/// [`FlowV4::armed_generation`]).
pub const ARM_PROG_NAME: &str = "xdp_router_arm";

/// Name of the arming program for devices without a link-layer header (`ppp0`: the IP
/// header is at offset 0 on its egress); otherwise the same as [`ARM_PROG_NAME`]. (At most
/// 15 bytes: the kernel keeps no more of a program's name.)
pub const ARM_L3_PROG_NAME: &str = "xdp_router_arm3";

/// Name of the TC ingress program that stamps each packet the kernel receives with the DSCP
/// it arrived with (see [`dscp_stamp`]), so the arming program can tell a DSCP the kernel's
/// rules rewrote.
pub const STAMP_PROG_NAME: &str = "xdp_router_stamp";

/// Name of the TC ingress program that runs the fast path on socket buffers, for interfaces
/// whose datapath is TC (`datapath = "tc"`): the same pipeline as [`PROG_NAME`].
pub const TC_PROG_NAME: &str = "xdp_router_tc";

/// Classic tc (clsact qdisc + cls_bpf filter, for kernels without TCX links, Linux < 6.6):
/// the programs the filters run, one per TC program, each only a tail call through
/// [`MAP_CLASSIC_TC`] into its TC program (at the [`ClassicSlot`] of the same name). A filter
/// is no bpf_link and outlives the daemon; the kernel empties a program array when the last
/// file descriptor on it closes, so after the daemon is gone a filter left behind tail-calls
/// into nothing and passes every packet on untouched (see the daemon's `datapath/tc_links.rs`).
pub const CLASSIC_TC_PROG_NAME: &str = "xr_cls_tc";
/// See [`CLASSIC_TC_PROG_NAME`]: for [`ARM_PROG_NAME`].
pub const CLASSIC_ARM_PROG_NAME: &str = "xr_cls_arm";
/// See [`CLASSIC_TC_PROG_NAME`]: for [`ARM_L3_PROG_NAME`].
pub const CLASSIC_ARM_L3_PROG_NAME: &str = "xr_cls_arm3";
/// See [`CLASSIC_TC_PROG_NAME`]: for [`STAMP_PROG_NAME`].
pub const CLASSIC_STAMP_PROG_NAME: &str = "xr_cls_stamp";
/// The program array the classic tc programs tail-call through (see [`CLASSIC_TC_PROG_NAME`]).
pub const MAP_CLASSIC_TC: &str = "CLASSIC_TC";
/// The handle of each of the daemon's classic tc filters (`tc filter show` prints `0x7872`,
/// "xr"): with [`CLASSIC_TC_PREFS`], how the daemon knows its own filters.
pub const CLASSIC_TC_HANDLE: u32 = 0x7872;
/// The priority ("pref") of the daemon's classic tc filter running each entry point: fixed, the
/// TC fast path's below the DSCP stamp's (it runs first on ingress, as among TCX programs).
pub const CLASSIC_TC_PREFS: [(&str, u16); 4] = [
    (CLASSIC_TC_PROG_NAME, 0x7870),
    (CLASSIC_STAMP_PROG_NAME, 0x7871),
    (CLASSIC_ARM_PROG_NAME, 0x7872),
    (CLASSIC_ARM_L3_PROG_NAME, 0x7873),
];

/// Slots of [`MAP_CLASSIC_TC`]: the TC program each classic tc program tail-calls into.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassicSlot {
    /// [`TC_PROG_NAME`].
    Tc = 0,
    /// [`ARM_PROG_NAME`].
    Arm = 1,
    /// [`ARM_L3_PROG_NAME`].
    ArmL3 = 2,
    /// [`STAMP_PROG_NAME`].
    Stamp = 3,
}

impl ClassicSlot {
    /// Entries of [`MAP_CLASSIC_TC`].
    pub const COUNT: u32 = 4;
}

/// Name of the XDP program the daemon runs once with `BPF_PROG_RUN` to ask whether this
/// kernel's `bpf_fib_lookup` takes [`FIB_LOOKUP_MARK`]; its return value is the helper's
/// answer (`-EINVAL`: no).
pub const FIB_MARK_PROBE_PROG_NAME: &str = "xdp_router_fibm";

/// Name of the program's load-time global (`u32`, default 0) with extra `bpf_fib_lookup` flags;
/// only [`FIB_LOOKUP_DIRECT`] is honoured. Set it with `EbpfLoader::override_global` before the
/// object is loaded (the verifier then prunes on the constant).
pub const GLOBAL_FIB_FLAGS: &str = "FIB_FLAGS";
/// The eBPF object's global (`u8`, 1 as built) saying whether XDP programs may use XDP metadata
/// (`bpf_xdp_adjust_meta`): the daemon loads 0 where the kernel refuses the helper, and the
/// hand-over to the TC program behind XDP then works without its mark (`handoff.rs`).
pub const GLOBAL_XDP_META: &str = "XDP_META";

/// `BPF_FIB_LOOKUP_DIRECT`: look up the main table (or the ingress VRF's) directly instead of
/// going through the FIB rules. Saves ~20 ns per IPv6 packet (the kernel otherwise looks up the
/// local table first) and nothing measurable for IPv4, but ignores policy routing (`ip rule`):
/// only for routers without rules beyond the default ones.
pub const FIB_LOOKUP_DIRECT: u32 = 1;

/// Default capacity of each flow map (per address family); the daemon overrides it from the
/// config at load time (`EbpfLoader::map_max_entries`).
pub const DEFAULT_FLOW_CAPACITY: u32 = 65_536;

/// Number of interface slots in [`MAP_STATS`]. Slot 0 counts packets whose ingress interface is
/// not in [`MAP_IFACES`] (which should not happen: the program is only attached to managed ones).
pub const MAX_IFACE_SLOTS: u32 = 64;

/// Entries of the per-CPU [`MAP_STATS`] array: one [`Counter`] per (interface slot, reason).
pub const STATS_ENTRIES: u32 = MAX_IFACE_SLOTS * Reason::COUNT;

/// Index into [`MAP_STATS`] for an interface slot and a reason.
#[inline(always)]
pub const fn stats_index(slot: u32, reason: Reason) -> u32 {
    slot * Reason::COUNT + reason as u32
}

/// Key of [`MAP_FLOWS_V4`]: one direction of a connection as it arrives on `ifindex`.
///
/// The ingress interface is part of the key so a host on one side cannot ride a flow that was
/// set up for the other side.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKeyV4 {
    /// Ingress interface index (host order).
    pub ifindex: u32,
    /// Source address (network order).
    pub src_be: u32,
    /// Destination address (network order).
    pub dst_be: u32,
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// IP protocol number (6 = TCP, 17 = UDP).
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<FlowKeyV4>() == 20);

/// Key of [`MAP_FLOWS_V6`]; see [`FlowKeyV4`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKeyV6 {
    /// Ingress interface index (host order).
    pub ifindex: u32,
    /// Source address (network order, as four raw 32-bit words).
    pub src_be: [u32; 4],
    /// Destination address (network order).
    pub dst_be: [u32; 4],
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// IP protocol number (6 = TCP, 17 = UDP).
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<FlowKeyV6>() == 44);

/// `FlowV4::flags` / `FlowV6::flags`: this entry is the reply direction of its connection.
pub const FLOW_F_REPLY: u32 = 1 << 0;
/// Set by the TC arming program when the kernel forwards a TCP SYN with this direction's tuple:
/// a new connection reuses the tuple, so this entry (the old connection's, still in the map
/// because the daemon has not read conntrack's events yet) is disarmed and never armed again.
/// The daemon's next write of the entry (the new connection's, once established) clears it.
pub const FLOW_F_STALE: u32 = 1 << 1;
/// A direction of a connection the daemon found in conntrack at its start and that has not
/// carried traffic since: it has no arming index entry (and a TCP connection no "be liberal"
/// mark in conntrack), so the kernel cannot arm it and the fast path never forwards it. The
/// fast path records the connection in the active map (`MAP_ACTIVE_V4` / `MAP_ACTIVE_V6`) when
/// it sees a packet of its original direction; the keep-alive then refreshes it (marking a
/// TCP one liberal), writes its arming index entries and clears this flag, and the next
/// packet the kernel forwards arms the direction. A router's table at start is mostly idle
/// connections: they cost two map entries each, and no mark, until they carry traffic.
pub const FLOW_F_AWAITING_TRAFFIC: u32 = 1 << 2;

/// Traffic counters of one flow direction, updated atomically by the datapath.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCounters {
    /// Packets forwarded by the fast path.
    pub packets: u64,
    /// Bytes forwarded by the fast path, counted as conntrack counts them (`nf_conntrack_acct`):
    /// each packet's IP datagram length (IPv4 total length, IPv6 payload length + 40), no
    /// link-layer header, so a flow's total is conntrack's counter plus this one.
    pub bytes: u64,
    /// `bpf_ktime_get_coarse_ns()` (CLOCK_MONOTONIC_COARSE: tick resolution, at most a jiffy behind
    /// CLOCK_MONOTONIC) of the last forwarded packet; 0 = never.
    pub last_seen_ns: u64,
    /// Packets of this direction the kernel forwarded itself (counted by the TC arming program
    /// on egress: the fast path off or passing them up), segments of a GSO packet each.
    /// Conntrack counts these too; with `packets` they make what the router forwarded of the
    /// direction while it was offloaded, which the per-host metrics report.
    pub kernel_packets: u64,
    /// IP bytes of `kernel_packets`, as `bytes`.
    pub kernel_bytes: u64,
}
const _: () = assert!(core::mem::size_of::<FlowCounters>() == 40);

/// Value of [`MAP_HOST_TRAFFIC`] (per CPU): one LAN host's traffic, in the units of
/// [`FlowCounters`] (packets, GSO segments each; IP bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Packets the host sent (the directions it is the source of).
    pub transmit_packets: u64,
    /// IP bytes of `transmit_packets`.
    pub transmit_bytes: u64,
    /// Packets sent to the host.
    pub receive_packets: u64,
    /// IP bytes of `receive_packets`.
    pub receive_bytes: u64,
}
const _: () = assert!(core::mem::size_of::<HostCounters>() == 32);

/// Value of [`MAP_FLOWS_V4`]: what to do with a packet matching the key.
///
/// After the rewrite the packet carries `new_src_be:new_sport_be -> new_dst_be:new_dport_be`.
/// Without NAT these equal the key's fields and both checksum diffs are 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowV4 {
    pub new_src_be: u32,
    pub new_dst_be: u32,
    pub new_sport_be: u16,
    pub new_dport_be: u16,
    /// `FLOW_F_*`.
    pub flags: u32,
    /// One's-complement sum to add to the IPv4 header checksum for the address rewrite
    /// (see [`checksum::nat_diff_v4`]); computed once per flow by the daemon.
    pub l3_csum_diff: u32,
    /// One's-complement sum to add to the TCP/UDP checksum for the address + port rewrite.
    pub l4_csum_diff: u32,
    /// When the kernel last forwarded a packet of this direction, in [`verdict_tick`]s of
    /// `bpf_ktime_get_coarse_ns()` (written by the TC arming program with
    /// `armed_generation`; 0 = never). While [`Settings::verdict_max_age`] is non-zero, the
    /// fast path forwards the direction only for that long after it: then the next packet
    /// goes through the kernel's rules again (`Reason::PassVerdictExpired`), so verdicts that
    /// change without a ruleset change (ipset membership, time matches, set element timeouts)
    /// reach offloaded flows.
    pub armed_at: u32,
    pub counters: FlowCounters,
    /// The datapath's copy of this direction's last FIB answer; the daemon writes it zeroed.
    pub fib: FibCache,
    /// [`Settings::ruleset_generation`] under which the kernel itself last forwarded a packet
    /// of this direction (set by the TC egress program `ARM_PROG_NAME` through the
    /// [`MAP_ARM_V4`] index). The fast path forwards the direction only while this equals the
    /// current generation: a new flow (written with 0) or any ruleset change sends its next
    /// packet through the kernel's rules first.
    pub armed_generation: u32,
    /// The packet mark (`skb->mark`) the kernel forwarded this direction with, recorded with
    /// `armed_generation`; passed to `bpf_fib_lookup` (`BPF_FIB_LOOKUP_MARK`) so that
    /// `ip rule fwmark` routing is the kernel's. 0 = no mark.
    pub fib_mark: u32,
    /// The DSCP the kernel sent this direction's arming packet out with, as
    /// `FLOW_DSCP_KNOWN | dscp` (0 = not recorded), written with `armed_generation`, plus
    /// [`FLOW_DSCP_REWRITTEN`] when that packet had arrived with another DSCP (stamped at TC
    /// ingress, see [`dscp_stamp`]). A rule in the forward path that rewrites the DSCP
    /// (`dscp set`, `-j DSCP`) shows here as a value that differs from what arrives. XDP
    /// forwards a packet whose DSCP is this one unchanged; another DSCP goes to the kernel
    /// (`Reason::PassDscpNotKernels`), unless the direction is `FLOW_DSCP_REWRITTEN` and the
    /// daemon proved from the ruleset that every DSCP rewrite is a constant on flow-constant
    /// matches ([`SETTINGS_F_DSCP_REWRITE`]): then XDP sets this DSCP itself, as the kernel's
    /// rule would.
    pub kernel_dscp: u32,
    /// The TTL the kernel sent this direction's last kernel-forwarded packet out with, as
    /// `FLOW_TTL_KNOWN | ttl` (0 = not recorded), written with `armed_generation`. XDP
    /// forwards a packet only if its TTL minus one is this one, i.e. what the kernel would
    /// send: a rule in the forward path that sets the TTL (`ip ttl set`, `-j TTL`) keeps the
    /// direction in the kernel (`Reason::PassTtlNotKernels`), so it applies to every packet.
    pub kernel_ttl: u32,
    /// `[sender, receiver]`: the [`MAP_HOST_TRAFFIC`] slots of this direction's LAN hosts
    /// (`HOST_SLOT_*`, written by the daemon): each packet the fast path or the kernel
    /// forwards adds to the sender's transmit and the receiver's receive counters.
    pub host_slots: [u32; 2],
}
const _: () = assert!(core::mem::size_of::<FlowV4>() == 136);
// The datapath reads and writes `armed_generation` with `fib_mark`, and `FibCache::generation`
// with `FibCache::ifindex`, as one ordered 64-bit word each (xdp-router-ebpf's order.rs).
const _: () = {
    use core::mem::offset_of;
    assert!(offset_of!(FlowV4, armed_generation) % 8 == 0);
    assert!(offset_of!(FlowV4, fib_mark) == offset_of!(FlowV4, armed_generation) + 4);
    assert!(offset_of!(FlowV6, armed_generation) % 8 == 0);
    assert!(offset_of!(FlowV6, fib_mark) == offset_of!(FlowV6, armed_generation) + 4);
    assert!(offset_of!(FlowV4, fib) % 8 == 0 && offset_of!(FlowV6, fib) % 8 == 0);
    assert!(offset_of!(FibCache, generation) == 0 && offset_of!(FibCache, ifindex) == 4);
};

/// Value of [`MAP_FLOWS_V6`]; see [`FlowV4`]. IPv6 has no header checksum.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowV6 {
    pub new_src_be: [u32; 4],
    pub new_dst_be: [u32; 4],
    pub new_sport_be: u16,
    pub new_dport_be: u16,
    /// `FLOW_F_*`.
    pub flags: u32,
    /// One's-complement sum to add to the TCP/UDP checksum for the address + port rewrite.
    pub l4_csum_diff: u32,
    /// See [`FlowV4::armed_at`].
    pub armed_at: u32,
    pub counters: FlowCounters,
    /// See [`FlowV4::fib`].
    pub fib: FibCache,
    /// See [`FlowV4::armed_generation`] ([`MAP_ARM_V6`]).
    pub armed_generation: u32,
    /// See [`FlowV4::fib_mark`].
    pub fib_mark: u32,
    /// See [`FlowV4::kernel_dscp`] (the traffic class's DSCP).
    pub kernel_dscp: u32,
    /// See [`FlowV4::kernel_ttl`] (the hop limit).
    pub kernel_ttl: u32,
    /// See [`FlowV4::host_slots`].
    pub host_slots: [u32; 2],
}
const _: () = assert!(core::mem::size_of::<FlowV6>() == 152);

/// `FlowV4::kernel_dscp` / `FlowV6::kernel_dscp`: a DSCP is recorded (its 6 bits are below).
pub const FLOW_DSCP_KNOWN: u32 = 1 << 8;

/// `FlowV4::kernel_dscp` / `FlowV6::kernel_dscp`: the packet that recorded the DSCP arrived
/// with another one, so the kernel's rules rewrote it for this direction.
pub const FLOW_DSCP_REWRITTEN: u32 = 1 << 9;

/// The high bits of a [`dscp_stamp`]: the stamp program's, not another `tc_index` user's.
const DSCP_STAMP_TAG: u32 = 0xd000;

/// The `skb->tc_index` the TC ingress program `STAMP_PROG_NAME` gives a packet that arrived
/// with `dscp`: the arming program reads it on egress to see whether the kernel changed the
/// DSCP on the way ([`FLOW_DSCP_REWRITTEN`]). `tc_index` is otherwise used only by the
/// removed `dsmark` qdisc and `tcindex` classifier.
#[inline(always)]
pub const fn dscp_stamp(dscp: u8) -> u32 {
    DSCP_STAMP_TAG | (dscp & 0x3f) as u32
}

/// The `skb->tc_index` the TC fast path (`TC_PROG_NAME`) gives each packet it redirects: the
/// arming program, which runs on the egress after the redirect, skips such packets (they were
/// not forwarded by the kernel, so they must not re-arm or refresh a verdict). Not a
/// [`dscp_stamp`] value.
pub const FASTPATH_TC_INDEX: u32 = 0xd100;

/// The arrival DSCP a `tc_index` carries, if the stamp program set it (see [`dscp_stamp`]).
#[inline(always)]
pub const fn stamped_dscp(tc_index: u32) -> Option<u8> {
    if tc_index & !0x3f == DSCP_STAMP_TAG {
        Some((tc_index & 0x3f) as u8)
    } else {
        None
    }
}

/// `FlowV4::kernel_ttl` / `FlowV6::kernel_ttl`: a TTL / hop limit is recorded (its 8 bits are
/// below).
pub const FLOW_TTL_KNOWN: u32 = 1 << 8;

/// Key of [`MAP_ARM_V4`]: one flow direction as the kernel sends it out, after NAT (the
/// direction's rewritten source and destination). Its value is the direction's
/// [`FlowKeyV4`] in [`MAP_FLOWS_V4`]; the daemon writes both together.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ArmKeyV4 {
    /// Source address as the packet leaves (network order).
    pub src_be: u32,
    /// Destination address as the packet leaves (network order).
    pub dst_be: u32,
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// IP protocol number.
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<ArmKeyV4>() == 16);

/// Key of [`MAP_ARM_V6`]; see [`ArmKeyV4`]. Its value is a [`FlowKeyV6`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ArmKeyV6 {
    /// Source address as the packet leaves (network order).
    pub src_be: [u32; 4],
    /// Destination address as the packet leaves (network order).
    pub dst_be: [u32; 4],
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// IP protocol number.
    pub proto: u8,
    pub _pad: [u8; 3],
}
const _: () = assert!(core::mem::size_of::<ArmKeyV6>() == 40);

/// A flow direction's cached `bpf_fib_lookup` answer, written and read only by the datapath.
///
/// The FIB is still the kernel's: the datapath asks `bpf_fib_lookup` and keeps the answer (egress
/// interface, MACs) in the flow entry, then reuses it for the flow's next packets as long as
/// 1. `generation` equals [`Settings::fib_generation`], which the daemon bumps on every
///    rtnetlink notification that can change a lookup's answer (routes, rules, addresses, links,
///    neighbours, forwarding sysctls) and after every lost notification;
/// 2. it is younger than [`Settings::fib_cache_ns`] (a bound on staleness that needs no daemon);
/// 3. the packet is not longer than `max_len`, the largest IP length the lookup accepted (so the
///    MTU check of the lookup still holds), and has the same TOS / flow information.
///
/// Otherwise the packet takes a full lookup, whose answer replaces the cache. Writers mark the
/// entry invalid (`generation` 0) before rewriting it and readers check `generation` again after
/// copying it, so a half-written entry is never used.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FibCache {
    /// [`Settings::fib_generation`] the answer belongs to; 0 = empty.
    pub generation: u32,
    /// Egress interface (host order).
    pub ifindex: u32,
    /// The lookup's TOS (IPv4, low byte) or flow information (IPv6) input, raw: policy rules
    /// may route by it, so a packet with another value takes a full lookup.
    pub tos_flowinfo: u32,
    /// Largest IP datagram length (host order) the lookup let through the egress MTU.
    pub max_len: u16,
    /// Source MAC for the egress (the router's).
    pub smac: [u8; 6],
    /// Destination MAC (the next hop's).
    pub dmac: [u8; 6],
    pub _pad: [u8; 6],
    /// `bpf_ktime_get_coarse_ns()` when the lookup ran.
    pub filled_ns: u64,
}
const _: () = assert!(core::mem::size_of::<FibCache>() == 40);

/// Key of [`MAP_BRIDGE_FDB`]: a MAC address behind a managed bridge (VLAN-unaware bridges:
/// the kernel's FDB entries without a VLAN). The value is the port's ifindex (host order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FdbKey {
    /// The bridge's ifindex (host order).
    pub bridge_ifindex: u32,
    /// The MAC address (wire order).
    pub mac: [u8; 6],
    /// The VLAN the entry is in (host order): 0 on a bridge without VLAN filtering, whose
    /// entries have none.
    pub vid: u16,
}
const _: () = assert!(core::mem::size_of::<FdbKey>() == 12);

/// Key of [`MAP_BRIDGE_VLANS`]: a VLAN a port of a VLAN-filtering bridge, or the bridge itself
/// (its `self` entries: `bridge vlan add dev br-lan vid 20 self`), is a member of. The value is
/// `BRIDGE_VLAN_F_*` flags.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BridgeVlanKey {
    /// The port's (or the bridge's) ifindex (host order).
    pub ifindex: u32,
    /// The VLAN ID (host order, 1..4094).
    pub vid: u16,
    pub _pad: u16,
}
const _: () = assert!(core::mem::size_of::<BridgeVlanKey>() == 8);

/// [`MAP_BRIDGE_VLANS`] value flag: the member sends this VLAN's frames untagged (a port's
/// `untagged`; for the bridge itself: its own IP layer sees the VLAN on the bridge device,
/// not on a VLAN device over it).
pub const BRIDGE_VLAN_F_UNTAGGED: u32 = 1;

/// Capacity of [`MAP_BRIDGE_VLANS`] (VLAN memberships of managed bridges and their ports).
pub const BRIDGE_VLANS_CAPACITY: u32 = 8192;

/// One packets/bytes counter in the per-CPU [`MAP_STATS`] array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

/// The single entry (index 0) of the [`MAP_SETTINGS`] array, written by the daemon.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Non-zero: established flows are forwarded in XDP. Zero: every packet is passed to the
    /// kernel (`Reason::PassDisabled`). Flipped live for A/B runs; nothing is detached.
    pub fastpath_enabled: u32,
    /// Current FIB generation (see [`FibCache`]); 0 disables the cache (every packet takes a
    /// full `bpf_fib_lookup`).
    pub fib_generation: u32,
    /// Longest a cached FIB answer is used, in ns; 0 disables the cache.
    pub fib_cache_ns: u64,
    /// Current firewall ruleset generation, bumped by the daemon on every nftables commit
    /// (and iptables-legacy change); starts at 1. A flow direction is forwarded only while its
    /// [`FlowV4::armed_generation`] equals it.
    pub ruleset_generation: u32,
    /// `SETTINGS_F_*`.
    pub flags: u32,
    /// Non-zero: verify TCP/UDP checksums before forwarding (`Reason::PassL4Checksum`), as
    /// conntrack does while `net.netfilter.nf_conntrack_checksum` is 1 (the daemon mirrors it).
    pub verify_l4_checksum: u32,
    /// Longest the fast path forwards a flow direction after the kernel last forwarded one of
    /// its packets, in [`verdict_tick`]s (see [`FlowV4::armed_at`]); 0 = no limit (the
    /// verdict holds until the ruleset changes, as in the kernel's flowtable).
    pub verdict_max_age: u32,
    /// Start of the current keep-alive pass, in `bpf_ktime_get_coarse_ns()` time; 0 = record
    /// nothing. The fast path records a connection in [`MAP_ACTIVE_V4`] / [`MAP_ACTIVE_V6`]
    /// when it forwards a packet of one of its directions whose `last_seen_ns` is older than
    /// this (the direction's first packet in the pass), so the daemon refreshes the conntrack
    /// timeouts of the connections that carried traffic without reading every flow entry.
    pub active_since_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Settings>() == 40);

/// log2 of the nanoseconds in a [`verdict_tick`] (2^20 ns ≈ 1.05 ms).
pub const VERDICT_TICK_SHIFT: u32 = 20;

/// A time in `bpf_ktime_get_coarse_ns()` nanoseconds as the 32-bit tick count
/// [`FlowV4::armed_at`] and [`Settings::verdict_max_age`] hold. Ages are compared with
/// wrapping subtraction; the count wraps after about 52 days.
#[inline(always)]
pub const fn verdict_tick(ns: u64) -> u32 {
    (ns >> VERDICT_TICK_SHIFT) as u32
}

/// `Settings::flags`: `bpf_fib_lookup` honours `BPF_FIB_LOOKUP_MARK` (Linux 6.10). Without
/// it a direction the kernel forwarded with a non-zero mark is never armed.
pub const SETTINGS_F_FIB_MARK: u32 = 1 << 0;

/// `Settings::flags`: the firewall ruleset has a rule that must see every packet (a rate
/// limit, quota, queue, log, …; see `Reason::PassPerPacketRule`) in a chain that forwarded
/// packets traverse, or the daemon could not read the ruleset: every packet goes to the
/// kernel, counted `PassPerPacketRule`. The daemon also sets it while it reads the ruleset
/// after a change, so no flow re-armed under the new ruleset is fast-pathed before it knows.
pub const SETTINGS_F_HOLD_ALL: u32 = 1 << 1;

/// `Settings::flags`: the daemon proved from the ruleset that the DSCP the kernel sends an
/// established flow direction out with is a function of the flow alone (every rule that sets
/// one sets a constant, and no rule in the forward path matches anything that changes from
/// packet to packet): XDP applies a recorded rewrite (`FLOW_DSCP_REWRITTEN`) itself instead of
/// passing the packet to the kernel.
pub const SETTINGS_F_DSCP_REWRITE: u32 = 1 << 2;

/// `BPF_FIB_LOOKUP_MARK` (Linux 6.10, commit "bpf: Add support for passing mark with
/// bpf_fib_lookup"): route with `bpf_fib_lookup::mark`, the 4 bytes at offset 52 that share a
/// union with the output `smac`/`dmac`.
pub const FIB_LOOKUP_MARK: u32 = 1 << 5;

#[cfg(feature = "user")]
mod pod {
    use super::*;
    /// Marks map types as plain old data for aya.
    macro_rules! pod {
        ($($t:ty),* $(,)?) => {$(
            // SAFETY: every type listed is #[repr(C)], made only of integers and integer
            // arrays, with explicit padding fields, so every bit pattern is valid and there
            // are no implicit holes.
            unsafe impl aya::Pod for $t {}
        )*};
    }
    pod!(
        FlowKeyV4,
        FlowKeyV6,
        FlowV4,
        FlowV6,
        HostCounters,
        IfaceInfo,
        Counter,
        Settings,
        FibCache,
        ArmKeyV4,
        ArmKeyV6,
        FdbKey,
        VlanKey,
        PppoeKey,
        BridgeVlanKey,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dscp_stamp_round_trips_and_other_tc_index_values_are_not_stamps() {
        for dscp in 0..64u8 {
            assert_eq!(stamped_dscp(dscp_stamp(dscp)), Some(dscp));
        }
        // Only the low 6 bits of a DSCP are kept.
        assert_eq!(stamped_dscp(dscp_stamp(0xff)), Some(0x3f));
        // Untouched skbs (0) and another user's classes are not stamps.
        for other in [0, 1, 0x10, 0xc000, 0xd040, 0xffff, 0x1_d000] {
            assert_eq!(stamped_dscp(other), None, "{other:#x}");
        }
    }
}
