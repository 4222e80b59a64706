//! The control socket: `status`, `flows` and the fast-path toggle, each answered from the state
//! with a few map reads or one map write (on a blocking thread, see [`crate::control::serve`]),
//! served on a thread and runtime of its own (see [`super::on_own_thread`]).

use std::sync::Arc;

use anyhow::{Context as _, anyhow};
use tokio::net::UnixListener;
use tracing::info;

use crate::{
    control::{self, Handler, Request},
    flows::accounting::KernelCounters,
    state::Shared,
    sync::{ctnetlink::CtNetlink, sysctl::conntrack_acct},
};

/// Serves the control socket (bound at start-up) until the daemon exits.
pub async fn run(listener: UnixListener, shared: Arc<Shared>) -> anyhow::Result<()> {
    // Moved to the thread's own runtime.
    let listener = listener
        .into_std()
        .context("cannot take the control socket off the runtime")?;
    super::on_own_thread("control", move || async move {
        let listener =
            UnixListener::from_std(listener).context("cannot register the control socket")?;
        control::serve(listener, Arc::new(ControlHandler { shared })).await;
        Err(anyhow!("control socket closed"))
    })
    .await
}

/// Answers control requests from the shared state.
pub struct ControlHandler {
    pub shared: Arc<Shared>,
}

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> anyhow::Result<serde_json::Value> {
        Ok(match req {
            Request::Status => serde_json::to_value(self.shared.status()?)?,
            Request::Flows => {
                let (kernel, note) = conntrack_counters();
                serde_json::to_value(self.shared.flows(&kernel, note))?
            }
            Request::Fastpath { on } => {
                self.shared.set_fastpath(on)?;
                info!(on, "fast path switched {}", if on { "on" } else { "off" });
                serde_json::json!({ "fastpath": on })
            }
            Request::VerdictAge { ms } => {
                self.shared.set_verdict_max_age(ms)?;
                info!(
                    ms,
                    "kernel verdicts now held for {ms} ms (0: until the ruleset changes)"
                );
                serde_json::json!({ "verdict_max_age_ms": ms })
            }
        })
    }
}

/// Conntrack's own counters of every connection, read before the state is locked (a dump of
/// the table), and why there are none when there are none.
fn conntrack_counters() -> (KernelCounters, Option<String>) {
    if !conntrack_acct() {
        let note = "net.netfilter.nf_conntrack_acct is 0: the kernel counts nothing (set it to \
                    1; connections are counted from their start)";
        return (KernelCounters::default(), Some(note.into()));
    }
    // On the control task's blocking thread: its runtime drives the request socket.
    let dump = tokio::runtime::Handle::current()
        .block_on(async { CtNetlink::new()?.dump_counters().await });
    match dump {
        Ok(counters) => (counters, None),
        Err(e) => (KernelCounters::default(), Some(e.to_string())),
    }
}
