//! The pipeline on socket buffers: [`Packet`] for the TC program's context, so the TC ingress
//! program (`xdp_router_tc`) runs the same `flow::try_forward` as the XDP program, on devices
//! without native XDP or where the config asks for TC (`datapath = "tc"`).
//!
//! What differs from an XDP frame:
//! - The skb may be non-linear (GRO, page-fragment drivers): the entry point pulls the headers
//!   into the head ([`TC_HEADER_PULL`]); lengths are the skb's (`skb->len`), not the head's.
//! - Its checksum state is the kernel's. A `CHECKSUM_PARTIAL` skb (locally generated, or merged
//!   by GRO) has only the pseudo-header's sum in its checksum field, so a direct incremental
//!   update of that field (the XDP path's) is wrong for ports and right only with the
//!   pseudo-header's rule for addresses; a `CHECKSUM_COMPLETE` skb carries a sum over the
//!   packet that every uncompensated change must update. The rewrite therefore leaves the
//!   transport checksum to `bpf_l4_csum_replace` (`BPF_F_PSEUDO_HDR` for the addresses,
//!   `BPF_F_MARK_MANGLED_0` for UDP), which handles each state as `nf_nat`'s
//!   `inet_proto_csum_replace4` does (see [`Packet::update_l4_checksum`]). A
//!   `CHECKSUM_UNNECESSARY` skb (its checksum verified by the device) has a full checksum in the
//!   field and no sum of the packet: its checksum is neither summed by the pipeline (conntrack
//!   does not either) nor updated through the helpers, but written directly, as on XDP.
//! - A redirect is `bpf_redirect` to the egress device's transmit path (`dev_queue_xmit`): its
//!   qdisc and TC egress programs run, and it needs no XDP transmit support.

use aya_ebpf::{
    EbpfContext,
    bindings::{
        __sk_buff, BPF_CSUM_LEVEL_QUERY, BPF_F_MARK_MANGLED_0, BPF_F_PSEUDO_HDR,
        BPF_F_RECOMPUTE_CSUM, TC_ACT_REDIRECT,
    },
    helpers::{
        bpf_csum_level, bpf_csum_update, bpf_l4_csum_replace, bpf_redirect, bpf_skb_change_head,
        bpf_skb_change_tail, bpf_skb_pull_data, bpf_skb_store_bytes, bpf_skb_vlan_pop,
        bpf_skb_vlan_push,
    },
    programs::TcContext,
};
use core::ffi::c_void;
use xdp_router_common::{
    Reason,
    checksum::{fold, is_noop},
    parse::{ETH_HLEN, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, L3, PPPOE_HLEN},
};

use crate::packet::{L4ChecksumEdit, Packet, ptr_at_mut};

/// Bytes the TC entry point pulls into the skb's head before the pipeline reads headers
/// directly: Ethernet (14), VLAN tag (4), PPPoE (8), IPv6 (40), the TCP header up to its
/// checksum and beyond (20), rounded up. Shorter packets are pulled whole.
pub const TC_HEADER_PULL: u32 = 96;

/// The end of a PPPoE session frame's headers: Ethernet, then the session header and the PPP
/// protocol.
const SESSION_END: u32 = (ETH_HLEN + PPPOE_HLEN) as u32;

/// Writes the 10 bytes from the EtherType to the end of an untagged session frame's headers
/// (see `pop_session`): the EtherType outside the sum a `CHECKSUM_COMPLETE` skb carries (which
/// at TC ingress starts after the MAC header), the rest with the sum updated. Cannot fail on a
/// head made writable before.
#[inline(always)]
fn store_after_macs(skb: *mut __sk_buff, bytes: &[u8; 10]) {
    // SAFETY: helpers on this program's own context, reading 2 and 8 bytes of `bytes`.
    unsafe {
        bpf_skb_store_bytes(skb, 12, bytes.as_ptr().cast(), 2, 0);
        bpf_skb_store_bytes(
            skb,
            14,
            bytes.as_ptr().add(2).cast(),
            8,
            u64::from(BPF_F_RECOMPUTE_CSUM),
        );
    }
}

impl Packet for TcContext {
    const SKB: bool = true;

    #[inline(always)]
    fn data(&self) -> usize {
        TcContext::data(self)
    }

    #[inline(always)]
    fn data_end(&self) -> usize {
        TcContext::data_end(self)
    }

    #[inline(always)]
    unsafe fn from_ptr(ptr: *mut c_void) -> Self {
        TcContext::new(ptr.cast::<__sk_buff>())
    }

