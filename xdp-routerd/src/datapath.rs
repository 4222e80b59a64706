//! The loaded eBPF object and its typed maps.

/// The xdp-router eBPF object, built by build.rs (aya-build) and embedded in the binary.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"));
