//! Memory ordering between CPUs for the few words one program run publishes and another reads
//! without a lock: a flow direction's arming (`armed_generation` with `fib_mark`, published
//! after the DSCP, TTL and time it vouches for) and the per-flow FIB cache's `generation` with
//! `ifindex` (a sequence lock around the cached answer, see `fib.rs`). Each is a 64-bit word:
//! two `u32` fields side by side, 8-byte aligned (asserted in the common crate).
//!
//! BPF programs are JIT-compiled to the CPU's own loads and stores. On x86-64 (TSO) stores
//! become visible in program order and loads are not reordered with other loads, so volatile
//! accesses in the right order are enough, and cost nothing. On arm64 (and other weakly ordered
//! CPUs) either may be reordered: a reader could see a new generation with old fields, or copy
//! fields a writer is still changing. There, these accessors use 64-bit BPF atomics with
//! `BPF_FETCH`, which the arm64 JIT emits as `swpal` / `ldclral`-style instructions with
//! acquire and release semantics (Linux `arch/arm64/net/bpf_jit_comp.c`): a publishing store
//! is an exchange, which orders every earlier access before it and every later one after; an
//! ordered load is a fetch-or of 0, with the same effect. (BPF's own load-acquire /
//! store-release instructions need Linux 6.15; Debian's 6.12 has the fetch atomics. 32-bit
//! fetch atomics would need the object built for BPF CPU v3.)
//!
//! The object is built per daemon architecture (`bpf_target_arch`, set by aya-build), so an
//! x86-64 daemon carries the plain version and an arm64 daemon the ordered one.

#[cfg(not(bpf_target_arch = "x86_64"))]
use core::intrinsics::{AtomicOrdering, atomic_or, atomic_xchg};
#[cfg(bpf_target_arch = "x86_64")]
use core::ptr::{read_volatile, write_volatile};

/// The two `u32` fields of an ordered word: `(low, high)` = (the field at the lower address,
/// the one after it) on little-endian BPF.
#[inline(always)]
pub fn halves(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// The ordered word of `(low, high)`; see [`halves`].
#[inline(always)]
pub fn word(low: u32, high: u32) -> u64 {
    u64::from(low) | (u64::from(high) << 32)
}

/// Reads `*p` ordered after every earlier access and before every later one.
///
/// # Safety
/// `p` points into a live map value, 8-byte aligned.
#[inline(always)]
pub unsafe fn load_ordered(p: *mut u64) -> u64 {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: see the function's contract.
        unsafe { read_volatile(p) }
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        // SAFETY: see the function's contract; the returned old value makes it a fetch-or.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(p, 0) }
    }
}

/// Writes `v` to `*p` after every earlier access (and before every later one).
///
/// # Safety
/// `p` points into a live map value, 8-byte aligned.
#[inline(always)]
pub unsafe fn store_ordered(p: *mut u64, v: u64) {
    #[cfg(bpf_target_arch = "x86_64")]
    {
        // SAFETY: see the function's contract.
        unsafe { write_volatile(p, v) }
    }
    #[cfg(not(bpf_target_arch = "x86_64"))]
    {
        // SAFETY: see the function's contract.
        let _ = unsafe { atomic_xchg::<u64, { AtomicOrdering::SeqCst }>(p, v) };
    }
}
