//! Which offloaded connections the kernel has forwarded a packet of since their map entries
//! were written (the TC arming program records it in `armed_at`): the TCP ones among them are
//! the connections whose "be liberal" mark must be repeated after arming (see
//! [`crate::tasks::conntrack`]); a connection the kernel has not forwarded since its mark has
//! had no packet that could set `MAXACK_SET` again.

use super::conntrack::CtEntry;
use super::map_entries::{DirKey, Plan};
use super::{FlowManager, FlowTable};

/// Whether the kernel may have forwarded a packet of an offloaded direction since `before`
/// ([`FlowTable::kernel_forwarded_packets`] read earlier, e.g. before a batch's entries were
/// written): not when the count has not moved, so no `armed_at` was written and no entry
/// needs reading (a million idle connections after a start-up cost one read, not two
/// million); yes when either read failed.
pub fn kernel_forwarded_since(table: &impl FlowTable, before: Option<u64>) -> bool {
    before.is_none() || table.kernel_forwarded_packets() != before
}

impl FlowManager {
    /// The connections of `entries` that are offloaded and have a direction the kernel
    /// forwarded since its map entry was written (`armed_at` set; two map reads each; ask
    /// [`kernel_forwarded_since`] first).
    pub fn kernel_forwarded<'a>(
        &self,
        entries: impl IntoIterator<Item = &'a CtEntry>,
        table: &impl FlowTable,
    ) -> Vec<CtEntry> {
        entries
            .into_iter()
            .filter(|e| {
                let Some(conn) = self.get(&e.orig) else {
                    return false;
                };
                let plan = Plan::new(
                    &e.orig,
                    &conn.reply,
                    conn.ingress[0],
                    conn.ingress[1],
                    conn.awaiting_traffic,
                );
                plan.keys.iter().any(|key| match key {
                    DirKey::V4(k) => table.get_v4(k).is_some_and(|v| v.armed_at != 0),
                    DirKey::V6(k) => table.get_v6(k).is_some_and(|v| v.armed_at != 0),
                })
            })
            .cloned()
            .collect()
    }
}
