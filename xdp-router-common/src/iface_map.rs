//! The user side of [`MAP_IFACES`]: an array indexed by ifindex, read and written as a map
//! keyed by ifindex whose entries with `slot` 0 are absent.

use aya::maps::{Array, MapData, MapError};

use crate::IfaceInfo;
#[cfg(doc)]
use crate::{IFACES_ARRAY_LEN, MAP_IFACES};

/// `BPF_EXIST`: update an existing entry only.
const BPF_EXIST: u64 = 2;

/// [`MAP_IFACES`] as a map keyed by ifindex.
///
/// An update of an array entry is copied in place, where a hash map's replaced the entry whole:
/// a packet read while the daemon rewrites an interface may see some fields old and some new,
/// as one that read the entry before the update and again after it would.
pub struct IfaceMap(Array<MapData, IfaceInfo>);

impl IfaceMap {
    /// The map as taken from the loaded object.
    pub fn new(array: Array<MapData, IfaceInfo>) -> Self {
        Self(array)
    }

    /// The entry of `ifindex`; `MapError::KeyNotFound` when it has none.
    pub fn get(&self, ifindex: &u32, flags: u64) -> Result<IfaceInfo, MapError> {
        let info = self.0.get(ifindex, flags)?;
        if info.slot == 0 {
            return Err(MapError::KeyNotFound);
        }
        Ok(info)
    }

    /// Writes the entry of `ifindex`, whose `slot` must not be 0; `flags` as for a hash map
    /// (`BPF_EXIST`: only if it has one). `MapError::OutOfBounds` for an ifindex from
    /// [`IFACES_ARRAY_LEN`] on.
    pub fn insert(&mut self, ifindex: u32, info: IfaceInfo, flags: u64) -> Result<(), MapError> {
        if flags & BPF_EXIST != 0 {
            self.get(&ifindex, 0)?;
        }
        self.0.set(ifindex, info, 0)
    }

    /// Removes the entry of `ifindex`; `MapError::KeyNotFound` when it has none.
    pub fn remove(&mut self, ifindex: &u32) -> Result<(), MapError> {
        self.get(ifindex, 0)?;
        self.0.set(*ifindex, IfaceInfo::default(), 0)
    }

    /// Removes every entry.
    pub fn clear(&mut self) -> Result<(), MapError> {
        for ifindex in 0..self.0.len() {
            if self.0.get(&ifindex, 0)?.slot != 0 {
                self.0.set(ifindex, IfaceInfo::default(), 0)?;
            }
        }
        Ok(())
    }
}
