//! The TOML configuration file (`xdp-routerd run --config FILE`).
//!
//! Unknown keys are errors, every field has an explicit default, and errors name the file and
//! the line so a typo is a one-line fix.

use std::{
    collections::HashSet,
    fmt,
    net::SocketAddr,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::flows::per_packet::PerPacketMode;

pub mod keys;

/// Default path of the control socket (root-only Unix socket).
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/xdp-router/control.sock";

/// Default address of the Prometheus `/metrics` endpoint (loopback only).
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9824";

/// The whole configuration file. What each key means is documented once, for users, in
/// [`keys::KEYS`] (a test keeps it in step with these fields).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_control_socket")]
    pub control_socket: PathBuf,
    #[serde(default)]
    pub xdp_mode: XdpModeConfig,
    #[serde(default, skip_serializing_if = "DatapathConfig::is_auto")]
    pub datapath: DatapathConfig,
    #[serde(default)]
    pub flow_capacity: Option<u32>,
    #[serde(default = "default_keepalive_interval_ms")]
    pub keepalive_interval_ms: u64,
    #[serde(default = "default_fib_cache_ms")]
    pub fib_cache_ms: u64,
    #[serde(default = "default_verdict_max_age_ms")]
    pub verdict_max_age_ms: u64,
    #[serde(default = "default_conntrack_event_buffer")]
    pub conntrack_event_buffer: usize,
    #[serde(default = "default_log_level")]
    pub log_level: String,
    #[serde(default = "default_metrics_listen", with = "listen_addr")]
    pub metrics_listen: Option<SocketAddr>,
    #[serde(default = "default_host_metrics_limit")]
    pub host_metrics_limit: usize,
    #[serde(default)]
    pub per_packet_rules: PerPacketMode,
    #[serde(rename = "interface", default)]
    pub interfaces: Vec<InterfaceConfig>,
}

/// One managed interface (`[[interface]]`; its keys are documented in [`keys::KEYS`]).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceConfig {
    pub name: String,
    pub role: Role,
    #[serde(default)]
    pub shaped: Shaped,
    #[serde(default)]
    pub bypass_hooks: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pppoe_device: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath: Option<DatapathConfig>,
}

/// `shaped = "auto" | true | false`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shaped {
    /// Shaped while a qdisc that can delay or reorder packets sits in the egress tree (see
    /// [`crate::sync::qdisc`]); followed live over rtnetlink.
    #[default]
    Auto,
    /// `true`: always treated as shaped.
    Always,
    /// `false`: never treated as shaped, whatever qdisc it has (the fast path bypasses it).
    Never,
}

impl fmt::Display for Shaped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Shaped::Auto => "auto",
            Shaped::Always => "true",
            Shaped::Never => "false",
        })
    }
}

impl Serialize for Shaped {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Shaped::Auto => s.serialize_str("auto"),
            Shaped::Always => s.serialize_bool(true),
            Shaped::Never => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for Shaped {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Shaped, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Shaped;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or \"auto\"")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Shaped, E> {
                Ok(if v { Shaped::Always } else { Shaped::Never })
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Shaped, E> {
                match v {
                    "auto" => Ok(Shaped::Auto),
                    _ => Err(E::custom(format!(
                        "shaped = {v:?}: expected true, false or \"auto\" (detect shaping qdiscs)"
                    ))),
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Which side of the router an interface faces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Lan,
    Wan,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Lan => "lan",
            Role::Wan => "wan",
        })
    }
}

/// XDP attach mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum XdpModeConfig {
    /// Driver (native) mode; falls back to generic (skb) mode with a warning when the driver
    /// has no XDP support.
    #[default]
    Native,
    /// Generic (skb) mode: works everywhere, much slower.
    Generic,
}