    #[inline(always)]
    fn adjust_head(&self, delta: i32) -> bool {
        // Only room in front of the IP header of a packet received without a link-layer header
        // (`IFACE_F_L3`), for the Ethernet header it leaves with: `bpf_skb_change_head` is
        // made for that (it moves the MAC header with the data and leaves the network header,
        // protocol, checksum and GSO state as they are). A VLAN tag is metadata on an skb
        // (`set_meta_vlan_tag`); a packet for a PPPoE device is sent into the PPP device
        // (`pppoe::lower`), and a received session header is taken off by `pop_session`.
        if delta >= 0 {
            return false;
        }
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_skb_change_head(self.as_ptr().cast(), delta.unsigned_abs(), 0) == 0 }
    }

    #[inline(always)]
    fn adjust_tail(&self, delta: i32) -> bool {
        let new_len = self.skb.len() as i32 + delta;
        if new_len <= 0 {
            return false;
        }
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_skb_change_tail(self.as_ptr().cast(), new_len as u32, 0) == 0 }
    }

    #[inline(always)]
    fn redirect(ifindex: u32) -> Option<u32> {
        // Only records the target (per-CPU redirect info, used once the program returns
        // TC_ACT_REDIRECT); flags 0: out of the device's egress (dev_queue_xmit), so its
        // qdisc, TC egress programs and the stack's GSO segmentation apply. The egress is a
        // device the daemon manages (checked in `egress::redirect_to`).
        // SAFETY: a helper without pointers.
        let action = unsafe { bpf_redirect(ifindex, 0) };
        if action == i64::from(TC_ACT_REDIRECT) {
            Some(TC_ACT_REDIRECT as u32)
        } else {
            None
        }
    }

    #[inline(always)]
    fn len(&self) -> usize {
        self.skb.len() as usize
    }

    #[inline(always)]
    fn l4_checksum_verified(&self) -> bool {
        // CHECKSUM_UNNECESSARY: the query answers its level, else -EACCES.
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_csum_level(self.as_ptr().cast(), u64::from(BPF_CSUM_LEVEL_QUERY)) >= 0 }
    }

    #[inline(always)]
    fn l4_checksum_partial(&self, check_off: usize) -> bool {
        let skb: *mut __sk_buff = self.as_ptr().cast();
        // CHECKSUM_PARTIAL cannot be queried; it is told by how the pseudo-header rule acts
        // on the field: adding a diff of 1 with BPF_F_PSEUDO_HDR gives `old + 1` for a partial
        // checksum (the field holds the pseudo-header's sum) and `old - 1` otherwise (a full
        // checksum, `~(~old + 1)`). The diff is taken back at once (-1, the same rule; a
        // CHECKSUM_COMPLETE sum moves and returns too). Only reached when the software check
        // failed, so packets with a correct full checksum never pay for it.
        let Ok(p) = ptr_at_mut::<u16, _>(self, check_off) else {
            return false;
        };
        // SAFETY: bounds checked by ptr_at_mut.
        let old = unsafe { *p };
        if old == 0xffff {
            // The round trip below would leave 0x0000 (the same one's-complement value), which
            // for UDP over IPv4 means "no checksum": such a packet goes to the kernel as is.
            return false;
        }
        // SAFETY: a helper on this program's own context; the offset is inside the head.
        if unsafe { bpf_l4_csum_replace(skb, check_off as u32, 0, 1, u64::from(BPF_F_PSEUDO_HDR)) }
            != 0
        {
            return false;
        }
        let Ok(p) = ptr_at_mut::<u16, _>(self, check_off) else {
            return false;
        };
        // SAFETY: bounds checked by ptr_at_mut (again: the helper invalidated the pointer).
        let new = unsafe { *p };
        // SAFETY: as above; the one's-complement -1 undoes the +1.
        unsafe {
            bpf_l4_csum_replace(
                skb,
                check_off as u32,
                0,
                u64::from(!1u32),
                u64::from(BPF_F_PSEUDO_HDR),
            )
        };
        new == fold(u64::from(old) + 1)
    }

    #[inline(always)]
    fn pull(&self, len: usize) -> bool {
        if self.data_end() - self.data() >= len {
            return true;
        }
        // SAFETY: a helper on this program's own context.
        unsafe { bpf_skb_pull_data(self.as_ptr().cast(), len as u32) == 0 }
    }

    #[inline(always)]
    fn mtu_len(&self, ip_len: u16, l3_off: usize, l4_off: usize, tcp: bool) -> u16 {
        let gso_size = self.skb.gso_size();
        if gso_size == 0 {
            return ip_len;
        }
        // A GSO skb leaves as segments of `gso_size` payload bytes each: those must fit the
        // egress MTU (ip_forward's `skb_gso_validate_network_len`), not the aggregate. Each
        // segment has the IP header (`l3_off` to `l4_off`) and the transport header.
        let l4_hlen = if tcp {
            let Ok(doff) = ptr_at_mut::<u8, _>(self, l4_off + 12) else {
                return ip_len;
            };
            // SAFETY: bounds checked by ptr_at_mut.
            u32::from(unsafe { *doff } >> 4) * 4
        } else {
            8
        };
        let seg = (l4_off - l3_off) as u32 + l4_hlen + gso_size;
        if seg < u32::from(ip_len) {
            seg as u16
        } else {
            ip_len
        }
    }

    #[inline(always)]
    fn meta_vlan_tag(&self) -> Option<(u16, u16)> {
        // SAFETY: the context's skb pointer is valid for the program run.
        let (present, tci, proto) = unsafe {
            let skb = self.skb.skb;
            ((*skb).vlan_present, (*skb).vlan_tci, (*skb).vlan_proto)
        };
        // `vlan_proto` holds the raw (network order) value, `vlan_tci` the host-order TCI.
        (present != 0).then(|| (proto as u16, (tci as u16).to_be()))
    }

    #[inline(always)]
    fn set_meta_vlan_tag(&self, want: Option<(u16, u16)>) {
        let have = self.meta_vlan_tag();
        if have == want {
            return;
        }
        let skb: *mut __sk_buff = self.as_ptr().cast();
        // The received tag first: `skb_vlan_push` would move a present one into the bytes
        // (Q-in-Q). With the metadata tag present and an IP protocol, `skb_vlan_pop` only
        // clears it; should it fail, nothing is pushed on top of it.
        // SAFETY: a helper on this program's own context.
        if have.is_some() && unsafe { bpf_skb_vlan_pop(skb) } != 0 {
            return;
        }
        if let Some((tpid_be, tci_be)) = want {
            // With no tag present `skb_vlan_push` only sets the metadata (any protocol but
            // 802.1ad becomes 802.1Q there; the daemon writes only those two).
            // SAFETY: a helper on this program's own context.
            unsafe { bpf_skb_vlan_push(skb, tpid_be, u16::from_be(tci_be)) };
        }
    }

    #[inline(always)]
    fn pop_session(&self, l3: L3) -> Result<(), Reason> {
        // `bpf_skb_adjust_room` takes only IP skbs, and nothing lets a program set
        // `skb->protocol` (here ETH_P_PPP_SES), but the VLAN helpers move it along the tags
        // they push and pop:
        // 1. the 10 bytes from the EtherType to the IP header (EtherType, session header, PPP
        //    protocol) are rewritten as two 802.1Q tags and the IP EtherType;
        // 2. with a tag in the skb's metadata (the received one, else a placeholder pushed
        //    there first), pushing another moves that one into the bytes in front of them
        //    (`skb_vlan_push`), which sets `skb->protocol` to its protocol, a VLAN one;
        // 3. four pops: each clears the metadata tag and moves the next tag out of the bytes
        //    into the metadata (`skb_vlan_pop`), setting `skb->protocol` to the EtherType
        //    after it (`vlan_set_encap_proto`); the third leaves the IP EtherType, the fourth
        //    only clears the metadata.
        // The frame is then 8 bytes shorter, untagged, with `skb->protocol` its family's.
        if self.skb.gso_size() != 0 {
            // A GRO aggregate of session frames (kernels with PPPoE GRO): not taken apart
            // here.
            return Err(Reason::PassNotOnTc);
        }
        let skb: *mut __sk_buff = self.as_ptr().cast();
        let ethertype = match l3 {
            L3::V4 => ETH_P_IP,
            L3::V6 => ETH_P_IPV6,
        };
        // Writable in the head from here on (the entry pulled it; this unclones it), so the
        // stores below cannot fail, nor the pops (`skb_ensure_writable` of what is already).
        // SAFETY: a helper on this program's own context.
        if unsafe { bpf_skb_pull_data(skb, SESSION_END) } != 0 {
            return Err(Reason::PassMalformed);
        }
        let received: [u8; 10] = {
            let p = ptr_at_mut::<[u8; 10], _>(self, 12)?;
            // SAFETY: bounds checked by ptr_at_mut.
            unsafe { *p }
        };
        let [tpid_hi, tpid_lo] = ETH_P_8021Q.to_be_bytes();
        let [type_hi, type_lo] = ethertype.to_be_bytes();
        let tags = [
            tpid_hi, tpid_lo, 0, 0, tpid_hi, tpid_lo, 0, 0, type_hi, type_lo,
        ];
        store_after_macs(skb, &tags);
        let had_tag = self.meta_vlan_tag().is_some();
        if !had_tag {
            // No tag present: only sets the metadata, cannot fail.
            // SAFETY: a helper on this program's own context.
            unsafe { bpf_skb_vlan_push(skb, ETH_P_8021Q.to_be(), 0) };
        }
        // SAFETY: a helper on this program's own context.
        if unsafe { bpf_skb_vlan_push(skb, ETH_P_8021Q.to_be(), 0) } != 0 {
            // No headroom for the tag (`skb_cow_head`): nothing moved. Back as received.
            if !had_tag {
                // SAFETY: a helper on this program's own context.
                unsafe { bpf_skb_vlan_pop(skb) };
            }
            store_after_macs(skb, &received);
            return Err(Reason::PassMalformed);
        }
        for _ in 0..4 {
            // SAFETY: a helper on this program's own context.
            unsafe { bpf_skb_vlan_pop(skb) };
        }
        if self.meta_vlan_tag().is_some() || self.l3_protocol() != ethertype {
            // Cannot happen (see above); should it, the frame is not what the pipeline
            // expects, and the kernel gets it as it now is.
            return Err(Reason::PassMalformed);
        }
        Ok(())
    }

    #[inline(always)]
    fn l3_protocol(&self) -> u16 {
        // `protocol` holds the raw (network order) 16-bit value.
        u16::from_be(self.skb.protocol() as u16)
    }

    #[inline(always)]
    fn update_l4_checksum(&self, edit: &L4ChecksumEdit) {
        let skb: *mut __sk_buff = self.as_ptr().cast();
        let udp = if edit.udp {
            u64::from(BPF_F_MARK_MANGLED_0)
        } else {
            0
        };
        let offset = edit.offset as u32;
        // A UDP datagram without checksum (0) keeps none: the helpers below leave it and the
        // skb alone (`BPF_F_MARK_MANGLED_0`). The ports changed all the same, and nothing
        // compensates them: a `CHECKSUM_COMPLETE` sum takes their diff (the addresses' is
        // compensated by the IPv4 header checksum).
        let no_checksum = edit.udp
            && ptr_at_mut::<u16, _>(self, edit.offset)
                // SAFETY: bounds checked by ptr_at_mut.
                .is_ok_and(|p| unsafe { *p } == 0);
        // Size 0 in the flags: `to` is a diff (inet_proto_csum_replace_by_diff). Failures
        // cannot happen here (the offset was bounds checked, the diffs are diffs); nothing to
        // undo if they did, the packet would leave with a wrong checksum and be dropped.
        // SAFETY: helpers on this program's own context.
        unsafe {
            if no_checksum && !is_noop(edit.ports) {
                bpf_csum_update(skb, edit.ports);
            }
            if !is_noop(edit.pseudo) {
                bpf_l4_csum_replace(
                    skb,
                    offset,
                    0,
                    u64::from(edit.pseudo),
                    u64::from(BPF_F_PSEUDO_HDR) | udp,
                );
            }
            if !is_noop(edit.ports) {
                bpf_l4_csum_replace(skb, offset, 0, u64::from(edit.ports), udp);
            }
            if !is_noop(edit.complete_fix) {
                // Only a CHECKSUM_COMPLETE skb has a sum to fix (the helper does nothing
                // otherwise). The pseudo-header call above took the address diff off it as
                // for IPv4, whose header checksum compensates the addresses (kernels before
                // BPF_F_IPV6 always do); for IPv6 the changed header words come back here.
                bpf_csum_update(skb, edit.complete_fix);
            }
        }
    }
}

/// Loads an skb field the aya context has no accessor for.
trait SkbFields {
    /// `skb->gso_size`: the payload bytes per segment of a GSO skb, 0 otherwise.
    fn gso_size(&self) -> u32;
}

impl SkbFields for aya_ebpf::programs::sk_buff::SkBuff {
    #[inline(always)]
    fn gso_size(&self) -> u32 {
        // SAFETY: the context's skb pointer is valid for the program run.
        unsafe { (*self.skb).gso_size }
    }
}
