//! Every map of the xdp-router program. Names and value types come from `xdp-router-common`
//! (the map ABI); the daemon finds them by those names and may resize the flow maps at load time
//! (`EbpfLoader::map_max_entries`).

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMapHash, HashMap, PerCpuArray},
};
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, BRIDGE_VLANS_CAPACITY, BridgeVlanKey, Counter, DEFAULT_FLOW_CAPACITY,
    DEFAULT_HOST_SLOTS, FDB_CAPACITY, FIB_LOOKUP_DIRECT, FdbKey, FlowKeyV4, FlowKeyV6, FlowV4,
    FlowV6, HostCounters, IfaceInfo, MAX_IFACE_SLOTS, PPPOE_CAPACITY, PppoeKey, STATS_ENTRIES,
    Settings, VLANS_CAPACITY, VlanKey,
};

/// `BPF_F_NO_PREALLOC`: entries are allocated on insert, so a map costs kernel memory for the
/// entries it holds, not for its capacity, and is created at once whatever its size (a
/// preallocated map of 2.5 M entries took seconds to create and ~750 B per entry slot). The
/// programs only look entries up and update fields in place; the daemon does every insert and
/// delete, and a deleted entry is freed after an RCU grace period (a program still holding it
/// writes to memory that is not reused meanwhile). The active maps hold only the connections
/// that carried traffic in one keep-alive pass, a small part of their capacity.
const BPF_F_NO_PREALLOC: u32 = 1;

/// Offloaded IPv4 flow directions (one entry per direction of a connection), written by the
/// daemon from conntrack; the datapath only updates each entry's counters.
#[map]
pub static FLOWS_V4: HashMap<FlowKeyV4, FlowV4> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// Offloaded IPv6 flow directions; see [`FLOWS_V4`].
#[map]
pub static FLOWS_V6: HashMap<FlowKeyV6, FlowV6> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// Offloaded IPv4 flow directions by their tuple as the kernel sends them out (after NAT):
/// the value is the direction's `FLOWS_V4` key. Read by the TC egress program to arm the
/// direction the kernel just forwarded; written by the daemon with the flow entries.
#[map]
pub static ARM_V4: HashMap<ArmKeyV4, FlowKeyV4> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// IPv6 counterpart of [`ARM_V4`].
#[map]
pub static ARM_V6: HashMap<ArmKeyV6, FlowKeyV6> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// IPv4 connections (by original direction key, ifindex 0) the fast path forwarded a packet of since the start of
/// the current keep-alive pass (`Settings::active_since_ns`); the daemon drains it every pass
/// and refreshes their conntrack timeouts. Sized like the flow maps at load time, so it never
/// fills: a connection has two entries in `FLOWS_V4` and one here.
#[map]
pub static ACTIVE_V4: HashMap<FlowKeyV4, u8> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// IPv6 counterpart of [`ACTIVE_V4`].
#[map]
pub static ACTIVE_V6: HashMap<FlowKeyV6, u8> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, BPF_F_NO_PREALLOC);

/// Managed interfaces by ifindex: stats slot and `IFACE_F_*` flags. A packet is forwarded only
/// to an egress interface listed here.
#[map]
pub static IFACES: HashMap<u32, IfaceInfo> = HashMap::with_max_entries(MAX_IFACE_SLOTS, 0);

/// Redirect targets by ifindex (value: the same ifindex). The daemon keeps it in step with
/// [`IFACES`]; an egress missing here is treated as not managed.
#[map]
pub static TX_PORTS: DevMapHash = DevMapHash::with_max_entries(MAX_IFACE_SLOTS, 0);

/// The managed bridges' FDBs: which port a MAC address is behind (value: the port's
/// ifindex), synced by the daemon from the kernel's bridge FDB (rtnetlink `AF_BRIDGE`
/// neighbours). A packet routed out of a bridge is redirected to that port.
#[map]
pub static BRIDGE_FDB: HashMap<FdbKey, u32> = HashMap::with_max_entries(FDB_CAPACITY, 0);

/// The VLANs the ports of managed VLAN-filtering bridges, and those bridges themselves, are
/// members of (value: `BRIDGE_VLAN_F_*`), synced by the daemon from the kernel's bridge VLAN
/// table (rtnetlink `AF_BRIDGE` links with `RTEXT_FILTER_BRVLAN`: `bridge vlan show`).
#[map]
pub static BRIDGE_VLANS: HashMap<BridgeVlanKey, u32> =
    HashMap::with_max_entries(BRIDGE_VLANS_CAPACITY, 0);

/// The managed VLAN devices by the tag they receive on their parent (value: the VLAN
/// device's ifindex, whose `IFACES` entry says how to tag on egress), written by the daemon
/// from rtnetlink (`IFLA_LINK`, `IFLA_VLAN_ID`, `IFLA_VLAN_PROTOCOL`).
#[map]
pub static VLANS: HashMap<VlanKey, u32> = HashMap::with_max_entries(VLANS_CAPACITY, 0);

/// The managed PPPoE sessions by session ID on their lower device (value: the PPP device's
/// ifindex, whose `IFACES` entry names the peer and says how to encapsulate on egress),
/// written by the daemon from the kernel's sessions (`/proc/net/pppoe`).
#[map]
pub static PPPOE: HashMap<PppoeKey, u32> = HashMap::with_max_entries(PPPOE_CAPACITY, 0);

/// Per-CPU packets/bytes per (ingress slot, reason), at `stats_index(slot, reason)`.
#[map]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(STATS_ENTRIES, 0);

/// Packets of offloaded flow directions the kernel forwarded, per CPU (`arm.rs`), at index 0:
/// the daemon reads whether any direction was armed since it wrote a batch of flows
/// (`MAP_KERNEL_FORWARDED`).
#[map]
pub static KERNEL_FWD: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// What the router forwarded per LAN host, per CPU, by host slot (`FlowV4::host_slots`;
/// `hosts.rs` adds to it). The daemon sizes it from `host_metrics_limit` at load time and
/// sums the CPUs at each scrape.
#[map]
pub static HOST_TRAFFIC: PerCpuArray<HostCounters> =
    PerCpuArray::with_max_entries(DEFAULT_HOST_SLOTS, 0);

/// Runtime settings, one entry (index 0), written by the daemon.
#[map]
pub static SETTINGS: Array<Settings> = Array::with_max_entries(1, 0);

/// Extra `bpf_fib_lookup` flags (`GLOBAL_FIB_FLAGS`), fixed at load time by the loader
/// (`EbpfLoader::override_global`). The daemon leaves it 0: a full lookup through the FIB rules,
/// as the kernel routes; the fixtures load `FIB_LOOKUP_DIRECT` to test that flag. Read with
/// [`fib_flags`].
#[unsafe(no_mangle)]
static FIB_FLAGS: u32 = 0;

/// The `bpf_fib_lookup` flags to use: [`FIB_FLAGS`] restricted to `FIB_LOOKUP_DIRECT`, the only
/// flag that keeps the lookup's meaning (the others add outputs or skip the neighbour).
#[inline(always)]
pub fn fib_flags() -> u32 {
    // SAFETY: reading a static; volatile so that the value the loader wrote into .rodata is
    // used instead of the compile-time 0.
    unsafe { core::ptr::read_volatile(&FIB_FLAGS) & FIB_LOOKUP_DIRECT }
}
