//! The loaded eBPF object: the XDP program, its attachments and typed handles on its maps.
//!
//! One [`Datapath`] owns everything the kernel holds for us. Attachments are bpf_links owned by
//! this process, so when it exits for any reason (SIGTERM, panic, SIGKILL) the kernel detaches
//! the program and carries every packet itself.

use std::{collections::BTreeMap, time::Duration};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, xdp::DevMapHash},
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode,
        links::LinkType,
        loaded_links,
        tc::{SchedClassifierLinkId, TcAttachOptions},
        xdp::XdpLinkId,
    },
    util::KernelVersion,
};
use tracing::{debug, error, info, warn};
use xdp_router_common::{
    ARM_L3_PROG_NAME, ARM_PROG_NAME, ArmKeyV4, ArmKeyV6, BRIDGE_VLAN_F_UNTAGGED, BridgeVlanKey,
    Counter, FdbKey, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT,
    IFACE_F_GENERIC_XDP, IFACE_F_NO_XDP_XMIT, IFACE_F_PPP_CCP, IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER,
    IFACE_F_VLAN, IFACE_F_VLAN_PARENT, IfaceInfo, MAP_ACTIVE_V4, MAP_ACTIVE_V6, MAP_ARM_V4,
    MAP_ARM_V6, MAP_BRIDGE_FDB, MAP_BRIDGE_VLANS, MAP_FLOWS_V4, MAP_FLOWS_V6, MAP_IFACES,
    MAP_PPPOE, MAP_SETTINGS, MAP_STATS, MAP_TX_PORTS, MAP_VLANS, MAX_IFACE_SLOTS, PROG_NAME,
    PppoeKey, Reason, SETTINGS_F_FIB_MARK, Settings, VlanKey, stats_index,
};

use crate::{config::XdpModeConfig, flows::FlowTable, status::FibCacheStatus};

/// The xdp-router eBPF object, built by build.rs (aya-build) and embedded in the binary.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"));

/// How the program ended up attached to an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    Native,
    Generic,
    /// A bridge: the program runs on its ports (each with its own mode), not on it.
    Ports,
    /// A PPP device: never on it; the program runs on its PPPoE session's lower device (see
    /// [`Datapath::attach_ppp`]).
    Lower,
}

impl AttachMode {
    /// Name used in `status` and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Ports => "ports",
            AttachMode::Lower => "lower",
        }
    }
}

/// The parent of a managed VLAN device, where the program runs (see
/// [`Datapath::attach_vlan`]; a bridge when `flags` has `IFACE_F_BRIDGE`); also the lower
/// device of a managed PPPoE session (see [`PppoeBinding`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VlanParent {
    pub name: String,
    pub ifindex: u32,
    /// Stats slot for what it receives that is not the VLANs' (when not managed itself).
    pub slot: u32,
    /// Its `IFACE_F_*` flags (XDP transmit, shaping, hooks), as for a managed interface.
    pub flags: u32,
    pub mac: [u8; 6],
}

/// A PPPoE session as [`Datapath::set_pppoe`] binds it to its PPP device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PppoeBinding {
    /// The session ID as the kernel holds it (network order).
    pub sid_be: u16,
    /// The access concentrator's MAC.
    pub peer_mac: [u8; 6],
    /// The device the session runs over, where its frames arrive; `slot` and `flags` are used
    /// when it is registered for the session only.
    pub lower: VlanParent,
    /// When `lower` is a VLAN device: its VLAN ID and tag protocol, and its parent, where the
    /// program then runs.
    pub vlan: Option<((u16, u16), VlanParent)>,
}

/// The loaded object, its attachments and typed map handles.
pub struct Datapath {
    ebpf: Ebpf,
    flows_v4: HashMap<MapData, FlowKeyV4, FlowV4>,
    flows_v6: HashMap<MapData, FlowKeyV6, FlowV6>,
    ifaces: HashMap<MapData, u32, IfaceInfo>,
    tx_ports: DevMapHash<MapData>,
    stats: PerCpuArray<MapData, Counter>,
    settings: Array<MapData, Settings>,
    /// What `settings` holds (the daemon is its only writer).
    current: Settings,
    /// Successful [`Datapath::invalidate_fib_cache`] calls.
    fib_invalidations: u64,
    /// XDP links, by ifindex.
    attached: BTreeMap<u32, XdpLinkId>,
    flow_capacity: u32,
    arm_v4: HashMap<MapData, ArmKeyV4, FlowKeyV4>,
    arm_v6: HashMap<MapData, ArmKeyV6, FlowKeyV6>,
    /// Connections the datapath forwarded packets of in the current keep-alive pass.
    active_v4: HashMap<MapData, FlowKeyV4, u8>,
    active_v6: HashMap<MapData, FlowKeyV6, u8>,
    /// TC egress (TCX) links of the arming programs, by ifindex, with the program's name
    /// ([`ARM_PROG_NAME`], or [`ARM_L3_PROG_NAME`] on a PPP device).
    armed_ifaces: BTreeMap<u32, (&'static str, SchedClassifierLinkId)>,
    /// Successful [`Datapath::bump_ruleset_generation`] calls.
    ruleset_changes: u64,
    /// Why the interfaces in generic mode did not get native XDP (config asked for native).
    generic_because: BTreeMap<u32, String>,
    /// The managed bridges' FDBs.
    fdb: HashMap<MapData, FdbKey, u32>,
    /// The VLANs of the managed VLAN-filtering bridges and their ports.
    bridge_vlans: HashMap<MapData, BridgeVlanKey, u32>,
    /// The managed VLAN devices by their tag on the parent.
    vlans: HashMap<MapData, VlanKey, u32>,
    /// The mode the XDP program got on each interface in `attached`.
    modes: BTreeMap<u32, AttachMode>,
    /// The managed VLAN devices (ifindex → their `VLANS` key), to find what to undo.
    vlan_keys: BTreeMap<u32, VlanKey>,
    /// The kernel refused `BPF_MAP_UPDATE_BATCH` (before 5.6): one update per entry.
    no_batch: bool,
    /// The managed PPPoE sessions, by their frames on the lower device.
    pppoe: HashMap<MapData, PppoeKey, u32>,
    /// The registered PPP devices (ifindex → the `PPPOE` key of their session, when bound).
    ppp_devices: BTreeMap<u32, Option<PppoeKey>>,
}

/// `BPF_MAP_UPDATE_BATCH` (Linux 5.6) on the map `fd`: `keys[i]` → `values[i]` in one system
/// call (the kernel stops at the first failing entry). aya 0.14 has no wrapper.
fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    /// The batch member of `union bpf_attr` (include/uapi/linux/bpf.h).
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    if keys.len() != values.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(keys.len())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::E2BIG))?,
        map_fd: fd.as_raw_fd() as u32,
        // BPF_ANY
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: `attr` is a valid batch attribute of the size passed; `keys` and `values` hold
    // `count` Pod elements of the map's key and value sizes (the typed handles' K and V) and
    // outlive the call, which only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            std::ptr::from_mut(&mut attr),
            std::mem::size_of::<BatchAttr>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `flows` and their `arms` with one `BPF_MAP_UPDATE_BATCH` per map, or one update per
