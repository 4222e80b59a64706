//! Where the routes a batch of flows needs are looked up, before any lock is taken.
//!
//! [`FlowManager`](crate::flows::FlowManager) asks a [`PathOracle`] up to three questions per
//! conntrack entry. [`resolve`] asks the kernel all of them for a whole batch first (deduplicated:
//! one query per address or per `(src, dst, iif, mark)`, many in flight at once), and the
//! [`ResolvedPaths`] it returns answers the manager from memory while the map writes are applied.
//! The answers are exact for the batch: the same query within one pass gets the same answer.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    future::Future,
    net::IpAddr,
    sync::atomic::{AtomicU64, Ordering},
};

use netlink_packet_route::route::RouteType;

use crate::flows::{
    PathOracle,
    conntrack::{CtEntry, CtTuple},
};
use prefix::Prefix;

/// Something that answers route queries in bulk (the kernel over rtnetlink, or a test fake).
pub trait RouteSource {
    /// One answer per query, in order (`None`: no usable route).
    fn lookup_all(
        &mut self,
        queries: &[RouteQuery],
    ) -> impl Future<Output = Vec<Option<RouteInfo>>> + Send;
}

/// What a route query found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteInfo {
    /// Route type (unicast, local, blackhole, ...).
    pub kind: RouteType,
    /// Output interface, if any.
    pub oif: Option<u32>,
}

/// One `ip route get DST [from SRC iif IIF mark MARK]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RouteQuery {
    pub dst: IpAddr,
    /// Source, ingress interface and packet mark: the route of a packet the kernel forwards,
    /// FIB rules included. `None`: the plain route to `dst`.
    pub from: Option<(IpAddr, u32, u32)>,
}

/// Route answers for one batch of conntrack entries; a [`PathOracle`] that never does I/O.
#[derive(Debug, Default)]
pub struct ResolvedPaths {
    answers: HashMap<RouteQuery, Option<RouteInfo>>,
    /// Questions asked that were not looked up (an entry that changed after [`resolve`]).
    missed: AtomicU64,
}

impl ResolvedPaths {
    /// Number of distinct queries answered.
    pub fn len(&self) -> usize {
        self.answers.len()
    }

    /// True when nothing was looked up.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Questions that had no looked-up answer (and were answered "no route").
    pub fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    fn answer(&self, q: RouteQuery) -> Option<Option<RouteInfo>> {
        let a = self.answers.get(&q).copied();
        if a.is_none() {
            self.missed.fetch_add(1, Ordering::Relaxed);
        }
        a
    }

    fn plain(&self, addr: IpAddr) -> Option<RouteInfo> {
        self.answer(RouteQuery {
            dst: addr,
            from: None,
        })
        .flatten()
    }
}

impl PathOracle for ResolvedPaths {
    fn ingress_for(&self, addr: IpAddr) -> Option<u32> {
        match self.plain(addr) {
            Some(RouteInfo {
                kind: RouteType::Unicast,
                oif,
            }) => oif,
            _ => None,
        }
    }

    fn forward_egress(&self, src: IpAddr, dst: IpAddr, iif: u32, mark: u32) -> Option<u32> {
        let q = RouteQuery {
            dst,
            from: Some((src, iif, mark)),
        };
        match self.answer(q).flatten() {
            Some(RouteInfo {
                kind: RouteType::Unicast,
                oif,
            }) => oif,
            // Local, blackhole, unreachable...: the kernel would not forward it.
            Some(_) => None,
            // The input-route query itself failed (e.g. the source fails rp_filter): judge by
            // the plain route to `dst`.
            None => self.ingress_for(dst),
        }
    }

    fn is_local(&self, addr: IpAddr) -> bool {
        matches!(
            self.plain(addr),
            Some(RouteInfo {
                kind: RouteType::Local,
                ..
            })
        )
    }
}

/// Which connections' route answers may be stale and must be looked up again (a
/// revalidation's scope): everything, or the connections with an address inside a changed
/// route's destination, or named ones (looked up while the routing changed).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stale {
    all: bool,
    /// Changed destinations by (IPv6?, prefix length): their masked addresses.
    prefixes: BTreeMap<(bool, u8), HashSet<IpAddr>>,
    conns: HashSet<CtTuple>,
}

impl Stale {
    /// Every connection.
    pub fn all() -> Stale {
        Stale {
            all: true,
            ..Stale::default()
        }
    }

    /// Nothing is stale.
    pub fn is_empty(&self) -> bool {
        !self.all && self.prefixes.is_empty() && self.conns.is_empty()
    }

    /// Whether every connection is.
    pub fn is_all(&self) -> bool {
        self.all
    }

    /// Makes every connection stale.
    pub fn add_all(&mut self) {
        *self = Stale::all();
    }

