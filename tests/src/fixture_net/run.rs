//! Running the program once under BPF_PROG_RUN: the `xdp_md` context, the run, and the clock
//! of the flows' `last_seen_ns`.

use std::{io, os::fd::AsFd};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions, Xdp};

use crate::bpf_sys::{BPF_F_TEST_SKB_CHECKSUM_COMPLETE, test_run};

/// CLOCK_MONOTONIC_COARSE now, in ns: the clock of the flows' `last_seen_ns`
/// (`bpf_ktime_get_coarse_ns`), which advances once per tick.
pub fn coarse_monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `struct xdp_md` context of a run: a frame of `len` bytes received on `ingress`.
pub fn xdp_md(ingress: u32, len: usize) -> Vec<u8> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
    // egress_ifindex. The kernel wants data = data_meta = 0 and data_end = frame length.
    let md: [u32; 6] = [0, len as u32, 0, ingress, 0, 0];
    md.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// Runs the program once on `frame` as received on `ingress`: (verdict, output frame).
pub fn run(prog: &Xdp, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
    let ctx = xdp_md(ingress, frame.len());
    let mut out = vec![0u8; frame.len() + 512];
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })
        .unwrap_or_else(|e| panic!("BPF_PROG_RUN: {e}"));
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}

/// The `struct __sk_buff` context of a TC run: up to `ifindex`, the device the skb is on (the
/// kernel takes it from there: `bpf_prog_test_run_skb`); every other field the kernel lets a
/// test set is left 0.
pub fn sk_buff_ctx(ifindex: u32) -> Vec<u8> {
    // len, pkt_type, mark, queue_mapping, protocol, vlan_present, vlan_tci, vlan_proto,
    // priority, ingress_ifindex, ifindex.
    let mut words = [0u32; 11];
    words[10] = ifindex;
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// `TC_ACT_UNSPEC` as a run's return value.
pub const TC_ACT_UNSPEC: u32 = -1i32 as u32;
/// `TC_ACT_REDIRECT`.
pub const TC_ACT_REDIRECT: u32 = 7;

/// Runs the TC program once on `frame` as an skb received on `ingress`: (verdict, output
/// frame). The skb is linear with no checksum state (CHECKSUM_NONE).
pub fn run_tc(prog: &SchedClassifier, frame: &[u8], ingress: u32) -> (u32, Vec<u8>) {
    try_run_tc(prog, frame, ingress)
        .unwrap_or_else(|e| panic!("BPF_PROG_RUN (TC), {} bytes: {e}", frame.len()))
}

/// [`run_tc`], or the kernel's refusal to build the skb (`EINVAL` for frames shorter than
/// the headers their EtherType promises, or longer than a page holds).
pub fn try_run_tc(
    prog: &SchedClassifier,
    frame: &[u8],
    ingress: u32,
) -> Result<(u32, Vec<u8>), String> {
    let ctx = sk_buff_ctx(ingress);
    let mut out = vec![0u8; frame.len() + 512];
    let res = prog
        .test_run(TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..TestRunOptions::default()
        })
        .map_err(|e| format!("{e:?}"))?;
    out.truncate(res.data_size_out as usize);
    Ok((res.return_value, out))
}

/// [`try_run_tc`] on an skb with `CHECKSUM_COMPLETE` (a sum over the packet from its network
/// header in `skb->csum`, as drivers like mlx5 or virtio-net hand over): the run fails with
/// `EBADMSG` when the program left `skb->csum` out of step with the packet (the kernel sums it
/// again after the run; `BPF_F_TEST_SKB_CHECKSUM_COMPLETE`), and with `EINVAL` on kernels
/// before 6.11, which lack the flag, or for frames the kernel builds no skb from.
pub fn try_run_tc_checksum_complete(
    prog: &SchedClassifier,
    frame: &[u8],
    ingress: u32,
) -> io::Result<(u32, Vec<u8>)> {
    let fd = prog.fd().map_err(io::Error::other)?;
    let mut out = vec![0u8; frame.len() + 512];
    let res = test_run(
        fd.as_fd(),
        frame,
        Some(&mut out),
        &sk_buff_ctx(ingress),
        1,
        BPF_F_TEST_SKB_CHECKSUM_COMPLETE,
    )?;
    out.truncate(res.data_size_out as usize);
    Ok((res.retval, out))
}
