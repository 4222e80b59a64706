//! Loading the `xdp_router` object and its maps, writing a case's [`Setup`] into them and
//! reading the counters and FIB cache back.

use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, DevMapHash, HashMap, IterableMap as _, MapData, PerCpuArray},
    programs::Xdp,
};
use xdp_router_common::{
    BridgeVlanKey, Counter, FdbKey, FibCache, FlowCounters, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6,
    GLOBAL_FIB_FLAGS, GLOBAL_XDP_META, HostCounters, IfaceInfo, MAP_BRIDGE_FDB, MAP_BRIDGE_VLANS,
    MAP_FLOWS_V4, MAP_FLOWS_V6, MAP_HOST_TRAFFIC, MAP_IFACES, MAP_PPPOE, MAP_SETTINGS, MAP_STATS,
    MAP_TX_PORTS, MAP_VLANS, PROG_NAME, PppoeKey, SETTINGS_F_DSCP_REWRITE, SETTINGS_F_FIB_MARK,
    SETTINGS_F_HOLD_ALL, Settings, VlanKey,
};

use xdp_routerd::{
    datapath::flows::BatchAttr,
    kernel_features::{self, Feature},
};

use super::{
    flow::{ARMED, FlowEntry},
    setup::Setup,
};

/// Typed handles on every map of the loaded object.
pub struct Maps {
    /// `FLOWS_V4`.
    pub flows_v4: HashMap<MapData, FlowKeyV4, FlowV4>,
    /// `FLOWS_V6`.
    pub flows_v6: HashMap<MapData, FlowKeyV6, FlowV6>,
    /// `IFACES`.
    pub ifaces: HashMap<MapData, u32, IfaceInfo>,
    /// `TX_PORTS`.
    pub tx_ports: DevMapHash<MapData>,
    /// `BRIDGE_FDB`.
    pub fdb: HashMap<MapData, FdbKey, u32>,
    /// `BRIDGE_VLANS` (`None` in an object built before it existed).
    pub bridge_vlans: Option<HashMap<MapData, BridgeVlanKey, u32>>,
    /// `VLANS`.
    pub vlans: HashMap<MapData, VlanKey, u32>,
    /// `PPPOE`.
    pub pppoe: HashMap<MapData, PppoeKey, u32>,
    /// `STATS`.
    pub stats: PerCpuArray<MapData, Counter>,
    /// `SETTINGS`.
    pub settings: Array<MapData, Settings>,
    /// `HOST_TRAFFIC` (`None` in an object built before it existed).
    pub host_traffic: Option<PerCpuArray<MapData, HostCounters>>,
}

/// `BPF_MAP_LOOKUP_BATCH` (enum bpf_cmd).
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Takes map `name` out of the loaded object as the typed handle `T`.
pub fn take<T: TryFrom<aya::maps::Map>>(ebpf: &mut Ebpf, name: &str) -> T
where
    T::Error: std::fmt::Display,
{
    let map = ebpf
        .take_map(name)
        .unwrap_or_else(|| panic!("object has no map {name}"));
    T::try_from(map).unwrap_or_else(|e| panic!("map {name}: {e}"))
}

/// The object the fixtures run: the daemon's embedded one, or the file named by
/// `XDP_ROUTER_EBPF_OBJECT` (another build of it, such as the arm64 flavour, whose ordered
/// accesses are BPF atomics: the bytecode runs on this kernel as on an arm64 one).
pub fn object() -> std::borrow::Cow<'static, [u8]> {
    match std::env::var_os("XDP_ROUTER_EBPF_OBJECT") {
        Some(path) => std::fs::read(&path)
            .unwrap_or_else(|e| panic!("XDP_ROUTER_EBPF_OBJECT={}: {e}", path.display()))
            .into(),
        None => xdp_routerd::datapath::EBPF_OBJECT.into(),
    }
}

/// Whether this kernel lets XDP programs use XDP metadata (the daemon's probe): what the
/// object is loaded with by [`load`] and [`load_object`], as the daemon loads it.
pub fn kernel_has_xdp_meta() -> bool {
    kernel_features::probe().usable(Feature::XdpMetadata)
}

/// Loads the object (see [`object`]) and the program (the verifier runs here).
pub fn load() -> (Ebpf, Maps) {
    load_object(&object(), 0)
}

/// Loads an `xdp_router` object (e.g. an older build to compare with) and its program, with
/// `fib_flags` as its `GLOBAL_FIB_FLAGS` (ignored by objects without it) and XDP metadata as
/// this kernel allows.
pub fn load_object(object: &[u8], fib_flags: u32) -> (Ebpf, Maps) {
    load_with(object, fib_flags, kernel_has_xdp_meta())
}

