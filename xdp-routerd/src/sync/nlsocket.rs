//! Opening netlink sockets, the one place `sync/` does: blocking ones for requests and
//! dumps ([`request_socket`]) and for notifications read on a thread of their own
//! ([`notification_socket`]), and a nonblocking one registered with tokio ([`AsyncNetlink`]:
//! ctnetlink requests and events, route lookups), so no netlink round trip on it ever blocks
//! a runtime worker.

use std::io;

use netlink_sys::{Socket, SocketAddr};
use tokio::io::unix::AsyncFd;

/// A blocking socket of `protocol` for requests: bound to a kernel-chosen port and connected
/// to the kernel, in the caller's network namespace.
pub fn request_socket(protocol: isize) -> io::Result<Socket> {
    let mut sock = Socket::new(protocol)?;
    sock.bind_auto()?;
    sock.connect(&SocketAddr::new(0, 0))?;
    Ok(sock)
}

/// A blocking socket of `protocol` bound to the notification `groups` (a bind mask: group n is
/// bit n - 1; groups above 32 are joined with `add_membership` afterwards), in the caller's
/// network namespace, with a receive buffer of `rcvbuf` bytes asked for (best effort: the
/// kernel caps it at `net.core.rmem_max`).
pub fn notification_socket(
    protocol: isize,
    groups: u32,
    rcvbuf: libc::c_int,
) -> io::Result<Socket> {
    let mut sock = Socket::new(protocol)?;
    let _ = sock.set_rx_buf_sz(rcvbuf);
    sock.bind(&SocketAddr::new(0, groups))?;
    Ok(sock)
}

/// A nonblocking netlink socket of one protocol, bound to a kernel-chosen port.
pub struct AsyncNetlink {
    fd: AsyncFd<Socket>,
    port: u32,
}

impl AsyncNetlink {
    /// Opens and binds the socket (in the caller's network namespace). Needs a tokio runtime
    /// with IO enabled.
    pub fn open(protocol: isize) -> io::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("must be called inside a tokio runtime"));
        }
        let mut sock = Socket::new(protocol)?;
        let addr = sock.bind_auto()?;
        sock.set_non_blocking(true)?;
        // SAFETY: `Socket` owns its fd (closed only on drop) and always returns that same fd.
        let fd = unsafe { AsyncFd::register(sock) }?;
        Ok(AsyncNetlink {
            fd,
            port: addr.port_number(),
        })
    }

    /// The socket itself (for socket options).
    pub fn socket(&self) -> &Socket {
        self.fd.get_ref()
    }

    /// The socket's netlink port id.
    pub fn port(&self) -> u32 {
        self.port
    }

    /// Sends one datagram to the kernel.
    pub async fn send(&self, buf: &[u8]) -> io::Result<()> {
        loop {
            let mut guard = self.fd.writable().await?;
            match guard.try_io(|s| s.get_ref().send(buf, 0)) {
                Ok(Ok(n)) if n == buf.len() => return Ok(()),
                Ok(Ok(n)) => {
                    return Err(io::Error::other(format!(
                        "short netlink send: {n} of {} bytes",
                        buf.len()
                    )));
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Waits for one datagram. Returns its length; errors when it did not fit `buf`.
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|s| recv_datagram(s.get_ref(), buf)) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }

    /// Reads one datagram if one is queued (`WouldBlock` otherwise).
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        recv_datagram(self.fd.get_ref(), buf)
    }
}

fn recv_datagram(sock: &Socket, buf: &mut [u8]) -> io::Result<usize> {
    // MSG_TRUNC makes recv return the datagram's real length, so truncation is detectable.
    let n = sock.recv(&mut &mut buf[..], libc::MSG_TRUNC)?;
    if n > buf.len() {
        return Err(io::Error::other(format!(
            "netlink datagram of {n} bytes truncated to {}",
            buf.len()
        )));
    }
    Ok(n)
}

/// `setsockopt(fd, level, name, &value)` for an int option.
pub fn setsockopt_int(fd: i32, level: i32, name: i32, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` lives across the call and its size is passed along.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
