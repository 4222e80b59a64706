//! Egress qdiscs over rtnetlink: is an interface's egress shaped?
//!
//! An XDP redirect hands the frame straight to the egress driver, so the egress qdisc never
//! sees it: a shaper on a managed interface would silently stop shaping what the fast path
//! sends out of it. With `shaped = "auto"` the daemon reads every interface's qdiscs
//! (`RTM_GETQDISC` dump, [`dump`]) at start and again after each `RTM_NEWQDISC` /
//! `RTM_DELQDISC` notification, and marks an interface shaped (`IFACE_F_SHAPED`: the datapath
//! passes packets that would leave through it) while [`Egress::shaper`] names a qdisc.
//!
//! # Policy: which qdiscs count as shaping
//! An egress is shaped when **any** qdisc in its egress tree (the root or a child of one of
//! its classes; ingress/clsact are not egress) may delay packets below line rate or reorder
//! them by an administrator's policy: the fast path would defeat exactly what that qdisc was
//! installed for.
//!
//! Not shaping ([`NOT_SHAPING`]): FIFOs and the system's default qdiscs (`noqueue`, `noop`,
//! `pfifo_fast`, `pfifo`, `bfifo`, `pfifo_head_drop`), multiqueue containers that only spread
//! packets over hardware queues (`mq`, `multiq`; their children are judged on their own), and
//! AQM / flow-fairness qdiscs without a rate (`fq_codel`, `codel`, `pie`, `fq_pie`, `sfq`,
//! `red`, `choke`, `sfb`, `gred`, `hhf`, `dualpi2`): they only act when the link itself is the
//! bottleneck, keep latency low there, and are what distributions install by default, so
//! treating them as shaping would switch the fast path off everywhere. `fq` belongs here too
//! unless it has a `maxrate` (then it paces below line rate: shaping).
//!
//! Shaping: everything else. That is the rate limiters and shapers (`htb`, `tbf`, `hfsc`,
//! `cbq`, `cake` — with or without a bandwidth, since unlimited cake still schedules by DiffServ
//! tins —, `cbs`, `taprio`, `etf`, `mqprio`), delay emulation (`netem`, `plug`), class-based
//! schedulers that serve an administrator's priorities or weights (`prio`, `ets`, `drr`, `qfq`,
//! `skbprio`), and any kind this list does not know: in doubt the kernel keeps the packets
//! (`shaped = false` in the config overrides the detection).

use std::{collections::BTreeMap, io};

use netlink_packet_core::{
    DecodeError, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload, NlasIterator,
};
use netlink_packet_route::{
    RouteNetlinkMessage,
    tc::{TcAttribute, TcMessage, TcOption},
};
use netlink_sys::{Socket, protocols::NETLINK_ROUTE};

/// Qdisc kinds that never make an egress shaped (see the module documentation); `fq` only
/// without a `maxrate`.
pub const NOT_SHAPING: &[&str] = &[
    "noqueue",
    "noop",
    "pfifo_fast",
    "pfifo",
    "bfifo",
    "pfifo_head_drop",
    "mq",
    "multiq",
    "fq_codel",
    "codel",
    "pie",
    "fq_pie",
    "sfq",
    "red",
    "choke",
    "sfb",
    "gred",
    "hhf",
    "dualpi2",
    "fq",
];

/// `TC_H_ROOT`: the parent of a root qdisc.
const TC_H_ROOT: u32 = 0xffff_ffff;
/// `TC_H_INGRESS` (= `TC_H_CLSACT`): the parent of the ingress and clsact qdiscs.
const TC_H_INGRESS: u32 = 0xffff_fff1;
/// `TCA_FQ_FLOW_MAX_RATE` (`uapi/linux/pkt_sched.h`): per-flow pacing cap in bytes/s, `~0U`
/// when unlimited.
const TCA_FQ_FLOW_MAX_RATE: u16 = 7;
/// Kind given to a qdisc whose message did not decode (judged shaping: in doubt, the kernel).
pub const UNDECODABLE: &str = "(undecodable)";

/// One qdisc as rtnetlink reports it: what the shaping decision needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Qdisc {
    /// Interface index.
    pub ifindex: u32,
    /// `major:minor` handle as one number (`1:` is `0x0001_0000`).
    pub handle: u32,
    /// Parent handle: `TC_H_ROOT` for a root qdisc, a class id for a child.
    pub parent: u32,
    /// `TCA_KIND`, e.g. `htb`.
    pub kind: String,
    /// `fq` only: `TCA_FQ_FLOW_MAX_RATE` in bytes/s when it limits (not `~0U`).
    pub max_rate: Option<u32>,
}

