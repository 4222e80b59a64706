//! The loaded eBPF object: the XDP program, its attachments and typed handles on its maps.
//!
//! One [`Datapath`] owns everything the kernel holds for us. Attachments are bpf_links owned by
//! this process, so when it exits for any reason (SIGTERM, panic, SIGKILL) the kernel detaches
//! the program and carries every packet itself; on kernels without TCX links the TC programs
//! are classic tc filters instead, which stay but turn inert with the process ([`tc_links`]).
//!
//! This file loads the object and takes every map handle once; the rest is split by concern:
//! [`ports`] (the [`Ports`] interface the state drives: registering, attaching and detaching
//! interfaces of every kind), [`attach`] (XDP links, native or generic), [`tc_links`] (the TC
//! programs: TCX links or classic tc filters), [`flows`] (the
//! flow maps and their batches), [`hosts`] (the per-host counters), [`settings`] (the fast-path switch, generations, FIB cache,
//! counters), and one file per device kind: [`bridge`], [`vlan`], [`pppoe`].

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData, MapError, xdp::DevMapHash},
    programs::{SchedClassifier, Xdp},
    util::KernelVersion,
};
use tracing::warn;
use xdp_router_common::{
    ARM_L3_PROG_NAME, ARM_PROG_NAME, GLOBAL_XDP_META, IFACE_F_BRIDGE, IFACE_F_BRIDGE_PORT,
    IFACE_F_GENERIC_XDP, IFACE_F_L3, IFACE_F_PPP_CCP, IFACE_F_PPPOE, IFACE_F_PPPOE_LOWER,
    IFACE_F_TC_HANDOFF, IFACE_F_VLAN, IFACE_F_VLAN_PARENT, IfaceInfo, MAP_HOST_TRAFFIC, MAP_IFACES,
    MAP_TX_PORTS, STAMP_PROG_NAME, TC_PROG_NAME,
};

use crate::kernel_features::{self, Feature, KernelFeatures};

pub mod attach;
pub mod bridge;
pub mod flows;
pub mod hosts;
pub mod ports;
pub mod pppoe;
pub mod settings;
pub mod tc_links;
pub mod verifier;
pub mod vlan;

pub use attach::{AttachMode, DatapathChoice, native_attach_failure};
pub use ports::{NO_LINK_LAYER_TC, Ports};
pub use pppoe::PppoeBinding;
pub use settings::{FibCache, Ruleset};
pub use tc_links::TcHook;
pub use vlan::VlanParent;

/// The xdp-router eBPF object, built by build.rs (aya-build) and embedded in the binary.
pub static EBPF_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"));

/// The loaded object, its attachments and typed map handles.
pub struct Datapath {
    ebpf: Ebpf,
    /// `IFACES`: the entry of every registered interface.
    ifaces: HashMap<MapData, u32, IfaceInfo>,
    /// `TX_PORTS`: the interfaces XDP frames are redirected to.
    tx_ports: DevMapHash<MapData>,
    /// The flow maps, their arming indexes and the active-connection record.
    flows: flows::FlowMaps,
    /// `HOST_TRAFFIC`: the per-LAN-host counters.
    host_traffic: hosts::HostTrafficMap,
    /// `SETTINGS` (and what it holds), `STATS`.
    settings: settings::SettingsMaps,
    /// The XDP and TC links, by ifindex.
    links: attach::Links,
    /// The managed bridges' FDBs and VLANs.
    bridges: bridge::BridgeMaps,
    /// The managed VLAN devices.
    vlans: vlan::VlanMaps,
    /// The managed PPPoE sessions and PPP devices.
    pppoe: pppoe::PppoeMaps,
    /// Which datapath each interface is to get (config).
    datapath_choice: attach::DatapathChoice,
    /// Why the TC fast path cannot be attached anywhere (the kernel rejected it), if so.
    tc_unavailable: Option<String>,
    /// TCX or classic tc: what the kernel took so far.
    tc_attach: tc_links::TcAttach,
    /// What the kernel lacks of the optional features, found before the object was loaded.
    features: KernelFeatures,
    /// The XDP program attached: multi-buffer or not (see [`kernel_features::xdp_program`]).
    xdp_prog: &'static str,
}

/// The `IFACE_F_*` bits the datapath owns, kept when the state rewrites an interface's flags:
/// what the interface is, whether the program runs on it in generic mode or with the TC fast
/// path behind it, and whether the XDP program saw CCP run on its PPPoE session.
const DATAPATH_FLAGS: u32 = IFACE_F_BRIDGE
    | IFACE_F_BRIDGE_PORT
    | IFACE_F_VLAN
    | IFACE_F_VLAN_PARENT
    | IFACE_F_PPPOE
    | IFACE_F_PPPOE_LOWER
    | IFACE_F_PPP_CCP
    | IFACE_F_GENERIC_XDP
    | IFACE_F_TC_HANDOFF
    | IFACE_F_L3;

