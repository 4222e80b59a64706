//! Map ABI of the benchmark lab programs (the `lab` binary of xdp-router-ebpf, driven by
//! `xdp-router-bench`). Nothing here is used by the router itself.
//!
//! The lab object holds four XDP programs:
//! - [`LAB_GEN_PROG`]: a traffic generator for `BPF_PROG_RUN` with `BPF_F_TEST_XDP_LIVE_FRAMES`.
//!   It writes [`GenConfig::template`] over the start of every frame (the kernel recycles
//!   live-frame pages without re-initialising them, and forwarding rewrites headers in place),
//!   puts the flow's port into the varying port field and redirects the frame.
//! - [`LAB_SINK_PROG`]: counts and drops UDP to or from [`LAB_PORT`]; passes everything else.
//! - [`LAB_REDIRECT_PROG`]: rewrites the MACs and redirects every frame (the XDP ceiling).
//! - [`LAB_PASS_PROG`]: `XDP_PASS`, so a veth accepts redirected frames (it gives the veth NAPI).

/// Name of the generator program in the lab object.
pub const LAB_GEN_PROG: &str = "lab_gen";
/// Name of the sink program in the lab object.
pub const LAB_SINK_PROG: &str = "lab_sink";
/// Name of the bare-redirect program in the lab object.
pub const LAB_REDIRECT_PROG: &str = "lab_redirect";
/// Name of the pass program in the lab object.
pub const LAB_PASS_PROG: &str = "lab_pass";

/// `Array<GenConfig>` with one entry: what the generator writes.
pub const MAP_LAB_GEN: &str = "LAB_GEN";
/// `PerCpuArray<u32>` with one entry: the generator's frame sequence number (picks the flow).
pub const MAP_LAB_GEN_SEQ: &str = "LAB_GEN_SEQ";
/// `PerCpuArray<LabCounter>` with one entry: what the sink counted.
pub const MAP_LAB_SINK: &str = "LAB_SINK";
/// `Array<RedirectConfig>` with one entry: where the bare-redirect program sends frames.
pub const MAP_LAB_REDIR: &str = "LAB_REDIR";

/// UDP port of the benchmark traffic (discard). The sink counts UDP with this source or
/// destination port; the generator uses it as the fixed port of every flow.
pub const LAB_PORT: u16 = 9;

/// Size of [`GenConfig::template`]: the IPv6 headers (14 + 40 + 8) plus the 2-byte
/// compensation word. IPv4 uses the first 44 bytes.
pub const GEN_TEMPLATE_LEN: usize = 64;

/// Template length for IPv4: Ethernet 14 + IPv4 20 + UDP 8 + compensation word 2.
pub const GEN_TEMPLATE_LEN_V4: usize = 44;

/// [`GenConfig::family`] value for IPv4.
pub const GEN_FAMILY_V4: u8 = 4;
/// [`GenConfig::family`] value for IPv6.
pub const GEN_FAMILY_V6: u8 = 6;

/// Configuration of the generator program (one entry of [`MAP_LAB_GEN`]).
///
/// Flow `i` (the frame's sequence number modulo `flows`) carries port `port_base + i` in the
/// varying port field (the UDP source port, or the destination port when `vary_dst` is 1). The
/// 2-byte payload word right after the UDP header carries the one's complement of that port, so
/// the UDP checksum of the template stays valid for every flow without being recomputed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenConfig {
    /// Ethernet + IP + UDP headers + compensation word of flow `0`, with valid checksums, built
    /// by the host (wire bytes). Only the first 44 bytes are used for IPv4.
    pub template: [u8; GEN_TEMPLATE_LEN],
    /// Interface index the frames are redirected into, in the generator's netns (host order).
    pub ifindex: u32,
    /// Number of flows, at least 1 (host order).
    pub flows: u32,
    /// Port of flow 0 (host order).
    pub port_base: u16,
    /// [`GEN_FAMILY_V4`] or [`GEN_FAMILY_V6`]; anything else makes the program abort frames.
    pub family: u8,
    /// 0: the source port varies per flow; 1: the destination port varies.
    pub vary_dst: u8,
}
const _: () = assert!(core::mem::size_of::<GenConfig>() == 76);

/// Packets and bytes counted by the sink (one per-CPU entry of [`MAP_LAB_SINK`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabCounter {
    /// Frames counted (host order).
    pub packets: u64,
    /// Bytes counted, Ethernet header included, FCS excluded (host order).
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<LabCounter>() == 16);

/// Configuration of the bare-redirect program (one entry of [`MAP_LAB_REDIR`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedirectConfig {
    /// Egress interface index, in the router's netns (host order).
    pub ifindex: u32,
    /// Source MAC written into every frame (wire order).
    pub src_mac: [u8; 6],
    /// Destination MAC written into every frame (wire order).
    pub dst_mac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<RedirectConfig>() == 16);

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // SAFETY: #[repr(C)], integers and byte arrays only, no implicit padding (sizes asserted).
    unsafe impl aya::Pod for GenConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for LabCounter {}
    // SAFETY: as above.
    unsafe impl aya::Pod for RedirectConfig {}
}