impl Qdisc {
    /// The root qdisc of the interface's egress.
    pub fn is_root(&self) -> bool {
        self.parent == TC_H_ROOT
    }

    /// Part of the egress tree (not the ingress or clsact qdisc).
    pub fn is_egress(&self) -> bool {
        self.parent != TC_H_INGRESS
    }

    /// Whether this qdisc by itself makes the egress shaped (see the module documentation).
    pub fn is_shaping(&self) -> bool {
        match self.kind.as_str() {
            "fq" => self.max_rate.is_some(),
            kind => !NOT_SHAPING.contains(&kind),
        }
    }

    /// Name for logs and `status`: the kind, with `fq`'s pacing cap when it has one.
    pub fn describe(&self) -> String {
        match self.max_rate {
            Some(rate) if self.kind == "fq" => format!("fq maxrate {}bit", u64::from(rate) * 8),
            _ => self.kind.clone(),
        }
    }
}

/// What the egress of one interface looks like.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    /// Kind of the root qdisc, when one is reported (a device that is down has none).
    pub root: Option<String>,
    /// The qdisc that makes the egress shaped: the root when it shapes, else the first
    /// shaping qdisc in the tree; `None` when nothing shapes.
    pub shaper: Option<String>,
}

impl Egress {
    /// Shaped per the qdiscs.
    pub fn shaped(&self) -> bool {
        self.shaper.is_some()
    }
}

/// Groups qdiscs by interface and decides each interface's [`Egress`] (pure; unit-tested).
/// Interfaces without any egress qdisc are absent: [`Egress::default`] (not shaped).
pub fn egress_by_ifindex(qdiscs: &[Qdisc]) -> BTreeMap<u32, Egress> {
    let mut out: BTreeMap<u32, Egress> = BTreeMap::new();
    for q in qdiscs.iter().filter(|q| q.is_egress()) {
        let e = out.entry(q.ifindex).or_default();
        if q.is_root() {
            e.root = Some(q.kind.clone());
            if q.is_shaping() {
                // The root names the shaping best (`tc qdisc show` lists it first).
                e.shaper = Some(q.describe());
            }
        } else if q.is_shaping() && e.shaper.is_none() {
            e.shaper = Some(q.describe());
        }
    }
    // A shaping child seen before a non-shaping root stays; a shaping root seen after a
    // shaping child replaces it (above). Nothing else to reconcile.
    out
}

/// The qdisc an `RTM_NEWQDISC` message (dump entry or notification) describes.
pub fn qdisc_from_message(msg: &TcMessage) -> Qdisc {
    let kind = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            TcAttribute::Kind(k) => Some(k.clone()),
            _ => None,
        })
        .unwrap_or_default();
    let max_rate = if kind == "fq" {
        fq_max_rate(&msg.attributes)
    } else {
        None
    };
    Qdisc {
        ifindex: msg.header.index as u32,
        handle: msg.header.handle.into(),
        parent: msg.header.parent.into(),
        kind,
        max_rate,
    }
}

/// `TCA_FQ_FLOW_MAX_RATE` from `fq`'s `TCA_OPTIONS`, when limiting. netlink-packet-route
/// leaves `fq` options as one raw attribute holding the nested ones.
fn fq_max_rate(attrs: &[TcAttribute]) -> Option<u32> {
    let nested = attrs.iter().find_map(|a| match a {
        TcAttribute::Options(opts) => opts.iter().find_map(|o| match o {
            TcOption::Other(nla) => {
                let mut value = vec![0u8; netlink_packet_core::Nla::value_len(nla)];
                netlink_packet_core::Nla::emit_value(nla, &mut value);
                Some(value)
            }
            _ => None,
        }),
        _ => None,
    })?;
    NlasIterator::new(&nested[..])
        .filter_map(Result::ok)
        .find(|nla| nla.kind() == TCA_FQ_FLOW_MAX_RATE)
        .and_then(|nla| Some(u32::from_ne_bytes(nla.value().get(..4)?.try_into().ok()?)))
        .filter(|&rate| rate != u32::MAX)
}

