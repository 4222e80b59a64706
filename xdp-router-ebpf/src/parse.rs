//! The headers the fast path reads and rewrites (accessed through `packet::ptr_at_mut`).
//!
//! Headers are plain `#[repr(C, packed(2))]` structs of integers, read and written field by
//! field through accessor methods: nothing is ever reinterpreted as a Rust enum. Multi-byte
//! fields hold raw wire bytes (`_be`); accessors convert where host order is needed. Packet data
//! in XDP starts at least 2-byte aligned (`XDP_PACKET_HEADROOM`, or `NET_SKB_PAD + NET_IP_ALIGN`
//! in drivers), hence `packed(2)`: the compiler emits 16-bit loads for the 32-bit address fields
//! that sit at 2 mod 4 behind the 14-byte Ethernet header.

/// Ethernet II header.
#[repr(C, packed(2))]
pub struct EthHdr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// EtherType (network order).
    pub ethertype_be: u16,
}

impl EthHdr {
    /// EtherType in host order.
    #[inline(always)]
    pub fn ethertype(&self) -> u16 {
        u16::from_be(self.ethertype_be)
    }
}

/// The rest of an 802.1Q / 802.1ad tag after the TPID (which sits where an untagged frame's
/// EtherType is): the TCI and the EtherType of what follows.
#[repr(C, packed(2))]
pub struct VlanHdr {
    /// Priority (3 bits), DEI (1), VLAN ID (12), network order.
    pub tci_be: u16,
    /// EtherType of the payload (network order).
    pub inner_ethertype_be: u16,
}

/// A whole tag as written on egress: TPID and TCI, after the MAC addresses.
#[repr(C, packed(2))]
pub struct VlanTag {
    /// 0x8100 / 0x88a8 (network order).
    pub tpid_be: u16,
    /// Priority, DEI, VLAN ID (network order).
    pub tci_be: u16,
}

/// A PPPoE session header and the PPP protocol field after it (RFC 2516), between the
/// EtherType 0x8864 and the IP header.
#[repr(C, packed(2))]
pub struct PppoeHdr {
    /// Version and type: 0x11.
    pub ver_type: u8,
    /// 0 for session data.
    pub code: u8,
    /// Session ID (network order).
    pub sid_be: u16,
    /// Length of the PPP protocol field and what follows (network order).
    pub length_be: u16,
    /// PPP protocol (network order): 0x0021 IPv4, 0x0057 IPv6.
    pub proto_be: u16,
}

/// IPv4 header without options.
#[repr(C, packed(2))]
pub struct Ipv4Hdr {
    /// Version (high nibble) and IHL (low nibble).
    pub version_ihl: u8,
    /// DSCP/ECN.
    pub tos: u8,
    /// Total length (network order).
    pub tot_len_be: u16,
    /// Identification (network order).
    pub id_be: u16,
    /// Flags and fragment offset (network order).
    pub frag_off_be: u16,
    /// Time to live.
    pub ttl: u8,
    /// Transport protocol.
    pub proto: u8,
    /// Header checksum (raw).
    pub check: u16,
    /// Source address (network order).
    pub src_be: u32,
    /// Destination address (network order).
    pub dst_be: u32,
}

impl Ipv4Hdr {
    /// Total length in host order.
    #[inline(always)]
    pub fn tot_len(&self) -> u16 {
        u16::from_be(self.tot_len_be)
    }

    /// Flags and fragment offset in host order.
    #[inline(always)]
    pub fn frag_off(&self) -> u16 {
        u16::from_be(self.frag_off_be)
    }

    /// The TTL and protocol bytes as the raw 16-bit word the header checksum covers.
    #[inline(always)]
    pub fn ttl_proto_word(&self) -> u16 {
        u16::from_ne_bytes([self.ttl, self.proto])
    }

    /// Version/IHL and TOS as the header checksum's 16-bit word (its first).
    #[inline(always)]
    pub fn version_tos_word(&self) -> u16 {
        u16::from_ne_bytes([self.version_ihl, self.tos])
    }
}

/// Fixed IPv6 header.
#[repr(C, packed(2))]
pub struct Ipv6Hdr {
    /// Version (4 bits), traffic class (8), flow label (20), network order.
    pub vtc_flow_be: u32,
    /// Payload length (network order).
    pub payload_len_be: u16,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source address (network order, raw 32-bit words).
    pub src_be: [u32; 4],
    /// Destination address (network order, raw 32-bit words).
    pub dst_be: [u32; 4],
}

impl Ipv6Hdr {
    /// Payload length in host order.
    #[inline(always)]
    pub fn payload_len(&self) -> u16 {
        u16::from_be(self.payload_len_be)
    }

    /// First byte: version and the high nibble of the traffic class.
    #[inline(always)]
    pub fn version_tc(&self) -> u8 {
        (u32::from_be(self.vtc_flow_be) >> 24) as u8
    }

    /// Traffic class and flow label without the version, as `bpf_fib_lookup`'s `flowinfo`
    /// wants it (network order).
    #[inline(always)]
    pub fn flowinfo_be(&self) -> u32 {
        self.vtc_flow_be & u32::to_be(0x0fff_ffff)
    }
}

/// TCP header without options (20 bytes).
#[repr(C, packed(2))]
pub struct TcpHdr {
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// Sequence number (network order).
    pub seq_be: u32,
    /// Acknowledgment number (network order).
    pub ack_be: u32,
    /// Data offset (high nibble) and reserved bits.
    pub doff_res: u8,
    /// Flags: CWR ECE URG ACK PSH RST SYN FIN.
    pub flags: u8,
    /// Window (network order).
    pub window_be: u16,
    /// Checksum (raw).
    pub check: u16,
    /// Urgent pointer (network order).
    pub urg_ptr_be: u16,
}

/// The source and destination ports that TCP and UDP headers both start with.
#[repr(C, packed(2))]
pub struct PortsHdr {
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
}

/// UDP header.
#[repr(C, packed(2))]
pub struct UdpHdr {
    /// Source port (network order).
    pub sport_be: u16,
    /// Destination port (network order).
    pub dport_be: u16,
    /// Length (network order).
    pub len_be: u16,
    /// Checksum (raw); 0 over IPv4 means "none".
    pub check: u16,
}

/// A received frame's VLAN tag, if it has one (`present`). Not an `Option`: LLVM leaves
/// `None`'s payload undefined, and where it spilled that payload and reloaded it on every
/// path, a verifier before 6.3 (Ubuntu 22.04's 5.15) refused the read of a stack slot nothing
/// wrote ("invalid read from stack"); an untagged frame's words here are defined (zero).
#[derive(Clone, Copy)]
pub struct FrameTag {
    /// Whether the frame has a tag; the other fields are zero, and `inner` the frame's
    /// EtherType, when not.
    pub present: bool,
    /// Tag protocol (raw).
    pub tpid_be: u16,
    /// Tag control information (raw).
    pub tci_be: u16,
    /// The EtherType after the tag (host order).
    pub inner: u16,
}

impl FrameTag {
    /// An untagged frame of EtherType `ethertype` (host order).
    #[inline(always)]
    pub fn untagged(ethertype: u16) -> FrameTag {
        FrameTag {
            present: false,
            tpid_be: 0,
            tci_be: 0,
            inner: ethertype,
        }
    }
}
