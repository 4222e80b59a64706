//! Packet access, whatever the program type: [`Packet`] is what the pipeline (flow.rs and the
//! modules below it) needs from its context: where the packet is, how to resize it, how to
//! redirect it, and how its transport checksum is kept right. The XDP program's context
//! implements it here, the TC (socket buffer) program's in `tc.rs`; both run the same pipeline.
//! On top of it: the bounds-checked pointer into the packet and the packet's length.

use core::{ffi::c_void, mem::size_of};

use aya_ebpf::{
    EbpfContext,
    bindings::{xdp_action, xdp_md},
    helpers::{bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use xdp_router_common::{
    Reason,
    parse::{L3, PPPOE_HLEN},
};

use crate::maps::TX_PORTS;

/// A program context the pipeline can forward a packet from. Every method is
/// `#[inline(always)]` in its implementations: the pipeline compiles to what it would be
/// written against the context itself.
pub trait Packet: EbpfContext {
    /// The context is a socket buffer (TC): its checksum state is the kernel's (see
    /// [`Packet::l4_checksum_verified`], [`Packet::l4_checksum_partial`]), a redirect goes
    /// through the egress device's qdisc and needs no XDP transmit, and its transport checksum
    /// is updated by the skb helpers after the rewrite ([`Packet::update_l4_checksum`]) unless
    /// the device verified it. `false` for XDP, where every branch on it folds away: the XDP
    /// program's code is what it was before TC existed.
    const SKB: bool;

    /// Address of the packet's first byte.
    fn data(&self) -> usize;

    /// Address one past the packet's last byte.
    fn data_end(&self) -> usize;

    /// The context whose pointer ([`EbpfContext::as_ptr`]) is `ptr`: a BPF subprogram takes
    /// the context pointer as its argument (see `verify::l4_checksum`).
    ///
    /// # Safety
    /// `ptr` must be this program type's context pointer, as the program received it.
    unsafe fn from_ptr(ptr: *mut c_void) -> Self;

    /// Moves the packet's start by `delta` bytes, as `bpf_xdp_adjust_head` does: a positive
    /// delta removes bytes from the front, a negative one makes room there (on an skb: only
    /// room for the link-layer header of a packet that has none, see `tc.rs`). `false` when
    /// it failed (the packet is unchanged). Every packet pointer is invalid afterwards.
    fn adjust_head(&self, delta: i32) -> bool;

    /// Moves the packet's end by `delta` bytes, as `bpf_xdp_adjust_tail` does (negative:
    /// trims). `false` when it failed. Every packet pointer is invalid afterwards.
    fn adjust_tail(&self, delta: i32) -> bool;

    /// Sets up the redirect of the packet out of `ifindex`, if the daemon lists it as a
    /// target: the action the program then returns. `None`: not a target, nothing set up.
    fn redirect(ifindex: u32) -> Option<u32>;

    /// Length of the whole packet: what the length checks and counters use. For an skb this
    /// includes paged data beyond [`Packet::data_end`].
    fn len(&self) -> usize;

    /// Whether the device verified the transport checksum (an skb's `CHECKSUM_UNNECESSARY`):
    /// conntrack does not verify it again (`nf_ip_checksum`), nor does the pipeline, and the
    /// checksum field holds the full checksum with no sum of the packet in the skb to keep, so
    /// the NAT rewrite writes it directly, as on XDP. Never for XDP: no driver's verdict
    /// reaches an XDP program.
    fn l4_checksum_verified(&self) -> bool;

    /// Whether the transport checksum is still to be computed on transmit (an skb's
    /// `CHECKSUM_PARTIAL`: a locally generated or GRO-merged packet, whose checksum field holds
    /// only the pseudo-header sum), which conntrack does not verify either. Asked only of a
    /// checksum the software check found wrong. `check_off`: the checksum field's offset.
    /// Never for XDP.
    fn l4_checksum_partial(&self, check_off: usize) -> bool;

    /// Makes the first `len` bytes of the packet direct-accessible (an skb's paged data pulled
    /// into its head); `false` when that failed. Every packet pointer is invalid afterwards.
    /// XDP frames are one buffer: nothing to do.
    fn pull(&self, len: usize) -> bool;

    /// The IP length the egress MTU is checked against for a datagram of `ip_len` bytes
    /// whose IP header is at `l3_off` and transport header (TCP if `tcp`, else UDP) at
    /// `l4_off`: the datagram's own length, or for a GSO skb the length of each segment it
    /// will be cut into (as `ip_forward` checks with `skb_gso_validate_network_len`).
    fn mtu_len(&self, ip_len: u16, l3_off: usize, l4_off: usize, tcp: bool) -> u16;

    /// The VLAN tag the kernel took out of the received frame into the skb's metadata
    /// (protocol, TCI: raw): it takes every received tag there before TC ingress
    /// (`skb_vlan_untag` in `__netif_receive_skb_core`), so the frame's bytes are untagged
    /// and its IP header follows the Ethernet header. `None` for XDP, whose frames carry
    /// their tags (a tag the NIC stripped, rx VLAN offload, is not visible to XDP at all).
    fn meta_vlan_tag(&self) -> Option<(u16, u16)>;

    /// Makes `want` (protocol, TCI: raw; `None`: untagged) the skb's metadata tag, the one
    /// it leaves with: the egress device's transmit path puts it on the wire
    /// (`validate_xmit_vlan`, or the driver's VLAN offload). No bytes move, so GSO and the
    /// checksum state are untouched. Called after the rewrite, on an skb of an IP protocol,
    /// where it cannot fail (see `encap::write_l2`). Every packet pointer is invalid
    /// afterwards. Never for XDP.
    fn set_meta_vlan_tag(&self, want: Option<(u16, u16)>);

    /// Takes a received PPPoE session header (the 8 bytes between the EtherType and the IP
    /// header of family `l3`) out of a frame without a VLAN tag in its bytes: the frame is
    /// then 8 bytes shorter, with its MACs in front (the caller rewrites them) and the IP
    /// header at 14. On XDP the start moves (`bpf_xdp_adjust_head`); on an skb see `tc.rs`.
    /// An error leaves the packet as received (see each implementation for the exception).
    /// Every packet pointer is invalid afterwards.
    fn pop_session(&self, l3: L3) -> Result<(), Reason>;

    /// The packet's protocol as the kernel recorded it (`skb->protocol`, an EtherType, host
    /// order): the family of a packet received on a device without a link-layer header
    /// (`IFACE_F_L3`), which only the TC program runs on. Never for XDP.
    fn l3_protocol(&self) -> u16;

    /// Brings the transport checksum at `edit.offset` up to date after the rewrite, for
    /// contexts whose checksum the rewrite does not write directly (skbs, [`Packet::SKB`]).
    /// Called after every direct write: the helpers it uses invalidate packet pointers.
    fn update_l4_checksum(&self, edit: &L4ChecksumEdit);
}

/// What the NAT rewrite changed that the transport checksum covers, for
/// [`Packet::update_l4_checksum`]: the pseudo-header's addresses and the ports, kept apart
/// because a `CHECKSUM_PARTIAL` checksum field holds the pseudo-header's sum only.
pub struct L4ChecksumEdit {
    /// Offset of the checksum field in the packet.
    pub offset: usize,
    /// Checksum diff of the address rewrite (the pseudo-header).
    pub pseudo: u32,
    /// Checksum diff of the port rewrite.
    pub ports: u32,
    /// UDP: a checksum of 0 means none and stays 0, a computed 0 goes out as 0xffff.
    pub udp: bool,
    /// Checksum diff of what changed in the IPv6 header (addresses, hop limit, DSCP), which no
    /// header checksum compensates: a `CHECKSUM_COMPLETE` skb's sum is corrected by it. 0 for
    /// IPv4, whose header checksum compensates its own changes.
    pub complete_fix: u32,
}

impl Packet for XdpContext {
    const SKB: bool = false;

    #[inline(always)]
    fn data(&self) -> usize {
        XdpContext::data(self)
    }

    #[inline(always)]
    fn data_end(&self) -> usize {
        XdpContext::data_end(self)
    }

    #[inline(always)]
    unsafe fn from_ptr(ptr: *mut c_void) -> Self {
        XdpContext::new(ptr.cast::<xdp_md>())
    }

    #[inline(always)]
    fn adjust_head(&self, delta: i32) -> bool {
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_xdp_adjust_head(self.ctx, delta) == 0 }
    }

    #[inline(always)]
    fn adjust_tail(&self, delta: i32) -> bool {
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_xdp_adjust_tail(self.ctx, delta) == 0 }
    }

    #[inline(always)]
    fn redirect(ifindex: u32) -> Option<u32> {
        // bpf_redirect_map() only records the target (per-CPU redirect info, used once the
        // program returns XDP_REDIRECT), and a missing TX_PORTS entry returns the low bits of
        // the flags (XDP_PASS) instead, so an egress the daemon did not (or no longer) list
        // goes to the kernel untouched. One devmap lookup instead of a lookup to check plus
        // another in the redirect.
        TX_PORTS
            .redirect(ifindex, u64::from(xdp_action::XDP_PASS))
            .ok()
    }

    #[inline(always)]
    fn len(&self) -> usize {
        let len = XdpContext::data_end(self) - XdpContext::data(self);
        // A number from here on, not pointers: LLVM would otherwise fold a later `len - l2`
        // (with `l2` a variable) into the end pointer, which the verifier rejects (pointer
        // arithmetic on pkt_end). One stack store and load.
        // SAFETY: reading a live local.
        unsafe { core::ptr::read_volatile(&len) }
    }

    #[inline(always)]
    fn l4_checksum_verified(&self) -> bool {
        // A frame straight from the driver: no checksum state, the pipeline verifies.
        false
    }

    #[inline(always)]
    fn l4_checksum_partial(&self, _check_off: usize) -> bool {
        false
    }

    #[inline(always)]
    fn pull(&self, _len: usize) -> bool {
        true
    }

    #[inline(always)]
    fn mtu_len(&self, ip_len: u16, _l3_off: usize, _l4_off: usize, _tcp: bool) -> u16 {
        ip_len
    }

    #[inline(always)]
    fn meta_vlan_tag(&self) -> Option<(u16, u16)> {
        None
    }

    #[inline(always)]
    fn set_meta_vlan_tag(&self, _want: Option<(u16, u16)>) {
        // XDP frames carry their tags: `encap::write_l2` writes them.
    }

    #[inline(always)]
    fn pop_session(&self, _l3: L3) -> Result<(), Reason> {
        // The MACs are rewritten by the caller, so moving the start past the first 8 bytes
        // is all it takes (256 bytes of headroom, a frame longer than the header).
        if self.adjust_head(PPPOE_HLEN as i32) {
            Ok(())
        } else {
            Err(Reason::PassMalformed)
        }
    }

    #[inline(always)]
    fn l3_protocol(&self) -> u16 {
        // Frames carry their EtherType; the pipeline reads it there.
        0
    }

    #[inline(always)]
    fn update_l4_checksum(&self, _edit: &L4ChecksumEdit) {
        // `rewrite::rewrite_l4` wrote the checksum field directly.
    }
}

/// Pointer to a `T` at `offset` bytes into the packet, if the whole `T` is inside it; a packet
/// too short for the header is [`Reason::PassMalformed`]. Mutable because every header the
/// fast path reads is also one it may rewrite (after all checks).
#[inline(always)]
pub fn ptr_at_mut<T, P: Packet>(ctx: &P, offset: usize) -> Result<*mut T, Reason> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(Reason::PassMalformed);
    }
    Ok((start + offset) as *mut T)
}

/// Length of the whole packet (what the counters count; see [`Packet::len`]).
#[inline(always)]
pub fn frame_len<P: Packet>(ctx: &P) -> usize {
    ctx.len()
}