/// [`load_object`] with `GLOBAL_XDP_META` set to `xdp_meta` (ignored by objects without it):
/// `false` loads the hand-over without its mark on any kernel.
pub fn load_with(object: &[u8], fib_flags: u32, xdp_meta: bool) -> (Ebpf, Maps) {
    let mut ebpf = EbpfLoader::new()
        .override_global(GLOBAL_FIB_FLAGS, &fib_flags, false)
        .override_global(GLOBAL_XDP_META, &u8::from(xdp_meta), false)
        .load(object)
        .unwrap_or_else(|e| panic!("load eBPF object: {e:#}"));
    let prog: &mut Xdp = ebpf
        .program_mut(PROG_NAME)
        .unwrap_or_else(|| panic!("object has no program {PROG_NAME}"))
        .try_into()
        .unwrap_or_else(|e| panic!("{PROG_NAME} is not XDP: {e}"));
    if let Err(e) = prog.load() {
        panic!("verifier rejected {PROG_NAME}: {e}\n{:?}", e);
    }
    let maps = Maps {
        flows_v4: take(&mut ebpf, MAP_FLOWS_V4),
        flows_v6: take(&mut ebpf, MAP_FLOWS_V6),
        ifaces: take(&mut ebpf, MAP_IFACES),
        tx_ports: take(&mut ebpf, MAP_TX_PORTS),
        fdb: take(&mut ebpf, MAP_BRIDGE_FDB),
        bridge_vlans: ebpf
            .take_map(MAP_BRIDGE_VLANS)
            .map(|m| HashMap::try_from(m).expect("BRIDGE_VLANS map")),
        vlans: take(&mut ebpf, MAP_VLANS),
        pppoe: take(&mut ebpf, MAP_PPPOE),
        stats: take(&mut ebpf, MAP_STATS),
        settings: take(&mut ebpf, MAP_SETTINGS),
        host_traffic: ebpf
            .take_map(MAP_HOST_TRAFFIC)
            .map(|m| PerCpuArray::try_from(m).expect("HOST_TRAFFIC map")),
    };
    (ebpf, maps)
}

impl Maps {
    /// Empties every map, then writes the case's setup.
    pub fn apply(&mut self, s: &Setup) {
        let keys: Vec<_> = self
            .flows_v4
            .keys()
            .map(|k| k.expect("flows_v4 key"))
            .collect();
        for k in keys {
            self.flows_v4.remove(&k).expect("remove flow v4");
        }
        let keys: Vec<_> = self
            .flows_v6
            .keys()
            .map(|k| k.expect("flows_v6 key"))
            .collect();
        for k in keys {
            self.flows_v6.remove(&k).expect("remove flow v6");
        }
        let keys: Vec<_> = self.ifaces.keys().map(|k| k.expect("ifaces key")).collect();
        for k in keys {
            self.ifaces.remove(&k).expect("remove iface");
        }
        let keys: Vec<_> = self
            .tx_ports
            .keys()
            .map(|k| k.expect("tx_ports key"))
            .collect();
        for k in keys {
            self.tx_ports.remove(k).expect("remove tx port");
        }
        for f in &s.flows {
            match f {
                FlowEntry::V4(k, v) => self.flows_v4.insert(k, v, 0).expect("insert flow v4"),
                FlowEntry::V6(k, v) => self.flows_v6.insert(k, v, 0).expect("insert flow v6"),
            }
        }
        for (i, info) in &s.ifaces {
            self.ifaces.insert(i, info, 0).expect("insert iface");
        }
        for i in &s.tx_ports {
            self.tx_ports
                .insert(*i, *i, None, 0)
                .expect("insert tx port");
        }
        let keys: Vec<_> = self.fdb.keys().map(|k| k.expect("fdb key")).collect();
        for k in keys {
            self.fdb.remove(&k).expect("remove fdb entry");
        }
        for (key, port) in &s.fdb {
            self.fdb.insert(key, port, 0).expect("insert fdb entry");
        }
        if let Some(bridge_vlans) = &mut self.bridge_vlans {
            let keys: Vec<_> = bridge_vlans
                .keys()
                .map(|k| k.expect("bridge vlans key"))
                .collect();
            for k in keys {
                bridge_vlans.remove(&k).expect("remove bridge vlan entry");
            }
            for ((ifindex, vid), flags) in &s.bridge_vlans {
                let key = BridgeVlanKey {
                    ifindex: *ifindex,
                    vid: *vid,
                    _pad: 0,
                };
                bridge_vlans
                    .insert(key, flags, 0)
                    .expect("insert bridge vlan entry");
            }
        } else {
            assert!(
                s.bridge_vlans.is_empty(),
                "this object has no {MAP_BRIDGE_VLANS} map"
            );
        }
        let keys: Vec<_> = self.vlans.keys().map(|k| k.expect("vlans key")).collect();
        for k in keys {
            self.vlans.remove(&k).expect("remove vlan entry");
        }
        for (key, vlan) in &s.vlans {
            self.vlans.insert(key, vlan, 0).expect("insert vlan entry");
        }
        let keys: Vec<_> = self.pppoe.keys().map(|k| k.expect("pppoe key")).collect();
        for k in keys {
            self.pppoe.remove(&k).expect("remove pppoe entry");
        }
        for (key, ppp) in &s.pppoe {
            self.pppoe.insert(key, ppp, 0).expect("insert pppoe entry");
        }
        self.write_settings(s);
    }