/// A qdisc message that netlink-packet-route could not decode: the ifindex and parent come
/// from the raw `struct tcmsg` (after the 16-byte netlink header) and it counts as shaping.
fn undecodable_qdisc(raw: &[u8]) -> Option<Qdisc> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(raw.get(at..at + 4)?.try_into().ok()?))
    };
    Some(Qdisc {
        ifindex: word(16 + 4)?,
        handle: word(16 + 8)?,
        parent: word(16 + 12)?,
        kind: UNDECODABLE.into(),
        max_rate: None,
    })
}

/// `RTM_NEWQDISC` (`uapi/linux/rtnetlink.h`).
const RTM_NEWQDISC: u16 = 36;

/// Splits a datagram into netlink messages and decodes the qdisc ones. Messages of other
/// types are skipped; a qdisc message that does not decode becomes an [`UNDECODABLE`] qdisc.
/// Also returns whether the kernel flagged the dump inconsistent (`NLM_F_DUMP_INTR`), whether
/// `NLMSG_DONE` for `seq` was seen, and an error the kernel answered with.
fn parse_dump_datagram(data: &[u8], seq: u32, out: &mut Vec<Qdisc>) -> io::Result<(bool, bool)> {
    let mut interrupted = false;
    for raw in super::datagram::messages(data) {
        let raw = raw.map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("truncated rtnetlink message in a qdisc dump: {e}"),
            )
        })?;
        let msg_type = u16::from_ne_bytes([raw[4], raw[5]]);
        let flags = u16::from_ne_bytes([raw[6], raw[7]]);
        let msg_seq = u32::from_ne_bytes([raw[8], raw[9], raw[10], raw[11]]);
        if msg_seq != seq {
            continue;
        }
        interrupted |= flags & NLM_F_DUMP_INTR != 0;
        match NetlinkMessage::<RouteNetlinkMessage>::deserialize(raw) {
            Ok(msg) => match msg.payload {
                NetlinkPayload::Done(_) => return Ok((interrupted, true)),
                NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewQueueDiscipline(m)) => {
                    out.push(qdisc_from_message(&m));
                }
                _ => {}
            },
            Err(e) if msg_type == RTM_NEWQDISC => {
                let q = undecodable_qdisc(raw).ok_or_else(|| decode_error(&e))?;
                tracing::warn!(
                    ifindex = q.ifindex,
                    error = %e,
                    "cannot decode a qdisc; treating it as shaping"
                );
                out.push(q);
            }
            Err(_) => {}
        }
    }
    Ok((interrupted, false))
}

fn decode_error(e: &DecodeError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

/// Reads every qdisc of the namespace (on a blocking thread); a few attempts, since a failed
/// read leaves `auto` interfaces marked shaped.
pub async fn read_all() -> std::io::Result<Vec<Qdisc>> {
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        match tokio::task::spawn_blocking(dump).await {
            Ok(Ok(q)) => return Ok(q),
            Ok(Err(e)) => last = Some(e),
            Err(e) => last = Some(std::io::Error::other(e.to_string())),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("qdisc dump failed")))
}

/// Every qdisc of every interface of the caller's network namespace (`tc qdisc show`,
/// including the invisible default children of multiqueue and classful qdiscs). Blocking.
pub fn dump() -> io::Result<Vec<Qdisc>> {
    let sock = super::nlsocket::request_socket(NETLINK_ROUTE)?;
    // A dump that raced with a change is flagged NLM_F_DUMP_INTR: read it again.
    for seq in 1..=5 {
        let (qdiscs, interrupted) = dump_once(&sock, seq)?;
        if !interrupted {
            return Ok(qdiscs);
        }
    }
    Err(io::Error::other(
        "the qdisc dump kept changing under us (NLM_F_DUMP_INTR five times)",
    ))
}

fn dump_once(sock: &Socket, seq: u32) -> io::Result<(Vec<Qdisc>, bool)> {
    let mut msg = TcMessage::default();
    // Also list the default qdiscs the kernel hides (`tc qdisc show invisible`).
    msg.attributes.push(TcAttribute::DumpInvisible(true));
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    header.sequence_number = seq;
    let mut req = NetlinkMessage::new(
        header,
        NetlinkPayload::from(RouteNetlinkMessage::GetQueueDiscipline(msg)),
    );
    req.finalize();
    let mut buf = vec![0; req.buffer_len()];
    req.serialize(&mut buf);
    sock.send(&buf, 0)?;
    let mut qdiscs = Vec::new();
    let mut interrupted = false;
    loop {
        let (data, _) = sock.recv_from_full()?;
        let (intr, done) = parse_dump_datagram(&data, seq, &mut qdiscs)?;
        interrupted |= intr;
        if done {
            return Ok((qdiscs, interrupted));
        }
    }
}

