//! The control socket: `status`, `flows` and the fast-path toggle, each answered from the state
//! with a few map reads or one map write (on a blocking thread, see [`crate::control::serve`]).

use std::sync::Arc;

use tracing::info;

use crate::{
    control::{Handler, Request},
    state::Shared,
};

/// Answers control requests from the shared state.
pub struct ControlHandler {
    pub shared: Arc<Shared>,
}

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> anyhow::Result<serde_json::Value> {
        let mut s = self.shared.lock();
        Ok(match req {
            Request::Status => serde_json::to_value(s.status()?)?,
            Request::Flows => serde_json::to_value(s.flows())?,
            Request::Fastpath { on } => {
                s.dp.set_fastpath(on)?;
                info!(on, "fast path switched {}", if on { "on" } else { "off" });
                serde_json::json!({ "fastpath": on })
            }
        })
    }
}
