//! The frames of one generator stream, as the lab's `lab_gen` program writes them: the stream's
//! initial frame with [`GenConfig::template`] over its start and flow `seq % flows`'s port in
//! the varying port field, its one's complement in the compensation word after the UDP header.

use anyhow::{Result, bail};
use xdp_router_common::lab::{
    GEN_FAMILY_V4, GEN_FAMILY_V6, GEN_TEMPLATE_LEN, GEN_TEMPLATE_LEN_V4, GenConfig,
};

/// UDP header offset of an IPv4 frame without options (Ethernet 14 + IPv4 20).
const L4_OFF_V4: usize = 34;
/// UDP header offset of an IPv6 frame without extension headers (Ethernet 14 + IPv6 40).
const L4_OFF_V6: usize = 54;

/// Frame `seq` of a stream (see the module doc).
pub struct FlowFrames<'a> {
    cfg: &'a GenConfig,
    frame: &'a [u8],
    /// Bytes of the template written over the frame (44 for IPv4, 64 for IPv6).
    head_len: usize,
    /// UDP header offset.
    l4: usize,
    /// Offset of the varying port.
    port_off: usize,
}

impl<'a> FlowFrames<'a> {
    /// The stream `cfg` with initial frame `frame`; fails on a configuration `lab_gen` would
    /// abort frames of (no flows, unknown family, frame shorter than the template).
    pub fn new(cfg: &'a GenConfig, frame: &'a [u8]) -> Result<FlowFrames<'a>> {
        let (head_len, l4) = match cfg.family {
            GEN_FAMILY_V4 => (GEN_TEMPLATE_LEN_V4, L4_OFF_V4),
            GEN_FAMILY_V6 => (GEN_TEMPLATE_LEN, L4_OFF_V6),
            f => bail!("generator config has unknown address family {f}"),
        };
        if cfg.flows == 0 {
            bail!("generator config has no flows");
        }
        if frame.len() < head_len {
            bail!(
                "generator frame of {} B is shorter than its {head_len}-byte headers",
                frame.len()
            );
        }
        Ok(FlowFrames {
            cfg,
            frame,
            head_len,
            l4,
            port_off: l4 + if cfg.vary_dst != 0 { 2 } else { 0 },
        })
    }

    /// Length of every frame of the stream (FCS excluded).
    pub fn len(&self) -> usize {
        self.frame.len()
    }

    /// Writes frame number `seq` into `out`, which is [`Self::len`] bytes long.
    pub fn write(&self, seq: u32, out: &mut [u8]) {
        out.copy_from_slice(self.frame);
        out[..self.head_len].copy_from_slice(&self.cfg.template[..self.head_len]);
        let port = self
            .cfg
            .port_base
            .wrapping_add((seq % self.cfg.flows) as u16);
        out[self.port_off..self.port_off + 2].copy_from_slice(&port.to_be_bytes());
        out[self.l4 + 8..self.l4 + 10].copy_from_slice(&(!port).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::{FCS_LEN, FrameSpec};

    fn spec(src: &str, dst: &str, size: usize, port_base: u16, vary_dst: bool) -> FrameSpec {
        FrameSpec {
            frame_size: size,
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_ip: src.parse().unwrap(),
            dst_ip: dst.parse().unwrap(),
            fixed_port: 9,
            port_base,
            flows: 100,
            vary_dst,
        }
    }

    /// Frame `seq` is byte for byte the frame the packet helpers build for flow `seq % flows`
    /// on its own (a one-flow stream whose port is that flow's, checksums computed afresh).
    #[test]
    fn every_frame_is_its_flows_reference_frame() {
        for (src, dst) in [("10.0.1.2", "10.0.2.2"), ("fd00:1::2", "fd00:2::2")] {
            for size in [68, 78, 128, 1518] {
                for vary_dst in [false, true] {
                    let s = spec(src, dst, size, 20_000, vary_dst);
                    let cfg = s.gen_config(3).unwrap();
                    let frame = s.frame().unwrap();
                    let frames = FlowFrames::new(&cfg, &frame).unwrap();
                    assert_eq!(frames.len(), size - FCS_LEN);
                    let mut out = vec![0xa5; frames.len()];
                    for seq in [0, 1, 2, 99, 100, 12_345, u32::MAX] {
                        frames.write(seq, &mut out);
                        let reference = FrameSpec {
                            port_base: 20_000 + (seq % 100) as u16,
                            flows: 1,
                            ..s.clone()
                        };
                        assert_eq!(
                            out,
                            reference.frame().unwrap(),
                            "{src} {size} B vary_dst {vary_dst} seq {seq}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_template_replaces_whatever_the_frame_held() {
        let s = spec("10.0.1.2", "10.0.2.2", 64, 40_000, false);
        let cfg = s.gen_config(3).unwrap();
        // A frame whose headers a router rewrote (TTL, MACs): the template restores them.
        let mut stale = s.frame().unwrap();
        stale[..12].fill(0xee);
        stale[22] = 1;
        let frames = FlowFrames::new(&cfg, &stale).unwrap();
        let mut out = vec![0; frames.len()];
        frames.write(0, &mut out);
        assert_eq!(out, s.frame().unwrap());
    }

    #[test]
    fn configs_lab_gen_aborts_are_refused() {
        let s = spec("fd00:1::2", "fd00:2::2", 68, 40_000, false);
        let frame = s.frame().unwrap();
        let mut cfg = s.gen_config(3).unwrap();
        assert!(FlowFrames::new(&cfg, &frame[..63]).is_err());
        cfg.flows = 0;
        assert!(FlowFrames::new(&cfg, &frame).is_err());
        cfg.flows = 1;
        cfg.family = 5;
        assert!(FlowFrames::new(&cfg, &frame).is_err());
    }
}