#[cfg(test)]
mod tests {
    //! Golden bytes: RTM_NEWQDISC messages of a real `RTM_GETQDISC` dump (with
    //! `TCA_DUMP_INVISIBLE`) on Linux 6.18, in a netns with
    //! `a0`: `htb` root `1:` with a `pfifo` leaf `10:` under class `1:10`, plus `clsact`;
    //! `m0` (4 TX queues): `mq` root `1:` with the default `pfifo_fast` per queue and a `tbf`
    //! `20:` on queue 2 (whose own invisible `bfifo` child shows too); `m1`: `noqueue`;
    //! `b0`: `pfifo` root. Whole netlink messages, header included.

    use netlink_packet_core::DefaultNla;

    use super::*;

    /// ifindex 2: pfifo 8002:0 parent ffffffff
    const B0_PFIFO_ROOT: &str = concat!(
        "9c000000240002000100000059440000000000000200000000000280ffffffff030000000a00010070666966",
        "6f00000008000200e803000005000c0000000000300007001400010000000000000000000000000000000000",
        "1800030000000000000000000000000000000000000000002c00030000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000",
    );
    /// ifindex 3: htb 1:0 parent ffffffff
    const A0_HTB_ROOT: &str = concat!(
        "b4000000240002000100000059440000000000000300000000000100ffffffff030000000800010068746200",
        "2400020018000200110003000a00000010000000000000000100000008000500e803000005000c0000000000",
        "30000700140001005a0000000000000001000000000000001800030000000000000000000000000000000000",
        "000000002c0003005a0000000000000001000000000000000000000000000000000000000000000000000000",
        "00000000",
    );
    /// ifindex 3: pfifo 10:0 parent 00010010
    const A0_PFIFO_LEAF: &str = concat!(
        "9c00000024000200010000005944000000000000030000000000100010000100010000000a00010070666966",
        "6f000000080002006400000005000c0000000000300007001400010000000000000000000000000000000000",
        "1800030000000000000000000000000000000000000000002c00030000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000",
    );
    /// ifindex 3: clsact ffff:0 parent fffffff1
    const A0_CLSACT: &str = concat!(
        "9800000024000200010000005944000000000000030000000000fffff1ffffff010000000b000100636c7361",
        "637400000400020005000c000000000030000700140001000000000000000000000000000000000018000300",
        "00000000000000000000000000000000000000002c0003000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000",
    );
    /// ifindex 4: noqueue 0:0 parent ffffffff
    const M1_NOQUEUE: &str = concat!(
        "94000000240002000100000059440000000000000400000000000000ffffffff020000000c0001006e6f7175",
        "6575650005000c00000000003000070014000100000000000000000000000000000000001800030000000000",
        "000000000000000000000000000000002c000300000000000000000000000000000000000000000000000000",
        "00000000000000000000000000000000",
    );
    /// ifindex 5: mq 1:0 parent ffffffff
    const M0_MQ_ROOT: &str = concat!(
        "90000000240002000100000059440000000000000500000000000100ffffffff01000000070001006d710000",
        "05000c000000000030000700140001005a000000000000000100000000000000180003000000000000000000",
        "0000000000000000000000002c0003005a000000000000000100000000000000000000000000000000000000",
        "000000000000000000000000",
    );
    /// ifindex 5: bfifo 0:0 parent 00200001
    const M0_TBF_BFIFO: &str = concat!(
        "9c00000024000200010000005944000000000000050000000000000001002000010000000a00010062666966",
        "6f00000008000200241c010005000c0000000000300007001400010000000000000000000000000000000000",
        "1800030000000000000000000000000000000000000000002c00030000000000000000000000000000000000",
        "000000000000000000000000000000000000000000000000",
    );
    /// ifindex 5: pfifo_fast 0:0 parent 00010001
    const M0_PFIFO_FAST_Q1: &str = concat!(
        "b000000024000200010000005944000000000000050000000000000001000100010000000f00010070666966",
        "6f5f66617374000018000200030000000102020201020000010101010101010105000c000000000030000700",
        "1400010000000000000000000000000000000000180003000000000000000000000000000000000000000000",
        "2c00030000000000000000000000000000000000000000000000000000000000000000000000000000000000",
    );
    /// ifindex 5: tbf 20:0 parent 00010002
    const M0_TBF_Q2: &str = concat!(
        "bc00000024000200010000005944000000000000050000000000200002000100010000000800010074626600",
        "2c000200280001000001000000000000d0121300000000000000000000000000241c010000f4010000000000",
        "05000c0000000000300007001400010000000000000000000000000000000000180003000000000000000000",
        "0000000000000000000000002c00030000000000000000000000000000000000000000000000000000000000",
        "000000000000000000000000",
    );

