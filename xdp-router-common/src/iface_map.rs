//! The user side of [`MAP_IFACES`] and [`MAP_IFACES_HIGH`]: an array indexed by ifindex below
//! [`IFACES_DIRECT`] and by an index the high map gives above, read and written as one map
//! keyed by ifindex whose entries with `slot` 0 are absent.

use aya::maps::{Array, HashMap, MapData, MapError};

use crate::{IFACES_ARRAY_LEN, IFACES_DIRECT, IfaceInfo, MAX_IFACE_SLOTS};
#[cfg(doc)]
use crate::{MAP_IFACES, MAP_IFACES_HIGH};

/// `BPF_EXIST`: update an existing entry only.
const BPF_EXIST: u64 = 2;

/// [`MAP_IFACES`] (with [`MAP_IFACES_HIGH`]) as a map keyed by ifindex.
///
/// An update of an array entry is copied in place, where a hash map's replaced the entry whole:
/// a packet read while the daemon rewrites an interface may see some fields old and some new,
/// as one that read the entry before the update and again after it would.
pub struct IfaceMap {
    array: Array<MapData, IfaceInfo>,
    high: HashMap<MapData, u32, u32>,
}

impl IfaceMap {
    /// The maps as taken from the loaded object.
    pub fn new(array: Array<MapData, IfaceInfo>, high: HashMap<MapData, u32, u32>) -> Self {
        Self { array, high }
    }

    /// The array index of `ifindex`'s entry, `None` for a large ifindex without one.
    fn index(&self, ifindex: u32) -> Result<Option<u32>, MapError> {
        if ifindex < IFACES_DIRECT {
            return Ok(Some(ifindex));
        }
        match self.high.get(&ifindex, 0) {
            Ok(index) => Ok(Some(index)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A free index after the directly indexed part, for a large ifindex.
    fn free_index(&self) -> Result<u32, MapError> {
        let mut taken = [false; MAX_IFACE_SLOTS as usize];
        for entry in self.high.iter() {
            if let Some(t) = taken.get_mut(entry?.1.wrapping_sub(IFACES_DIRECT) as usize) {
                *t = true;
            }
        }
        (IFACES_DIRECT..IFACES_ARRAY_LEN)
            .find(|i| !taken[(i - IFACES_DIRECT) as usize])
            .ok_or(MapError::OutOfBounds {
                index: IFACES_ARRAY_LEN,
                max_entries: IFACES_ARRAY_LEN,
            })
    }

    /// The entry of `ifindex`; `MapError::KeyNotFound` when it has none.
    pub fn get(&self, ifindex: &u32, flags: u64) -> Result<IfaceInfo, MapError> {
        let Some(index) = self.index(*ifindex)? else {
            return Err(MapError::KeyNotFound);
        };
        let info = self.array.get(&index, flags)?;
        if info.slot == 0 {
            return Err(MapError::KeyNotFound);
        }
        Ok(info)
    }

    /// Writes the entry of `ifindex`, whose `slot` must not be 0; `flags` as for a hash map
    /// (`BPF_EXIST`: only if it has one). A large ifindex takes a free index after the direct
    /// part (written before the high map points to it); `MapError::OutOfBounds` when none is
    /// left, which more managed interfaces than stats slots would need.
    pub fn insert(&mut self, ifindex: u32, info: IfaceInfo, flags: u64) -> Result<(), MapError> {
        if flags & BPF_EXIST != 0 {
            self.get(&ifindex, 0)?;
        }
        match self.index(ifindex)? {
            Some(index) => self.array.set(index, info, 0),
            None => {
                let index = self.free_index()?;
                self.array.set(index, info, 0)?;
                self.high.insert(ifindex, index, 0)
            }
        }
    }

    /// Removes the entry of `ifindex`; `MapError::KeyNotFound` when it has none. A large
    /// ifindex leaves the high map before its array entry is cleared.
    pub fn remove(&mut self, ifindex: &u32) -> Result<(), MapError> {
        self.get(ifindex, 0)?;
        let Some(index) = self.index(*ifindex)? else {
            return Err(MapError::KeyNotFound);
        };
        if *ifindex >= IFACES_DIRECT {
            self.high.remove(ifindex)?;
        }
        self.array.set(index, IfaceInfo::default(), 0)
    }

    /// Removes every entry.
    pub fn clear(&mut self) -> Result<(), MapError> {
        while let Some(ifindex) = self.high.keys().next() {
            self.high.remove(&ifindex?)?;
        }
        for index in 0..self.array.len() {
            if self.array.get(&index, 0)?.slot != 0 {
                self.array.set(index, IfaceInfo::default(), 0)?;
            }
        }
        Ok(())
    }
}
