//! The lab programs (xdp-router-ebpf `lab` binary) on the host side: loading them (the
//! live-frames generator in [`crate::gen`] loads its own), the counting sink, the bare redirect
//! (XDP ceiling) and the pass program.

use std::ffi::CString;

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, PerCpuArray},
    programs::{Xdp, XdpMode},
};
use xdp_router_common::lab::{
    LAB_PASS_PROG, LAB_REDIRECT_PROG, LAB_SINK_PROG, LabCounter, MAP_LAB_REDIR, MAP_LAB_SINK,
    RedirectConfig,
};
use xdp_router_testbed::netns::Netns;

/// The lab object, built by build.rs (aya-build) and embedded in the binary.
pub static LAB_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lab"));

/// Loads the lab object with its program `prog` loaded (verified).
pub fn load(prog: &str) -> Result<Ebpf> {
    let mut ebpf = Ebpf::load(LAB_OBJECT).context("loading the lab eBPF object")?;
    xdp(&mut ebpf, prog)?
        .load()
        .with_context(|| format!("loading lab program {prog} (verifier)"))?;
    Ok(ebpf)
}

fn xdp<'a>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut Xdp> {
    ebpf.program_mut(prog)
        .ok_or_else(|| anyhow!("lab object has no program {prog}"))?
        .try_into()
        .with_context(|| format!("{prog} is not an XDP program"))
}

/// Index of interface `name` in the calling thread's network namespace.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).context("interface name contains NUL")?;
    // SAFETY: a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no interface {name}: {}", std::io::Error::last_os_error());
    }
    Ok(idx)
}

/// Attaches `prog` of `ebpf` to `ifname` inside `ns` (native mode unless `mode` says otherwise).
pub fn attach(ebpf: &mut Ebpf, prog: &str, ns: &Netns, ifname: &str, mode: XdpMode) -> Result<()> {
    let p = xdp(ebpf, prog)?;
    ns.enter(|| {
        p.attach(ifname, mode)
            .map(drop)
            .with_context(|| format!("attach {prog} to {ifname} in {}", ns.name()))
    })
}

/// An attached lab program; detached when dropped (the links belong to this process).
pub struct Attached {
    _ebpf: Ebpf,
}

/// Attaches the `XDP_PASS` program to `ifname` (native), so the veth accepts redirected frames.
pub fn attach_pass(ns: &Netns, ifname: &str) -> Result<Attached> {
    let mut ebpf = load(LAB_PASS_PROG)?;
    attach(&mut ebpf, LAB_PASS_PROG, ns, ifname, XdpMode::Driver)?;
    Ok(Attached { _ebpf: ebpf })
}

/// The bare redirect on one interface, its config writable while attached.
pub struct Redirect {
    ebpf: Ebpf,
}

impl Redirect {
    /// Attaches the bare redirect to `ifname` (native): every frame gets `cfg`'s MACs and goes
    /// out of `cfg.ifindex`.
    pub fn attach(ns: &Netns, ifname: &str, cfg: RedirectConfig) -> Result<Redirect> {
        let mut r = Redirect {
            ebpf: load(LAB_REDIRECT_PROG)?,
        };
        r.set(cfg)?;
        attach(&mut r.ebpf, LAB_REDIRECT_PROG, ns, ifname, XdpMode::Driver)?;
        Ok(r)
    }

    /// Sends every frame from now on as `cfg` says.
    pub fn set(&mut self, cfg: RedirectConfig) -> Result<()> {
        let mut map: Array<_, RedirectConfig> = Array::try_from(
            self.ebpf
                .map_mut(MAP_LAB_REDIR)
                .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_REDIR}"))?,
        )?;
        map.set(0, cfg, 0).context("writing the redirect config")
    }
}

/// The counting sink on one interface: counts and drops benchmark UDP, passes the rest.
pub struct Sink {
    ebpf: Ebpf,
    ifname: String,
}

impl Sink {
    /// Loads a sink (with its own counters) and attaches it natively to `ifname` in `ns`.
    pub fn attach(ns: &Netns, ifname: &str) -> Result<Sink> {
        let mut ebpf = load(LAB_SINK_PROG)?;
        attach(&mut ebpf, LAB_SINK_PROG, ns, ifname, XdpMode::Driver)?;
        Ok(Sink {
            ebpf,
            ifname: ifname.to_owned(),
        })
    }

    /// Packets and bytes counted so far (summed over CPUs).
    pub fn read(&self) -> Result<LabCounter> {
        let map: PerCpuArray<_, LabCounter> = PerCpuArray::try_from(
            self.ebpf
                .map(MAP_LAB_SINK)
                .ok_or_else(|| anyhow!("lab object has no map {MAP_LAB_SINK}"))?,
        )?;
        let values = map
            .get(&0, 0)
            .with_context(|| format!("reading the sink counters of {}", self.ifname))?;
        Ok(values
            .iter()
            .fold(LabCounter::default(), |a, v| LabCounter {
                packets: a.packets + v.packets,
                bytes: a.bytes + v.bytes,
            }))
    }
}