    fn unhex(hex: &str) -> Vec<u8> {
        assert_eq!(hex.len() % 2, 0, "odd hex length");
        (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// The whole dump as the kernel sent it: every golden message, then NLMSG_DONE.
    fn dump_datagram() -> Vec<u8> {
        let mut data = Vec::new();
        for m in [
            B0_PFIFO_ROOT,
            A0_HTB_ROOT,
            A0_PFIFO_LEAF,
            A0_CLSACT,
            M1_NOQUEUE,
            M0_MQ_ROOT,
            M0_TBF_BFIFO,
            M0_PFIFO_FAST_Q1,
            M0_TBF_Q2,
        ] {
            data.extend(unhex(m));
        }
        // NLMSG_DONE, seq 1, with its 4-byte status.
        data.extend([
            20, 0, 0, 0, 3, 0, 2, 0, 1, 0, 0, 0, 0x94, 0x41, 0, 0, 0, 0, 0, 0,
        ]);
        data
    }

    fn parse_all() -> Vec<Qdisc> {
        let mut out = Vec::new();
        let (interrupted, done) = parse_dump_datagram(&dump_datagram(), 1, &mut out).unwrap();
        assert!(!interrupted && done);
        out
    }

    #[test]
    fn dump_messages_decode_to_qdiscs() {
        let q = parse_all();
        assert_eq!(q.len(), 9);
        let htb = &q[1];
        assert_eq!(
            (htb.ifindex, htb.handle, htb.kind.as_str()),
            (3, 0x0001_0000, "htb")
        );
        assert!(htb.is_root() && htb.is_egress() && htb.is_shaping());
        let leaf = &q[2];
        assert_eq!((leaf.parent, leaf.kind.as_str()), (0x0001_0010, "pfifo"));
        assert!(!leaf.is_root() && !leaf.is_shaping());
        let clsact = &q[3];
        assert_eq!(clsact.kind, "clsact");
        assert!(!clsact.is_egress());
        let tbf = &q[8];
        assert_eq!(
            (tbf.ifindex, tbf.parent, tbf.kind.as_str()),
            (5, 0x0001_0002, "tbf")
        );
        assert!(tbf.is_shaping());
        assert!(q.iter().all(|q| q.max_rate.is_none()));
    }

    #[test]
    fn egress_names_the_shaper_root_first_then_children() {
        let e = egress_by_ifindex(&parse_all());
        assert_eq!(
            e.get(&3),
            Some(&Egress {
                root: Some("htb".into()),
                shaper: Some("htb".into())
            }),
            "htb root (its pfifo leaf and the clsact do not matter)"
        );
        assert_eq!(
            e.get(&5),
            Some(&Egress {
                root: Some("mq".into()),
                shaper: Some("tbf".into())
            }),
            "a tbf on one queue of an mq shapes"
        );
        for (ifindex, root) in [(4, "noqueue"), (2, "pfifo")] {
            let eg = &e[&ifindex];
            assert_eq!(eg.root.as_deref(), Some(root));
            assert!(!eg.shaped(), "{root}: {eg:?}");
        }
        assert!(!e.contains_key(&1), "no qdisc reported for ifindex 1");

        // Order does not matter: a shaping root listed after a shaping child still wins.
        let mut q = parse_all();
        q.reverse();
        assert_eq!(
            egress_by_ifindex(&q)[&3].shaper.as_deref(),
            Some("htb"),
            "reversed dump"
        );
        // Only the clsact left on a0: ingress side only, not an egress.
        let only_clsact: Vec<Qdisc> = parse_all()
            .into_iter()
            .filter(|q| q.kind == "clsact")
            .collect();
        assert!(egress_by_ifindex(&only_clsact).is_empty());
    }

    fn qdisc(kind: &str) -> Qdisc {
        Qdisc {
            ifindex: 7,
            handle: 0x0001_0000,
            parent: TC_H_ROOT,
            kind: kind.into(),
            max_rate: None,
        }
    }

    #[test]
    fn policy_table() {
        for kind in [
            "htb",
            "tbf",
            "hfsc",
            "cbq",
            "cake",
            "netem",
            "prio",
            "ets",
            "drr",
            "qfq",
            "taprio",
            "cbs",
            "etf",
            "mqprio",
            "plug",
            "skbprio",
            "some_new_qdisc",
        ] {
            assert!(qdisc(kind).is_shaping(), "{kind} must count as shaping");
        }
        for kind in NOT_SHAPING {
            assert!(
                !qdisc(kind).is_shaping(),
                "{kind} must not count as shaping"
            );
        }
        let paced = Qdisc {
            max_rate: Some(1_250_000),
            ..qdisc("fq")
        };
        assert!(paced.is_shaping());
        assert_eq!(paced.describe(), "fq maxrate 10000000bit");
    }

    /// An fq qdisc message as the kernel builds it: `TCA_OPTIONS` nesting `TCA_FQ_PLIMIT` and
    /// `TCA_FQ_FLOW_MAX_RATE` (the emitter nests the options it is given).
    fn fq_message(max_rate: u32) -> TcMessage {
        let mut m = TcMessage::with_index(9);
        m.header.parent = TC_H_ROOT.into();
        m.attributes.push(TcAttribute::Kind("fq".into()));
        m.attributes.push(TcAttribute::Options(vec![
            TcOption::Other(DefaultNla::new(1, 10_000u32.to_ne_bytes().to_vec())),
            TcOption::Other(DefaultNla::new(
                TCA_FQ_FLOW_MAX_RATE,
                max_rate.to_ne_bytes().to_vec(),
            )),
        ]));
        m
    }

    /// Serialises and parses a message the way the dump does.
    fn round_trip(m: TcMessage) -> Qdisc {
        let mut header = NetlinkHeader::default();
        header.sequence_number = 1;
        let mut nl = NetlinkMessage::new(
            header,
            NetlinkPayload::from(RouteNetlinkMessage::NewQueueDiscipline(m)),
        );
        nl.finalize();
        let mut buf = vec![0; nl.buffer_len()];
        nl.serialize(&mut buf);
        let mut out = Vec::new();
        parse_dump_datagram(&buf, 1, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        out.remove(0)
    }

    #[test]
    fn fq_is_shaping_only_with_a_maxrate() {
        let unlimited = round_trip(fq_message(u32::MAX));
        assert_eq!((unlimited.kind.as_str(), unlimited.max_rate), ("fq", None));
        assert!(!unlimited.is_shaping());
        let paced = round_trip(fq_message(2_500_000));
        assert_eq!(paced.max_rate, Some(2_500_000));
        assert!(paced.is_shaping());
        assert_eq!(
            egress_by_ifindex(&[paced])[&9].shaper.as_deref(),
            Some("fq maxrate 20000000bit")
        );
    }

    #[test]
    fn undecodable_qdisc_counts_as_shaping() {
        // The htb root message with its TCA_KIND length corrupted (runs past the message).
        let mut raw = unhex(A0_HTB_ROOT);
        raw[36] = 0xff;
        let mut out = Vec::new();
        parse_dump_datagram(&raw, 1, &mut out).unwrap();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].kind, UNDECODABLE);
        assert_eq!((out[0].ifindex, out[0].parent), (3, TC_H_ROOT));
        assert_eq!(
            egress_by_ifindex(&out)[&3].shaper.as_deref(),
            Some(UNDECODABLE)
        );
    }

    #[test]
    fn errors_interruptions_and_foreign_sequence_numbers() {
        // NLMSG_ERROR EPERM for seq 1 becomes an io::Error.
        let mut err = vec![36, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        err.extend((-libc::EPERM).to_ne_bytes());
        err.extend([16, 0, 0, 0, 38, 0, 1, 3, 1, 0, 0, 0, 0, 0, 0, 0]);
        let e = parse_dump_datagram(&err, 1, &mut Vec::new()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
        // The same datagram for another request is none of our business.
        assert_eq!(
            parse_dump_datagram(&err, 2, &mut Vec::new()).unwrap(),
            (false, false)
        );
        // NLM_F_DUMP_INTR on an entry is reported.
        let mut raw = unhex(M1_NOQUEUE);
        raw[6] |= NLM_F_DUMP_INTR as u8;
        let mut out = Vec::new();
        assert_eq!(
            parse_dump_datagram(&raw, 1, &mut out).unwrap(),
            (true, false)
        );
        assert_eq!(out[0].kind, "noqueue");
    }
}