    /// Writes only the setup's `SETTINGS` entry (fast path switch, FIB cache generation and age).
    pub fn write_settings(&mut self, s: &Setup) {
        let settings = Settings {
            fastpath_enabled: u32::from(s.fastpath),
            fib_generation: s.fib_generation,
            fib_cache_ns: s.fib_cache_ns,
            ruleset_generation: ARMED,
            flags: if s.fib_mark { SETTINGS_F_FIB_MARK } else { 0 }
                | if s.hold_all { SETTINGS_F_HOLD_ALL } else { 0 }
                | if s.dscp_rewrite {
                    SETTINGS_F_DSCP_REWRITE
                } else {
                    0
                },
            verify_l4_checksum: u32::from(s.verify_l4_checksum),
            verdict_max_age: s.verdict_max_age,
            active_since_ns: 0,
        };
        self.settings.set(0, settings, 0).expect("write settings");
    }

    /// Every STATS entry, summed over CPUs.
    pub fn stats(&self) -> Vec<Counter> {
        // One BPF_MAP_LOOKUP_BATCH for the whole array instead of a lookup per entry: the
        // table reads it twice per case, and thousands of syscalls per case made the table
        // take minutes in an emulated guest.
        let ncpus = aya::util::nr_cpus().expect("number of possible CPUs");
        let len = self.stats.len() as usize;
        let mut keys = vec![0u32; len];
        let mut values = vec![Counter::default(); len * ncpus];
        let mut next = 0u32;
        let mut attr = BatchAttr {
            in_batch: 0,
            out_batch: &raw mut next as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: len as u32,
            map_fd: self.stats.map().fd().as_fd().as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: `attr` is the kernel's batch attribute layout; the buffers it points to hold
        // `count` keys and `count` per-CPU values (a `Counter` is 16 bytes, already 8-aligned).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        // ENOENT: the end of the array was reached, with `count` entries filled.
        let err = std::io::Error::last_os_error();
        assert!(
            rc == 0 || err.raw_os_error() == Some(libc::ENOENT),
            "BPF_MAP_LOOKUP_BATCH on STATS: {err}"
        );
        assert_eq!(
            attr.count as usize, len,
            "STATS batch read {} of {len}",
            attr.count
        );
        values
            .chunks(ncpus)
            .map(|per_cpu| {
                per_cpu.iter().fold(Counter::default(), |a, c| Counter {
                    packets: a.packets + c.packets,
                    bytes: a.bytes + c.bytes,
                })
            })
            .collect()
    }

    /// Current counters of a flow entry.
    pub fn counters(&self, f: &FlowEntry) -> FlowCounters {
        match f {
            FlowEntry::V4(k, _) => self.flows_v4.get(k, 0).expect("flow v4 present").counters,
            FlowEntry::V6(k, _) => self.flows_v6.get(k, 0).expect("flow v6 present").counters,
        }
    }

    /// The `HOST_TRAFFIC` counters of `slot` summed over the CPUs (`None` without the map).
    pub fn host_traffic(&self, slot: u32) -> Option<HostCounters> {
        let map = self.host_traffic.as_ref()?;
        let per_cpu = map.get(&slot, 0).expect("HOST_TRAFFIC slot");
        Some(
            per_cpu
                .iter()
                .fold(HostCounters::default(), |a, c| HostCounters {
                    transmit_packets: a.transmit_packets + c.transmit_packets,
                    transmit_bytes: a.transmit_bytes + c.transmit_bytes,
                    receive_packets: a.receive_packets + c.receive_packets,
                    receive_bytes: a.receive_bytes + c.receive_bytes,
                }),
        )
    }

    /// The flow entry's cached FIB answer.
    pub fn fib_cache(&self, f: &FlowEntry) -> FibCache {
        match f {
            FlowEntry::V4(k, _) => self.flows_v4.get(k, 0).expect("flow v4 present").fib,
            FlowEntry::V6(k, _) => self.flows_v6.get(k, 0).expect("flow v6 present").fib,
        }
    }

    /// Replaces the flow entry's cached FIB answer (the rest of the entry is kept).
    pub fn set_fib_cache(&mut self, f: &FlowEntry, fib: FibCache) {
        match f {
            FlowEntry::V4(k, _) => {
                let mut v = self.flows_v4.get(k, 0).expect("flow v4 present");
                v.fib = fib;
                self.flows_v4.insert(k, v, 0).expect("rewrite flow v4");
            }
            FlowEntry::V6(k, _) => {
                let mut v = self.flows_v6.get(k, 0).expect("flow v6 present");
                v.fib = fib;
                self.flows_v6.insert(k, v, 0).expect("rewrite flow v6");
            }
        }
    }
}
