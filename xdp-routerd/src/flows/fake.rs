//! An in-memory [`FlowTable`] for unit tests (the flow maps without the kernel).

use std::{
    cell::Cell,
    collections::{HashMap, HashSet},
};

use aya::maps::MapError;
use xdp_router_common::{ArmKeyV4, ArmKeyV6, FLOW_F_REPLY, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6};

use super::FlowTable;

/// The flow maps and their arming indexes, in memory.
#[derive(Default)]
pub struct FakeTable {
    pub v4: HashMap<FlowKeyV4, FlowV4>,
    pub v6: HashMap<FlowKeyV6, FlowV6>,
    pub arm_v4: HashMap<ArmKeyV4, FlowKeyV4>,
    pub arm_v6: HashMap<ArmKeyV6, FlowKeyV6>,
    /// IPv4 directions that fit (0: unlimited).
    pub capacity: usize,
    /// Start of the current keep-alive pass ([`FlowTable::take_active`]).
    pub active_since_ns: u64,
    /// Connections (original tuple, ifindex 0) the datapath recorded as active in this pass.
    pub active_v4: HashSet<FlowKeyV4>,
    pub active_v6: HashSet<FlowKeyV6>,
    /// Packets of offloaded directions the kernel forwarded ([`FakeTable::kernel_forwards_v4`]).
    pub kernel_forwarded: u64,
    /// Flow entries read ([`FlowTable::get_v4`], [`FlowTable::get_v6`]).
    pub reads: Cell<u64>,
}

impl FakeTable {
    /// What the arming program does when the kernel forwards a packet of the IPv4 direction
    /// `key` (xdp-router-ebpf `arm.rs`): `armed_at` written, the kernel-forwarded count up.
    pub fn kernel_forwards_v4(&mut self, key: &FlowKeyV4, tick: u32) {
        self.v4.get_mut(key).expect("offloaded direction").armed_at = tick;
        self.kernel_forwarded += 1;
    }

    /// What the datapath does with the counters and the active record when it forwards a
    /// packet of the IPv4 direction `key` at `now` (xdp-router-ebpf `first_in_pass`).
    pub fn forward_v4(&mut self, key: &FlowKeyV4, now: u64) {
        let v = self.v4.get_mut(key).expect("offloaded direction");
        if v.counters.last_seen_ns < self.active_since_ns {
            let conn = if v.flags & FLOW_F_REPLY == 0 {
                FlowKeyV4 {
                    ifindex: 0,
                    src_be: key.src_be,
                    dst_be: key.dst_be,
                    sport_be: key.sport_be,
                    dport_be: key.dport_be,
                    proto: key.proto,
                    _pad: [0; 3],
                }
            } else {
                FlowKeyV4 {
                    ifindex: 0,
                    src_be: v.new_dst_be,
                    dst_be: v.new_src_be,
                    sport_be: v.new_dport_be,
                    dport_be: v.new_sport_be,
                    proto: key.proto,
                    _pad: [0; 3],
                }
            };
            self.active_v4.insert(conn);
        }
        v.counters.last_seen_ns = now;
        v.counters.packets += 1;
    }
}

fn full_error() -> MapError {
    MapError::SyscallError(aya::sys::SyscallError {
        call: "bpf_map_update_elem",
        io_error: std::io::Error::from_raw_os_error(libc::E2BIG),
    })
}

impl FlowTable for FakeTable {
    fn insert_v4(&mut self, key: &FlowKeyV4, value: &FlowV4) -> Result<(), MapError> {
        if self.capacity != 0 && self.v4.len() >= self.capacity && !self.v4.contains_key(key) {
            return Err(full_error());
        }
        self.v4.insert(*key, *value);
        Ok(())
    }
    fn insert_v6(&mut self, key: &FlowKeyV6, value: &FlowV6) -> Result<(), MapError> {
        self.v6.insert(*key, *value);
        Ok(())
    }
    fn remove_v4(&mut self, key: &FlowKeyV4) {
        self.v4.remove(key);
    }
    fn remove_v6(&mut self, key: &FlowKeyV6) {
        self.v6.remove(key);
    }
    fn get_v4(&self, key: &FlowKeyV4) -> Option<FlowV4> {
        self.reads.set(self.reads.get() + 1);
        self.v4.get(key).copied()
    }
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6> {
        self.reads.set(self.reads.get() + 1);
        self.v6.get(key).copied()
    }
    fn insert_arm_v4(&mut self, arm: &ArmKeyV4, flow: &FlowKeyV4) -> Result<(), MapError> {
        self.arm_v4.insert(*arm, *flow);
        Ok(())
    }
    fn insert_arm_v6(&mut self, arm: &ArmKeyV6, flow: &FlowKeyV6) -> Result<(), MapError> {
        self.arm_v6.insert(*arm, *flow);
        Ok(())
    }
    fn remove_arm_v4(&mut self, arm: &ArmKeyV4) {
        self.arm_v4.remove(arm);
    }
    fn remove_arm_v6(&mut self, arm: &ArmKeyV6) {
        self.arm_v6.remove(arm);
    }
    fn kernel_forwarded_packets(&self) -> Option<u64> {
        Some(self.kernel_forwarded)
    }
    fn take_active(&mut self, now_ns: u64) -> (Vec<FlowKeyV4>, Vec<FlowKeyV6>) {
        self.active_since_ns = now_ns;
        (
            self.active_v4.drain().collect(),
            self.active_v6.drain().collect(),
        )
    }
}