/// `datapath = "auto" | "xdp" | "tc"`: where the fast path runs on an interface's received
/// packets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DatapathConfig {
    /// Chosen by the daemon, per interface managed for itself or bridge port: native XDP
    /// where the driver takes it, else the TC fast path (a macvlan, a Wi-Fi or DSA port, a
    /// jumbo-MTU veth), else generic XDP. With `xdp_mode = "generic"`, generic XDP as asked.
    /// Once some interface runs TC, the TC fast path also runs behind native XDP on the others,
    /// for packets routed into ports XDP cannot transmit to.
    #[default]
    Auto,
    /// The XDP program (native, or generic as `xdp_mode` says).
    Xdp,
    /// The TC ingress program (TCX, Linux 6.6+): the same fast path on socket buffers, after
    /// GRO; for devices without native XDP. Its redirects need no XDP transmit on the egress.
    /// On interfaces, bridge ports (tagged or not), VLAN devices and PPP devices (on the VLAN
    /// or PPP device itself where the device under it has no native XDP, or a PPP device has
    /// no PPPoE session: L2TP, PPTP, a modem), and behind XDP on a PPPoE session's lower
    /// device for the session frames XDP hands over.
    Tc,
}

impl DatapathConfig {
    /// The default, `auto` (left out when the config is written back).
    pub fn is_auto(&self) -> bool {
        *self == DatapathConfig::Auto
    }

    /// Name as in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            DatapathConfig::Auto => "auto",
            DatapathConfig::Xdp => "xdp",
            DatapathConfig::Tc => "tc",
        }
    }
}

fn default_control_socket() -> PathBuf {
    PathBuf::from(DEFAULT_CONTROL_SOCKET)
}
/// Smallest `conntrack_event_buffer`: a few events (tests force overruns with it).
pub const MIN_CONNTRACK_EVENT_BUFFER: usize = 4 << 10;
/// Largest `conntrack_event_buffer` (1 GiB; the kernel charges it to the daemon's socket).
pub const MAX_CONNTRACK_EVENT_BUFFER: usize = 1 << 30;

/// Default `host_metrics_limit`: a home or small-office LAN, four series each.
pub const DEFAULT_HOST_METRICS_LIMIT: usize = 256;

/// Largest `host_metrics_limit`: the series a scrape returns stay bounded.
pub const MAX_HOST_METRICS_LIMIT: usize = 65_536;

/// Largest `verdict_max_age_ms` (one minute): an ipset entry or a time rule must not wait
/// longer than that to reach an offloaded flow.
pub const MAX_VERDICT_AGE_MS: u64 = 60_000;

/// `Err` (one line) unless `ms` is a valid `verdict_max_age_ms`: the config file's check and
/// the live `verdict-age` command's.
pub fn check_verdict_max_age(ms: u64) -> Result<(), String> {
    if ms > MAX_VERDICT_AGE_MS {
        return Err(format!(
            "verdict_max_age_ms = {ms} is out of range (0..={MAX_VERDICT_AGE_MS}; 0 keeps a \
             verdict until the ruleset changes)"
        ));
    }
    Ok(())
}

/// Largest flow map capacity the automatic sizing picks (per family, in directions): 4 Mi
/// directions, two million connections. The maps are preallocated (≈ 300 B of kernel memory per
/// IPv4 direction with its arming index), so a larger table must be asked for explicitly.
pub const MAX_AUTO_FLOW_CAPACITY: u32 = 1 << 22;

/// Where [`Config::flow_capacity`] took its value from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacitySource {
    /// `flow_capacity` in the config file.
    Config,
    /// Two directions per connection the kernel may track (`nf_conntrack_max`).
    ConntrackMax(u32),
    /// `nf_conntrack_max` could not be read (conntrack not loaded yet): the built-in default.
    Default,
}

