//! The AF_PACKET generator, for kernels that refuse live-frames `BPF_PROG_RUN`: the stream's
//! frames (the bytes `lab_gen` would send, see [`super::frames`]) written into the
//! `PACKET_TX_RING` (TPACKET_V2) of a raw packet socket in the host's namespace and sent
//! (`PACKET_QDISC_BYPASS`: straight to the driver) into the host's spare veth pair, whose other
//! end runs the lab's bare redirect: it redirects every frame out of the interface `lab_gen`
//! redirects out of, so the router receives XDP frames, as from `lab_gen`. (Sent out of that
//! interface directly, frames reach the router as socket buffers, which its veth copies into
//! XDP buffers one by one: that copy took 58 % of the router's XDP thread here.)
//!
//! The spare pair's receive runs in its own NAPI thread on the generator's CPU at real-time
//! priority: woken by the first frame of a `send`, it runs when the `send` returns (on a kernel
//! without full preemption, as here) and takes all its frames in one poll, so the router's
//! thread is woken once per batch, as with `lab_gen`, not once per frame (as a softirq, which
//! runs after every frame, the generator reached a third of the rate here).
//! A virtio-net header before every frame (`PACKET_VNET_HDR`, see [`vnet_hdr`]) makes the
//! kernel copy the frame into the socket buffer rather than attach the ring's page, which the
//! veth would otherwise copy into a fresh page for every frame.
//!
//! Frames the router cannot take are dropped by the redirect, counted as sent, as with
//! `lab_gen`. A full spare veth (`send` fails with `ENOBUFS`; the kernel keeps the frame
//! queued) only slows the generator down: the frame goes out with the next `send`.

use std::{
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use xdp_router_common::lab::{GenConfig, RedirectConfig};
use xdp_router_testbed::netns::Netns;

use super::{frames::FlowFrames, pacing::Pacer};
use crate::{
    lab::{Redirect, ifindex},
    napi,
    pin::{pin_pid, set_fifo},
};

/// Bytes of one ring slot: the TPACKET_V2 and virtio-net headers and the largest frame (1514 B,
/// veth MTU 1500).
const SLOT_SIZE: usize = 2048;
/// Bytes of one ring block (a multiple of the page size; slots never cross blocks).
const BLOCK_SIZE: usize = 64 * 1024;
/// Blocks of the ring: 1,024 slots, four times what a veth's ring holds.
const BLOCKS: usize = 32;
/// Slots of the ring.
const SLOTS: usize = BLOCKS * BLOCK_SIZE / SLOT_SIZE;
/// Offset of the data in a slot (the virtio-net header, then the frame): right after the
/// 32-byte TPACKET_V2 header (`TPACKET2_HDRLEN - sizeof(struct sockaddr_ll)`, packet(7)).
const DATA_OFF: usize = libc::TPACKET2_HDRLEN - std::mem::size_of::<libc::sockaddr_ll>();
/// Bytes of the `struct virtio_net_hdr` before every frame (`PACKET_VNET_HDR`).
const VNET_HDR_LEN: usize = 10;
/// Largest frame a slot holds.
const MAX_FRAME: usize = SLOT_SIZE - DATA_OFF - VNET_HDR_LEN;
const _: () = assert!(MAX_FRAME >= 1514 && BLOCK_SIZE.is_multiple_of(SLOT_SIZE));
/// Frames queued per `send` call.
const KICK: u32 = 64;
/// Frames per burst when the generator runs flat out (the run's end is checked between bursts).
pub const UNPACED_CHUNK: u32 = SLOTS as u32;
/// Socket send buffer: every slot in flight at once (a frame's socket buffer is charged at
/// about 1 KiB plus the frame) fits, so only the ring limits the frames in flight.
const SNDBUF: usize = SLOTS * 4096;
/// Real-time priority of the spare pair's NAPI thread on the generator's CPU (the router's NAPI
/// threads on its own CPU have 50).
const HOP_PRIO: i32 = 10;
/// Longest time the ring may make no progress (no frame taken, no slot back) before the run
/// fails.
const STALL: Duration = Duration::from_secs(2);

/// What one `send` call on the ring did.
#[derive(Debug, PartialEq, Eq)]
enum Kick {
    /// The kernel took the queued frames (all of them unless a buffer ran out).
    Sent,
    /// The spare veth's ring (`ENOBUFS`) or the socket's send buffer (`EAGAIN`) is full; the
    /// frames stay queued.
    Full,
}

/// The AF_PACKET sender of one namespace.
pub struct AfPacket {
    fd: OwnedFd,
    ring: NonNull<u8>,
    /// The bare redirect on the spare pair's other end.
    hop: Redirect,
    /// `<interface> in <namespace>`, for messages.
    iface: String,
    /// Next slot to fill.
    head: usize,
    /// Filled slots the kernel has not taken yet: the `queued` slots before `head`.
    queued: usize,
    /// Sequence number of the next frame (picks its flow; carried over runs, as `lab_gen`'s
    /// per-CPU counter is).
    seq: u32,
}

// SAFETY: the ring mapping belongs to this value alone and is only touched through `&mut self`.
unsafe impl Send for AfPacket {}

/// `setsockopt` with an integer or struct value.
fn set_opt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T, what: &str) -> Result<()> {
    // SAFETY: `value` points to a live `T` of the length given.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        bail!(
            "AF_PACKET generator: setting {what}: {}",
            io::Error::last_os_error()
        );
    }
    Ok(())
}

