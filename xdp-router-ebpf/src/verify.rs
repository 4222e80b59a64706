//! What the kernel verifies before it forwards, verified here too: the destination MAC, the
//! IPv4 header checksum (`ip_rcv_core`) and, while conntrack checks them, TCP/UDP checksums.
//! A packet that fails goes to the kernel, which drops or judges it.

use core::{ffi::c_void, ptr::null_mut};

use aya_ebpf::helpers::bpf_csum_diff;
use xdp_router_common::{
    IfaceInfo, Reason,
    checksum::{fold, sum_is_valid},
};

use crate::{
    packet::{Packet, ptr_at_mut},
    parse::EthHdr,
};

/// A MAC address as a 32-bit and a 16-bit raw word (compared without a `memcmp`).
#[inline(always)]
pub fn mac_words(m: [u8; 6]) -> (u32, u16) {
    let [a, b, c, d, e, f] = m;
    (u32::from_ne_bytes([a, b, c, d]), u16::from_ne_bytes([e, f]))
}

/// `Ok` when the frame is addressed to the ingress interface itself (`info`, its `IFACES`
/// entry): the kernel forwards only `PACKET_HOST` frames (`ip_forward`, `ip6_forward`), never
/// broadcast, multicast or another host's. Without an entry the MAC is unknown: pass.
#[inline(always)]
pub fn dst_mac_is_ours(eth: *const EthHdr, info: Option<*const IfaceInfo>) -> Result<(), Reason> {
    let Some(info) = info else {
        return Err(Reason::PassDstMacNotOurs);
    };
    // SAFETY: `eth` was bounds checked by the caller; `info` is a live map value.
    let (dst, ours) = unsafe { ((*eth).dst, (*info).mac) };
    if mac_words(dst) != mac_words(ours) {
        return Err(Reason::PassDstMacNotOurs);
    }
    Ok(())
}

/// The 20-byte IPv4 header as ten raw 16-bit words.
#[repr(C, packed(2))]
struct Words10 {
    w: [u16; 10],
}

/// `Ok` when the option-less IPv4 header at `offset` has a correct checksum.
#[inline(always)]
pub fn ipv4_header_checksum<P: Packet>(ctx: &P, offset: usize) -> Result<(), Reason> {
    let h: *mut Words10 = ptr_at_mut(ctx, offset)?;
    // SAFETY: bounds checked by ptr_at_mut.
    let w = unsafe { (*h).w };
    let mut sum = 0u64;
    for x in w {
        sum += x as u64;
    }
    if !sum_is_valid(sum) {
        return Err(Reason::PassIpv4Checksum);
    }
    Ok(())
}

/// Bytes per `bpf_csum_diff` call over a large block (the helper takes at most 512).
const BIG: usize = 512;
/// The smallest block summed by a `bpf_csum_diff` call; the rest below it is summed in words.
const SMALL: usize = 64;
/// Big blocks summed at most: with the smaller blocks and the word loop, segments up to 3071 bytes, every
/// frame of a 1500 (or 3000) byte MTU; longer ones (jumbo frames that still fit one buffer,
/// up to ≈ 3.5 KB; longer ones are `Reason::PassMultiBuffer` before the pipeline) go to the
/// kernel as `Reason::PassL4ChecksumTooLong`.
const MAX_BIG: usize = 5;

/// Segments at least this long are not summed (`Reason::PassL4ChecksumTooLong`).
pub const MAX_SUMMED: usize = (MAX_BIG + 1) * BIG;

/// `v`, through a stack slot the optimiser cannot see through: LLVM would otherwise fold a
/// comparison of `len >> 9` with a constant back into one of `len`, which the verifier then
/// narrows (see [`l4_checksum`]).
#[inline(always)]
fn opaque(v: usize) -> usize {
    // SAFETY: reading a live local.
    unsafe { core::ptr::read_volatile(&v) }
}

/// Two raw 16-bit words.
#[repr(C, packed(2))]
struct Words2 {
    w: [u16; 2],
}

/// `bpf_csum_diff` over `LEN` packet bytes at `offset` added to `seed` (a 32-bit partial sum).
#[inline(always)]
fn csum_block<const LEN: usize>(
    ctx: &impl Packet,
    offset: usize,
    seed: u32,
) -> Result<u32, Reason> {
    let p: *mut [u8; LEN] = ptr_at_mut(ctx, offset)?;
    // SAFETY: `p` covers LEN bytes of the packet (checked above); LEN is a multiple of 4 and at
    // most 512, as the helper requires; no `from` buffer.
    let r = unsafe { bpf_csum_diff(null_mut(), 0, p as *mut u32, LEN as u32, seed) };
    if r < 0 {
        return Err(Reason::PassL4Checksum);
    }
    Ok(r as u32)
}

/// `partial` plus the segment's `LEN`-byte block (`LEN` a power of two, 64 to 256) that starts
/// after its length rounded down to `2 * LEN`, when bit `LEN` of its length `len` is set: one
/// stage of the segment's rest below [`BIG`] bytes.
#[inline(always)]
fn csum_bit<const LEN: usize>(
    ctx: &impl Packet,
    offset: usize,
    len: usize,
    partial: u32,
) -> Result<u32, Reason> {
    if opaque(len & LEN) == 0 {
        return Ok(partial);
    }
    csum_block::<LEN>(ctx, offset + (len & !(2 * LEN - 1)), partial)
}