/// The flow map capacity that holds every connection of a conntrack table of `conntrack_max`
/// entries (two directions each, all of one family in the worst case), bounded by
/// [`xdp_router_common::DEFAULT_FLOW_CAPACITY`] below and [`MAX_AUTO_FLOW_CAPACITY`] above.
pub fn capacity_for_conntrack_max(conntrack_max: u32) -> u32 {
    conntrack_max.saturating_mul(2).clamp(
        xdp_router_common::DEFAULT_FLOW_CAPACITY,
        MAX_AUTO_FLOW_CAPACITY,
    )
}
fn default_keepalive_interval_ms() -> u64 {
    2000
}
fn default_fib_cache_ms() -> u64 {
    100
}
fn default_verdict_max_age_ms() -> u64 {
    500
}
fn default_conntrack_event_buffer() -> usize {
    crate::sync::ctnetlink::DEFAULT_EVENT_RCVBUF
}
fn default_host_metrics_limit() -> usize {
    DEFAULT_HOST_METRICS_LIMIT
}
fn default_log_level() -> String {
    "info".to_string()
}
fn default_metrics_listen() -> Option<SocketAddr> {
    DEFAULT_METRICS_LISTEN.parse().ok()
}

/// `metrics_listen`: a socket address, or `""` for "disabled". Parsed during deserialisation so
/// a bad value is reported with its line.
mod listen_addr {
    use std::net::SocketAddr;

    use serde::{Deserialize as _, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(a) => s.collect_str(a),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        let text = String::deserialize(d)?;
        if text.trim().is_empty() {
            return Ok(None);
        }
        text.trim().parse().map(Some).map_err(|_| {
            serde::de::Error::custom(format!(
                "metrics_listen = {text:?} is not an address:port such as \"127.0.0.1:9824\" or \"[::1]:9824\" (\"\" disables the endpoint)"
            ))
        })
    }
}

/// Whether `name` can be a kernel interface name (1 to 15 bytes, no `/` or whitespace).
fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 15 && !name.contains(|c: char| c == '/' || c.is_whitespace())
}

