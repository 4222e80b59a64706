//! What the facts [`super::gather`] read mean for xdp-router: one line per requirement and per
//! device, each `ok`, `warn` or `fail`. Pure, so every verdict is unit-tested.

use std::fmt::{self, Write as _};

use crate::{
    datapath::TcHook, kernel_features::KernelFeatures, sync::xdp_xmit::NETDEV_XDP_ACT_NDO_XMIT,
};

/// How a requirement stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    /// Works, with less acceleration or a caveat.
    Warn,
    /// The daemon cannot start, or nothing is accelerated.
    Fail,
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        })
    }
}

/// One judged requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub level: Level,
    /// Short name (`kernel`, `btf`, …).
    pub what: &'static str,
    pub detail: String,
}

/// The running kernel's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

/// `NETDEV_XDP_ACT_*` bits (`uapi/linux/netdev.h`) and their names as `ip link` prints them.
const XDP_FEATURES: [(u64, &str); 7] = [
    (1 << 0, "basic"),
    (1 << 1, "redirect"),
    (1 << 2, "ndo-xmit"),
    (1 << 3, "xsk-zerocopy"),
    (1 << 4, "hw-offload"),
    (1 << 5, "rx-sg"),
    (1 << 6, "ndo-xmit-sg"),
];
const XDP_BASIC: u64 = 1 << 0;

/// A network device as read from sysfs and the `netdev` generic-netlink family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub ifindex: u32,
    /// The driver bound to the device (`/sys/class/net/X/device/driver`), if it has one.
    pub driver: Option<String>,
    /// The link kind of a software device (`DEVTYPE=` in its uevent: bridge, vlan, wlan, …).
    pub kind: Option<String>,
    pub mtu: u32,
    /// `NETDEV_A_DEV_XDP_FEATURES`; `None` without the `netdev` family (Linux < 6.3).
    pub xdp_features: Option<u64>,
    /// It has an Ethernet address, so its frames have an Ethernet header (a PPP device has
    /// none and is served through its PPPoE lower device).
    pub ethernet: bool,
    /// Named in the config given with `--config`.
    pub configured: bool,
}

/// Everything [`super::gather`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub kernel: Option<Version>,
    pub machine: String,
    pub btf: bool,
    /// Effective capabilities (`CapEff` of `/proc/self/status`).
    pub cap_eff: Option<u64>,
    /// `Ok` when the eBPF object loaded (the verifier accepted both programs), else the load
    /// error's one line; `None` when not tried (no privileges).
    pub ebpf_load: Option<Result<(), String>>,
    /// How the kernel takes the TC programs (a TCX link tried on `lo`), or why that attempt
    /// failed; `None` when not tried (no privileges, or the object did not load).
    pub tc_hook: Option<Result<TcHook, String>>,
    /// What the probe found of the optional kernel features; `None` when not tried (no
    /// privileges).
    pub features: Option<KernelFeatures>,
    /// `net.netfilter.nf_conntrack_{max,acct,events,checksum}`; `None` when conntrack is not
    /// loaded.
    pub conntrack: Option<[Option<u64>; 4]>,
    /// The `netdev` generic-netlink family answered (Linux 6.3).
    pub netdev_family: bool,
    pub devices: Vec<Device>,
    /// Interfaces the config names that do not exist (yet).
    pub missing: Vec<String>,
}

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Whether the effective capability mask `cap_eff` (unknown: no) has capability `bit`.
pub fn has_cap(cap_eff: Option<u64>, bit: u32) -> bool {
    cap_eff.is_some_and(|c| c & (1 << bit) != 0)
}

