//! Stack structs built from 32-bit words (map keys, `bpf_fib_lookup` input). Runs of constant
//! zero stores would be merged by LLVM into a `memset`, which the BPF backend (LLVM 22 via
//! bpf-linker) lowers to a call to a byte-by-byte loop; words of non-constant values are stored
//! as they are.

/// A zero the optimiser cannot see through (one stack store and load), so that zero fields do
/// not turn into a `memset` call.
#[inline(always)]
pub fn opaque_zero() -> u32 {
    let zero = 0u32;
    // SAFETY: reading a live local.
    unsafe { core::ptr::read_volatile(&zero) }
}

/// Two raw 16-bit words as the raw 32-bit word they form in memory (first one first).
#[inline(always)]
pub fn pack16(first: u16, second: u16) -> u32 {
    let [a, b] = first.to_ne_bytes();
    let [c, d] = second.to_ne_bytes();
    u32::from_ne_bytes([a, b, c, d])
}
