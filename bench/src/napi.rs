//! The kernel threads of threaded NAPI instances, asked from the kernel's `netdev` generic
//! netlink family (`NETDEV_CMD_NAPI_GET`; the thread's PID is reported since Linux 6.8), so a
//! testbed pins exactly its own threads whatever its interfaces are called (`eth0` is a common
//! name; the thread names `napi/<dev>-<id>` do not say which namespace a device lives in).

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, bail};

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;

/// `include/uapi/linux/netdev.h`.
const NETDEV_CMD_NAPI_GET: u8 = 11;
const NETDEV_A_NAPI_IFINDEX: u16 = 1;
const NETDEV_A_NAPI_PID: u16 = 4;

const NLMSG_HDRLEN: usize = 16;
const GENL_HDRLEN: usize = 4;

/// The attributes (type, value) of one reply message.
type Attrs = Vec<(u16, Vec<u8>)>;

/// PIDs of the NAPI threads of interface `ifindex` in the calling thread's network namespace
/// (empty when its NAPI is not threaded). An error when the kernel has no `netdev` family.
pub fn thread_pids(ifindex: u32) -> Result<Vec<i32>> {
    let mut sock = Genl::open()?;
    let family = sock
        .family_id("netdev")
        .context("generic netlink family `netdev` (Linux ≥ 6.8 reports NAPI threads)")?;
    let replies = sock.request(
        family,
        NETDEV_CMD_NAPI_GET,
        NLM_F_DUMP,
        &[(NETDEV_A_NAPI_IFINDEX, &ifindex.to_ne_bytes())],
    )?;
    Ok(napi_pids(&replies, ifindex))
}

/// The thread PIDs in NAPI_GET replies that belong to `ifindex` (a kernel that ignores the
/// ifindex filter of the dump returns every NAPI of the namespace).
fn napi_pids(replies: &[Attrs], ifindex: u32) -> Vec<i32> {
    replies
        .iter()
        .filter(|attrs| attr_u32(attrs, NETDEV_A_NAPI_IFINDEX) == Some(ifindex))
        .filter_map(|attrs| attr_u32(attrs, NETDEV_A_NAPI_PID))
        .filter_map(|pid| i32::try_from(pid).ok())
        .collect()
}

fn attr_u32(attrs: &[(u16, Vec<u8>)], ty: u16) -> Option<u32> {
    attrs
        .iter()
        .find(|(t, _)| *t == ty)
        .and_then(|(_, v)| Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?)))
}

/// A generic netlink socket.
struct Genl {
    fd: OwnedFd,
    seq: u32,
}

impl Genl {
    fn open() -> Result<Genl> {
        // SAFETY: plain socket(2); the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if fd < 0 {
            bail!("generic netlink socket: {}", io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A kernel that never answers must not hang the benchmark.
        let timeout = libc::timeval {
            tv_sec: 2,
            tv_usec: 0,
        };
        // SAFETY: a valid timeval of the size passed.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const timeout).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            bail!("SO_RCVTIMEO: {}", io::Error::last_os_error());
        }
        Ok(Genl { fd, seq: 0 })
    }

    /// The id of generic netlink family `name`.
    fn family_id(&mut self, name: &str) -> Result<u16> {
        let mut cname = name.as_bytes().to_vec();
        cname.push(0);
        let replies = self.request(
            GENL_ID_CTRL,
            CTRL_CMD_GETFAMILY,
            0,
            &[(CTRL_ATTR_FAMILY_NAME, &cname)],
        )?;
        replies
            .iter()
            .find_map(|attrs| {
                attrs
                    .iter()
                    .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
                    .and_then(|(_, v)| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
            })
            .with_context(|| format!("no id in the reply for family {name}"))
    }

    /// Sends one request and returns the attributes of every reply message.
    fn request(
        &mut self,
        family: u16,
        cmd: u8,
        flags: u16,
        attrs: &[(u16, &[u8])],
    ) -> Result<Vec<Attrs>> {
        self.seq += 1;
        let msg = encode(family, NLM_F_REQUEST | flags, self.seq, cmd, attrs);
        // SAFETY: sends `msg.len()` bytes from a live buffer; an unconnected netlink socket
        // sends to the kernel.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            bail!("generic netlink send: {}", io::Error::last_os_error());
        }
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receives into a live buffer of the given length.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                bail!("generic netlink recv: {}", io::Error::last_os_error());
            }
            let done = parse(&buf[..n as usize], self.seq, &mut replies)?;
            if done || !dump {
                return Ok(replies);
            }
        }
    }
}