/// entry when the kernel has no batch support (remembered in `no_batch`).
fn insert_many<K: aya::Pod, V: aya::Pod, A: aya::Pod>(
    no_batch: &mut bool,
    flow_map: &mut HashMap<MapData, K, V>,
    arm_map: &mut HashMap<MapData, A, K>,
    flows: &[(K, V)],
    arms: &[(A, K)],
) -> Result<(), MapError> {
    let (fk, fv): (Vec<_>, Vec<_>) = flows.iter().copied().unzip();
    let (ak, av): (Vec<_>, Vec<_>) = arms.iter().copied().unzip();
    let flows_written = !*no_batch && insert_batch(flow_map, &fk, &fv)?;
    if flows_written && insert_batch(arm_map, &ak, &av)? {
        return Ok(());
    }
    *no_batch = true;
    if !flows_written {
        flows
            .iter()
            .try_for_each(|(k, v)| flow_map.insert(k, v, 0))?;
    }
    arms.iter().try_for_each(|(a, k)| arm_map.insert(a, k, 0))
}

/// [`update_batch`] on an aya hash map; `Ok(false)` when the kernel does not know the command.
fn insert_batch<K: aya::Pod, V: aya::Pod>(
    map: &HashMap<MapData, K, V>,
    keys: &[K],
    values: &[V],
) -> Result<bool, MapError> {
    use aya::maps::IterableMap as _;
    use std::os::fd::AsFd as _;
    match update_batch(map.map().fd().as_fd(), keys, values) {
        Ok(()) => Ok(true),
        // EINVAL: an unknown command; ENOTSUPP (524, kernel-internal) / EOPNOTSUPP: a map type
        // without batch support.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | 524)
            ) =>
        {
            Ok(false)
        }
        Err(io_error) => Err(MapError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_update_batch",
            io_error,
        })),
    }
}

/// The `IFACE_F_*` bits the datapath owns, kept when the state rewrites an interface's flags:
/// what the interface is, whether the program runs on it in generic mode, and whether the XDP
/// program saw CCP run on its PPPoE session.
const DATAPATH_FLAGS: u32 = IFACE_F_BRIDGE
    | IFACE_F_BRIDGE_PORT
    | IFACE_F_VLAN
    | IFACE_F_VLAN_PARENT
    | IFACE_F_PPPOE
    | IFACE_F_PPPOE_LOWER
    | IFACE_F_PPP_CCP
    | IFACE_F_GENERIC_XDP;

/// The `BRIDGE_FDB` key of `mac` behind `bridge` in VLAN `vid` (0: none).
fn fdb_key(bridge: u32, mac: [u8; 6], vid: u16) -> FdbKey {
    FdbKey {
        bridge_ifindex: bridge,
        mac,
        vid,
    }
}

/// The `BRIDGE_VLANS` key of VLAN `vid` on `ifindex`.
fn bridge_vlan_key(ifindex: u32, vid: u16) -> BridgeVlanKey {
    BridgeVlanKey {
        ifindex,
        vid,
        _pad: 0,
    }
}

