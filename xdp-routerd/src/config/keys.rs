//! What each configuration key means, for users: the one place its documentation is written.
//! The manual's configuration reference (docs/manual/src/reference/config.md) is generated from
//! [`KEYS`] with each key's default as the code sets it (`crate::reference`), and a test keeps
//! the table exhaustive: every key serde accepts is here, and nothing else.

/// Where a key is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// At the top of the file.
    Top,
    /// In each `[[interface]]` table.
    Interface,
}

/// One key of the configuration file.
#[derive(Debug)]
pub struct Key {
    pub section: Section,
    /// The key as written in the file.
    pub name: &'static str,
    /// Its TOML type and the values allowed.
    pub ty: &'static str,
    /// For a key the default configuration leaves unset (or that has no default): what that
    /// means. `None` for keys whose default is a value, which the reference shows.
    pub unset: Option<&'static str>,
    /// What it does (Markdown, one paragraph).
    pub doc: &'static str,
}

/// Every key, in the order the reference lists them.
pub const KEYS: &[Key] = &[
    Key {
        section: Section::Top,
        name: "control_socket",
        ty: "string (path)",
        unset: None,
        doc: "Root-only Unix socket the control commands (`status`, `fastpath`, `flows`, …) \
              talk to. `xdp-routerd run --socket` overrides it.",
    },
    Key {
        section: Section::Top,
        name: "xdp_mode",
        ty: "string: `\"native\"` or `\"generic\"`",
        unset: None,
        doc: "How the XDP program is attached. `\"native\"`: driver mode, falling back to \
              generic (skb) mode with a warning when the driver has no XDP support. \
              `\"generic\"`: skb mode everywhere. On a generically attached interface the \
              program only counts: everything it receives goes to the kernel (reason \
              `generic_xdp`).",
    },
    Key {
        section: Section::Top,
        name: "datapath",
        ty: "string: `\"auto\"`, `\"xdp\"` or `\"tc\"`",
        unset: Some("`\"auto\"`"),
        doc: "Where the fast path runs on the packets an interface receives, for the \
              interfaces that do not say (`datapath` in an `[[interface]]`). `\"xdp\"`: the \
              XDP program (native, or generic as `xdp_mode` says). `\"tc\"`: the same fast path \
              at TC ingress on socket buffers (TCX, or a classic tc filter before Linux 6.6), \
              for devices without native XDP; its redirects need no XDP transmit on the \
              egress device. `\"auto\"`: native XDP where the driver takes it, else the TC \
              fast path (a macvlan, a Wi-Fi or DSA port, a jumbo-MTU veth), else generic XDP; \
              once some interface runs TC, the TC fast path also runs behind native XDP on the \
              others, for packets routed into ports XDP cannot transmit to. With \
              `xdp_mode = \"generic\"`, generic XDP as asked.",
    },
    Key {
        section: Section::Top,
        name: "flow_capacity",
        ty: "integer (flow directions, at least 16)",
        unset: Some("twice the kernel's `nf_conntrack_max`, at least 65536 and at most 4194304"),
        doc: "Capacity of each flow map (one for IPv4, one for IPv6), in flow directions: each \
              offloaded connection takes two. When a map is full, new connections stay in the \
              kernel (`xdp_router_connections_skipped_total{reason=\"flow_table_full\"}`).",
    },
    Key {
        section: Section::Top,
        name: "keepalive_interval_ms",
        ty: "integer (ms, 100..=60000)",
        unset: None,
        doc: "How often the conntrack timeouts of flows that carried fast-path traffic are \
              refreshed, so the kernel never expires a connection that is in use.",
    },
    Key {
        section: Section::Top,
        name: "fib_cache_ms",
        ty: "integer (ms, 0..=10000)",
        unset: None,
        doc: "How long a flow may reuse its last `bpf_fib_lookup` answer (egress interface, \
              next-hop MAC), at most; 0 = look up every packet. Any routing, rule, address, \
              link, neighbour or forwarding change the kernel announces drops every cached \
              answer at once, whatever this says.",
    },
    Key {
        section: Section::Top,
        name: "verdict_max_age_ms",
        ty: "integer (ms, 0..=60000)",
        unset: None,
        doc: "How long the fast path forwards a flow direction after the kernel last forwarded \
              one of its packets; then the next packet is judged by the kernel's rules again. \
              This is what makes verdicts that change without a ruleset change reach offloaded \
              flows: an `ipset add` to a blocklist, a `-m time` / `meta hour` boundary, a set \
              element timing out. It applies only while a rule that established packets reach \
              has such a match (an ipset, a set with timeouts, the time, a route lookup) or the \
              ruleset cannot be read; otherwise verdicts hold until the ruleset changes, and \
              `status` says which. 0 = never (a verdict holds until the ruleset changes, like \
              the kernel's flowtable). `xdp-routerd verdict-age MS` changes it live.",
    },
    Key {
        section: Section::Top,
        name: "conntrack_event_buffer",
        ty: "integer (bytes, 4096..=1073741824)",
        unset: None,
        doc: "Receive buffer of the conntrack event socket (`SO_RCVBUFFORCE`). When a burst of \
              connections overflows it, events are lost and the flows are resynced from a full \
              conntrack dump (counted as `xdp_router_conntrack_resyncs_total`).",
    },
    Key {
        section: Section::Top,
        name: "log_level",
        ty: "string (tracing `EnvFilter` syntax)",
        unset: None,
        doc: "Log filter, e.g. `info` or `xdp_routerd=debug`; the `RUST_LOG` environment \
              variable wins when set.",
    },
    Key {
        section: Section::Top,
        name: "metrics_listen",
        ty: "string (`address:port`, or `\"\"`)",
        unset: None,
        doc: "Where the Prometheus `/metrics` HTTP endpoint listens; `\"\"` disables it. The \
              endpoint has no authentication: expose it beyond localhost only behind a \
              firewall or a reverse proxy.",
    },
    Key {
        section: Section::Top,
        name: "host_metrics_limit",
        ty: "integer (0..=65536)",
        unset: None,
        doc: "Most LAN hosts with per-host traffic series of their own \
              (`xdp_router_host_{transmit,receive}_{bytes,packets}_total{host}`): the first \
              hosts seen, by address; the traffic of any others is summed under \
              `host=\"other\"`. A LAN host is an endpoint whose packets arrive on a `lan` \
              interface. 0 disables the series.",
    },
    Key {
        section: Section::Top,
        name: "per_packet_rules",
        ty: "string: `\"hold\"` or `\"ignore\"`",
        unset: None,
        doc: "What to do about firewall rules that must see every packet (rate limits, quotas, \
              `NFQUEUE`, `LOG`/`NFLOG`, … in a chain forwarded packets traverse). `\"hold\"` \
              keeps in the kernel the connections such a rule can match (every flow for a \
              rule without protocol, port or address tests, reason \
              `per_packet_rule_in_ruleset`, or when the ruleset cannot be read); the rules \
              are listed in `status`. \
              `\"ignore\"` fast-paths flows anyway, so such rules see only the packets the \
              kernel still carries (the kernel flowtable's semantics).",
    },
    Key {
        section: Section::Top,
        name: "interface",
        ty: "array of tables (`[[interface]]`, at least one)",
        unset: Some("required"),
        doc: "The interfaces the fast path manages; packets are only forwarded between managed \
              interfaces. Each takes the keys below.",
    },
    Key {
        section: Section::Interface,
        name: "name",
        ty: "string (kernel interface name, 1 to 15 bytes)",
        unset: Some("required"),
        doc: "Kernel interface name, e.g. `eth0`, a VLAN device (`eth0.7`), a bridge \
              (`br-lan`) or a PPP device (`ppp0`). An interface that does not exist yet is \
              attached when it appears.",
    },
    Key {
        section: Section::Interface,
        name: "role",
        ty: "string: `\"lan\"` or `\"wan\"`",
        unset: Some("required"),
        doc: "Which side of the router it faces.",
    },
    Key {
        section: Section::Interface,
        name: "shaped",
        ty: "`true`, `false` or `\"auto\"`",
        unset: None,
        doc: "Whether egress on this interface is shaped (tc qdisc). The fast path never sends \
              out of a shaped interface, so the shaper keeps seeing every packet; traffic \
              arriving on it is still accelerated. `\"auto\"` decides from the interface's \
              qdiscs (a qdisc that can delay or reorder packets in the egress tree), live; \
              `true` always treats it as shaped, `false` never (the fast path bypasses any \
              qdisc).",
    },
    Key {
        section: Section::Interface,
        name: "bypass_hooks",
        ty: "boolean",
        unset: None,
        doc: "Let the fast path jump over nftables `netdev` chains and tc filters on this \
              interface (`false`: directions that would meet one stay in the kernel).",
    },
    Key {
        section: Section::Interface,
        name: "pppoe_device",
        ty: "string (kernel interface name)",
        unset: Some("the session's device from `/proc/net/pppoe`"),
        doc: "For a PPP device carrying a PPPoE session (`ppp0`): the device its session runs \
              over (`eth0.7`). Only needed when the namespace has several PPPoE sessions; \
              ignored, with a warning, on any other device.",
    },
    Key {
        section: Section::Interface,
        name: "datapath",
        ty: "string: `\"auto\"`, `\"xdp\"` or `\"tc\"`",
        unset: Some("the global `datapath`"),
        doc: "Which datapath runs the fast path on packets arriving on this interface (see the \
              global `datapath`).",
    },
];
