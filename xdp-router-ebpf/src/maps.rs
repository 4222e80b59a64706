//! Every map of the xdp-router program. Names and value types come from `xdp-router-common`
//! (the map ABI); the daemon finds them by those names and may resize the flow maps at load time
//! (`EbpfLoader::map_max_entries`).

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMapHash, HashMap, PerCpuArray},
};
use xdp_router_common::{
    Counter, DEFAULT_FLOW_CAPACITY, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, IfaceInfo,
    MAX_IFACE_SLOTS, STATS_ENTRIES, Settings,
};

/// Offloaded IPv4 flow directions (one entry per direction of a connection), written by the
/// daemon from conntrack; the datapath only updates each entry's counters.
#[map]
pub static FLOWS_V4: HashMap<FlowKeyV4, FlowV4> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, 0);

/// Offloaded IPv6 flow directions; see [`FLOWS_V4`].
#[map]
pub static FLOWS_V6: HashMap<FlowKeyV6, FlowV6> =
    HashMap::with_max_entries(DEFAULT_FLOW_CAPACITY, 0);

/// Managed interfaces by ifindex: stats slot and `IFACE_F_*` flags. A packet is forwarded only
/// to an egress interface listed here.
#[map]
pub static IFACES: HashMap<u32, IfaceInfo> = HashMap::with_max_entries(MAX_IFACE_SLOTS, 0);

/// Redirect targets by ifindex (value: the same ifindex). The daemon keeps it in step with
/// [`IFACES`]; an egress missing here is treated as not managed.
#[map]
pub static TX_PORTS: DevMapHash = DevMapHash::with_max_entries(MAX_IFACE_SLOTS, 0);

/// Per-CPU packets/bytes per (ingress slot, reason), at `stats_index(slot, reason)`.
#[map]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(STATS_ENTRIES, 0);

/// Runtime settings, one entry (index 0), written by the daemon.
#[map]
pub static SETTINGS: Array<Settings> = Array::with_max_entries(1, 0);