fn take<T: TryFrom<aya::maps::Map, Error = MapError>>(
    ebpf: &mut Ebpf,
    name: &str,
) -> anyhow::Result<T> {
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow!("eBPF object has no map {name}"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

impl Datapath {
    /// Loads the embedded object with flow maps of `flow_capacity` entries each and verifies
    /// the program. Nothing is attached yet. The fast path starts switched on.
    pub fn load(flow_capacity: u32) -> anyhow::Result<Datapath> {
        Self::load_object(EBPF_OBJECT, flow_capacity)
    }

    /// [`Datapath::load`] for an arbitrary object (tests).
    pub fn load_object(object: &[u8], flow_capacity: u32) -> anyhow::Result<Datapath> {
        // XDP bpf_links (5.9) are what makes the daemon fail-open: without them an attachment
        // would outlive the process. (An unreadable version is left to the load to judge.)
        if let Ok(v) = KernelVersion::current()
            && v < KernelVersion::new(5, 9, 0)
        {
            bail!("Linux {v} is too old: xdp-routerd needs 5.9 or newer (XDP bpf_link)");
        }
        let mut ebpf = EbpfLoader::new()
            .map_max_entries(MAP_FLOWS_V4, flow_capacity)
            .map_max_entries(MAP_FLOWS_V6, flow_capacity)
            .map_max_entries(MAP_ARM_V4, flow_capacity)
            .map_max_entries(MAP_ARM_V6, flow_capacity)
            .map_max_entries(MAP_ACTIVE_V4, flow_capacity)
            .map_max_entries(MAP_ACTIVE_V6, flow_capacity)
            .load(object)
            .map_err(explain_load_error)?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {PROG_NAME}"))?
            .try_into()?;
        prog.load()
            .map_err(|e| anyhow!("the kernel rejected the XDP program: {e:#}"))?;
        let arm: &mut SchedClassifier = ebpf
            .program_mut(ARM_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {ARM_PROG_NAME}"))?
            .try_into()?;
        arm.load().map_err(|e| {
            anyhow!(
                "the kernel rejected the TC arming program (it needs CONFIG_XFRM for \
                     bpf_skb_get_xfrm_state): {e:#}"
            )
        })?;
        let arm3: &mut SchedClassifier = ebpf
            .program_mut(ARM_L3_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {ARM_L3_PROG_NAME}"))?
            .try_into()?;
        arm3.load().map_err(|e| {
            anyhow!("the kernel rejected the TC arming program for PPP devices: {e:#}")
        })?;
        // bpf_fib_lookup takes the packet mark from Linux 6.10 (BPF_FIB_LOOKUP_MARK); before,
        // marked flow directions are never armed (policy routing by mark stays in the kernel).
        let fib_mark = KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 10, 0));
        let mut dp = Datapath {
            flows_v4: take(&mut ebpf, MAP_FLOWS_V4)?,
            flows_v6: take(&mut ebpf, MAP_FLOWS_V6)?,
            ifaces: take(&mut ebpf, MAP_IFACES)?,
            tx_ports: take(&mut ebpf, MAP_TX_PORTS)?,
            stats: take(&mut ebpf, MAP_STATS)?,
            settings: take(&mut ebpf, MAP_SETTINGS)?,
            current: Settings {
                // Until the daemon has read nf_conntrack_checksum: verify (the kernel default).
                verify_l4_checksum: 1,
                _pad: 0,
                // Until the first keep-alive pass: record every flow's first packet.
                active_since_ns: 1,
                fastpath_enabled: 1,
                fib_generation: 1,
                fib_cache_ns: 0,
                ruleset_generation: 1,
                flags: if fib_mark { SETTINGS_F_FIB_MARK } else { 0 },
            },
            fib_invalidations: 0,
            attached: BTreeMap::new(),
            flow_capacity,
            arm_v4: take(&mut ebpf, MAP_ARM_V4)?,
            arm_v6: take(&mut ebpf, MAP_ARM_V6)?,
            active_v4: take(&mut ebpf, MAP_ACTIVE_V4)?,
            active_v6: take(&mut ebpf, MAP_ACTIVE_V6)?,
            armed_ifaces: BTreeMap::new(),
            ruleset_changes: 0,
            generic_because: BTreeMap::new(),
            fdb: take(&mut ebpf, MAP_BRIDGE_FDB)?,
            bridge_vlans: take(&mut ebpf, MAP_BRIDGE_VLANS)?,
            vlans: take(&mut ebpf, MAP_VLANS)?,
            vlan_keys: BTreeMap::new(),
            modes: BTreeMap::new(),
            no_batch: false,
            pppoe: take(&mut ebpf, MAP_PPPOE)?,
            ppp_devices: BTreeMap::new(),
            ebpf,
        };
        dp.write_settings()?;
        Ok(dp)
    }

    fn program(&mut self) -> anyhow::Result<&mut Xdp> {
        Ok(self
            .ebpf
            .program_mut(PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {PROG_NAME}"))?
            .try_into()?)
    }

    /// Registers `ifindex` as managed (stats slot, flags, its own MAC, devmap entry) and
    /// attaches the program to it. Returns the mode it got.
    pub fn attach(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        let info = IfaceInfo {
            slot,
            flags,
            mac,
            l3_ifindex: 0,
            ..IfaceInfo::default()
        };
        self.register(name, ifindex, info, mode, true)
    }

    /// Registers `ifindex` as a port of the managed bridge `bridge_ifindex` (whose MAC is
    /// `bridge_mac`) and attaches the program to it: frames it receives for the bridge's MAC
    /// are routed as the bridge's, and packets routed out of the bridge to a MAC behind it are
    /// redirected to it (`BRIDGE_FDB`). No arming program: the kernel's routed packets leave
    /// through the bridge device, where that one runs.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the mode"
    )]
    pub fn attach_port(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        bridge_mac: [u8; 6],
        bridge_ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_BRIDGE_PORT,
            mac: bridge_mac,
            l3_ifindex: bridge_ifindex,
            ..IfaceInfo::default()
        };
        self.register(name, ifindex, info, mode, false)
    }

    /// Registers the bridge `ifindex` (`IFACE_F_BRIDGE`): no XDP program on it (it runs on the
    /// ports, see [`Datapath::attach_port`]) and no `TX_PORTS` entry (a bridge transmits no
    /// XDP frames), but the arming program on its egress, where the kernel's routed packets
    /// to the LAN leave.
    pub fn attach_bridge(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
    ) -> anyhow::Result<AttachMode> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_BRIDGE | IFACE_F_NO_XDP_XMIT,
            mac,
            l3_ifindex: 0,
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        self.attach_arming(name, ifindex, ARM_PROG_NAME);
        info!(interface = name, ifindex, "bridge: XDP runs on its ports");
        Ok(AttachMode::Ports)
    }

    /// Registers the VLAN device `ifindex` (VLAN `vid`, tag protocol `tpid`, over the parent
    /// `parent`): its `IFACES` entry (`IFACE_F_VLAN`, no `TX_PORTS` entry: the parent
    /// transmits), its `VLANS` entry, and the arming program on its egress, where the kernel's
    /// routed packets leave. The XDP program runs on the parent: attached here unless it runs
    /// there already (the parent is managed itself, or for another VLAN); a parent that is not
    /// managed itself gets an entry of its own (`IFACE_F_VLAN_PARENT`, stats slot
    /// `parent.slot`, flags `parent.flags`). A bridge parent (`IFACE_F_BRIDGE` in
    /// `parent.flags`, `br-lan.20`) gets no XDP program (it runs on the bridge's ports, which
    /// the caller attaches with [`Datapath::attach_port`]) and no `TX_PORTS` entry.
    #[expect(
        clippy::too_many_arguments,
        reason = "one per IFACES field plus the parent"
    )]
    pub fn attach_vlan(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
        mac: [u8; 6],
        (vid, tpid): (u16, u16),
        parent: &VlanParent,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let bridge = self
            .ifaces
            .get(&parent.ifindex, 0)
            .map_or(parent.flags, |i| i.flags)
            & IFACE_F_BRIDGE
            != 0;
        let mode = if bridge {
            // Registered already: managed itself, or for another VLAN.
            if self.ifaces.get(&parent.ifindex, 0).is_err() {
                if parent.slot == 0 || parent.slot >= MAX_IFACE_SLOTS {
                    bail!("interface slot {} out of range", parent.slot);
                }
                let info = IfaceInfo {
                    slot: parent.slot,
                    flags: parent.flags | IFACE_F_VLAN_PARENT | IFACE_F_NO_XDP_XMIT,
                    mac: parent.mac,
                    ..IfaceInfo::default()
                };
                self.ifaces
                    .insert(parent.ifindex, info, 0)
                    .with_context(|| format!("{}: cannot add to {MAP_IFACES}", parent.name))?;
            }
            AttachMode::Ports
        } else if self.attached.contains_key(&parent.ifindex) {
            self.attached_mode(parent.ifindex)
        } else {
            let info = IfaceInfo {
                slot: parent.slot,
                flags: parent.flags | IFACE_F_VLAN_PARENT,
                mac: parent.mac,
                ..IfaceInfo::default()
            };
            self.register(&parent.name, parent.ifindex, info, mode, false)?
        };
        let info = IfaceInfo {
            slot,
            flags: flags | IFACE_F_VLAN,
            mac,
            vlan_tci_be: vid.to_be(),
            lower_ifindex: parent.ifindex,
            vlan_tpid_be: tpid.to_be(),
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        let key = VlanKey {
            parent_ifindex: parent.ifindex,
            vid,
            tpid_be: tpid.to_be(),
        };
        self.vlans
            .insert(key, ifindex, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_VLANS}"))?;
        self.vlan_keys.insert(ifindex, key);
        // A VLAN device managed only as a PPPoE session's lower device: the kernel's routed
        // packets leave through the PPP device, where its own arming program runs.
        if flags & IFACE_F_PPPOE_LOWER == 0 {
            self.attach_arming(name, ifindex, ARM_PROG_NAME);
        }
        info!(
            interface = name,
            ifindex,
            parent = %parent.name,
            vid,
            tpid = format!("{tpid:#06x}"),
            mode = mode.as_str(),
            "VLAN device: XDP runs on its parent, tags popped and pushed there"
        );
        Ok(mode)
    }

    /// Forgets the VLAN device `ifindex` (see [`Datapath::attach_vlan`]) and detaches from its
    /// parent when the parent was managed only for its VLANs and none is left.
    fn detach_vlan(&mut self, ifindex: u32) {
        let Some(key) = self.vlan_keys.remove(&ifindex) else {
            return;
        };
        let _ = self.vlans.remove(&key);
        let parent = key.parent_ifindex;
        let in_use = self.vlan_keys.values().any(|k| k.parent_ifindex == parent);
        let parent_only = self
            .ifaces
            .get(&parent, 0)
            .is_ok_and(|i| i.flags & IFACE_F_VLAN_PARENT != 0);
        if !in_use && parent_only {
            self.detach(parent);
        }
    }

    /// Registers the PPP device `ifindex` (`ppp0`): its `IFACES` entry (stats slot, its own
    /// `flags`) and the L3 arming program on its egress, where the kernel's routed packets
    /// leave without a link-layer header. Never XDP (it would only run generic there, and
    /// never see a session frame) and never a `TX_PORTS` entry (the lower device transmits).
    /// The entry gets `IFACE_F_PPPOE` only while a session is bound ([`Datapath::set_pppoe`]):
    /// until then packets routed out of it go to the kernel.
    pub fn attach_ppp(
        &mut self,
        name: &str,
        ifindex: u32,
        slot: u32,
        flags: u32,
    ) -> anyhow::Result<AttachMode> {
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        let info = IfaceInfo {
            slot,
            flags: flags & !(IFACE_F_PPPOE | IFACE_F_PPPOE_LOWER),
            ..IfaceInfo::default()
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        self.ppp_devices.insert(ifindex, None);
        let _ = self.tx_ports.remove(ifindex);
        if !self.armed_ifaces.contains_key(&ifindex) {
            self.attach_arming(name, ifindex, ARM_L3_PROG_NAME);
        }
        info!(
            interface = name,
            ifindex, "PPP device: XDP runs on its PPPoE session's lower device"
        );
        Ok(AttachMode::Lower)
    }

    /// Binds the PPP device `ifindex` (registered by [`Datapath::attach_ppp`]) to `session`,
    /// or unbinds it (`None`). In the order that never forwards into a session that is not
    /// the current one: the old session goes first (the PPP device's entry loses
    /// `IFACE_F_PPPOE`, so nothing is sent into it, then its `PPPOE` key goes, so nothing of
    /// it is received as the PPP device's); then the lower device is registered (XDP attached
    /// in `mode`, `IFACE_F_PPPOE_LOWER`, unless it is registered already), the PPP device's
    /// entry rewritten (`IFACE_F_PPPOE`, session ID, peer, lower device and its MAC), and the
    /// new key added last; a lower device managed only for the old session is released at
    /// the end. On error the PPP device is left unbound.
    pub fn set_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        session: Option<&PppoeBinding>,
        mode: XdpModeConfig,
    ) -> anyhow::Result<()> {
        let Some(old) = self.ppp_devices.get(&ifindex).copied() else {
            bail!("{name}: not a registered PPP device");
        };
        let mut info = self.iface(ifindex)?;
        // The PPP device's entry without a session: its packets go to the kernel.
        let unbound = |i: IfaceInfo| IfaceInfo {
            slot: i.slot,
            // CCP seen (by the datapath) belongs to the session that goes.
            flags: i.flags & !(IFACE_F_PPPOE | IFACE_F_PPP_CCP),
            ..IfaceInfo::default()
        };
        if let Some(key) = old {
            info = unbound(info);
            self.update_iface(ifindex, info)?;
            let _ = self.pppoe.remove(&key);
            self.ppp_devices.insert(ifindex, None);
        }
        let result = match session {
            Some(s) => self.bind_pppoe(name, ifindex, &mut info, s, mode),
            None => Ok(()),
        };
        if session.is_none() || result.is_err() {
            self.update_iface(ifindex, unbound(info))?;
        }
        if let Some(key) = old
            && (result.is_err() || session.is_none_or(|s| s.lower.ifindex != key.lower_ifindex))
        {
            self.release_lower(key.lower_ifindex);
        }
        if let (Err(_), Some(s)) = (&result, session) {
            self.release_lower(s.lower.ifindex);
        }
        result
    }

    /// [`Datapath::set_pppoe`] with a session: lower device, entry, key.
    fn bind_pppoe(
        &mut self,
        name: &str,
        ifindex: u32,
        info: &mut IfaceInfo,
        s: &PppoeBinding,
        mode: XdpModeConfig,
    ) -> anyhow::Result<()> {
        let lower = &s.lower;
        match self.ifaces.get(&lower.ifindex, 0) {
            Ok(l) if l.flags & (IFACE_F_BRIDGE | IFACE_F_BRIDGE_PORT) != 0 => {
                bail!(
                    "{name}: its PPPoE session runs over a bridge or bridge port ({})",
                    lower.name
                )
            }
            Ok(mut l)
                if l.flags & IFACE_F_VLAN_PARENT != 0 && l.flags & IFACE_F_PPPOE_LOWER == 0 =>
            {
                // Managed only as the parent of VLANs so far: now its session frames too.
                l.flags |= IFACE_F_PPPOE_LOWER;
                self.update_iface(lower.ifindex, l)?;
            }
            Ok(mut l) if l.flags & IFACE_F_PPPOE_LOWER != 0 && l.mac != lower.mac => {
                // Managed for sessions (this one, another): its MAC as read now.
                l.mac = lower.mac;
                self.update_iface(lower.ifindex, l)?;
            }
            // Managed itself, or for another session already: the program runs there.
            Ok(_) => {}
            Err(_) => {
                let flags = lower.flags | IFACE_F_PPPOE_LOWER;
                match &s.vlan {
                    Some((vlan, parent)) => {
                        self.attach_vlan(
                            &lower.name,
                            lower.ifindex,
                            lower.slot,
                            flags,
                            lower.mac,
                            *vlan,
                            parent,
                            mode,
                        )?;
                    }
                    None => {
                        let l = IfaceInfo {
                            slot: lower.slot,
                            flags,
                            mac: lower.mac,
                            ..IfaceInfo::default()
                        };
                        self.register(&lower.name, lower.ifindex, l, mode, false)?;
                    }
                }
            }
        }
        *info = IfaceInfo {
            slot: info.slot,
            flags: info.flags | IFACE_F_PPPOE,
            mac: lower.mac,
            lower_ifindex: lower.ifindex,
            pppoe_sid_be: s.sid_be,
            peer_mac: s.peer_mac,
            ..IfaceInfo::default()
        };
        self.update_iface(ifindex, *info)?;
        let key = PppoeKey {
            lower_ifindex: lower.ifindex,
            sid_be: s.sid_be,
            _pad: 0,
        };
        self.pppoe
            .insert(key, ifindex, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_PPPOE}"))?;
        self.ppp_devices.insert(ifindex, Some(key));
        info!(
            interface = name,
            ifindex,
            lower = %lower.name,
            session_id = format!("{:#06x}", u16::from_be(s.sid_be)),
            "PPPoE session: XDP runs on its lower device, PPPoE and PPP headers popped and pushed there"
        );
        Ok(())
    }

    /// Whether a bound PPPoE session runs over `ifindex`.
    fn pppoe_lower_in_use(&self, ifindex: u32) -> bool {
        self.ppp_devices
            .values()
            .flatten()
            .any(|k| k.lower_ifindex == ifindex)
    }

    /// Stops managing `lower` as a PPPoE lower device when no bound session runs over it any
    /// more: detached when it was managed only for sessions, the flag cleared when it is
    /// still a VLAN parent. A device managed for itself is left as it is.
    fn release_lower(&mut self, lower: u32) {
        if self.pppoe_lower_in_use(lower) {
            return;
        }
        let Ok(mut info) = self.iface(lower) else {
            return;
        };
        if info.flags & IFACE_F_PPPOE_LOWER == 0 {
            return;
        }
        let vlan_parent = self.vlan_keys.values().any(|k| k.parent_ifindex == lower);
        if vlan_parent {
            info.flags &= !IFACE_F_PPPOE_LOWER;
            let _ = self.update_iface(lower, info);
        } else {
            self.detach(lower);
        }
    }

    /// Forgets the PPP device `ifindex`: its session's key, its entry and arming program, and
    /// the lower device when it was managed only for this session.
    fn detach_ppp(&mut self, ifindex: u32) {
        let key = self.ppp_devices.remove(&ifindex).flatten();
        if let Some(key) = key {
            let _ = self.pppoe.remove(&key);
        }
        self.detach_arming(ifindex);
        let _ = self.ifaces.remove(&ifindex);
        if let Some(key) = key {
            self.release_lower(key.lower_ifindex);
        }
    }

    /// `BRIDGE_FDB`: `mac` is behind `port` of `bridge` in VLAN `vid` (0: none).
    pub fn fdb_learn(
        &mut self,
        bridge: u32,
        mac: [u8; 6],
        vid: u16,
        port: u32,
    ) -> anyhow::Result<()> {
        self.fdb
            .insert(fdb_key(bridge, mac, vid), port, 0)
            .with_context(|| format!("cannot write {MAP_BRIDGE_FDB}"))
    }

    /// `BRIDGE_FDB`: `mac` is no longer known to `bridge` in VLAN `vid`.
    pub fn fdb_forget(&mut self, bridge: u32, mac: [u8; 6], vid: u16) {
        let _ = self.fdb.remove(&fdb_key(bridge, mac, vid));
    }

    /// `BRIDGE_VLANS`: `ifindex` (a port of a managed VLAN-filtering bridge, or the bridge) is
    /// a member of VLAN `vid`, sending it untagged when `untagged`.
    pub fn bridge_vlan_set(
        &mut self,
        ifindex: u32,
        vid: u16,
        untagged: bool,
    ) -> anyhow::Result<()> {
        let flags = if untagged { BRIDGE_VLAN_F_UNTAGGED } else { 0 };
        self.bridge_vlans
            .insert(bridge_vlan_key(ifindex, vid), flags, 0)
            .with_context(|| format!("cannot write {MAP_BRIDGE_VLANS}"))
    }

    /// `BRIDGE_VLANS`: `ifindex` is no longer a member of VLAN `vid`.
    pub fn bridge_vlan_remove(&mut self, ifindex: u32, vid: u16) {
        let _ = self.bridge_vlans.remove(&bridge_vlan_key(ifindex, vid));
    }

    /// Every `BRIDGE_VLANS` entry of `ifindex` goes (it is no longer managed).
    fn bridge_vlans_clear(&mut self, ifindex: u32) {
        let keys: Vec<BridgeVlanKey> = self
            .bridge_vlans
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.ifindex == ifindex)
            .collect();
        for k in keys {
            let _ = self.bridge_vlans.remove(&k);
        }
    }

    /// Writes the tag protocol (`tpid`, host order) and PVID (0: none) of a registered
    /// VLAN-filtering bridge or port into its `IFACES` entry (both 0 when it does not filter).
    /// The datapath reads them only while the entry has `IFACE_F_BRIDGE_VLAN_FILTERING`.
    pub fn set_bridge_pvid(&mut self, ifindex: u32, tpid: u16, pvid: u16) -> anyhow::Result<()> {
        let mut info = self.iface(ifindex)?;
        info.vlan_tpid_be = tpid.to_be();
        info.vlan_tci_be = pvid.to_be();
        self.update_iface(ifindex, info)
    }

    /// Every `BRIDGE_FDB` entry of `bridge` goes (the bridge went away or stopped being
    /// managed).
    pub fn fdb_clear(&mut self, bridge: u32) {
        let keys: Vec<FdbKey> = self
            .fdb
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.bridge_ifindex == bridge)
            .collect();
        for k in keys {
            let _ = self.fdb.remove(&k);
        }
    }

    /// Number of `BRIDGE_FDB` entries of `bridge`.
    pub fn fdb_len(&self, bridge: u32) -> usize {
        self.fdb
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.bridge_ifindex == bridge)
            .count()
    }

    /// The mode the program runs in on `ifindex`; `None` where it is not attached.
    pub fn mode_of(&self, ifindex: u32) -> Option<AttachMode> {
        self.modes.get(&ifindex).copied()
    }

    /// The mode the program got on `ifindex`, where it is attached.
    fn attached_mode(&self, ifindex: u32) -> AttachMode {
        self.modes
            .get(&ifindex)
            .copied()
            .unwrap_or(AttachMode::Native)
    }

    /// Writes `info` for `ifindex`, its `TX_PORTS` entry (unless it cannot transmit XDP frames)
    /// and attaches the program (and the arming program when `arm`).
    fn register(
        &mut self,
        name: &str,
        ifindex: u32,
        info: IfaceInfo,
        mode: XdpModeConfig,
        arm: bool,
    ) -> anyhow::Result<AttachMode> {
        let (slot, flags) = (info.slot, info.flags);
        if slot == 0 || slot >= MAX_IFACE_SLOTS {
            bail!("interface slot {slot} out of range");
        }
        // Generic until the attachment is known to be native (see IFACE_F_GENERIC_XDP).
        let info = IfaceInfo {
            flags: flags | IFACE_F_GENERIC_XDP,
            ..info
        };
        self.ifaces
            .insert(ifindex, info, 0)
            .with_context(|| format!("{name}: cannot add to {MAP_IFACES}"))?;
        // A device that cannot transmit XDP frames is no redirect target.
        if flags & IFACE_F_NO_XDP_XMIT == 0 {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .with_context(|| format!("{name}: cannot add to {MAP_TX_PORTS}"))?;
        }
        let mode = if self.attached.contains_key(&ifindex) {
            // The program already runs there for a VLAN device over it (see
            // `attach_vlan`): the interface is now managed itself too.
            self.attached_mode(ifindex)
        } else {
            match self.attach_program(name, ifindex, mode) {
                Ok(mode) => mode,
                Err(e) => {
                    let _ = self.ifaces.remove(&ifindex);
                    let _ = self.tx_ports.remove(ifindex);
                    return Err(e);
                }
            }
        };
        if mode == AttachMode::Native {
            self.update_iface(ifindex, IfaceInfo { flags, ..info })?;
        }
        if arm && !self.armed_ifaces.contains_key(&ifindex) {
            self.attach_arming(name, ifindex, ARM_PROG_NAME);
        }
        Ok(mode)
    }

    /// Attaches the arming program `prog` ([`ARM_PROG_NAME`], or [`ARM_L3_PROG_NAME`] for a
    /// device without a link-layer header) to the egress of `name` as a TCX bpf_link (Linux
    /// 6.6), owned by this process like the XDP links. Without it no flow direction is ever
    /// armed: the kernel keeps forwarding every packet of that interface's flows (correct, not
    /// faster).
    fn attach_arming(&mut self, name: &str, ifindex: u32, prog: &'static str) {
        let result = self
            .ebpf
            .program_mut(prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {prog}"))
            .and_then(|p| Ok(<&mut SchedClassifier>::try_from(p)?))
            .and_then(|p| {
                // A netlink (clsact) attachment would outlive the daemon: TCX links only.
                Ok(p.attach_with_options(
                    name,
                    TcAttachType::Egress,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )?)
            });
        match result {
            Ok(link) => {
                self.armed_ifaces.insert(ifindex, (prog, link));
            }
            Err(e) => error!(
                interface = name,
                error = %format!("{e:#}"),
                "{name}: cannot attach the TC egress arming program (TCX, Linux >= 6.6 needed): \
                 no flow through {name} is fast-pathed, the kernel forwards them all"
            ),
        }
    }

    fn attach_program(
        &mut self,
        name: &str,
        ifindex: u32,
        mode: XdpModeConfig,
    ) -> anyhow::Result<AttachMode> {
        let mut fallback = None;
        let prog = self.program()?;
        let (link, got) = match mode {
            XdpModeConfig::Generic => (
                prog.attach_to_if_index(ifindex, XdpMode::Skb)
                    .map_err(|e| anyhow!("{name}: cannot attach XDP (generic mode): {e}"))?,
                AttachMode::Generic,
            ),
            XdpModeConfig::Native => match prog.attach_to_if_index(ifindex, XdpMode::Driver) {
                Ok(link) => (link, AttachMode::Native),
                Err(native_err) => {
                    let why = native_attach_failure(&native_err);
                    warn!(
                        interface = name,
                        error = %native_err,
                        "{name}: native XDP attach failed: {why}; falling back to generic XDP \
                         (much slower)"
                    );
                    fallback = Some(why);
                    let link = prog
                        .attach_to_if_index(ifindex, XdpMode::Skb)
                        .map_err(|e| {
                            anyhow!("{name}: cannot attach XDP: native: {native_err}; generic: {e}")
                        })?;
                    (link, AttachMode::Generic)
                }
            },
        };
        self.attached.insert(ifindex, link);
        self.modes.insert(ifindex, got);
        if let Some(why) = fallback {
            self.generic_because.insert(ifindex, why);
        }
        // Fail-open relies on every attachment being a bpf_link owned by this process, which the
        // kernel removes when the process goes away. aya falls back to a netlink attach when
        // bpf_link_create() answers EINVAL (kernels before 5.9); such an attachment would
        // outlive a killed daemon and keep forwarding from stale maps, so refuse it.
        match self.owned_xdp_links() {
            Ok(n) if n == self.attached.len() => {}
            Ok(n) => {
                self.detach(ifindex);
                bail!(
                    "{name}: the kernel attached XDP without a bpf_link ({n} links for {} \
                     attachments); refusing, since it would outlive the daemon (Linux >= 5.9 needed)",
                    self.attached.len() + 1
                );
            }
            // Enumerating links needs CAP_SYS_ADMIN, which the least-privilege systemd unit
            // does not grant; `load` already refused kernels without XDP bpf_links.
            Err(e) => {
                debug!(interface = name, error = %format!("{e:#}"), "cannot verify the XDP link")
            }
        }
        info!(
            interface = name,
            ifindex,
            mode = got.as_str(),
            "XDP program attached"
        );
        Ok(got)
    }

    /// Number of XDP bpf_links that point at our program (one per attached interface).
    fn owned_xdp_links(&self) -> anyhow::Result<usize> {
        let prog: &Xdp = self
            .ebpf
            .program(PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {PROG_NAME}"))?
            .try_into()?;
        let id = prog.info()?.id();
        let mut n = 0;
        for link in loaded_links() {
            let link = link.context("cannot list BPF links")?;
            if link.program_id() == id && matches!(link.link_type(), Ok(LinkType::Xdp)) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Detaches the arming program from `ifindex`, if it is attached there.
    fn detach_arming(&mut self, ifindex: u32) {
        if let Some((name, link)) = self.armed_ifaces.remove(&ifindex)
            && let Some(Ok(prog)) = self
                .ebpf
                .program_mut(name)
                .map(<&mut SchedClassifier>::try_from)
        {
            let _ = prog.detach(link);
        }
    }

    /// Detaches from `ifindex` (if attached) and forgets it in the maps. Used when an interface
    /// disappears; the kernel already dropped the link if the device is gone.
    pub fn detach(&mut self, ifindex: u32) {
        self.detach_vlan(ifindex);
        // A bridge or port no longer managed (also one that stays only as a VLAN parent:
        // its VLANs are written again when it is managed again).
        self.bridge_vlans_clear(ifindex);
        if self.ppp_devices.contains_key(&ifindex) {
            self.detach_ppp(ifindex);
            return;
        }
        let vlan_parent = self.vlan_keys.values().any(|k| k.parent_ifindex == ifindex);
        let pppoe_lower = self.pppoe_lower_in_use(ifindex);
        if (vlan_parent || pppoe_lower)
            && let Ok(mut info) = self.iface(ifindex)
        {
            // A managed interface that is also the parent of managed VLANs or the lower
            // device of a managed PPPoE session: the program stays for them, the interface
            // itself is now managed only as their parent / lower device.
            if vlan_parent {
                info.flags |= IFACE_F_VLAN_PARENT;
            }
            if pppoe_lower {
                info.flags |= IFACE_F_PPPOE_LOWER;
            } else {
                // Only its VLANs' tagged frames are sent out of it.
                let _ = self.tx_ports.remove(ifindex);
            }
            let _ = self.update_iface(ifindex, info);
            self.detach_arming(ifindex);
            return;
        }
        self.detach_arming(ifindex);
        if let Some(link) = self.attached.remove(&ifindex)
            && let Ok(prog) = self.program()
        {
            let _ = prog.detach(link);
        }
        self.generic_because.remove(&ifindex);
        self.modes.remove(&ifindex);
        let _ = self.ifaces.remove(&ifindex);
        let _ = self.tx_ports.remove(ifindex);
    }

    /// Detaches from every interface (shutdown): the kernel carries everything again, whoever
    /// still holds a reference to the datapath.
    pub fn detach_all(&mut self) {
        // The PPP devices first: their lower devices are then detached, not kept for them.
        let ifindexes: Vec<u32> = self
            .ppp_devices
            .keys()
            .chain(self.attached.keys())
            .chain(self.armed_ifaces.keys())
            .copied()
            .collect();
        for ifindex in ifindexes {
            self.detach(ifindex);
        }
    }

    /// Rewrites the `IFACE_F_*` flags of a registered interface (e.g. its egress became shaped
    /// or stopped being shaped); the program sees them from its next packet on. Fails when
    /// `ifindex` is not registered (never adds it).
    ///
    /// `IFACE_F_NO_XDP_XMIT` also decides the interface's `TX_PORTS` entry, in the order that
    /// never lets the datapath see the flag clear without the entry (that would count packets
    /// as `egress_not_managed`): the entry is added before the flag is cleared, and removed
    /// only after it is set.
    pub fn set_iface_flags(&mut self, ifindex: u32, slot: u32, flags: u32) -> anyhow::Result<()> {
        let mut info = self.iface(ifindex)?;
        // What the interface is (bridge, port, VLAN device, VLAN parent) and how the program
        // is attached to it stay.
        let flags = flags | (info.flags & DATAPATH_FLAGS);
        // A bridge, VLAN device or PPP device transmits nothing itself: no TX_PORTS entry.
        let xmit = flags & IFACE_F_NO_XDP_XMIT == 0
            && flags & (IFACE_F_BRIDGE | IFACE_F_VLAN) == 0
            && !self.ppp_devices.contains_key(&ifindex);
        if xmit {
            self.tx_ports
                .insert(ifindex, ifindex, None, 0)
                .with_context(|| format!("cannot add ifindex {ifindex} to {MAP_TX_PORTS}"))?;
        }
        info.slot = slot;
        info.flags = flags;
        self.update_iface(ifindex, info)?;
        if !xmit {
            let _ = self.tx_ports.remove(ifindex);
        }
        Ok(())
    }

    /// Rewrites the MAC address of a registered interface (`ip link set dev X address ...`):
    /// only frames sent to it are forwarded. Returns whether it changed.
    pub fn set_iface_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> anyhow::Result<bool> {
        let mut info = self.iface(ifindex)?;
        if info.mac == mac {
            return Ok(false);
        }
        info.mac = mac;
        self.update_iface(ifindex, info)?;
        Ok(true)
    }

    fn iface(&self, ifindex: u32) -> anyhow::Result<IfaceInfo> {
        self.ifaces
            .get(&ifindex, 0)
            .with_context(|| format!("ifindex {ifindex} is not in {MAP_IFACES}"))
    }

    fn update_iface(&mut self, ifindex: u32, info: IfaceInfo) -> anyhow::Result<()> {
        /// `BPF_EXIST`: update an existing element only.
        const BPF_EXIST: u64 = 2;
        self.ifaces
            .insert(ifindex, info, BPF_EXIST)
            .with_context(|| format!("cannot update ifindex {ifindex} in {MAP_IFACES}"))
    }

    /// Why `ifindex` runs generic XDP although native was asked for (see
    /// [`native_attach_failure`]); `None` when native or not attached.
    pub fn generic_because(&self, ifindex: u32) -> Option<&str> {
        self.generic_because.get(&ifindex).map(String::as_str)
    }

    fn write_settings(&mut self) -> anyhow::Result<()> {
        self.settings
            .set(0, self.current, 0)
            .context("cannot write the settings map")
    }

    /// Whether the program verifies L4 checksums (see [`Datapath::set_verify_l4_checksum`]).
    pub fn verify_l4_checksum(&self) -> bool {
        self.current.verify_l4_checksum != 0
    }

    /// Whether TCP/UDP checksums are verified before forwarding: the daemon mirrors
    /// `net.netfilter.nf_conntrack_checksum` (conntrack marks bad ones INVALID while it is 1).
    pub fn set_verify_l4_checksum(&mut self, on: bool) -> anyhow::Result<()> {
        if self.current.verify_l4_checksum == u32::from(on) {
            return Ok(());
        }
        self.current.verify_l4_checksum = u32::from(on);
        self.write_settings()
    }

    /// Switches the fast path on or off (a map flag; nothing is detached).
    pub fn set_fastpath(&mut self, on: bool) -> anyhow::Result<()> {
        self.current.fastpath_enabled = on as u32;
        self.write_settings()
    }

    /// How long a flow may reuse its last FIB answer (`fib_cache_ms`); zero disables the
    /// cache. Starts at zero.
    pub fn set_fib_cache(&mut self, max_age: Duration) -> anyhow::Result<()> {
        self.current.fib_cache_ns = u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        self.write_settings()
    }

    /// Invalidates every flow's cached FIB answer: the next packet of each flow takes a full
    /// `bpf_fib_lookup`. Called for every kernel notification that can change an answer.
    pub fn invalidate_fib_cache(&mut self) -> anyhow::Result<()> {
        // 0 means "cache disabled" to the datapath: skip it on wrap-around.
        self.current.fib_generation = self.current.fib_generation.checked_add(1).unwrap_or(1);
        self.write_settings()?;
        self.fib_invalidations += 1;
        Ok(())
    }

    /// A new firewall ruleset generation: every flow direction is disarmed at once, so the next
    /// packet of each is judged by the kernel's rules as they are now (and re-armed only if the
    /// kernel forwards it). Called for every nftables commit and iptables-legacy change.
    pub fn bump_ruleset_generation(&mut self) -> anyhow::Result<()> {
        // 0 is what new flow entries hold: never current.
        self.current.ruleset_generation =
            self.current.ruleset_generation.checked_add(1).unwrap_or(1);
        self.write_settings()?;
        self.ruleset_changes += 1;
        Ok(())
    }

    /// Ruleset tracking as `status` shows it: generation, changes since start, interfaces with
    /// the arming program, whether the FIB lookup takes marks.
    pub fn ruleset_status(&self) -> crate::status::RulesetStatus {
        crate::status::RulesetStatus {
            generation: self.current.ruleset_generation,
            changes: self.ruleset_changes,
            armed_interfaces: self.armed_ifaces.len() as u32,
            fib_mark: self.current.flags & SETTINGS_F_FIB_MARK != 0,
        }
    }

    /// The FIB cache as `status` shows it: longest reuse, generation, invalidations.
    pub fn fib_cache_status(&self) -> FibCacheStatus {
        FibCacheStatus {
            max_age_ms: self.current.fib_cache_ns / 1_000_000,
            generation: self.current.fib_generation,
            invalidations: self.fib_invalidations,
        }
    }

    /// Whether the fast path is on.
    pub fn fastpath(&self) -> anyhow::Result<bool> {
        Ok(self
            .settings
            .get(&0, 0)
            .context("cannot read the settings map")?
            .fastpath_enabled
            != 0)
    }

    /// Capacity of each flow map.
    pub fn flow_capacity(&self) -> u32 {
        self.flow_capacity
    }

    /// Packets/bytes summed over CPUs for one (interface slot, reason).
    pub fn counter(&self, slot: u32, reason: Reason) -> anyhow::Result<Counter> {
        let values = self
            .stats
            .get(&stats_index(slot, reason), 0)
            .context("cannot read the stats map")?;
        Ok(values.iter().fold(Counter::default(), |acc, c| Counter {
            packets: acc.packets + c.packets,
            bytes: acc.bytes + c.bytes,
        }))
    }
}

impl FlowTable for Datapath {
    fn insert_v4(&mut self, key: &FlowKeyV4, value: &FlowV4) -> Result<(), MapError> {
        self.flows_v4.insert(key, value, 0)
    }
    fn insert_v6(&mut self, key: &FlowKeyV6, value: &FlowV6) -> Result<(), MapError> {
        self.flows_v6.insert(key, value, 0)
    }
    fn remove_v4(&mut self, key: &FlowKeyV4) {
        let _ = self.flows_v4.remove(key);
    }
    fn remove_v6(&mut self, key: &FlowKeyV6) {
        let _ = self.flows_v6.remove(key);
    }
    fn get_v4(&self, key: &FlowKeyV4) -> Option<FlowV4> {
        self.flows_v4.get(key, 0).ok()
    }
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6> {
        self.flows_v6.get(key, 0).ok()
    }
    fn insert_arm_v4(&mut self, arm: &ArmKeyV4, flow: &FlowKeyV4) -> Result<(), MapError> {
        self.arm_v4.insert(arm, flow, 0)
    }
    fn insert_arm_v6(&mut self, arm: &ArmKeyV6, flow: &FlowKeyV6) -> Result<(), MapError> {
        self.arm_v6.insert(arm, flow, 0)
    }
    fn remove_arm_v4(&mut self, arm: &ArmKeyV4) {
        let _ = self.arm_v4.remove(arm);
    }
    fn insert_many_v4(
        &mut self,
        flows: &[(FlowKeyV4, FlowV4)],
        arms: &[(ArmKeyV4, FlowKeyV4)],
    ) -> Result<(), MapError> {
        insert_many(
            &mut self.no_batch,
            &mut self.flows_v4,
            &mut self.arm_v4,
            flows,
            arms,
        )
    }
    fn insert_many_v6(
        &mut self,
        flows: &[(FlowKeyV6, FlowV6)],
        arms: &[(ArmKeyV6, FlowKeyV6)],
    ) -> Result<(), MapError> {
        insert_many(
            &mut self.no_batch,
            &mut self.flows_v6,
            &mut self.arm_v6,
            flows,
            arms,
        )
    }
    fn remove_arm_v6(&mut self, arm: &ArmKeyV6) {
        let _ = self.arm_v6.remove(arm);
    }
    fn take_active(&mut self, now_ns: u64) -> (Vec<FlowKeyV4>, Vec<FlowKeyV6>) {
        // The new pass starts before the record is read: a packet forwarded in between is
        // either taken now or recorded again for the next pass, never lost.
        self.current.active_since_ns = now_ns;
        if let Err(e) = self.write_settings() {
            warn!(error = %format!("{e:#}"), "cannot start a keep-alive pass");
        }
        let v4: Vec<FlowKeyV4> = self.active_v4.keys().filter_map(Result::ok).collect();
        for k in &v4 {
            let _ = self.active_v4.remove(k);
        }
        let v6: Vec<FlowKeyV6> = self.active_v6.keys().filter_map(Result::ok).collect();
        for k in &v6 {
            let _ = self.active_v6.remove(k);
        }
        (v4, v6)
    }
}

/// Why the kernel refused a native (driver mode) XDP attachment, from the errno of the
/// failed call. An XDP bpf_link attach returns no extack text (the kernel's message goes only
/// to the `xdp:bpf_xdp_link_attach_failed` tracepoint), so the errnos the drivers use are
/// mapped here (`dev_xdp_attach` in `net/core/dev.c`, `veth_xdp_set` in
/// `drivers/net/veth.c`).
pub fn native_attach_failure(err: &(dyn std::error::Error + 'static)) -> String {
    let mut source = Some(err);
    let mut errno = None;
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            errno = io.raw_os_error();
            break;
        }
        source = e.source();
    }
    match errno {
        Some(libc::ERANGE) => "the MTU is too large for native XDP (on a veth: the peer's MTU \
             is above what one page holds, about 3 500 bytes); lower it for native XDP"
            .into(),
        Some(libc::EOPNOTSUPP) => {
            "the driver has no native XDP (a bridge, a bond or VLAN device, or an old driver)"
                .into()
        }
        Some(libc::ENOSPC) => {
            "fewer RX queues than its veth peer has TX queues (create it with numrxqueues >= \
             the peer's numtxqueues)"
                .into()
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => {
            "another XDP program is already attached to it".into()
        }
        Some(libc::ENOTCONN) => "a veth without a peer".into(),
        Some(n) => format!(
            "the kernel refused it ({})",
            std::io::Error::from_raw_os_error(n)
        ),
        None => format!("{err}"),
    }
}

/// Turns the usual load failures into one actionable line.
fn explain_load_error(e: aya::EbpfError) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        anyhow!(
            "cannot load the eBPF program: permission denied (run as root or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON)"
        )
    } else if text.contains("btf") || text.contains("BTF") {
        anyhow!(
            "cannot load the eBPF program: kernel BTF problem ({text}); a kernel with CONFIG_DEBUG_INFO_BTF is required"
        )
    } else {
        anyhow!("cannot load the eBPF program: {text}")
    }
}