/// A configuration error, already formatted for the user (`file:line: message`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// The capacity of each flow map: `flow_capacity` when set, else sized from the kernel's
    /// `nf_conntrack_max` ([`capacity_for_conntrack_max`]) so that every connection the kernel
    /// may track can be offloaded.
    pub fn flow_capacity(&self) -> (u32, CapacitySource) {
        self.flow_capacity_from(Path::new("/proc/sys/net/netfilter/nf_conntrack_max"))
    }

    /// [`Config::flow_capacity`] with `nf_conntrack_max` read from `path`.
    pub fn flow_capacity_from(&self, path: &Path) -> (u32, CapacitySource) {
        if let Some(c) = self.flow_capacity {
            return (c, CapacitySource::Config);
        }
        match std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
        {
            Some(max) => (
                capacity_for_conntrack_max(max),
                CapacitySource::ConntrackMax(max),
            ),
            None => (
                xdp_router_common::DEFAULT_FLOW_CAPACITY,
                CapacitySource::Default,
            ),
        }
    }

    /// The datapath configured for interface `name`: its own `datapath`, else the global one.
    pub fn datapath_of(&self, name: &str) -> DatapathConfig {
        self.interfaces
            .iter()
            .find(|i| i.name == name)
            .and_then(|i| i.datapath)
            .unwrap_or(self.datapath)
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(format!("{}: cannot read: {e}", path.display())))?;
        Config::parse(&text, &path.display().to_string())
    }

    /// Parses and validates config text; `origin` names it in error messages.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let msg = e.message().trim().to_string();
            match line {
                Some(l) => ConfigError(format!("{origin}:{l}: {msg}")),
                None => ConfigError(format!("{origin}: {msg}")),
            }
        })?;
        config
            .validate()
            .map_err(|m| ConfigError(format!("{origin}: {m}")))?;
        Ok(config)
    }

    /// Managed interfaces that do not exist on this host. Not an error for `check-config` (a
    /// config may be checked on another machine), but `run` needs them all.
    pub fn missing_interfaces(&self) -> Vec<&str> {
        self.interfaces
            .iter()
            .filter(|i| crate::sync::netdev::ifindex(&i.name).is_none())
            .map(|i| i.name.as_str())
            .collect()
    }

    /// Checks what serde cannot: at least one interface, valid and unique names (`pppoe_device`
    /// included), at most `MAX_IFACE_SLOTS - 1` interfaces, and the capacities' and intervals'
    /// ranges.
    fn validate(&self) -> Result<(), String> {
        if self.interfaces.is_empty() {
            return Err("no [[interface]] configured: list the LAN and WAN interfaces".into());
        }
        let mut seen = HashSet::new();
        for i in &self.interfaces {
            if !valid_name(&i.name) {
                return Err(format!("invalid interface name {:?}", i.name));
            }
            if !seen.insert(i.name.as_str()) {
                return Err(format!("interface {:?} is listed twice", i.name));
            }
            if let Some(d) = &i.pppoe_device {
                if !valid_name(d) {
                    return Err(format!(
                        "interface {:?}: invalid pppoe_device {d:?} (the device its PPPoE session runs over, e.g. \"eth0.7\")",
                        i.name
                    ));
                }
                if *d == i.name {
                    return Err(format!(
                        "interface {:?}: pppoe_device names the interface itself; it names the device the PPPoE session runs over (e.g. \"eth0\")",
                        i.name
                    ));
                }
            }
        }
        if self.interfaces.len() as u32 >= xdp_router_common::MAX_IFACE_SLOTS {
            return Err(format!(
                "at most {} interfaces can be managed",
                xdp_router_common::MAX_IFACE_SLOTS - 1
            ));
        }
        if let Some(c) = self.flow_capacity
            && c < 16
        {
            return Err(format!("flow_capacity = {c} is too small (minimum 16)"));
        }
        if self.fib_cache_ms > 10_000 {
            return Err(format!(
                "fib_cache_ms = {} is out of range (0..=10000; 0 looks up every packet)",
                self.fib_cache_ms
            ));
        }
        check_verdict_max_age(self.verdict_max_age_ms)?;
        if self.host_metrics_limit > MAX_HOST_METRICS_LIMIT {
            return Err(format!(
                "host_metrics_limit = {} is out of range (0..={MAX_HOST_METRICS_LIMIT}; 0 \
                 disables the per-host series)",
                self.host_metrics_limit
            ));
        }
        if !(MIN_CONNTRACK_EVENT_BUFFER..=MAX_CONNTRACK_EVENT_BUFFER)
            .contains(&self.conntrack_event_buffer)
        {
            return Err(format!(
                "conntrack_event_buffer = {} is out of range ({MIN_CONNTRACK_EVENT_BUFFER}..={MAX_CONNTRACK_EVENT_BUFFER} bytes)",
                self.conntrack_event_buffer
            ));
        }
        if !(100..=60_000).contains(&self.keepalive_interval_ms) {
            return Err(format!(
                "keepalive_interval_ms = {} is out of range (100..=60000)",
                self.keepalive_interval_ms
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/xdp-routerd.toml");
        let c = Config::load(Path::new(path)).expect("example config");
        assert_eq!(c.interfaces.len(), 2);
        assert!(c.interfaces.iter().any(|i| i.role == Role::Wan));
        assert!(c.interfaces.iter().any(|i| i.role == Role::Lan));
        assert_eq!(c.control_socket, PathBuf::from(DEFAULT_CONTROL_SOCKET));
    }

    #[test]
    fn defaults_apply() {
        let c = Config::parse("[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n", "t").unwrap();
        assert_eq!(c.xdp_mode, XdpModeConfig::Native);
        assert_eq!(c.flow_capacity, None);
        assert_eq!(c.interfaces[0].shaped, Shaped::Auto);
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9824".parse().unwrap()));
        assert_eq!(c.conntrack_event_buffer, 16 << 20);
    }

    /// `datapath`: global and per interface, `auto` by default; a bad value is one line that
    /// names the file, the line and the values allowed.
    #[test]
    fn datapath_is_global_or_per_interface() {
        let c = Config::parse(
            "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"eth1\"\nrole = \"lan\"\ndatapath = \"tc\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.datapath, DatapathConfig::Auto);
        assert_eq!(c.datapath_of("eth0"), DatapathConfig::Auto);
        assert_eq!(c.datapath_of("eth1"), DatapathConfig::Tc);
        let c = Config::parse(
            "datapath = \"tc\"\n[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n\
             [[interface]]\nname = \"eth1\"\nrole = \"lan\"\ndatapath = \"xdp\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.datapath_of("eth0"), DatapathConfig::Tc);
        assert_eq!(c.datapath_of("eth1"), DatapathConfig::Xdp);
        // Written back as read: `auto` left out, the others kept.
        let again = Config::parse(&toml::to_string(&c).unwrap(), "t").unwrap();
        assert_eq!(again, c);
        for bad in [
            "datapath = \"ebpf\"\n[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n",
            "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\ndatapath = \"TC\"\n",
        ] {
            let e = Config::parse(bad, "t.toml").unwrap_err().to_string();
            assert!(!e.contains('\n'), "{e}");
            assert!(e.starts_with("t.toml:"), "{e}");
            assert!(e.contains("`auto`, `xdp`, `tc`"), "{e}");
        }
    }

    #[test]
    fn per_packet_rules_is_hold_or_ignore() {
        let base = "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n";
        let c = Config::parse(base, "t").unwrap();
        assert_eq!(c.per_packet_rules, PerPacketMode::Hold);
        let c = Config::parse(&format!("per_packet_rules = \"ignore\"\n{base}"), "t").unwrap();
        assert_eq!(c.per_packet_rules, PerPacketMode::Ignore);
        let err = Config::parse(&format!("per_packet_rules = \"off\"\n{base}"), "t")
            .expect_err("not a mode");
        assert!(
            err.to_string().starts_with("t:1: ") && err.to_string().contains("hold"),
            "{err}"
        );
    }

    #[test]
    fn conntrack_event_buffer_is_bounded() {
        let base = "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n";
        let c = Config::parse(&format!("conntrack_event_buffer = 131072\n{base}"), "t").unwrap();
        assert_eq!(c.conntrack_event_buffer, 131_072);
        let err = Config::parse(&format!("conntrack_event_buffer = 100\n{base}"), "t")
            .expect_err("below the minimum");
        assert!(
            err.to_string()
                .contains("conntrack_event_buffer = 100 is out of range"),
            "{err}"
        );
    }

    #[test]
    fn metrics_listen_parses_disables_and_explains() {
        let base = "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n";
        let c = Config::parse(&format!("metrics_listen = \"[::1]:9100\"\n{base}"), "t").unwrap();
        assert_eq!(c.metrics_listen, Some("[::1]:9100".parse().unwrap()));
        let c = Config::parse(&format!("metrics_listen = \"\"\n{base}"), "t").unwrap();
        assert_eq!(c.metrics_listen, None);
        let err = Config::parse(
            &format!("\nmetrics_listen = \"localhost\"\n{base}"),
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("x.toml:2:"), "{err}");
        assert!(err.contains("address:port"), "{err}");
        // Serialising and parsing again gives the same config (disabled stays disabled).
        let c = Config::parse(&format!("metrics_listen = \"\"\n{base}"), "t").unwrap();
        let again = Config::parse(&toml::to_string(&c).unwrap(), "t").unwrap();
        assert_eq!(again, c);
    }

    #[test]
    fn shaped_is_auto_or_a_boolean() {
        let parse = |v: &str| {
            Config::parse(
                &format!("[[interface]]\nname = \"eth0\"\nrole = \"wan\"\nshaped = {v}\n"),
                "x.toml",
            )
        };
        assert_eq!(parse("true").unwrap().interfaces[0].shaped, Shaped::Always);
        assert_eq!(parse("false").unwrap().interfaces[0].shaped, Shaped::Never);
        assert_eq!(
            parse("\"auto\"").unwrap().interfaces[0].shaped,
            Shaped::Auto
        );
        for bad in ["\"yes\"", "1"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("x.toml:4:"), "{bad}: {err}");
            assert!(err.contains("\"auto\""), "{bad}: {err}");
        }
        // Each form survives a round trip through the serialiser.
        for v in ["true", "false", "\"auto\""] {
            let c = parse(v).unwrap();
            let again = Config::parse(&toml::to_string(&c).unwrap(), "t").unwrap();
            assert_eq!(again, c, "{v}");
        }
    }

    #[test]
    fn pppoe_device_is_optional_and_checked() {
        let parse = |extra: &str| {
            Config::parse(
                &format!("[[interface]]\nname = \"ppp0\"\nrole = \"wan\"\n{extra}"),
                "x.toml",
            )
        };
        assert_eq!(parse("").unwrap().interfaces[0].pppoe_device, None);
        let c = parse("pppoe_device = \"eth0.7\"\n").unwrap();
        assert_eq!(c.interfaces[0].pppoe_device.as_deref(), Some("eth0.7"));
        let again = Config::parse(&toml::to_string(&c).unwrap(), "t").unwrap();
        assert_eq!(again, c);
        for bad in ["\"\"", "\"eth 0\"", "\"a-name-far-too-long\"", "\"ppp0\""] {
            let err = parse(&format!("pppoe_device = {bad}\n"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("x.toml: interface \"ppp0\""),
                "{bad}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
        let err = parse("pppoe_device = 7\n").unwrap_err().to_string();
        assert!(err.starts_with("x.toml:4:"), "{err}");
    }

    #[test]
    fn missing_interfaces_are_listed() {
        let c = Config::parse(
            "[[interface]]\nname = \"lo\"\nrole = \"lan\"\n[[interface]]\nname = \"xr-no-such0\"\nrole = \"wan\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.missing_interfaces(), vec!["xr-no-such0"]);
    }

    #[test]
    fn unknown_key_names_file_and_line() {
        let err = Config::parse(
            "flow_capacity = 1024\n\n[[interface]]\nname = \"eth0\"\nrloe = \"wan\"\n",
            "x.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("x.toml:5:"), "{err}");
        assert!(err.contains("rloe"), "{err}");
    }

    #[test]
    fn invalid_role_is_explained() {
        let err = Config::parse("[[interface]]\nname = \"eth0\"\nrole = \"dmz\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("x.toml:3:"), "{err}");
        assert!(err.contains("lan") && err.contains("wan"), "{err}");
    }

    #[test]
    fn duplicates_and_empty_are_rejected() {
        assert!(
            Config::parse("", "x")
                .unwrap_err()
                .0
                .contains("no [[interface]]")
        );
        let dup = "[[interface]]\nname = \"a\"\nrole = \"wan\"\n[[interface]]\nname = \"a\"\nrole = \"lan\"\n";
        assert!(Config::parse(dup, "x").unwrap_err().0.contains("twice"));
    }

    #[test]
    fn flow_capacity_follows_nf_conntrack_max_unless_configured() {
        let dir = std::env::temp_dir().join(format!("xdp-routerd-capacity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let max = dir.join("nf_conntrack_max");
        let auto = Config::parse("[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n", "t").unwrap();
        std::fs::write(&max, "262144\n").unwrap();
        assert_eq!(
            auto.flow_capacity_from(&max),
            (524_288, CapacitySource::ConntrackMax(262_144))
        );
        // A small router still gets the built-in minimum; a huge table is capped.
        std::fs::write(&max, "8192\n").unwrap();
        assert_eq!(auto.flow_capacity_from(&max).0, 65_536);
        std::fs::write(&max, "4000000\n").unwrap();
        assert_eq!(auto.flow_capacity_from(&max).0, MAX_AUTO_FLOW_CAPACITY);
        let missing = dir.join("absent");
        assert_eq!(
            auto.flow_capacity_from(&missing),
            (65_536, CapacitySource::Default)
        );
        let fixed = Config {
            flow_capacity: Some(1024),
            ..auto
        };
        assert_eq!(
            fixed.flow_capacity_from(&max),
            (1024, CapacitySource::Config)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