/// What the kernel line says of the TC programs' attachments on Linux `v`, from the TCX
/// attempt `probe` (by the version where none was made).
fn tc_hook_line(v: Version, probe: Option<&Result<TcHook, String>>) -> (Level, String) {
    const CLASSIC: &str = "the TC programs go in as classic tc filters (clsact qdisc, cls_bpf; \
                           inert once the daemon is gone)";
    match probe {
        Some(Ok(TcHook::Tcx)) => (Level::Ok, "TC programs as TCX links".into()),
        Some(Ok(TcHook::Classic)) => (Level::Ok, format!("no TCX links: {CLASSIC}")),
        Some(Err(e)) => (
            Level::Warn,
            format!(
                "TCX links could not be tried ({e}): the daemon tries them and falls back to \
                 classic tc filters"
            ),
        ),
        None if v < Version(6, 6, 0) => (Level::Ok, format!("no TCX links before 6.6: {CLASSIC}")),
        None => (Level::Ok, "TC programs as TCX links (6.6)".into()),
    }
}

/// The requirement lines of `facts`, in a fixed order.
pub fn requirements(f: &Facts) -> Vec<Line> {
    let mut out = Vec::new();
    let line = |level, what, detail: String| Line {
        level,
        what,
        detail,
    };
    out.push(match f.kernel {
        None => line(
            Level::Warn,
            "kernel",
            format!("version unreadable ({})", f.machine),
        ),
        Some(v) if v < Version(5, 9, 0) => line(
            Level::Fail,
            "kernel",
            format!(
                "Linux {v} {}: XDP bpf_links need 5.9; the daemon refuses to start",
                f.machine
            ),
        ),
        Some(v) => {
            let (level, tc) = tc_hook_line(v, f.tc_hook.as_ref());
            line(level, "kernel", format!("Linux {v} {}: {tc}", f.machine))
        }
    });
    out.push(if f.btf {
        line(Level::Ok, "btf", "/sys/kernel/btf/vmlinux".into())
    } else {
        line(
            Level::Fail,
            "btf",
            "no /sys/kernel/btf/vmlinux: a kernel built with CONFIG_DEBUG_INFO_BTF is required"
                .into(),
        )
    });
    let missing: Vec<&str> = [
        (CAP_BPF, "CAP_BPF"),
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_PERFMON, "CAP_PERFMON"),
    ]
    .into_iter()
    .filter(|(bit, _)| !has_cap(f.cap_eff, *bit))
    .map(|(_, name)| name)
    .collect();
    out.push(if missing.is_empty() {
        line(
            Level::Ok,
            "privileges",
            "CAP_BPF CAP_NET_ADMIN CAP_PERFMON".into(),
        )
    } else {
        line(
            Level::Fail,
            "privileges",
            format!(
                "missing {}: run as root or with the capabilities of config/xdp-routerd.service",
                missing.join(" ")
            ),
        )
    });
    out.push(match &f.ebpf_load {
        Some(Ok(())) => line(
            Level::Ok,
            "ebpf",
            "the XDP and TC arming programs load (the kernel's verifier accepts them)".into(),
        ),
        Some(Err(e)) => line(Level::Fail, "ebpf", e.clone()),
        None => line(
            Level::Fail,
            "ebpf",
            "not tried without the privileges above".into(),
        ),
    });
    for (feature, why) in f.features.iter().flat_map(KernelFeatures::missing) {
        out.push(line(
            Level::Warn,
            feature.name(),
            format!("{why}: {}", feature.without()),
        ));
    }
    out.push(match f.conntrack {
        None => line(
            Level::Warn,
            "conntrack",
            "nf_conntrack is not loaded: nothing is offloaded until a firewall rule (NAT, \
             ctstate) loads it"
                .into(),
        ),
        Some([max, acct, events, checksum]) => {
            let show = |v: Option<u64>| v.map_or("?".to_owned(), |v| v.to_string());
            let mut detail = format!(
                "nf_conntrack_max {}, nf_conntrack_acct {}, nf_conntrack_events {}, \
                 nf_conntrack_checksum {}",
                show(max),
                show(acct),
                show(events),
                show(checksum)
            );
            let level = if events == Some(0) {
                detail.push_str(": events off, the daemon hears of no connection");
                Level::Fail
            } else {
                if acct == Some(1) {
                    detail.push_str(
                        " (conntrack's counters leave out fast-pathed packets: see \
                         `xdp-routerd flows`)",
                    );
                }
                Level::Ok
            };
            line(level, "conntrack", detail)
        }
    });
    out.push(if f.netdev_family {
        line(
            Level::Ok,
            "xdp-features",
            "the kernel reports each device's XDP features (netdev generic netlink)".into(),
        )
    } else {
        line(
            Level::Warn,
            "xdp-features",
            "no netdev generic-netlink family (Linux < 6.3): which devices transmit redirected \
             frames is judged by link kind"
                .into(),
        )
    });
    out
}