    /// The answers for addresses inside `p` may have changed.
    pub fn add_prefix(&mut self, p: Prefix) {
        if !self.all {
            self.prefixes
                .entry((p.addr.is_ipv6(), p.len))
                .or_default()
                .insert(p.addr);
        }
    }

    /// The answers looked up for these connections may have changed.
    pub fn add_conns(&mut self, conns: impl IntoIterator<Item = CtTuple>) {
        if !self.all {
            self.conns.extend(conns);
        }
    }

    /// Adds what `other` holds.
    pub fn merge(&mut self, other: Stale) {
        if other.all {
            self.add_all();
        } else if !self.all {
            for (k, v) in other.prefixes {
                self.prefixes.entry(k).or_default().extend(v);
            }
            self.conns.extend(other.conns);
        }
    }

    /// The changed destinations.
    pub fn prefixes(&self) -> impl Iterator<Item = Prefix> + '_ {
        self.prefixes
            .iter()
            .flat_map(|(&(_, len), addrs)| addrs.iter().map(move |&addr| Prefix { addr, len }))
    }

    /// The connections named.
    pub fn conns(&self) -> impl Iterator<Item = &CtTuple> + '_ {
        self.conns.iter()
    }

    /// Whether `addr` is inside a changed destination.
    fn covers(&self, addr: IpAddr) -> bool {
        let v6 = addr.is_ipv6();
        self.prefixes
            .range((v6, 0)..=(v6, u8::MAX))
            .any(|(&(_, len), set)| set.contains(&Prefix::mask(addr, len)))
    }

    /// Whether `e`'s route answers may be stale: it is named, or one of the addresses
    /// [`resolve`] asks about for it (source, NAT address, reply source) is covered.
    pub fn touches(&self, e: &CtEntry) -> bool {
        self.all
            || self.conns.contains(&e.orig)
            || [e.orig.src, e.reply.dst, e.reply.src]
                .into_iter()
                .any(|a| self.covers(a))
    }
}

/// Looks up every route that offloading `entries` can ask about, in three rounds of batched
/// queries (the forwarding query needs the ingress the first round finds; its fallback needs
/// the second round's answer). Entries conntrack does not let us offload ask nothing.
pub async fn resolve<'a>(
    source: &mut impl RouteSource,
    entries: impl IntoIterator<Item = &'a CtEntry>,
) -> ResolvedPaths {
    let entries: Vec<&CtEntry> = entries
        .into_iter()
        .filter(|e| e.offload_decision().is_ok())
        .collect();
    let mut paths = ResolvedPaths::default();
    let plain = |dst| RouteQuery { dst, from: None };
    // Round 1: where each source is reached, and whether each NAT address is local.
    let round1 = entries.iter().flat_map(|e| {
        let nat = (e.reply.dst != e.orig.src).then_some(plain(e.reply.dst));
        std::iter::once(plain(e.orig.src)).chain(nat)
    });
    ask(source, &mut paths, round1).await;
    // Round 2: where the kernel forwards the original direction (policy routing included).
    let forward = |e: &CtEntry, iif| RouteQuery {
        dst: e.reply.src,
        from: Some((e.orig.src, iif, e.mark)),
    };
    let round2: Vec<RouteQuery> = entries
        .iter()
        .filter_map(|e| Some(forward(e, paths.ingress_for_quiet(e.orig.src)?)))
        .collect();
    ask(source, &mut paths, round2.iter().copied()).await;
    // Round 3: the plain route to the destination where the forwarding query failed.
    let round3: Vec<RouteQuery> = round2
        .iter()
        .filter(|q| paths.answers.get(q).copied().flatten().is_none())
        .map(|q| plain(q.dst))
        .collect();
    ask(source, &mut paths, round3).await;
    paths
}

impl ResolvedPaths {
    /// [`PathOracle::ingress_for`] without counting a miss (used while resolving).
    fn ingress_for_quiet(&self, addr: IpAddr) -> Option<u32> {
        match self.answers.get(&RouteQuery {
            dst: addr,
            from: None,
        }) {
            Some(Some(RouteInfo {
                kind: RouteType::Unicast,
                oif,
            })) => *oif,
            _ => None,
        }
    }
}

/// Looks up the queries not answered yet (each once).
async fn ask(
    source: &mut impl RouteSource,
    paths: &mut ResolvedPaths,
    queries: impl IntoIterator<Item = RouteQuery>,
) {
    let mut seen = HashSet::new();
    let todo: Vec<RouteQuery> = queries
        .into_iter()
        .filter(|q| !paths.answers.contains_key(q) && seen.insert(*q))
        .collect();
    if todo.is_empty() {
        return;
    }
    let answers = source.lookup_all(&todo).await;
    paths.answers.extend(todo.into_iter().zip(answers));
}

pub mod prefix;
#[cfg(test)]
mod tests;
