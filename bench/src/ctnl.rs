//! Conntrack entries for benchmarks, without real sockets: created in bulk with the
//! `conntrack` tool (`conntrack -R`, one process per batch), deleted over a raw ctnetlink
//! socket (`conntrack -D` scans the whole table per entry: 2,000 deletions took 33 s).

use std::{fmt::Write as _, io::Write as _, net::Ipv4Addr, process::Stdio};

use anyhow::{Context as _, Result, bail};

use crate::netns::Netns;

/// One established, assured TCP connection from a LAN host to a remote host, masqueraded to
/// `nat`: what a router's conntrack holds for a live connection.
#[derive(Debug, Clone, Copy)]
pub struct Conn {
    pub src: Ipv4Addr,
    pub sport: u16,
    pub dst: Ipv4Addr,
    pub dport: u16,
    pub nat: Ipv4Addr,
}

impl Conn {
    /// The `conntrack -R` line that creates it (600 s timeout).
    fn insert_line(&self) -> String {
        let Conn {
            src,
            sport,
            dst,
            dport,
            nat,
        } = self;
        format!(
            "-I -p tcp -s {src} -d {dst} --sport {sport} --dport {dport} --state ESTABLISHED \
             -u SEEN_REPLY,ASSURED -t 600 -r {dst} -q {nat} --reply-port-src {dport} \
             --reply-port-dst {sport}\n"
        )
    }
}