/// `Ok` when the TCP/UDP segment of `len` bytes at `offset` (ending at or before the end of
/// the frame, checked by the caller's header checks) sums with the pseudo-header sum `pseudo`
/// to a correct checksum. Bounded loops for the verifier: 512-byte blocks, then one 256-, 128-
/// and 64-byte block each where the length has that bit, through `bpf_csum_diff`, then 4-byte
/// words, then the last 2 and 1 bytes.
///
/// Each loop runs a block *count* derived from `len` (shift and mask, passed through
/// [`opaque`]), and each single block is taken on a bit of `len` (also through [`opaque`]),
/// never a comparison of a position with `len` itself: the verifier then explores
/// each loop once per iteration and the paths merge behind it, instead of splitting `len` into
/// one known range per path that every later instruction of the program is verified again for.
///
/// A BPF subprogram of its own (not inlined): the verifier still walks every path through the
/// loops, but they end with the subprogram's frame at its return, where they merge (two
/// outcomes) instead of each carrying its own stack into the rest of the program.
#[inline(always)]
pub fn l4_checksum<P: Packet>(
    ctx: &P,
    offset: usize,
    len: usize,
    pseudo: u64,
) -> Result<(), Reason> {
    match l4_checksum_call::<P>(ctx.as_ptr(), offset, len, pseudo) {
        0 => Ok(()),
        CSUM_TOO_LONG => Err(Reason::PassL4ChecksumTooLong),
        CSUM_SHORT => Err(Reason::PassMalformed),
        _ => Err(Reason::PassL4Checksum),
    }
}

/// [`l4_checksum_call`]: the segment is longer than the loops cover.
const CSUM_TOO_LONG: u32 = 2;
/// [`l4_checksum_call`]: the frame ends before the segment (the caller checked it does not).
const CSUM_SHORT: u32 = 3;

/// [`l4_checksum`]'s subprogram: 0 = correct, 1 = wrong, [`CSUM_TOO_LONG`], [`CSUM_SHORT`].
#[inline(never)]
fn l4_checksum_call<P: Packet>(ctx: *mut c_void, offset: usize, len: usize, pseudo: u64) -> u32 {
    // SAFETY: `ctx` is the program's context pointer, passed on by `l4_checksum`.
    match l4_sum_checks(&unsafe { P::from_ptr(ctx) }, offset, len, pseudo) {
        Ok(()) => 0,
        Err(Reason::PassL4ChecksumTooLong) => CSUM_TOO_LONG,
        Err(Reason::PassMalformed) => CSUM_SHORT,
        Err(_) => 1,
    }
}

#[inline(always)]
fn l4_sum_checks<P: Packet>(ctx: &P, offset: usize, len: usize, pseudo: u64) -> Result<(), Reason> {
    // Also bounds every offset below for the verifier (a packet offset must stay below 64 KiB).
    if len >= MAX_SUMMED {
        return Err(Reason::PassL4ChecksumTooLong);
    }
    let big = opaque(len >> 9);
    let mut partial = 0u32;
    for i in 0..MAX_BIG {
        if i >= big {
            break;
        }
        partial = csum_block::<BIG>(ctx, offset + i * BIG, partial)?;
    }
    // Each stage starts where the segment's length says (not where the previous one ended):
    // the verifier's paths out of one stage are the same state at the next. The rest below
    // 512 bytes in at most three calls, one per bit of its length (256, 128, 64).
    partial = csum_bit::<256>(ctx, offset, len, partial)?;
    partial = csum_bit::<128>(ctx, offset, len, partial)?;
    partial = csum_bit::<SMALL>(ctx, offset, len, partial)?;
    let mut sum = pseudo + partial as u64;
    let words = opaque((len >> 2) & (SMALL / 4 - 1));
    let words_at = offset + (len & !(SMALL - 1));
    for i in 0..SMALL / 4 - 1 {
        if i >= words {
            break;
        }
        let w: *mut Words2 = ptr_at_mut(ctx, words_at + i * 4)?;
        // SAFETY: bounds checked by ptr_at_mut.
        let [a, b] = unsafe { (*w).w };
        sum += a as u64 + b as u64;
    }
    let tail = opaque(len & 3);
    let tail_at = offset + (len & !3);
    if tail & 2 != 0 {
        let w: *mut u16 = ptr_at_mut(ctx, tail_at)?;
        // SAFETY: bounds checked by ptr_at_mut; packet data is 2-byte aligned and so is the
        // offset (the headers before it have even lengths).
        sum += unsafe { *w } as u64;
    }
    if tail & 1 != 0 {
        // The odd last byte with the one before it (a segment has at least 8 bytes): LLVM
        // turns a 1-byte bounds check into `pointer < end`, which gives the verifier no range.
        let b: *mut [u8; 2] = ptr_at_mut(ctx, tail_at + (tail & 2) - 1)?;
        // SAFETY: bounds checked by ptr_at_mut. The odd last byte is the high-order byte of a
        // word padded with zero, i.e. the first byte in memory.
        let [_, last] = unsafe { *b };
        sum += u16::from_ne_bytes([last, 0]) as u64;
    }
    if !sum_is_valid(fold(sum) as u64) {
        return Err(Reason::PassL4Checksum);
    }
    Ok(())
}