/// Takes the map `name` out of `ebpf` as the typed handle `T` (once: the map is gone after).
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
    /// Loads the embedded object with flow maps of `flow_capacity` entries each and
    /// `host_slots` per-host counters (see [`hosts::slots`]) and verifies the program.
    /// Nothing is attached yet. The fast path starts switched on.
    pub fn load(flow_capacity: u32, host_slots: u32) -> anyhow::Result<Datapath> {
        Self::load_object(EBPF_OBJECT, flow_capacity, host_slots)
    }

    /// [`Datapath::load`] for an arbitrary object (tests).
    pub fn load_object(
        object: &[u8],
        flow_capacity: u32,
        host_slots: u32,
    ) -> anyhow::Result<Datapath> {
        // XDP bpf_links (5.9) are what makes the daemon fail-open: without them an attachment
        // would outlive the process. (An unreadable version is left to the load to judge.)
        if let Ok(v) = KernelVersion::current()
            && v < KernelVersion::new(5, 9, 0)
        {
            bail!("Linux {v} is too old: xdp-routerd needs 5.9 or newer (XDP bpf_link)");
        }
        let mut features = kernel_features::probe();
        let xdp_meta = u8::from(features.usable(Feature::XdpMetadata));
        let mut loader = EbpfLoader::new();
        for map in flows::SIZED_MAPS {
            loader.map_max_entries(map, flow_capacity);
        }
        loader.map_max_entries(MAP_HOST_TRAFFIC, host_slots);
        loader.override_global(GLOBAL_XDP_META, &xdp_meta, true);
        let mut ebpf = loader.load(object).map_err(explain_load_error)?;
        features.set(
            Feature::FibLookupMark,
            kernel_features::probe_fib_mark(&mut ebpf),
        );
        features.set(
            Feature::MultiBufferXdp,
            kernel_features::probe_multi_buffer(&mut ebpf),
        );
        let xdp_prog = kernel_features::xdp_program(&features);
        for (feature, why) in features.missing() {
            warn!(%feature, why, lost = feature.without(), "kernel feature missing");
        }
        let prog: &mut Xdp = ebpf
            .program_mut(xdp_prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {xdp_prog}"))?
            .try_into()?;
        prog.load()
            .map_err(|e| verifier::refusal("the kernel rejected the XDP program", xdp_prog, e))?;
        let arm: &mut SchedClassifier = ebpf
            .program_mut(ARM_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {ARM_PROG_NAME}"))?
            .try_into()?;
        arm.load().map_err(|e| {
            verifier::refusal(
                "the kernel rejected the TC arming program (it needs CONFIG_XFRM for \
                 bpf_skb_get_xfrm_state)",
                ARM_PROG_NAME,
                e,
            )
        })?;
        let arm3: &mut SchedClassifier = ebpf
            .program_mut(ARM_L3_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {ARM_L3_PROG_NAME}"))?
            .try_into()?;
        arm3.load().map_err(|e| {
            verifier::refusal(
                "the kernel rejected the TC arming program for PPP devices",
                ARM_L3_PROG_NAME,
                e,
            )
        })?;
        let stamp: &mut SchedClassifier = ebpf
            .program_mut(STAMP_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {STAMP_PROG_NAME}"))?
            .try_into()?;
        stamp.load().map_err(|e| {
            verifier::refusal(
                "the kernel rejected the TC DSCP stamp program",
                STAMP_PROG_NAME,
                e,
            )
        })?;
        // The TC fast path: only interfaces configured for it need it, so a kernel that rejects
        // it stops only those (with this reason), not the daemon.
        let tc_unavailable = match ebpf
            .program_mut(TC_PROG_NAME)
            .ok_or_else(|| anyhow!("eBPF object has no program {TC_PROG_NAME}"))
            .and_then(|p| Ok(<&mut SchedClassifier>::try_from(p)?))
            .and_then(|p| {
                p.load().map_err(|e| {
                    verifier::refusal("the kernel rejected the TC fast path", TC_PROG_NAME, e)
                })
            }) {
            Ok(()) => None,
            Err(e) => {
                warn!(error = %format!("{e:#}"), "the kernel rejected the TC fast path program: interfaces with datapath = \"tc\" cannot be managed");
                Some(format!("{e:#}"))
            }
        };
        let mut dp = Datapath {
            ifaces: take(&mut ebpf, MAP_IFACES)?,
            tx_ports: take(&mut ebpf, MAP_TX_PORTS)?,
            flows: flows::FlowMaps::take(&mut ebpf, flow_capacity)?,
            host_traffic: hosts::HostTrafficMap::take(&mut ebpf)?,
            settings: settings::SettingsMaps::take(
                &mut ebpf,
                features.usable(Feature::FibLookupMark),
            )?,
            links: attach::Links::default(),
            bridges: bridge::BridgeMaps::take(&mut ebpf)?,
            vlans: vlan::VlanMaps::take(&mut ebpf)?,
            pppoe: pppoe::PppoeMaps::take(&mut ebpf)?,
            datapath_choice: attach::DatapathChoice::default(),
            tc_unavailable,
            tc_attach: tc_links::TcAttach::default(),
            features,
            xdp_prog,
            ebpf,
        };
        dp.settings.write()?;
        Ok(dp)
    }

    /// A handle on the per-host counters for a reader that does not take the state's lock.
    pub fn host_traffic_reader(&self) -> anyhow::Result<hosts::HostTrafficMap> {
        self.host_traffic.try_clone()
    }

    /// The optional kernel features the object was loaded for.
    pub fn kernel_features(&self) -> &KernelFeatures {
        &self.features
    }

    /// The `IFACES` entry of `ifindex`; an error when it is not registered.
    fn iface(&self, ifindex: u32) -> anyhow::Result<IfaceInfo> {
        self.ifaces
            .get(&ifindex, 0)
            .with_context(|| format!("ifindex {ifindex} is not in {MAP_IFACES}"))
    }

    /// Rewrites the `IFACES` entry of `ifindex`, which must exist.
    fn update_iface(&mut self, ifindex: u32, info: IfaceInfo) -> anyhow::Result<()> {
        /// `BPF_EXIST`: update an existing element only.
        const BPF_EXIST: u64 = 2;
        self.ifaces
            .insert(ifindex, info, BPF_EXIST)
            .with_context(|| format!("cannot update ifindex {ifindex} in {MAP_IFACES}"))
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