/// Creates `conns` in the conntrack table of `ns` (`conntrack -R -`).
pub fn insert(ns: &Netns, conns: &[Conn]) -> Result<()> {
    let mut lines = String::with_capacity(conns.len() * 200);
    for c in conns {
        lines.push_str(&c.insert_line());
    }
    let mut child = ns
        .command("conntrack")
        .args(["-R", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running conntrack -R")?;
    child
        .stdin
        .take()
        .context("conntrack stdin")?
        .write_all(lines.as_bytes())
        .context("writing to conntrack -R")?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "conntrack -R: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A raw `NETLINK_NETFILTER` socket that deletes conntrack entries by their original tuple.
/// Must be opened on a thread inside the namespace whose table it edits.
pub struct Deleter {
    fd: i32,
    seq: u32,
}

/// `NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_DELETE`.
const CT_DELETE: u16 = (1 << 8) | 2;
const NLA_F_NESTED: u16 = 0x8000;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;

impl Deleter {
    /// Opens the socket in the calling thread's network namespace.
    pub fn open() -> Result<Deleter> {
        // SAFETY: plain socket call.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_NETFILTER,
            )
        };
        if fd < 0 {
            bail!("ctnetlink socket: {}", std::io::Error::last_os_error());
        }
        Ok(Deleter { fd, seq: 1 })
    }

    /// Deletes `conns` (a few datagrams of requests without acks). Returns how many the kernel
    /// refused (an entry already gone, for instance).
    pub fn delete(&mut self, conns: &[Conn]) -> Result<usize> {
        let mut failed = 0;
        for chunk in conns.chunks(256) {
            let mut buf = Vec::with_capacity(chunk.len() * 80);
            for c in chunk {
                self.seq = self.seq.wrapping_add(1);
                buf.extend_from_slice(&delete_message(c, self.seq));
            }
            // SAFETY: sockaddr_nl is plain old data; all zero is valid (the kernel, no groups).
            let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            addr.nl_family = libc::AF_NETLINK as u16;
            // SAFETY: buf and addr are valid for the lengths passed.
            let rc = unsafe {
                libc::sendto(
                    self.fd,
                    buf.as_ptr().cast(),
                    buf.len(),
                    0,
                    (&raw const addr).cast(),
                    size_of::<libc::sockaddr_nl>() as u32,
                )
            };
            if rc < 0 {
                bail!("ctnetlink delete: {}", std::io::Error::last_os_error());
            }
            failed += self.drain_errors();
        }
        Ok(failed)
    }

    /// Reads the error replies queued so far (only failures are answered without NLM_F_ACK).
    fn drain_errors(&self) -> usize {
        let mut n = 0;
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: buf is valid for its length.
            let got = unsafe {
                libc::recv(
                    self.fd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if got <= 0 {
                return n;
            }
            let mut off = 0usize;
            let got = got as usize;
            while off + 16 <= got {
                let len = u32::from_ne_bytes([buf[off], buf[off + 1], buf[off + 2], buf[off + 3]])
                    as usize;
                let kind = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                // NLMSG_ERROR with a non-zero error code.
                if kind == 2
                    && off + 20 <= got
                    && i32::from_ne_bytes([
                        buf[off + 16],
                        buf[off + 17],
                        buf[off + 18],
                        buf[off + 19],
                    ]) != 0
                {
                    n += 1;
                }
                if len < 16 {
                    break;
                }
                off += len.next_multiple_of(4);
            }
        }
    }
}

impl Drop for Deleter {
    fn drop(&mut self) {
        // SAFETY: the fd is ours.
        unsafe { libc::close(self.fd) };
    }
}

fn attr(buf: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let len = 4 + payload.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(payload);
    buf.resize(buf.len().next_multiple_of(4), 0);
}

/// One IPCTNL_MSG_CT_DELETE request for the original tuple of `c` (pure).
fn delete_message(c: &Conn, seq: u32) -> Vec<u8> {
    let mut ip = Vec::new();
    attr(&mut ip, CTA_IP_V4_SRC, &c.src.octets());
    attr(&mut ip, CTA_IP_V4_DST, &c.dst.octets());
    let mut proto = Vec::new();
    attr(&mut proto, CTA_PROTO_NUM, &[libc::IPPROTO_TCP as u8]);
    attr(&mut proto, CTA_PROTO_SRC_PORT, &c.sport.to_be_bytes());
    attr(&mut proto, CTA_PROTO_DST_PORT, &c.dport.to_be_bytes());
    let mut tuple = Vec::new();
    attr(&mut tuple, CTA_TUPLE_IP | NLA_F_NESTED, &ip);
    attr(&mut tuple, CTA_TUPLE_PROTO | NLA_F_NESTED, &proto);
    let mut body = vec![libc::AF_INET as u8, 0, 0, 0];
    attr(&mut body, CTA_TUPLE_ORIG | NLA_F_NESTED, &tuple);
    let mut msg = Vec::with_capacity(16 + body.len());
    msg.extend_from_slice(&((16 + body.len()) as u32).to_ne_bytes());
    msg.extend_from_slice(&CT_DELETE.to_ne_bytes());
    msg.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&body);
    msg
}

/// `ip -batch` lines adding (`add`) or deleting routes to `n` /32 destinations from
/// 172.16.0.0 on, via `gw`.
pub fn route_batch(verb: &str, n: u32, gw: Ipv4Addr) -> String {
    let mut s = String::with_capacity(n as usize * 48);
    for i in 0..n {
        let dst = Ipv4Addr::from(u32::from(Ipv4Addr::new(172, 16, 0, 0)) + i);
        let _ = writeln!(s, "route {verb} {dst}/32 via {gw}");
    }
    s
}

/// Runs `ip -batch -` in `ns` with `script` on stdin.
pub fn ip_batch(ns: &Netns, script: &str) -> Result<()> {
    let mut child = ns
        .command("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running ip -batch")?;
    child
        .stdin
        .take()
        .context("ip stdin")?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "ip -batch: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delete_message_is_one_well_formed_netlink_message() {
        let c = Conn {
            src: Ipv4Addr::new(10, 0, 1, 2),
            sport: 40000,
            dst: Ipv4Addr::new(198, 51, 100, 7),
            dport: 443,
            nat: Ipv4Addr::new(203, 0, 113, 1),
        };
        let m = delete_message(&c, 7);
        assert_eq!(
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(m.len() % 4, 0);
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), CT_DELETE);
        // The ports are in network byte order inside the nested proto tuple.
        let port = 40000u16.to_be_bytes();
        assert!(m.windows(2).any(|w| w == port));
        assert!(m.windows(4).any(|w| w == [10, 0, 1, 2]));
    }

    #[test]
    fn insert_lines_carry_the_nat_reply_tuple() {
        let c = Conn {
            src: Ipv4Addr::new(10, 0, 1, 2),
            sport: 40000,
            dst: Ipv4Addr::new(198, 51, 100, 7),
            dport: 443,
            nat: Ipv4Addr::new(203, 0, 113, 1),
        };
        let l = c.insert_line();
        assert!(l.contains(
            "-r 198.51.100.7 -q 203.0.113.1 --reply-port-src 443 --reply-port-dst 40000"
        ));
    }
}
