//! The flow maps: one entry per offloaded flow direction, the arming index the TC program
//! looks flows up by, and the record of the connections forwarded in the current keep-alive
//! pass; written one entry at a time or in batches (`BPF_MAP_UPDATE_BATCH`); and the count of
//! packets of offloaded directions the kernel forwarded.

use aya::{
    Ebpf,
    maps::{HashMap, MapData, MapError, PerCpuArray},
};
use tracing::warn;
use xdp_router_common::{
    ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6, MAP_ACTIVE_V4, MAP_ACTIVE_V6,
    MAP_ARM_V4, MAP_ARM_V6, MAP_FLOWS_V4, MAP_FLOWS_V6, MAP_KERNEL_FORWARDED,
};

use super::{Datapath, take};
use crate::flows::FlowTable;

/// The maps sized by the flow capacity at load time.
pub(super) const SIZED_MAPS: [&str; 6] = [
    MAP_FLOWS_V4,
    MAP_FLOWS_V6,
    MAP_ARM_V4,
    MAP_ARM_V6,
    MAP_ACTIVE_V4,
    MAP_ACTIVE_V6,
];

/// The flow maps and their arming indexes.
pub(super) struct FlowMaps {
    v4: HashMap<MapData, FlowKeyV4, FlowV4>,
    v6: HashMap<MapData, FlowKeyV6, FlowV6>,
    arm_v4: HashMap<MapData, ArmKeyV4, FlowKeyV4>,
    arm_v6: HashMap<MapData, ArmKeyV6, FlowKeyV6>,
    /// Connections the datapath forwarded packets of in the current keep-alive pass.
    active_v4: HashMap<MapData, FlowKeyV4, u8>,
    active_v6: HashMap<MapData, FlowKeyV6, u8>,
    /// Packets of offloaded directions the kernel forwarded, per CPU (the arming program).
    kernel_forwarded: PerCpuArray<MapData, u64>,
    /// Entries of each flow map ([`SIZED_MAPS`]).
    capacity: u32,
    /// The kernel refused `BPF_MAP_UPDATE_BATCH` (before 5.6): one update per entry.
    no_batch: bool,
}

impl FlowMaps {
    /// Takes the flow maps out of `ebpf`, loaded with `capacity` entries each.
    pub(super) fn take(ebpf: &mut Ebpf, capacity: u32) -> anyhow::Result<FlowMaps> {
        Ok(FlowMaps {
            v4: take(ebpf, MAP_FLOWS_V4)?,
            v6: take(ebpf, MAP_FLOWS_V6)?,
            arm_v4: take(ebpf, MAP_ARM_V4)?,
            arm_v6: take(ebpf, MAP_ARM_V6)?,
            active_v4: take(ebpf, MAP_ACTIVE_V4)?,
            active_v6: take(ebpf, MAP_ACTIVE_V6)?,
            kernel_forwarded: take(ebpf, MAP_KERNEL_FORWARDED)?,
            capacity,
            no_batch: false,
        })
    }
}

impl Datapath {
    /// Capacity of each flow map.
    pub fn flow_capacity(&self) -> u32 {
        self.flows.capacity
    }
}

/// The batch member of `union bpf_attr` (include/uapi/linux/bpf.h): the BPF_MAP_*_BATCH
/// commands (aya 0.14 wraps none; the fixtures read STATS with it too).
#[repr(C)]
pub struct BatchAttr {
    pub in_batch: u64,
    pub out_batch: u64,
    pub keys: u64,
    pub values: u64,
    pub count: u32,
    pub map_fd: u32,
    pub elem_flags: u64,
    pub flags: u64,
}

/// `BPF_MAP_UPDATE_BATCH` (Linux 5.6) on the map `fd`: `keys[i]` → `values[i]` in one system
/// call (the kernel stops at the first failing entry). aya 0.14 has no wrapper.
fn update_batch<K: aya::Pod, V: aya::Pod>(
    fd: std::os::fd::BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
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

impl FlowTable for Datapath {
    fn insert_v4(&mut self, key: &FlowKeyV4, value: &FlowV4) -> Result<(), MapError> {
        self.flows.v4.insert(key, value, 0)
    }
    fn insert_v6(&mut self, key: &FlowKeyV6, value: &FlowV6) -> Result<(), MapError> {
        self.flows.v6.insert(key, value, 0)
    }
    fn remove_v4(&mut self, key: &FlowKeyV4) {
        let _ = self.flows.v4.remove(key);
    }
    fn remove_v6(&mut self, key: &FlowKeyV6) {
        let _ = self.flows.v6.remove(key);
    }
    fn get_v4(&self, key: &FlowKeyV4) -> Option<FlowV4> {
        self.flows.v4.get(key, 0).ok()
    }
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6> {
        self.flows.v6.get(key, 0).ok()
    }
    fn insert_arm_v4(&mut self, arm: &ArmKeyV4, flow: &FlowKeyV4) -> Result<(), MapError> {
        self.flows.arm_v4.insert(arm, flow, 0)
    }
    fn insert_arm_v6(&mut self, arm: &ArmKeyV6, flow: &FlowKeyV6) -> Result<(), MapError> {
        self.flows.arm_v6.insert(arm, flow, 0)
    }
    fn remove_arm_v4(&mut self, arm: &ArmKeyV4) {
        let _ = self.flows.arm_v4.remove(arm);
    }
    fn insert_many_v4(
        &mut self,
        flows: &[(FlowKeyV4, FlowV4)],
        arms: &[(ArmKeyV4, FlowKeyV4)],
    ) -> Result<(), MapError> {
        let f = &mut self.flows;
        insert_many(&mut f.no_batch, &mut f.v4, &mut f.arm_v4, flows, arms)
    }
    fn insert_many_v6(
        &mut self,
        flows: &[(FlowKeyV6, FlowV6)],
        arms: &[(ArmKeyV6, FlowKeyV6)],
    ) -> Result<(), MapError> {
        let f = &mut self.flows;
        insert_many(&mut f.no_batch, &mut f.v6, &mut f.arm_v6, flows, arms)
    }
    fn remove_arm_v6(&mut self, arm: &ArmKeyV6) {
        let _ = self.flows.arm_v6.remove(arm);
    }
    fn kernel_forwarded_packets(&self) -> Option<u64> {
        let per_cpu = self.flows.kernel_forwarded.get(&0, 0).ok()?;
        Some(per_cpu.iter().fold(0u64, |sum, n| sum.wrapping_add(*n)))
    }
    fn take_active(&mut self, now_ns: u64) -> (Vec<FlowKeyV4>, Vec<FlowKeyV6>) {
        // The new pass starts before the record is read: a packet forwarded in between is
        // either taken now or recorded again for the next pass, never lost.
        self.settings.current.active_since_ns = now_ns;
        if let Err(e) = self.settings.write() {
            warn!(error = %format!("{e:#}"), "cannot start a keep-alive pass");
        }
        let v4: Vec<FlowKeyV4> = self.flows.active_v4.keys().filter_map(Result::ok).collect();
        for k in &v4 {
            let _ = self.flows.active_v4.remove(k);
        }
        let v6: Vec<FlowKeyV6> = self.flows.active_v6.keys().filter_map(Result::ok).collect();
        for k in &v6 {
            let _ = self.flows.active_v6.remove(k);
        }
        (v4, v6)
    }
}