/// One generic netlink request: nlmsghdr, genlmsghdr, attributes.
fn encode(family: u16, flags: u16, seq: u32, cmd: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
    let mut m = vec![0u8; NLMSG_HDRLEN];
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    for (ty, value) in attrs {
        let len = 4 + value.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(value);
        m.resize(m.len().next_multiple_of(4), 0);
    }
    let total = m.len() as u32;
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&family.to_ne_bytes());
    m[6..8].copy_from_slice(&flags.to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m
}

/// Appends the attributes of every reply to `seq` in `buf` to `out`; true at `NLMSG_DONE`.
fn parse(mut buf: &[u8], seq: u32, out: &mut Vec<Attrs>) -> Result<bool> {
    let u16_at = |b: &[u8], i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
    let u32_at = |b: &[u8], i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    while buf.len() >= NLMSG_HDRLEN {
        let len = u32_at(buf, 0) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            bail!(
                "malformed netlink message (length {len} of {} bytes)",
                buf.len()
            );
        }
        let (msg, rest) = buf.split_at(len);
        buf = rest
            .get(len.next_multiple_of(4) - len..)
            .unwrap_or_default();
        if u32_at(msg, 8) != seq {
            continue;
        }
        let body = &msg[NLMSG_HDRLEN..];
        match u16_at(msg, 4) {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let err = body
                    .get(..4)
                    .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                if err != 0 {
                    bail!("netlink: {}", io::Error::from_raw_os_error(-err));
                }
                return Ok(true);
            }
            _ => {}
        }
        let mut attrs = Vec::new();
        let mut a = body.get(GENL_HDRLEN..).unwrap_or_default();
        while a.len() >= 4 {
            let alen = u16_at(a, 0) as usize;
            if alen < 4 || alen > a.len() {
                break;
            }
            attrs.push((u16_at(a, 2) & NLA_TYPE_MASK, a[4..alen].to_vec()));
            a = a.get(alen.next_multiple_of(4)..).unwrap_or_default();
        }
        out.push(attrs);
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn napi_dump_replies_are_read() {
        // Two NAPI replies (ours with a thread, another device's) and DONE, as one datagram.
        let mut buf = encode(
            30,
            2,
            7,
            NETDEV_CMD_NAPI_GET,
            &[
                (NETDEV_A_NAPI_IFINDEX, &5u32.to_ne_bytes()),
                (2, &8200u32.to_ne_bytes()),
                (NETDEV_A_NAPI_PID, &4242u32.to_ne_bytes()),
            ],
        );
        buf.extend(encode(
            30,
            2,
            7,
            NETDEV_CMD_NAPI_GET,
            &[
                (NETDEV_A_NAPI_IFINDEX, &9u32.to_ne_bytes()),
                (NETDEV_A_NAPI_PID, &77u32.to_ne_bytes()),
            ],
        ));
        let mut done = encode(NLMSG_DONE, 2, 7, 0, &[]);
        done.truncate(NLMSG_HDRLEN + 4);
        buf.extend(done);
        let mut replies = Vec::new();
        assert!(parse(&buf, 7, &mut replies).unwrap());
        assert_eq!(replies.len(), 2);
        assert_eq!(napi_pids(&replies, 5), vec![4242]);
        assert_eq!(napi_pids(&replies, 6), Vec::<i32>::new());
        // A reply to another request is skipped; an error reply is an error.
        let mut other = Vec::new();
        assert!(!parse(&buf[..buf.len() - 20], 8, &mut other).unwrap());
        assert!(other.is_empty());
        let mut err = encode(NLMSG_ERROR, 0, 1, 0, &[]);
        err[NLMSG_HDRLEN..NLMSG_HDRLEN + 4].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert!(parse(&err, 1, &mut Vec::new()).is_err());
    }

    #[test]
    fn strings_are_padded() {
        let m = encode(GENL_ID_CTRL, 1, 3, CTRL_CMD_GETFAMILY, &[(2, b"netdev\0")]);
        // 16 header + 4 genl + 4 attr header + 7 name → padded to 32.
        assert_eq!(m.len(), 32);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 32);
        assert_eq!(&m[24..31], b"netdev\0");
    }
}
