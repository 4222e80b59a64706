//! The two baseline programs, loaded from raw eBPF instructions with the `bpf(2)` syscall (aya
//! loads ELF objects only). Kept tiny on purpose: they are the floor and the ceiling.

use std::{
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
};

use xdp_router_tests::bpf_sys::{bpf, test_run};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_XDP` in `enum bpf_attach_type`.
const BPF_XDP: u32 = 37;
/// `XDP_FLAGS_DRV_MODE`.
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_FUNC_redirect` in the kernel's helper list (include/uapi/linux/bpf.h).
const BPF_FUNC_REDIRECT: i32 = 23;
const XDP_PASS: i32 = 2;

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Insn {
    code: u8,
    /// dst_reg (low nibble), src_reg (high nibble).
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}
/// r_dst = imm (BPF_ALU64 | BPF_MOV | BPF_K).
const fn mov_imm(dst: u8, imm: i32) -> Insn {
    insn(0xb7, dst, 0, 0, imm)
}
/// r_dst = r_src (BPF_ALU64 | BPF_MOV | BPF_X).
const fn mov_reg(dst: u8, src: u8) -> Insn {
    insn(0xbf, dst, src, 0, 0)
}
/// r_dst += imm (BPF_ALU64 | BPF_ADD | BPF_K).
const fn add_imm(dst: u8, imm: i32) -> Insn {
    insn(0x07, dst, 0, 0, imm)
}
/// r_dst = *(u32 *)(r_src + off) (BPF_LDX | BPF_MEM | BPF_W).
const fn load_u32(dst: u8, src: u8, off: i16) -> Insn {
    insn(0x61, dst, src, off, 0)
}
/// *(u32 *)(r_dst + off) = imm (BPF_ST | BPF_MEM | BPF_W).
const fn store_u32(dst: u8, off: i16, imm: i32) -> Insn {
    insn(0x62, dst, 0, off, imm)
}
/// *(u16 *)(r_dst + off) = imm (BPF_ST | BPF_MEM | BPF_H).
const fn store_u16(dst: u8, off: i16, imm: i32) -> Insn {
    insn(0x6a, dst, 0, off, imm)
}
/// if r_dst > r_src goto +off (BPF_JMP | BPF_JGT | BPF_X).
const fn jgt_reg(dst: u8, src: u8, off: i16) -> Insn {
    insn(0x2d, dst, src, off, 0)
}
/// call helper (BPF_JMP | BPF_CALL).
const fn call(helper: i32) -> Insn {
    insn(0x85, 0, 0, 0, helper)
}
/// exit (BPF_JMP | BPF_EXIT).
const fn exit() -> Insn {
    insn(0x95, 0, 0, 0, 0)
}

/// `return XDP_PASS`.
pub fn pass() -> Vec<Insn> {
    vec![mov_imm(0, XDP_PASS), exit()]
}

/// Rewrites both MACs and returns `bpf_redirect(ifindex, 0)`, like the lab's bare redirect
/// (runt frames: `XDP_PASS`).
pub fn redirect(ifindex: u32, smac: [u8; 6], dmac: [u8; 6]) -> Vec<Insn> {
    let w = |b: &[u8]| match *b {
        [a, b, c, d] => i32::from_ne_bytes([a, b, c, d]),
        [a, b] => i32::from(i16::from_ne_bytes([a, b])),
        _ => 0,
    };
    vec![
        load_u32(2, 1, 0), // r2 = ctx->data
        load_u32(3, 1, 4), // r3 = ctx->data_end
        mov_reg(4, 2),
        add_imm(4, 14),
        jgt_reg(4, 3, 8), // Ethernet header beyond the end: to the XDP_PASS below
        store_u32(2, 0, w(&dmac[..4])),
        store_u16(2, 4, w(&dmac[4..])),
        store_u32(2, 6, w(&smac[..4])),
        store_u16(2, 10, w(&smac[4..])),
        mov_imm(1, ifindex as i32),
        mov_imm(2, 0),
        call(BPF_FUNC_REDIRECT),
        exit(),
        mov_imm(0, XDP_PASS),
        exit(),
    ]
}

/// `union bpf_attr` for BPF_PROG_LOAD, up to `expected_attach_type`.
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// `union bpf_attr` for BPF_LINK_CREATE, up to `flags`.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// A loaded XDP program (closed on drop).
pub struct RawXdp {
    fd: OwnedFd,
}

impl RawXdp {
    /// Loads `insns` as an XDP program called `name`; errors carry the verifier log.
    pub fn load(name: &str, insns: &[Insn]) -> Result<RawXdp, String> {
        let license = CString::new("GPL").map_err(|e| e.to_string())?;
        let mut log = vec![0u8; 64 * 1024];
        let mut prog_name = [0u8; 16];
        for (d, s) in prog_name.iter_mut().zip(name.bytes().take(15)) {
            *d = s;
        }
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            kern_version: 0,
            prog_flags: 0,
            prog_name,
            prog_ifindex: 0,
            expected_attach_type: BPF_XDP,
        };
        let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            format!(
                "loading baseline {name}: {e}\n{}",
                String::from_utf8_lossy(&log[..end])
            )
        })?;
        // SAFETY: the kernel returned a new program fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        Ok(RawXdp { fd })
    }

    /// Attaches the program in native mode to `ifindex` of the calling thread's namespace;
    /// it stays attached as long as the returned link lives.
    pub fn attach(&self, ifindex: u32) -> Result<OwnedFd, String> {
        let mut attr = LinkCreateAttr {
            prog_fd: self.fd.as_raw_fd() as u32,
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: XDP_FLAGS_DRV_MODE,
        };
        let fd = bpf(BPF_LINK_CREATE, &mut attr)
            .map_err(|e| format!("attaching a baseline to ifindex {ifindex}: {e}"))?;
        // SAFETY: the kernel returned a new link fd that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    /// BPF_PROG_RUN with `repeat` runs: (return value of the last run, mean ns per run).
    pub fn test_run(&self, data: &[u8], ctx: &[u8], repeat: u32) -> Result<(u32, u32), String> {
        let out = test_run(self.fd.as_fd(), data, None, ctx, repeat, 0)
            .map_err(|e| format!("BPF_PROG_RUN: {e}"))?;
        Ok((out.retval, out.duration_ns))
    }
}
