//! Why the datapath did what it did with a packet. Every packet is counted under exactly one
//! reason, per ingress interface, in the per-CPU `STATS` map.

/// Defines [`Reason`] with each variant's discriminant, stable name ([`Reason::name`]) and doc
/// comment, which [`Reason::description`] returns too: the manual's reason table is generated
/// from it (xdp-routerd's `reference` module), so the text is written once.
macro_rules! reasons {
    (
        $(#[$meta:meta])*
        pub enum Reason {
            $( $(#[doc = $doc:literal])+ $variant:ident = $value:literal => $name:literal, )+
        }
    ) => {
        $(#[$meta])*
        pub enum Reason {
            $( $(#[doc = $doc])+ $variant = $value, )+
        }

        impl Reason {
            /// Stable snake_case name, used as the `reason` label in metrics and in `status`
            /// output.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Reason::$variant => $name, )+
                }
            }

            /// The variant's doc comment, one line per source line (each with its leading
            /// space): what the reason means, for the manual.
            pub const fn description(self) -> &'static str {
                match self {
                    $( Reason::$variant => concat!($($doc, "\n"),+), )+
                }
            }
        }
    };
}

reasons! {
    /// Outcome of one packet. `Forwarded*` means the fast path sent it; every `Pass*` means it was
    /// handed to the kernel stack unmodified.
    #[repr(u32)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Reason {
        /// Forwarded by the fast path, original direction of the connection (e.g. LAN -> WAN).
        ForwardedOriginal = 0 => "forwarded_original",
        /// Forwarded by the fast path, reply direction (e.g. WAN -> LAN).
        ForwardedReply = 1 => "forwarded_reply",
        /// The fast path is switched off (`xdp-routerd fastpath off`).
        PassDisabled = 2 => "fastpath_disabled",
        /// Not IPv4/IPv6 (ARP, LLDP, PPPoE, ...).
        PassNotIp = 3 => "not_ip",
        /// Truncated or malformed headers; the kernel decides what to do with it.
        PassMalformed = 4 => "malformed",
        /// IPv4 header with options (IHL > 5).
        PassIpv4Options = 5 => "ipv4_options",
        /// IPv4 fragment (MF set or non-zero offset).
        PassIpv4Fragment = 6 => "ipv4_fragment",
        /// IPv6 with an extension header (incl. fragment header) before the transport header.
        PassIpv6ExtHeader = 7 => "ipv6_ext_header",
        /// TTL / hop limit <= 1: the kernel sends the ICMP time-exceeded.
        PassTtlExpired = 8 => "ttl_expired",
        /// Neither TCP nor UDP (ICMP, GRE, ...).
        PassNotTcpUdp = 9 => "not_tcp_udp",
        /// TCP SYN, FIN or RST: connection setup and teardown stay with conntrack.
        PassTcpControl = 10 => "tcp_syn_fin_rst",
        /// No offloaded flow for this 5-tuple and ingress interface.
        PassNoFlow = 11 => "no_flow",
        /// The FIB says the kernel must handle it (local, blackhole, unreachable, prohibit, ...).
        PassFibNotForwardable = 12 => "fib_not_forwardable",
        /// The FIB has a route but no resolved neighbour: the kernel resolves ARP/ND.
        PassNoNeighbour = 13 => "no_neighbour",
        /// Packet bigger than the egress MTU: the kernel fragments or sends frag-needed/PTB.
        PassFragNeeded = 14 => "frag_needed",
        /// The egress interface is not managed by xdp-router.
        PassEgressNotManaged = 15 => "egress_not_managed",
        /// The egress interface has a shaping qdisc the fast path must not bypass.
        PassEgressShaped = 16 => "egress_shaped",
        /// IPv4 header checksum wrong: the kernel drops it (`ip_rcv_core`).
        PassIpv4Checksum = 17 => "ipv4_bad_checksum",
        /// Destination MAC is not the ingress interface's own (broadcast, multicast, zero, another
        /// host's): the kernel does not forward it (`PACKET_OTHERHOST`, not `PACKET_HOST`).
        PassDstMacNotOurs = 18 => "dst_mac_not_ours",
        /// TCP/UDP checksum wrong (verified while `net.netfilter.nf_conntrack_checksum` is 1):
        /// conntrack marks it INVALID.
        PassL4Checksum = 19 => "l4_bad_checksum",
        /// TCP segment without ACK (and without SYN/FIN/RST): conntrack marks it INVALID.
        PassTcpNoAck = 20 => "tcp_no_ack",
        /// TCP/UDP segment longer than the datapath verifies checksums for (over 3071 bytes: jumbo
        /// frames); the kernel checks it.
        PassL4ChecksumTooLong = 21 => "l4_checksum_too_long",
        /// An offloaded flow direction the kernel has not forwarded yet under the current firewall
        /// ruleset (new flow, or the ruleset changed since), or one of a connection found at the
        /// daemon's start that awaits the keep-alive's next pass after its first packet: the
        /// kernel's rules judge it, and the TC egress program arms the direction if the kernel
        /// forwards it.
        PassNotArmed = 22 => "awaiting_kernel_verdict",
        /// The kernel forwarded this direction with a packet mark, but `bpf_fib_lookup` cannot take
        /// a mark on this kernel (`BPF_FIB_LOOKUP_MARK`, Linux 6.10): it stays in the kernel.
        PassMarkUnsupported = 23 => "fib_mark_unsupported",
        /// The ingress interface has an nftables `netdev` ingress chain or tc ingress filters,
        /// which run after XDP, or is a bridge port while an nftables `bridge` family
        /// `prerouting`/`input` chain exists, and `bypass_hooks` is not set: the kernel must see
        /// the packet.
        PassIngressHook = 24 => "ingress_hook",
        /// The egress interface has an nftables `netdev` egress chain or tc egress filters, which
        /// a redirect would skip, or is a bridge port while a `bridge` family
        /// `output`/`postrouting` chain exists, and `bypass_hooks` is not set.
        PassEgressHook = 25 => "egress_hook",
        /// The packet's DSCP is not the one the kernel sent this flow direction out with: a rule
        /// in the forward path rewrites it (`dscp set`, `-j DSCP`), so the kernel must apply it.
        PassDscpNotKernels = 26 => "dscp_rewritten_by_kernel",
        /// The FIB sends the packet out of an interface that cannot transmit XDP frames (a bridge,
        /// a bond or VLAN device, a veth whose peer has neither XDP nor GRO: the kernel's
        /// `NETDEV_XDP_ACT_NDO_XMIT` feature is off), where a redirect would be dropped.
        PassEgressNoXdpXmit = 27 => "egress_no_xdp_xmit",
        /// Received on a bridge port and not addressed to the bridge's MAC (LAN↔LAN traffic, STP,
        /// multicast, broadcast): the kernel bridge forwards it.
        PassBridged = 28 => "bridged_by_kernel",
        /// Routed out of a bridge whose FDB has no port for the destination MAC: the kernel
        /// bridge floods it (and learns where the host is).
        PassBridgeFdbMiss = 29 => "bridge_fdb_miss",
        /// The bridge port it arrived on, or would leave by, is not in the STP forwarding state.
        PassBridgePortNotForwarding = 30 => "bridge_port_not_forwarding",
        /// Received on a bridge port from a source MAC the bridge FDB does not place on that port
        /// (a new host, a host that moved, or an entry that aged out while the fast path carried
        /// the host's traffic, which the bridge never sees): the kernel bridge learns from it.
        PassBridgeLearning = 31 => "bridge_learning",
        /// The kernel sent this flow direction out with another TTL / hop limit than this packet's
        /// minus one: a rule in the forward path sets it (`ip ttl set`, `-j TTL`), or the
        /// direction's TTL changed upstream since the kernel last forwarded it. The kernel forwards
        /// it (and records the TTL it sent).
        PassTtlNotKernels = 32 => "ttl_rewritten_by_kernel",
        /// An 802.1Q/802.1ad-tagged frame whose tag protocol and VLAN ID name no managed VLAN
        /// device on the interface it arrived on (another VLAN, or 802.1ad where only 802.1Q
        /// is configured): the kernel's VLAN devices (or nobody) take it.
        PassVlanUnknown = 33 => "vlan_unknown",
        /// A frame with two or more VLAN tags (Q-in-Q): the kernel's stacked VLAN devices take it.
        PassVlanQinQ = 34 => "vlan_q_in_q",
        /// A priority-tagged frame (VLAN ID 0: an 802.1p priority only): the kernel treats it as
        /// untagged on the parent and keeps its priority.
        PassVlanPriorityTagged = 35 => "vlan_priority_tagged",
        /// An untagged frame on a device managed only as the parent of VLAN devices (the device
        /// itself is not in the config): the kernel routes it as the parent's.
        PassVlanParentUntagged = 36 => "vlan_parent_untagged",
        /// Received on an interface where the program runs in generic (skb) mode: a packet
        /// rewritten there could keep a stale checksum state (see `IFACE_F_GENERIC_XDP`).
        PassGenericXdp = 37 => "generic_xdp",
        /// A PPPoE session frame whose session (ID, on the device it arrived on) is no managed
        /// PPPoE device's, or whose source is not that session's access concentrator: the
        /// kernel's PPPoE sockets (or nobody) take it.
        PassPppoeUnknownSession = 38 => "pppoe_unknown_session",
        /// A PPPoE session frame of a managed session that carries no IPv4/IPv6 datagram (LCP,
        /// IPCP, CCP, a compressed datagram, a compressed protocol field): pppd and the kernel's
        /// PPP layer handle it.
        PassPppoeNotIp = 39 => "pppoe_not_ip",
        /// A frame that is not a PPPoE session frame on a device managed only as the lower
        /// device of PPPoE sessions (discovery, other traffic): the kernel handles it.
        PassPppoeLowerOther = 40 => "pppoe_lower_other",
        /// A frame of a PPPoE session on which CCP runs (PPP compression or MPPE encryption: the
        /// datapath saw the access concentrator send a compressed datagram or acknowledge a CCP
        /// option, `IFACE_F_PPP_CCP`), or a packet routed into it: the kernel's compressor,
        /// decompressor or encryption must see every packet.
        PassPppoeCcp = 41 => "pppoe_ccp",
        /// A VLAN-filtering bridge drops it: an untagged frame on a port without a PVID, a VLAN
        /// the port (or the bridge itself) is not a member of, or a packet routed out of the
        /// bridge with no PVID there.
        PassBridgeVlanFiltered = 42 => "bridge_vlan_filtered",
        /// An offloaded flow direction the kernel last forwarded longer ago than the configured
        /// verdict age (`verdict_max_age_ms`): the kernel's rules judge this packet again, since
        /// a verdict can change without a ruleset change (an ipset entry added, a time rule's
        /// boundary passed). The TC egress program re-arms the direction if the kernel forwards it.
        PassVerdictExpired = 43 => "kernel_verdict_expired",
        /// The firewall ruleset has a rule that must see every packet of the flows it applies to
        /// (`limit`, `hashlimit`, `quota`, `connbytes`, `connlimit` / `ct count`, `statistic`,
        /// `recent`, `NFQUEUE` / `queue`, `LOG` / `NFLOG` / `log`, meters, sets updated from the
        /// packet path) in a chain that established forwarded packets traverse, and the daemon
        /// holds them in the kernel (`per_packet_rules = "hold"`, `SETTINGS_F_HOLD_ALL`); also
        /// while the ruleset cannot be read, and while a ruleset change is being read.
        /// `xdp-routerd status` names the rules (`held in the kernel: …`).
        PassPerPacketRule = 44 => "per_packet_rule_in_ruleset",
        /// The TC fast path (`datapath = "tc"`, or behind XDP) does not handle this packet yet: a
        /// GRO aggregate of PPPoE session frames (kernels with PPPoE GRO), whose session header
        /// it does not take off (or, in an skb built from a tagged frame's bytes, as BPF_PROG_RUN
        /// builds it, a VLAN tag in the bytes); the kernel forwards it.
        PassNotOnTc = 45 => "not_on_tc_yet",
        /// A frame in more than one buffer (XDP multi-buffer: on a port whose MTU is above what
        /// one page holds, ≈ 3,500 bytes, a longer frame arrives in fragments); the fast path
        /// forwards single-buffer frames only (and could not verify such a segment's checksum,
        /// see `l4_checksum_too_long`), the kernel forwards it.
        PassMultiBuffer = 46 => "multi_buffer_frame",
    }
}

impl Reason {
    /// Number of reasons (the `STATS` array's stride per interface slot).
    pub const COUNT: u32 = 47;

    /// Every reason, in discriminant order.
    pub const ALL: [Reason; Self::COUNT as usize] = [
        Reason::ForwardedOriginal,
        Reason::ForwardedReply,
        Reason::PassDisabled,
        Reason::PassNotIp,
        Reason::PassMalformed,
        Reason::PassIpv4Options,
        Reason::PassIpv4Fragment,
        Reason::PassIpv6ExtHeader,
        Reason::PassTtlExpired,
        Reason::PassNotTcpUdp,
        Reason::PassTcpControl,
        Reason::PassNoFlow,
        Reason::PassFibNotForwardable,
        Reason::PassNoNeighbour,
        Reason::PassFragNeeded,
        Reason::PassEgressNotManaged,
        Reason::PassEgressShaped,
        Reason::PassIpv4Checksum,
        Reason::PassDstMacNotOurs,
        Reason::PassL4Checksum,
        Reason::PassTcpNoAck,
        Reason::PassL4ChecksumTooLong,
        Reason::PassNotArmed,
        Reason::PassMarkUnsupported,
        Reason::PassIngressHook,
        Reason::PassEgressHook,
        Reason::PassDscpNotKernels,
        Reason::PassEgressNoXdpXmit,
        Reason::PassBridged,
        Reason::PassBridgeFdbMiss,
        Reason::PassBridgePortNotForwarding,
        Reason::PassBridgeLearning,
        Reason::PassTtlNotKernels,
        Reason::PassVlanUnknown,
        Reason::PassVlanQinQ,
        Reason::PassVlanPriorityTagged,
        Reason::PassVlanParentUntagged,
        Reason::PassGenericXdp,
        Reason::PassPppoeUnknownSession,
        Reason::PassPppoeNotIp,
        Reason::PassPppoeLowerOther,
        Reason::PassPppoeCcp,
        Reason::PassBridgeVlanFiltered,
        Reason::PassVerdictExpired,
        Reason::PassPerPacketRule,
        Reason::PassNotOnTc,
        Reason::PassMultiBuffer,
    ];

    /// True for the reasons that mean "forwarded by the fast path".
    pub const fn is_forwarded(self) -> bool {
        matches!(self, Reason::ForwardedOriginal | Reason::ForwardedReply)
    }

    /// The reason called `name` (see [`Reason::name`]), if any.
    pub fn from_name(name: &str) -> Option<Reason> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The reason with this discriminant, if any.
    pub const fn from_u32(v: u32) -> Option<Reason> {
        if v < Self::COUNT {
            Some(Self::ALL[v as usize])
        } else {
            None
        }
    }
}

impl core::fmt::Display for Reason {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        // `pad`, not `write_str`: tables align names with `{:<28}`.
        f.pad(self.name())
    }
}

/// Serialized as its stable name (`"no_flow"`), the same string metrics use as a label.
#[cfg(feature = "user")]
impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

#[cfg(feature = "user")]
impl<'de> serde::Deserialize<'de> for Reason {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Reason;
            fn expecting(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str("a reason name such as \"no_flow\"")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<Reason, E> {
                Reason::from_name(name)
                    .ok_or_else(|| E::custom(format_args!("unknown reason {name:?}")))
            }
        }
        d.deserialize_str(Name)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;

    #[test]
    fn all_is_in_discriminant_order_and_names_are_unique() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
            assert_eq!(Reason::from_u32(i as u32), Some(*r));
            assert_eq!(Reason::from_name(r.name()), Some(*r));
            for other in &Reason::ALL[..i] {
                assert_ne!(r.name(), other.name());
            }
        }
        assert_eq!(Reason::from_u32(Reason::COUNT), None);
    }

    /// The description is the variant's doc comment, line by line.
    #[test]
    fn description_is_the_doc_comment() {
        assert_eq!(
            Reason::PassNoFlow.description(),
            " No offloaded flow for this 5-tuple and ingress interface.\n"
        );
        let first_line = " An offloaded flow direction the kernel last forwarded longer ago than the \
                          configured\n";
        assert!(
            Reason::PassVerdictExpired
                .description()
                .starts_with(first_line)
        );
        for r in Reason::ALL {
            assert!(r.description().len() > 10, "{r}");
        }
    }

    /// The CLI's tables align reasons with width specifiers (`status`, `stats`).
    #[test]
    fn display_honours_width() {
        assert_eq!(std::format!("{:<12}|", Reason::PassNoFlow), "no_flow     |");
    }
}
