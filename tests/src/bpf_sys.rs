//! `BPF_PROG_TEST_RUN` through the `bpf(2)` syscall, for what aya's `TestRun` does not pass on:
//! the skb test flags (`BPF_F_TEST_SKB_CHECKSUM_COMPLETE`), and programs loaded from raw
//! instructions (`prog-cost`'s baselines).

use std::{
    io,
    mem::size_of,
    os::fd::{AsRawFd, BorrowedFd},
};

/// `BPF_PROG_TEST_RUN` in `enum bpf_cmd`.
pub const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// `BPF_F_TEST_SKB_CHECKSUM_COMPLETE` (Linux 6.11): the skb gets `CHECKSUM_COMPLETE`, its
/// `skb->csum` the sum of the packet from the network header; after the run the kernel sums the
/// packet again from there and fails the run with `EBADMSG` where `skb->csum` no longer matches.
pub const BPF_F_TEST_SKB_CHECKSUM_COMPLETE: u32 = 1 << 2;

/// `union bpf_attr` for `BPF_PROG_TEST_RUN` (`test`).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    _pad: u32,
}

/// The `bpf(2)` syscall with command `cmd` on `attr`, a `union bpf_attr` prefix.
pub fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a live, fully initialised bpf_attr prefix of the size passed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// What one `BPF_PROG_TEST_RUN` returned.
pub struct TestRunOut {
    /// The return value of the last run.
    pub retval: u32,
    /// Mean ns per run, as the kernel timed its repeat loop.
    pub duration_ns: u32,
    /// Bytes of the packet after the run (written to `data_out` up to its length).
    pub data_size_out: u32,
}

/// Runs program `prog` `repeat` times on `data_in` with the context `ctx_in` and the test
/// `flags`; the packet after the run goes to `data_out` (when given).
pub fn test_run(
    prog: BorrowedFd,
    data_in: &[u8],
    data_out: Option<&mut [u8]>,
    ctx_in: &[u8],
    repeat: u32,
    flags: u32,
) -> io::Result<TestRunOut> {
    let (out_ptr, out_len) = data_out.map_or((0, 0), |o| (o.as_mut_ptr() as u64, o.len()));
    let mut attr = TestRunAttr {
        prog_fd: prog.as_raw_fd() as u32,
        data_size_in: data_in.len() as u32,
        data_in: data_in.as_ptr() as u64,
        data_size_out: out_len as u32,
        data_out: out_ptr,
        repeat,
        ctx_size_in: ctx_in.len() as u32,
        ctx_in: ctx_in.as_ptr() as u64,
        flags,
        ..TestRunAttr::default()
    };
    bpf(BPF_PROG_TEST_RUN, &mut attr)?;
    Ok(TestRunOut {
        retval: attr.retval,
        duration_ns: attr.duration,
        data_size_out: attr.data_size_out,
    })
}