/// The XDP feature names set in `bits`, space-separated (`none` for 0).
pub fn feature_names(bits: u64) -> String {
    let names: Vec<&str> = XDP_FEATURES
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(" ")
    }
}

/// What xdp-router does with `d`: its level and one sentence.
pub fn device(d: &Device) -> (Level, String) {
    if !d.ethernet && d.kind.as_deref() != Some("ppp") {
        return (
            Level::Ok,
            "no link-layer header (an L3 device such as WireGuard, tun or GRE): the TC fast \
             path runs on its IP packets (XDP parses Ethernet frames), and traffic routed into \
             it from a native-XDP port is handed to TC there"
                .into(),
        );
    }
    if d.kind.as_deref() == Some("vlan") {
        return (
            Level::Ok,
            "a VLAN device: with datapath = \"auto\" (the default) XDP runs on its parent where \
             the parent has native XDP (tags popped and pushed there), else the TC fast path \
             runs on the VLAN device itself"
                .into(),
        );
    }
    match d.xdp_features {
        None => (
            Level::Warn,
            "XDP features unknown (Linux < 6.3): native XDP is tried at attach time, generic \
             XDP only counts"
                .into(),
        ),
        Some(bits) if bits & XDP_BASIC == 0 => (
            Level::Warn,
            "no native XDP in its driver: with datapath = \"auto\" (the default) the TC fast \
             path runs here instead (TCX, Linux >= 6.6; slower than native XDP), with \
             datapath = \"xdp\" generic XDP only counts (generic_xdp)"
                .into(),
        ),
        Some(bits) if bits & NETDEV_XDP_ACT_NDO_XMIT == 0 => (
            Level::Ok,
            "native XDP: traffic arriving here is accelerated; it cannot transmit redirected \
             frames, so traffic leaving by it stays in the kernel (egress_no_xdp_xmit) unless \
             the TC fast path runs behind XDP on its ingress port (once a port runs TC)"
                .into(),
        ),
        Some(_) => (
            Level::Ok,
            "native XDP and XDP transmit: accelerated both ways".into(),
        ),
    }
}

