//! The flow maps against conntrack after a churn step: the directions the daemon offloaded
//! (read from the kernel's maps) and the conntrack entries the fast path may carry, compared
//! until they agree (stale and missing entries counted).

use std::{
    collections::HashSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_testbed::netns::Netns;

use crate::router::Daemon;

/// Time the daemon gets after a step to bring its maps in step with conntrack.
pub(super) const CATCH_UP: Duration = Duration::from_secs(10);

/// Both tuples of a conntrack entry, as `(proto, "src:sport", "dst:dport")`.
type Tuple = (u8, String, String);

/// Carriable conntrack entries of the router (ESTABLISHED TCP, ASSURED UDP): their original
/// and reply tuples.
fn carriable(rtr: &Netns) -> Result<Vec<(Tuple, Tuple)>> {
    let out = rtr
        .sh("conntrack -L 2>/dev/null; conntrack -L -f ipv6 2>/dev/null; true")
        .context("listing conntrack (install conntrack)")?;
    Ok(out.lines().filter_map(parse_conntrack_line).collect())
}

/// The original and reply tuples of a `conntrack -L` line; `None` for an entry the fast path
/// does not carry.
fn parse_conntrack_line(l: &str) -> Option<(Tuple, Tuple)> {
    let proto = match l.split_whitespace().next()? {
        "tcp" if l.contains(" ESTABLISHED ") => 6,
        "udp" if l.contains("[ASSURED]") => 17,
        _ => return None,
    };
    // src=, dst=, sport=, dport= appear twice: the original tuple, then the reply tuple.
    let all = |key: &str| -> Vec<&str> {
        l.split_whitespace()
            .filter_map(|w| w.strip_prefix(key))
            .collect()
    };
    let (src, dst, sport, dport) = (all("src="), all("dst="), all("sport="), all("dport="));
    let sock = |i: usize, ip: &[&str], port: &[&str]| -> Option<String> {
        let ip: IpAddr = ip.get(i)?.parse().ok()?;
        Some(SocketAddr::new(ip, port.get(i)?.parse().ok()?).to_string())
    };
    let tuple = |i: usize| -> Option<Tuple> {
        Some((proto, sock(i, &src, &sport)?, sock(i, &dst, &dport)?))
    };
    Some((tuple(0)?, tuple(1)?))
}

/// The flow directions in the kernel's flow maps and the flow keys the arming maps point at,
/// read from the daemon's maps by id (what the fast path sees, not the daemon's bookkeeping).
struct Maps {
    flows: Vec<Tuple>,
    armed: Vec<Tuple>,
}

fn v4(addr: u32, port: u16) -> String {
    SocketAddr::new(
        IpAddr::V4(Ipv4Addr::from(u32::from_be(addr))),
        u16::from_be(port),
    )
    .to_string()
}

fn v6(addr: [u32; 4], port: u16) -> String {
    let mut b = [0u8; 16];
    for (chunk, w) in b.chunks_exact_mut(4).zip(addr) {
        chunk.copy_from_slice(&w.to_ne_bytes());
    }
    SocketAddr::new(IpAddr::V6(Ipv6Addr::from(b)), u16::from_be(port)).to_string()
}

fn read_maps(daemon: &Daemon) -> Result<Maps> {
    use aya::maps::{HashMap, Map, MapData, MapInfo};
    use xdp_router_common::{
        ArmKeyV4, ArmKeyV6, FlowKeyV4, FlowKeyV6, MAP_ARM_V4, MAP_ARM_V6, MAP_FLOWS_V4,
        MAP_FLOWS_V6,
    };
    let ids = daemon.map_ids()?;
    let mut maps = Maps {
        flows: Vec::new(),
        armed: Vec::new(),
    };
    // The map's own keys (any hash-map flavour: aya checks the type on conversion).
    fn keys<K: aya::Pod, V: aya::Pod>(id: u32) -> Result<Vec<K>> {
        let data = MapData::from_id(id)?;
        let map: HashMap<MapData, K, V> = match Map::from_map_data(data)? {
            Map::HashMap(d) => HashMap::try_from(Map::HashMap(d))?,
            Map::LruHashMap(d) => HashMap::try_from(Map::LruHashMap(d))?,
            _ => bail!("map {id} is not a hash map"),
        };
        Ok(map.keys().collect::<Result<Vec<K>, _>>()?)
    }
    fn values<K: aya::Pod, V: aya::Pod>(id: u32) -> Result<Vec<V>> {
        let data = MapData::from_id(id)?;
        let map: HashMap<MapData, K, V> = match Map::from_map_data(data)? {
            Map::HashMap(d) => HashMap::try_from(Map::HashMap(d))?,
            Map::LruHashMap(d) => HashMap::try_from(Map::LruHashMap(d))?,
            _ => bail!("map {id} is not a hash map"),
        };
        Ok(map
            .iter()
            .collect::<Result<Vec<(K, V)>, _>>()?
            .into_iter()
            .map(|(_, v)| v)
            .collect())
    }
    let mut seen = [false; 4];
    for id in ids {
        let name = MapInfo::from_id(id)?;
        let t4 = |k: &FlowKeyV4| (k.proto, v4(k.src_be, k.sport_be), v4(k.dst_be, k.dport_be));
        let t6 = |k: &FlowKeyV6| (k.proto, v6(k.src_be, k.sport_be), v6(k.dst_be, k.dport_be));
        match name.name_as_str() {
            Some(MAP_FLOWS_V4) => {
                seen[0] = true;
                let k = keys::<FlowKeyV4, xdp_router_common::FlowV4>(id)?;
                maps.flows.extend(k.iter().map(t4));
            }
            Some(MAP_FLOWS_V6) => {
                seen[1] = true;
                let k = keys::<FlowKeyV6, xdp_router_common::FlowV6>(id)?;
                maps.flows.extend(k.iter().map(t6));
            }
            Some(MAP_ARM_V4) => {
                seen[2] = true;
                maps.armed
                    .extend(values::<ArmKeyV4, FlowKeyV4>(id)?.iter().map(t4));
            }
            Some(MAP_ARM_V6) => {
                seen[3] = true;
                maps.armed
                    .extend(values::<ArmKeyV6, FlowKeyV6>(id)?.iter().map(t6));
            }
            _ => {}
        }
    }
    if seen != [true; 4] {
        bail!(
            "xdp-routerd (pid {}) holds no flow or arming maps",
            daemon.pid()
        );
    }
    Ok(maps)
}

/// Compares the kernel's flow maps with conntrack until they agree or [`CATCH_UP`] passes;
/// returns the flow directions (and arming entries) without a carriable conntrack entry
/// (stale) and the carriable entries without both directions offloaded (missing).
pub(super) fn in_step(rtr: &Netns, daemon: &Daemon, out: &Path) -> Result<(u64, u64)> {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let maps = read_maps(daemon)?;
        let ct = carriable(rtr)?;
        let tuples: HashSet<&Tuple> = ct.iter().flat_map(|(o, r)| [o, r]).collect();
        let flows: HashSet<&Tuple> = maps.flows.iter().collect();
        let stale = maps.flows.iter().filter(|t| !tuples.contains(t)).count()
            + maps.armed.iter().filter(|t| !flows.contains(t)).count()
            + maps.flows.len().saturating_sub(maps.armed.len());
        let missing = ct
            .iter()
            .filter(|(o, r)| !flows.contains(o) || !flows.contains(r))
            .count();
        let (stale, missing) = (stale as u64, missing as u64);
        if (stale == 0 && missing == 0) || Instant::now() > deadline {
            if stale + missing > 0 {
                let _ = std::fs::write(
                    out.join("churn-flows.txt"),
                    daemon.flows_text().unwrap_or_default(),
                );
                let _ = std::fs::write(
                    out.join("churn-conntrack.txt"),
                    rtr.sh("conntrack -L 2>&1; conntrack -L -f ipv6 2>&1")
                        .unwrap_or_default(),
                );
            }
            return Ok((stale, missing));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conntrack_lines_parse_to_both_tuples() {
        let tcp = "tcp      6 431999 ESTABLISHED src=10.0.1.2 dst=10.0.2.2 sport=40000 \
                   dport=7000 src=10.0.2.2 dst=10.0.2.1 sport=7000 dport=40000 [ASSURED] \
                   mark=0 use=1";
        assert_eq!(
            parse_conntrack_line(tcp),
            Some((
                (6, "10.0.1.2:40000".into(), "10.0.2.2:7000".into()),
                (6, "10.0.2.2:7000".into(), "10.0.2.1:40000".into())
            ))
        );
        let tw = tcp.replace("ESTABLISHED", "TIME_WAIT");
        assert_eq!(parse_conntrack_line(&tw), None);
        let udp6 = "udp      17 119 src=fd00:1::2 dst=fd00:2::2 sport=5000 dport=7000 \
                    src=fd00:2::2 dst=fd00:1::2 sport=7000 dport=5000 [ASSURED] mark=0 use=1";
        assert_eq!(
            parse_conntrack_line(udp6),
            Some((
                (17, "[fd00:1::2]:5000".into(), "[fd00:2::2]:7000".into()),
                (17, "[fd00:2::2]:7000".into(), "[fd00:1::2]:5000".into())
            ))
        );
        assert_eq!(parse_conntrack_line(&udp6.replace("[ASSURED]", "")), None);
    }

    #[test]
    fn map_keys_print_as_conntrack_does() {
        let a = u32::from(Ipv4Addr::new(10, 0, 1, 2)).to_be();
        assert_eq!(v4(a, 7000u16.to_be()), "10.0.1.2:7000");
        let ip6: Ipv6Addr = "fd00:1::2".parse().unwrap();
        let o = ip6.octets();
        let words: [u32; 4] = std::array::from_fn(|i| {
            u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
        });
        assert_eq!(v6(words, 5000u16.to_be()), "[fd00:1::2]:5000");
    }
}
