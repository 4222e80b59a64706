//! The event socket's kernel-side filter: a classic BPF socket filter that drops the events
//! caused by the daemon's own requests (timeout refreshes, "be liberal" marks) before they
//! are queued, so they take no room in the socket's receive buffer.
//!
//! Why in the kernel: ctnetlink sends an UPDATE event for every change a request makes, with
//! the requesting socket's port id in `nlmsg_pid` (`ctnetlink_conntrack_event`:
//! `nfnl_msg_put(skb, item->portid, …)`). Marking a million connections at start-up makes a
//! million such events (and as many again for the marks after arming); dropped only once read,
//! they still filled the receive buffer faster than the reader emptied it, and the overrun
//! cost a full resync in which nothing had changed. The kernel runs a socket's filter on
//! multicast delivery before charging the buffer (`net/netlink/af_netlink.c`,
//! `do_one_broadcast`: `sk_filter` before `netlink_broadcast_deliver`), as conntrackd's
//! event filters (`nfct_filter_attach`) rely on. Each event is one skb holding one message, so
//! the filter looks at the first header only.

use std::io;

/// `SO_ATTACH_FILTER` (`asm-generic/socket.h`; the same value on every Linux architecture,
/// but not exported by `libc` for the gnu targets).
const SO_ATTACH_FILTER: libc::c_int = 26;

/// Offset of `nlmsg_pid` in `struct nlmsghdr` (`len: u32, type: u16, flags: u16, seq: u32`).
const NLMSG_PID_OFFSET: u32 = 12;

/// Most ports one filter can name: a classic BPF conditional jump's offsets are one byte.
pub const MAX_IGNORED_PORTS: usize = 250;

/// `ld [k]`: the 32-bit word at byte `k` of the packet, read big-endian.
const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// `jeq #k, jt, jf`.
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
/// `ret #k`: keep at most `k` bytes (0 drops the packet).
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// One classic BPF instruction (`struct sock_filter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// The filter program: drop a message whose `nlmsg_pid` is one of `ports`, keep the rest.
/// `None` when there are more than [`MAX_IGNORED_PORTS`].
pub fn program(ports: &[u32]) -> Option<Vec<Insn>> {
    if ports.len() > MAX_IGNORED_PORTS {
        return None;
    }
    let n = ports.len();
    let mut prog = Vec::with_capacity(n + 3);
    prog.push(Insn {
        code: LD_W_ABS,
        jt: 0,
        jf: 0,
        k: NLMSG_PID_OFFSET,
    });
    for (i, port) in ports.iter().enumerate() {
        prog.push(Insn {
            code: JEQ_K,
            // From instruction 1 + i: the drop is at n + 2, the next test (or the accept) next.
            jt: u8::try_from(n - i).ok()?,
            jf: 0,
            // `nlmsg_pid` is in host byte order; `ld` reads big-endian.
            k: u32::from_be_bytes(port.to_ne_bytes()),
        });
    }
    prog.push(Insn {
        code: RET_K,
        jt: 0,
        jf: 0,
        k: u32::MAX,
    });
    prog.push(Insn {
        code: RET_K,
        jt: 0,
        jf: 0,
        k: 0,
    });
    Some(prog)
}

/// Attaches `prog` to the socket `fd`, replacing any filter it had.
pub fn attach(fd: libc::c_int, prog: &[Insn]) -> io::Result<()> {
    let mut insns: Vec<libc::sock_filter> = prog
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    let fprog = libc::sock_fprog {
        len: libc::c_ushort::try_from(insns.len())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?,
        filter: insns.as_mut_ptr(),
    };
    // SAFETY: `fprog` points at `insns`, both alive across the call; the kernel copies them.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_FILTER,
            (&raw const fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` on `packet` as the kernel's classic BPF interpreter does for the
    /// instructions [`program`] uses: the bytes kept (0: dropped).
    fn run(prog: &[Insn], packet: &[u8]) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let at = i.k as usize;
                    let Some(word) = packet.get(at..at + 4) else {
                        return 0; // out of bounds: the kernel drops
                    };
                    acc = u32::from_be_bytes(word.try_into().expect("4 bytes"));
                }
                JEQ_K => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
                RET_K => return i.k,
                other => panic!("instruction {other:#x} not expected"),
            }
        }
    }

    /// A netlink header as the kernel writes it (host byte order) from port `pid`.
    fn message_from(pid: u32) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend(20u32.to_ne_bytes());
        m.extend(0x0100u16.to_ne_bytes()); // IPCTNL_MSG_CT_NEW
        m.extend(0u16.to_ne_bytes());
        m.extend(7u32.to_ne_bytes());
        m.extend(pid.to_ne_bytes());
        m.extend([2, 0, 0, 0]); // nfgenmsg
        m
    }

    #[test]
    fn drops_the_listed_ports_only() {
        let ports = [0x1234_5678, 42, 3_000_000_001];
        let prog = program(&ports).expect("a few ports fit");
        for p in ports {
            assert_eq!(run(&prog, &message_from(p)), 0, "port {p} dropped");
        }
        // The kernel's own events (port 0) and other sockets' updates are kept.
        for p in [0, 43, 0x7856_3412, u32::MAX] {
            assert_eq!(run(&prog, &message_from(p)), u32::MAX, "port {p} kept");
        }
        // A message too short to have a port is not an event: dropped, as the kernel does.
        assert_eq!(run(&prog, &[0; 8]), 0);
    }

    #[test]
    fn no_ports_keeps_everything_and_too_many_is_refused() {
        let prog = program(&[]).expect("empty");
        assert_eq!(run(&prog, &message_from(9)), u32::MAX);
        let many: Vec<u32> = (1..=MAX_IGNORED_PORTS as u32).collect();
        let prog = program(&many).expect("the most that fit");
        assert_eq!(run(&prog, &message_from(1)), 0);
        assert_eq!(run(&prog, &message_from(MAX_IGNORED_PORTS as u32)), 0);
        assert_eq!(
            run(&prog, &message_from(MAX_IGNORED_PORTS as u32 + 1)),
            u32::MAX
        );
        let too_many: Vec<u32> = (0..=MAX_IGNORED_PORTS as u32).collect();
        assert_eq!(program(&too_many), None);
    }
}