/// The whole report, as `check-system` prints it (ends with a summary line).
pub fn render(version: &str, f: &Facts) -> (String, Level) {
    let mut s = String::new();
    let mut worst = Level::Ok;
    let (mut fails, mut warns) = (0, 0);
    let mut count = |level: Level, worst: &mut Level| {
        match level {
            Level::Fail => fails += 1,
            Level::Warn => warns += 1,
            Level::Ok => {}
        }
        *worst = (*worst).max(level);
    };
    let _ = writeln!(s, "xdp-routerd {version} check-system");
    for l in requirements(f) {
        count(l.level, &mut worst);
        let _ = writeln!(s, "{:<4}  {:<12}  {}", l.level, l.what, l.detail);
    }
    let _ = writeln!(s, "devices:");
    let configured = f.devices.iter().any(|d| d.configured) || !f.missing.is_empty();
    for d in f.devices.iter().filter(|d| !configured || d.configured) {
        let (level, why) = device(d);
        count(level, &mut worst);
        let driver = d
            .driver
            .clone()
            .or_else(|| d.kind.clone())
            .unwrap_or_else(|| "-".into());
        let features = d.xdp_features.map_or_else(|| "?".to_owned(), feature_names);
        let _ = writeln!(
            s,
            "{level:<4}  {:<12}  ifindex {}, driver {driver}, mtu {}, xdp features: {features}: {why}",
            d.name, d.ifindex, d.mtu
        );
    }
    for name in &f.missing {
        let _ = writeln!(
            s,
            "      {name:<12}  does not exist yet (`run` attaches it when it appears)"
        );
    }
    let _ = writeln!(s, "summary: {fails} failed, {warns} warning(s)");
    (s, worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        Facts {
            kernel: Some(Version(6, 12, 0)),
            machine: "x86_64".into(),
            btf: true,
            cap_eff: Some(u64::MAX >> 23),
            ebpf_load: Some(Ok(())),
            tc_hook: Some(Ok(TcHook::Tcx)),
            features: Some(KernelFeatures::all_available()),
            conntrack: Some([Some(262_144), Some(0), Some(1), Some(1)]),
            netdev_family: true,
            devices: vec![
                Device {
                    name: "eth0".into(),
                    ifindex: 2,
                    driver: Some("virtio_net".into()),
                    kind: None,
                    mtu: 1500,
                    xdp_features: Some(0b111),
                    ethernet: true,
                    configured: false,
                },
                Device {
                    name: "eth1".into(),
                    ifindex: 3,
                    driver: Some("r8169".into()),
                    kind: None,
                    mtu: 1500,
                    xdp_features: Some(0),
                    ethernet: true,
                    configured: false,
                },
            ],
            missing: Vec::new(),
        }
    }

    #[test]
    fn a_capable_system_passes_and_a_device_without_xdp_warns() {
        let (text, worst) = render("0.1.0", &facts());
        assert_eq!(worst, Level::Warn, "{text}");
        assert!(
            text.contains("ok    kernel        Linux 6.12.0 x86_64"),
            "{text}"
        );
        assert!(
            text.contains("eth0") && text.contains("accelerated both ways"),
            "{text}"
        );
        assert!(
            text.contains("driver r8169") && text.contains("generic_xdp"),
            "{text}"
        );
        assert!(
            text.ends_with("summary: 0 failed, 1 warning(s)\n"),
            "{text}"
        );
    }

    #[test]
    fn a_device_without_a_link_layer_header_gets_the_tc_fast_path() {
        let mut d = facts().devices[0].clone();
        d.ethernet = false;
        let (level, text) = device(&d);
        assert_eq!(level, Level::Ok);
        assert!(text.contains("the TC fast path runs"), "{text}");
        d.kind = Some("ppp".into());
        assert_eq!(
            device(&d).1,
            "native XDP and XDP transmit: accelerated both ways"
        );
    }

    #[test]
    fn a_vlan_device_is_served_on_its_parent_or_by_the_tc_fast_path() {
        let mut d = facts().devices[0].clone();
        d.kind = Some("vlan".into());
        d.xdp_features = Some(0);
        let (level, text) = device(&d);
        assert_eq!(level, Level::Ok);
        assert!(
            text.contains("XDP runs on its parent") && text.contains("TC fast path"),
            "{text}"
        );
    }

    #[test]
    fn a_missing_kernel_feature_warns_with_what_it_costs() {
        use crate::kernel_features::{Availability, Feature};
        let mut f = facts();
        let mut k = KernelFeatures::all_available();
        k.features[0].1 = Availability::Missing("refused".into());
        f.features = Some(k);
        let lines = requirements(&f);
        let l = lines.iter().find(|l| l.what == "xdp_metadata").unwrap();
        assert_eq!(l.level, Level::Warn);
        assert!(l.detail.starts_with("refused: "));
        assert!(l.detail.ends_with(Feature::XdpMetadata.without()));
        assert!(lines.iter().all(|l| l.what != "fib_lookup_mark"));
    }

    #[test]
    fn old_kernels_missing_btf_and_capabilities_fail() {
        let mut f = facts();
        f.kernel = Some(Version(5, 8, 0));
        assert_eq!(requirements(&f)[0].level, Level::Fail);
        // What a 6.8 kernel lacks (the FIB lookup's mark) is the probe's line, not the version's.
        f.kernel = Some(Version(6, 8, 0));
        assert_eq!(requirements(&f)[0].level, Level::Ok);
        f.btf = false;
        f.cap_eff = Some(1 << CAP_NET_ADMIN);
        f.ebpf_load = None;
        let lines = requirements(&f);
        assert_eq!(lines[1].level, Level::Fail);
        assert_eq!(lines[2].level, Level::Fail);
        assert!(lines[2].detail.contains("CAP_BPF CAP_PERFMON"), "{lines:?}");
        assert_eq!(lines[3].level, Level::Fail);
    }

    /// Without TCX links (Debian 12's 6.1) the TC programs go in as classic tc filters: the
    /// kernel line says which one this kernel takes, from the attempt, else from the version.
    #[test]
    fn the_kernel_line_says_tcx_or_classic_tc() {
        let mut f = facts();
        let kernel = |f: &Facts| requirements(f).swap_remove(0);
        assert_eq!(
            kernel(&f).detail,
            "Linux 6.12.0 x86_64: TC programs as TCX links"
        );
        f.kernel = Some(Version(6, 1, 0));
        f.tc_hook = Some(Ok(TcHook::Classic));
        let l = kernel(&f);
        assert_eq!(l.level, Level::Ok);
        assert!(
            l.detail.starts_with(
                "Linux 6.1.0 x86_64: no TCX links: the TC programs go in as classic tc filters"
            ),
            "{l:?}"
        );
        f.tc_hook = None;
        let l = kernel(&f);
        assert_eq!(l.level, Level::Ok);
        assert!(l.detail.contains("no TCX links before 6.6: "), "{l:?}");
        f.tc_hook = Some(Err("a TCX link on lo: EPERM".into()));
        let l = kernel(&f);
        assert_eq!(l.level, Level::Warn);
        assert!(
            l.detail.contains("falls back to classic tc filters"),
            "{l:?}"
        );
    }

    #[test]
    fn conntrack_without_events_fails_and_accounting_is_explained() {
        let mut f = facts();
        f.conntrack = Some([Some(1), Some(1), Some(0), Some(1)]);
        assert_eq!(requirements(&f)[4].level, Level::Fail);
        f.conntrack = Some([Some(1), Some(1), Some(1), Some(1)]);
        let l = &requirements(&f)[4];
        assert_eq!(l.level, Level::Ok);
        assert!(l.detail.contains("xdp-routerd flows"), "{l:?}");
        f.conntrack = None;
        assert_eq!(requirements(&f)[4].level, Level::Warn);
    }

    #[test]
    fn devices_are_judged_by_their_xdp_features() {
        let mut d = facts().devices[0].clone();
        assert_eq!(device(&d).0, Level::Ok);
        d.xdp_features = Some(0b001);
        assert!(device(&d).1.contains("egress_no_xdp_xmit"));
        d.xdp_features = None;
        assert_eq!(device(&d).0, Level::Warn);
        assert_eq!(feature_names(0b100101), "basic ndo-xmit rx-sg");
        assert_eq!(feature_names(0), "none");
    }

    #[test]
    fn with_a_config_only_its_devices_are_listed() {
        let mut f = facts();
        f.devices[1].configured = true;
        f.missing.push("ppp0".into());
        let (text, _) = render("0.1.0", &f);
        assert!(!text.contains("eth0"), "{text}");
        assert!(text.contains("ppp0          does not exist yet"), "{text}");
    }
}
