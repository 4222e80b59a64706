//! `xdp-routerd check-system`: whether this kernel and these devices can run the fast path, in
//! lines a user can paste into a bug report. [`gather`] reads the facts (procfs, sysfs, the
//! `netdev` generic-netlink family, and a real load of the eBPF object, which is what the
//! kernel's verifier says about BTF, `CONFIG_XFRM` and the helpers); [`judge`] says what they
//! mean.

pub mod judge;

use std::{fs, path::Path};

use netlink_sys::protocols::NETLINK_GENERIC;

use self::judge::{CAP_BPF, CAP_PERFMON, Device, Facts, Version, has_cap};
use crate::{
    config::Config,
    datapath::Datapath,
    kernel_features,
    sync::{nlsocket::request_socket, xdp_xmit},
};

/// `6.18.44-fc-v657` → 6.18.44. Pure.
pub fn parse_release(release: &str) -> Option<Version> {
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    Some(Version(major, minor, patch))
}

/// The `CapEff:` mask of a `/proc/<pid>/status` text. Pure.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

fn read_u64(path: &str) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The devices under `/sys/class/net` (loopback left out), with their XDP features from
/// `features` (`None`: unknown on this kernel).
fn devices(features: Option<&std::collections::BTreeMap<u32, u64>>) -> Vec<Device> {
    let Ok(dir) = fs::read_dir("/sys/class/net") else {
        return Vec::new();
    };
    let mut out: Vec<Device> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| name != "lo")
        .filter_map(|name| {
            let base = format!("/sys/class/net/{name}");
            let ifindex = read_u64(&format!("{base}/ifindex"))? as u32;
            let driver = fs::read_link(format!("{base}/device/driver"))
                .ok()
                .and_then(|p| p.file_name()?.to_str().map(str::to_owned));
            Some(Device {
                kind: xdp_xmit::link_kind(&name),
                mtu: read_u64(&format!("{base}/mtu")).unwrap_or(0) as u32,
                xdp_features: features.map(|f| f.get(&ifindex).copied().unwrap_or(0)),
                ethernet: crate::sync::netdev::hw_addr(&name).is_some(),
                configured: false,
                name,
                ifindex,
                driver,
            })
        })
        .collect();
    out.sort_by_key(|d| d.ifindex);
    out
}

/// Reads everything [`judge`] needs. `config`: only its interfaces are listed (and the missing
/// ones named). Loads (and unloads) the eBPF object when the privileges allow it.
pub fn gather(config: Option<&Config>) -> Facts {
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .and_then(|r| parse_release(&r));
    let cap_eff = fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_cap_eff(&s));
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    // Nothing loads without these two.
    let privileged = has_cap(cap_eff, CAP_BPF) && has_cap(cap_eff, CAP_PERFMON);
    // What the daemon would find: the object's own probes where it loads, else those that
    // need no object.
    let loaded = privileged.then(|| {
        Datapath::load(16, crate::datapath::hosts::slots(0))
            .map(|mut dp| (dp.kernel_features().clone(), dp.probe_tc_hook()))
            .map_err(|e| format!("{e:#}").replace('\n', " "))
    });
    let ebpf_load = loaded
        .as_ref()
        .map(|l| l.as_ref().map(drop).map_err(Clone::clone));
    let tc_hook = loaded
        .as_ref()
        .and_then(|l| l.as_ref().ok().map(|(_, h)| h.clone()));
    let kernel_features = loaded.map(|l| l.map_or_else(|_| kernel_features::probe(), |(k, _)| k));
    let conntrack = Path::new("/proc/sys/net/netfilter/nf_conntrack_max")
        .exists()
        .then(|| {
            ["max", "acct", "events", "checksum"]
                .map(|k| read_u64(&format!("/proc/sys/net/netfilter/nf_conntrack_{k}")))
        });
    let features = request_socket(NETLINK_GENERIC).ok().and_then(|sock| {
        let family = xdp_xmit::resolve(&sock).ok()??;
        xdp_xmit::dump(&sock, family.id).ok()
    });
    let mut devices = devices(features.as_ref());
    let mut missing = Vec::new();
    if let Some(c) = config {
        for i in &c.interfaces {
            match devices.iter_mut().find(|d| d.name == i.name) {
                Some(d) => d.configured = true,
                None => missing.push(i.name.clone()),
            }
        }
    }
    Facts {
        kernel,
        machine: std::env::consts::ARCH.to_owned(),
        btf,
        cap_eff,
        ebpf_load,
        tc_hook,
        features: kernel_features,
        conntrack,
        netdev_family: features.is_some(),
        devices,
        missing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_and_capability_masks_parse() {
        assert_eq!(parse_release("6.18.44-fc-v657\n"), Some(Version(6, 18, 44)));
        assert_eq!(parse_release("6.12.0+deb13-arm64"), Some(Version(6, 12, 0)));
        assert_eq!(parse_release("6.6"), Some(Version(6, 6, 0)));
        assert_eq!(parse_release("garbage"), None);
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(status), Some(0x1ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }
}
