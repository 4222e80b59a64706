//! The kernel's XDP feature notifications (`netdev` generic-netlink family, see
//! [`crate::sync::xdp_xmit`]): a device that gains or loses `NETDEV_XDP_ACT_NDO_XMIT` (a veth
//! whose peer got or lost XDP or GRO) has `IFACE_F_NO_XDP_XMIT` flipped, managed interfaces and
//! bridge ports alike.

use std::sync::Arc;

use anyhow::anyhow;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::{state::Shared, sync::xdp_xmit::XmitEvent};

/// Follows the notifications until their thread ends (the socket failed).
pub async fn run(
    shared: Arc<Shared>,
    mut events: UnboundedReceiver<XmitEvent>,
) -> anyhow::Result<()> {
    while let Some(ev) = events.recv().await {
        shared.lock().apply_xmit_event(ev);
    }
    Err(anyhow!("netdev (XDP features) event socket closed"))
}