impl AfPacket {
    /// A raw packet socket with a TX ring in namespace `ns`, sending into `spare_if`, one end
    /// of a veth pair that is down; `spare_peer`, its other end, gets the bare redirect and a
    /// NAPI thread on CPU `cpu`, the sender's. Both are brought up without IPv6 (no router
    /// solicitations or reports to redirect).
    pub fn new(ns: &Netns, spare_if: &str, spare_peer: &str, cpu: usize) -> Result<AfPacket> {
        ns.sh(&format!(
            "sysctl -qw net.ipv6.conf.{spare_if}.disable_ipv6=1 \
             net.ipv6.conf.{spare_peer}.disable_ipv6=1 && \
             ip link set {spare_if} up && ip link set {spare_peer} up"
        ))?;
        // No target yet: a frame would be dropped (redirect to ifindex 0) until a run sets one.
        let hop = Redirect::attach(ns, spare_peer, RedirectConfig::default())?;
        // The XDP program gave the veth its NAPI instance; now give that a thread.
        ns.sh(&format!("echo 1 > /sys/class/net/{spare_peer}/threaded"))?;
        match ns.enter(|| napi::thread_pids(ifindex(spare_peer)?)) {
            Ok(threads) if !threads.is_empty() => {
                for t in threads {
                    pin_pid(t, cpu)?;
                    set_fifo(t, HOP_PRIO)?;
                }
            }
            // Before Linux 6.8 the kernel does not say which thread is ours (`lk1` is no
            // unique name): the pair's receive stays a softirq, after every frame.
            found => {
                ns.sh(&format!("echo 0 > /sys/class/net/{spare_peer}/threaded"))?;
                eprintln!(
                    "note: no NAPI thread of {spare_peer} found ({}): it forwards the AF_PACKET \
                     generator's frames one by one, as a softirq, so the generator is slower",
                    found.map_or_else(|e| format!("{e:#}"), |_| "none started".into())
                );
            }
        }
        let (fd, idx) = ns.enter(|| {
            // Protocol 0: the socket receives nothing.
            // SAFETY: plain socket(2) call.
            let raw =
                unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
            if raw < 0 {
                bail!(
                    "AF_PACKET generator: socket in {}: {}",
                    ns.name(),
                    io::Error::last_os_error()
                );
            }
            // SAFETY: a new descriptor nothing else owns.
            Ok((unsafe { OwnedFd::from_raw_fd(raw) }, ifindex(spare_if)?))
        })?;
        let v2 = libc::tpacket_versions::TPACKET_V2 as libc::c_int;
        set_opt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_VERSION,
            &v2,
            "TPACKET_V2",
        )?;
        let one: libc::c_int = 1;
        set_opt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_QDISC_BYPASS,
            &one,
            "PACKET_QDISC_BYPASS",
        )?;
        set_opt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_VNET_HDR,
            &one,
            "PACKET_VNET_HDR",
        )?;
        let sndbuf = SNDBUF as libc::c_int;
        set_opt(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &sndbuf,
            "SO_SNDBUFFORCE",
        )?;
        let req = libc::tpacket_req {
            tp_block_size: BLOCK_SIZE as u32,
            tp_block_nr: BLOCKS as u32,
            tp_frame_size: SLOT_SIZE as u32,
            tp_frame_nr: SLOTS as u32,
        };
        set_opt(
            &fd,
            libc::SOL_PACKET,
            libc::PACKET_TX_RING,
            &req,
            "PACKET_TX_RING",
        )?;
        // SAFETY: maps the ring just set up on `fd`, at its full size.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BLOCKS * BLOCK_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            bail!(
                "AF_PACKET generator: mapping the TX ring: {}",
                io::Error::last_os_error()
            );
        }
        let g = AfPacket {
            fd,
            ring: NonNull::new(map.cast()).context("mmap returned NULL")?,
            hop,
            iface: format!("{spare_if} in {}", ns.name()),
            head: 0,
            queued: 0,
            seq: 0,
        };
        g.bind(idx)?;
        Ok(g)
    }

    /// Sends the frames of `cfg` and `frame` out of `cfg.ifindex` (through the spare pair) in
    /// the bursts of `pacer`; returns the frames sent.
    pub fn run(&mut self, cfg: &GenConfig, frame: &[u8], pacer: &Pacer) -> Result<u64> {
        let frames = FlowFrames::new(cfg, frame)?;
        if frames.len() > MAX_FRAME {
            bail!(
                "AF_PACKET generator: a {} B frame does not fit a {SLOT_SIZE}-byte ring slot",
                frames.len()
            );
        }
        // The redirect writes the MACs every frame already has.
        let mac = |at: usize| {
            let mut m = [0; 6];
            m.copy_from_slice(&cfg.template[at..at + 6]);
            m
        };
        self.hop.set(RedirectConfig {
            ifindex: cfg.ifindex,
            dst_mac: mac(0),
            src_mac: mac(6),
        })?;
        let mut sent = 0u64;
        while let Some(n) = pacer.next(sent) {
            self.burst(&frames, n)?;
            sent += u64::from(n);
        }
        Ok(sent)
    }

    fn bind(&self, ifindex: u32) -> Result<()> {
        // SAFETY: sockaddr_ll is plain data.
        let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_ifindex = ifindex as i32;
        // SAFETY: a valid sockaddr_ll of the length given.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if r != 0 {
            bail!(
                "AF_PACKET generator: binding to {}: {}",
                self.iface,
                io::Error::last_os_error()
            );
        }
        Ok(())
    }

    /// Sends `n` frames, `KICK` per `send`, until the kernel has taken all of them.
    fn burst(&mut self, frames: &FlowFrames<'_>, n: u32) -> Result<()> {
        let mut filled = 0u32;
        let mut progress = Instant::now();
        while filled < n || self.queued > 0 {
            let mut batch = 0;
            while filled < n && batch < KICK && self.slot_free(self.head)? {
                self.fill(frames);
                filled += 1;
                batch += 1;
            }
            if self.queued == 0 {
                // Every slot is in flight: wait for one to come back.
                if self.wait_writable()? {
                    progress = Instant::now();
                }
            } else {
                let kick = self.kick()?;
                if self.collect() > 0 {
                    progress = Instant::now();
                } else if kick == Kick::Full {
                    std::thread::yield_now();
                }
            }
            if progress.elapsed() > STALL {
                bail!(
                    "AF_PACKET generator: no frame left the TX ring on {} for {} s",
                    self.iface,
                    STALL.as_secs()
                );
            }
        }
        Ok(())
    }

    /// Status word of slot `i` (the first field of its `tpacket2_hdr`).
    fn status(&self, i: usize) -> &AtomicU32 {
        // SAFETY: slot `i < SLOTS` lies in the mapping and starts 4-byte aligned; the kernel
        // reads and writes the word with single accesses too.
        unsafe { AtomicU32::from_ptr(self.ring.as_ptr().add(i * SLOT_SIZE).cast()) }
    }

    /// Whether slot `i` may be filled (the kernel is done with it).
    fn slot_free(&self, i: usize) -> Result<bool> {
        let st = self.status(i).load(Ordering::Acquire);
        if st & libc::TP_STATUS_WRONG_FORMAT != 0 {
            bail!("AF_PACKET generator: the kernel refused the format of a frame in the TX ring");
        }
        Ok(st & (libc::TP_STATUS_SEND_REQUEST | libc::TP_STATUS_SENDING) == 0)
    }

    /// Writes the next frame into the free slot at `head` and queues it.
    fn fill(&mut self, frames: &FlowFrames<'_>) {
        let len = frames.len();
        // SAFETY: the slot lies in the mapping, is free (the kernel does not touch it until its
        // status says SEND_REQUEST) and holds the header plus `len <= MAX_FRAME` bytes.
        unsafe {
            let slot = self.ring.as_ptr().add(self.head * SLOT_SIZE);
            let hdr = slot.cast::<libc::tpacket2_hdr>();
            (*hdr).tp_len = (VNET_HDR_LEN + len) as u32;
            let data = std::slice::from_raw_parts_mut(slot.add(DATA_OFF), VNET_HDR_LEN + len);
            let (vnet, frame) = data.split_at_mut(VNET_HDR_LEN);
            vnet.copy_from_slice(&vnet_hdr(len));
            frames.write(self.seq, frame);
        }
        self.status(self.head)
            .store(libc::TP_STATUS_SEND_REQUEST, Ordering::Release);
        self.seq = self.seq.wrapping_add(1);
        self.head = (self.head + 1) % SLOTS;
        self.queued += 1;
    }

    /// Asks the kernel to send the queued frames, without waiting for them to leave.
    fn kick(&self) -> Result<Kick> {
        // SAFETY: a send(2) without a buffer: the kernel takes the frames from the ring.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), std::ptr::null(), 0, libc::MSG_DONTWAIT) };
        if r >= 0 {
            return Ok(Kick::Sent);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENOBUFS | libc::EAGAIN) => Ok(Kick::Full),
            _ => bail!("AF_PACKET generator: send on {}: {e}", self.iface),
        }
    }

    /// Forgets the queued frames the kernel has taken (in ring order, up to the first one still
    /// waiting); returns how many.
    fn collect(&mut self) -> u64 {
        let mut taken = 0;
        while self.queued > 0 {
            let tail = (self.head + SLOTS - self.queued) % SLOTS;
            if self.status(tail).load(Ordering::Acquire) & libc::TP_STATUS_SEND_REQUEST != 0 {
                break;
            }
            self.queued -= 1;
            taken += 1;
        }
        taken
    }

    /// Waits up to 1 ms for the slot at `head` (the kernel's head too: nothing is queued) to
    /// come back; true when it did.
    fn wait_writable(&self) -> Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                bail!("AF_PACKET generator: poll: {e}");
            }
        }
        self.slot_free(self.head)
    }
}

/// The `struct virtio_net_hdr` of a `len`-byte frame: no offloads, and `hdr_len` the whole
/// frame, so the kernel copies it into the socket buffer's head instead of attaching the ring
/// page (which a veth would copy into a fresh page for every frame, `skb_copy_ubufs`).
fn vnet_hdr(len: usize) -> [u8; VNET_HDR_LEN] {
    let mut h = [0; VNET_HDR_LEN];
    // Little-endian: the byte order of a virtio 1.0 header, which packet sockets use.
    h[2..4].copy_from_slice(&(len as u16).to_le_bytes());
    h
}

impl Drop for AfPacket {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, at its size; nothing uses it after this.
        unsafe { libc::munmap(self.ring.as_ptr().cast(), BLOCKS * BLOCK_SIZE) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vnet_header_puts_the_whole_frame_in_the_head() {
        assert_eq!(vnet_hdr(60), [0, 0, 60, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(vnet_hdr(1514), [0, 0, 0xea, 0x05, 0, 0, 0, 0, 0, 0]);
    }
}
