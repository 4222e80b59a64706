//! An in-memory [`FlowTable`] for unit tests (the flow maps without the kernel).

use std::collections::HashMap;

use aya::maps::MapError;
use xdp_router_common::{ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, FlowV4, FlowV6};

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
        self.v4.get(key).copied()
    }
    fn get_v6(&self, key: &FlowKeyV6) -> Option<FlowV6> {
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
}
