//! The lock the tasks share the state behind ([`Shared`], [`StateGuard`]), what it tells them
//! besides (route answers gone stale, a revalidation or a PPPoE read asked for), the status
//! published for reads that find the state busy, and how much work one lock hold may do
//! ([`APPLY_CHUNK`]).

use std::{
    net::IpAddr,
    panic::Location,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use parking_lot::{FairMutex, FairMutexGuard};
use tokio::sync::Notify;
use tracing::warn;
use xdp_router_common::HOST_SLOT_OTHER;

use super::{State, lock_stats, monotonic_ns};
use crate::{
    config::check_verdict_max_age,
    datapath::hosts::HostTrafficMap,
    flows::{
        Offloaded,
        accounting::{HostTotals, HostTraffic, KernelCounters},
    },
    paths::Stale,
    status::{Flows, Status},
};

/// Connections (or events) applied per lock hold when many are (resync, revalidation, a big
/// event batch): status, metrics and the other tasks get the lock in between. Measured under
/// `bench responsive`: a chunk of 4,096 upserts held the lock up to 47 ms; 1,024 keep holds
/// near 10 ms.
pub const APPLY_CHUNK: usize = 1024;

/// What the tasks share: the state, and what tells a task that route answers it looked up
/// may be stale.
pub struct Shared {
    state: FairMutex<State>,
    /// Bumped (before anything else) when an rtnetlink notification that can change a route
    /// answer arrives: a task that looked routes up compares it before and after.
    paths_generation: AtomicU64,
    /// Asks the rtnetlink task for a revalidation (a batch was applied with route answers
    /// that were stale by then).
    revalidate: Notify,
    /// What the next revalidation re-checks (gathered until it starts; its own small lock,
    /// never held with the state's).
    stale: parking_lot::Mutex<Stale>,
    /// The last status built, and when: answers a status read that finds the state busy.
    published: parking_lot::Mutex<Option<(Instant, Arc<Status>)>>,
    /// Asks the PPPoE task to read the sessions now (links changed).
    pppoe_read: Notify,
    /// Signalled when a lock holder had the state mutably (see [`StateGuard`]): the status
    /// publisher rebuilds only then, so an idle daemon builds no status and reads no counter.
    changed: Notify,
}

/// How long a status read waits for the state lock before it answers from the last status
/// built instead (see [`Shared::status`]).
pub const STATUS_WAIT: Duration = Duration::from_millis(10);
/// The oldest published status a read may answer with; older, it waits for the lock. Long
/// enough to cover a lock holder the scheduler keeps off the CPU on a loaded machine (up to
/// 1.6 s measured under `bench responsive` with three other build jobs on 2 cores).
pub const STATUS_MAX_AGE: Duration = Duration::from_secs(5);

impl Shared {
    /// Wraps the state built at start-up.
    pub fn new(state: State) -> Shared {
        Shared {
            state: FairMutex::new(state),
            paths_generation: AtomicU64::new(0),
            revalidate: Notify::new(),
            stale: parking_lot::Mutex::new(Stale::default()),
            published: parking_lot::Mutex::new(None),
            pppoe_read: Notify::new(),
            changed: Notify::new(),
        }
    }

    /// Locks the state (for planned map writes or a status read only). Fair: a task that
    /// applies a table in chunks lets every waiting request in between two chunks. How long
    /// each call site waits and holds it is recorded while debugging (see [`lock_stats`]).
    #[track_caller]
    pub fn lock(&self) -> StateGuard<'_> {
        // Outside any closure: a closure would be the caller.
        let at = Location::caller();
        let timed = lock_stats::enabled().then(|| (at, Instant::now()));
        let guard = self.state.lock();
        StateGuard {
            guard,
            timed: timed.map(|(at, asked)| (at, asked.elapsed(), Instant::now())),
            changed: &self.changed,
            touched: false,
        }
    }

    /// Waits at most `wait` for the state lock (see [`Shared::lock`]).
    #[track_caller]
    pub fn try_lock_for(&self, wait: Duration) -> Option<StateGuard<'_>> {
        let at = Location::caller();
        let asked = Instant::now();
        let guard = self.state.try_lock_for(wait)?;
        Some(StateGuard {
            guard,
            timed: lock_stats::enabled().then(|| (at, asked.elapsed(), Instant::now())),
            changed: &self.changed,
            touched: false,
        })
    }

    /// What `xdp-routerd status` and `/metrics` show: built fresh when the state lock is free
    /// within [`STATUS_WAIT`], else the status last built if it is younger than
    /// [`STATUS_MAX_AGE`] (rebuilt after changes by [`crate::tasks::status`], so it is fresh
    /// whenever bulk work holds the lock), else built fresh after waiting for the lock. A
    /// scrape does not queue behind bulk work.
    pub fn status(&self) -> anyhow::Result<Status> {
        if let Some(s) = self.try_lock_for(STATUS_WAIT) {
            return self.build_status(s);
        }
        if let Some((at, status)) = self.published.lock().clone()
            && at.elapsed() < STATUS_MAX_AGE
        {
            let mut status = (*status).clone();
            status.age_ms = at.elapsed().as_millis() as u64;
            return Ok(status);
        }
        self.build_status(self.lock())
    }

    /// Builds the status under `s` (released before it is published) and publishes it.
    pub fn build_status(&self, s: StateGuard<'_>) -> anyhow::Result<Status> {
        let status = s.status()?;
        drop(s);
        *self.published.lock() = Some((Instant::now(), Arc::new(status.clone())));
        Ok(status)
    }

    /// What `xdp-routerd flows` shows: the connections listed under the lock, their counters
    /// (two map reads each) read a chunk at a time with the lock released in between, so a
    /// listing of 100,000 flows does not stall the other tasks, each merged with conntrack's
    /// own (`kernel`, read before; `conntrack_note`: why there are none). A connection removed
    /// meanwhile is left out.
    pub fn flows(&self, kernel: &KernelCounters, conntrack_note: Option<String>) -> Flows {
        let conns: Vec<Offloaded> = self.lock().flows().conns().collect();
        let now = monotonic_ns();
        let mut flows = Vec::with_capacity(2 * conns.len());
        for chunk in conns.chunks(APPLY_CHUNK) {
            flows.extend(self.lock().flow_rows(chunk, now, kernel));
        }
        Flows {
            flows,
            conntrack_note,
        }
    }

    /// What the router forwarded per LAN host on offloaded connections (the per-host
    /// metrics): the admitted hosts' slots, taken under the lock, then one read of `map` per
    /// host and one for `other`, without it. Costs what the hosts cost, not the connections.
    /// A slot that cannot be read counts as zero (logged; the collector reports the previous
    /// value instead).
    pub fn host_traffic(&self, map: &HostTrafficMap) -> HostTotals {
        let slots: Vec<(IpAddr, u32)> = self.lock().flows().ledger().slots().collect();
        let read = |slot: u32| match map.read(slot) {
            Ok(c) => HostTraffic::from(c),
            Err(e) => {
                warn!(slot, error = %e, "cannot read the per-host counters");
                HostTraffic::default()
            }
        };
        HostTotals {
            hosts: slots
                .into_iter()
                .map(|(host, slot)| (host, read(slot)))
                .collect(),
            other: read(HOST_SLOT_OTHER),
        }
    }

    /// Switches the fast path on or off; the published status says so at once.
    pub fn set_fastpath(&self, on: bool) -> anyhow::Result<()> {
        let mut s = self.lock();
        s.set_fastpath(on)?;
        self.build_status(s).map(drop)
    }

    /// Sets `verdict_max_age_ms` live (see [`crate::config::Config::verdict_max_age_ms`]).
    pub fn set_verdict_max_age(&self, ms: u64) -> anyhow::Result<()> {
        check_verdict_max_age(ms).map_err(anyhow::Error::msg)?;
        let mut s = self.lock();
        s.set_verdict_max_age(Duration::from_millis(ms))?;
        self.build_status(s).map(drop)
    }

    /// The current route generation (see [`Shared::paths_changed`]).
    pub fn paths_generation(&self) -> u64 {
        self.paths_generation.load(Ordering::Acquire)
    }

    /// Routes, addresses or links may have changed: answers looked up before are stale.
    pub fn paths_changed(&self) {
        self.paths_generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Asks for a revalidation of the connections `stale` names against fresh route answers
    /// (nothing when it is empty). Requests made before the revalidation task takes them
    /// coalesce into one pass.
    pub fn request_revalidation(&self, stale: Stale) {
        if stale.is_empty() {
            return;
        }
        self.stale.lock().merge(stale);
        self.revalidate.notify_one();
    }

    /// Resolves when the state was changed (had mutably under the lock) since the last call;
    /// changes made meanwhile coalesce into one wake-up.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Asks the PPPoE task for a read of the sessions (see [`crate::tasks::pppoe`]); requests
    /// made before it starts the read coalesce.
    pub fn request_pppoe_read(&self) {
        self.pppoe_read.notify_one();
    }

    /// Resolves when a read of the PPPoE sessions was asked for.
    pub async fn pppoe_read_requested(&self) {
        self.pppoe_read.notified().await;
    }

    /// Resolves when a revalidation was asked for, with what it must re-check.
    pub async fn revalidation_requested(&self) -> Stale {
        loop {
            self.revalidate.notified().await;
            let stale = std::mem::take(&mut *self.stale.lock());
            if !stale.is_empty() {
                return stale;
            }
        }
    }
}

/// The locked state (see [`Shared::lock`]). Having it mutably counts as a change: the status
/// publisher is told when the guard is dropped.
pub struct StateGuard<'a> {
    guard: FairMutexGuard<'a, State>,
    /// Where it was locked, how long that took, and when it was got (while timing).
    timed: Option<(&'static Location<'static>, Duration, Instant)>,
    /// [`Shared::changed`]'s signal.
    changed: &'a Notify,
    /// Whether the state was had mutably.
    touched: bool,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.touched = true;
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if self.touched {
            self.changed.notify_one();
        }
        if let Some((at, wait, got)) = self.timed {
            let hold = got.elapsed();
            lock_stats::record(at, wait, hold);
        }
    }
}
