//! Fuzzing (proptest) of the parsers that take input from users and the kernel: the config file,
//! rtnetlink notifications, nftables notifications and `/proc/net/pppoe`. None may panic, whatever arrives: a
//! config error is a one-line message, an unparseable notification is an event or nothing. (The
//! ctnetlink decoder is fuzzed from its golden messages in `sync::conntrack`'s unit tests.)
//! Run with `cargo test`, a few hundred cases per property; `PROPTEST_CASES=100000` for longer.

use proptest::prelude::*;
use xdp_routerd::{
    config::Config,
    sync::{nftables, pppoe, rtnl},
};

/// The commented example config that ships in `config/`.
const EXAMPLE: &str = include_str!("../../config/xdp-routerd.toml");

/// One edit of a text: replace, insert or delete a character, or duplicate or drop a line.
#[derive(Debug, Clone)]
enum Edit {
    Replace(usize, char),
    Insert(usize, char),
    Delete(usize),
    DuplicateLine(usize),
    DropLine(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    // Characters that matter to TOML, plus any character at all.
    let ch = prop_oneof![
        prop::sample::select(vec![
            '=', '"', '\'', '[', ']', '{', '}', ',', '.', '#', '\n', ' ', '0', '9', '-', '+', 'e',
            '_', '\\'
        ]),
        any::<char>(),
    ];
    prop_oneof![
        (any::<usize>(), ch.clone()).prop_map(|(i, c)| Edit::Replace(i, c)),
        (any::<usize>(), ch).prop_map(|(i, c)| Edit::Insert(i, c)),
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::DuplicateLine),
        any::<usize>().prop_map(Edit::DropLine),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        let n = chars.len().max(1);
        match *e {
            Edit::Replace(i, c) if !chars.is_empty() => chars[i % n] = c,
            Edit::Insert(i, c) => chars.insert(i % (chars.len() + 1), c),
            Edit::Delete(i) if !chars.is_empty() => {
                chars.remove(i % n);
            }
            Edit::DuplicateLine(i) | Edit::DropLine(i) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<&str> = s.split('\n').collect();
                let at = i % lines.len();
                if matches!(e, Edit::DuplicateLine(_)) {
                    lines.insert(at, lines[at]);
                } else {
                    lines.remove(at);
                }
                chars = lines.join("\n").chars().collect();
            }
            _ => {}
        }
    }
    chars.into_iter().collect()
}

/// A netlink message header (`len` covers header + body) followed by `body`.
fn nlmsg(kind: u16, flags: u16, body: &[u8]) -> Vec<u8> {
    let len = (16 + body.len()) as u32;
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&kind.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&[0; 8]);
    m.extend_from_slice(body);
    m
}

proptest! {
    /// Edited example configs give a config or a one-line error, never a panic.
    #[test]
    fn edited_configs_never_panic(edits in prop::collection::vec(edit(), 1..6)) {
        let text = apply(EXAMPLE, &edits);
        if let Err(e) = Config::parse(&text, "fuzz.toml") {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("fuzz.toml"), "error without its origin: {msg}");
            prop_assert!(!msg.trim().is_empty());
        }
    }

    /// Arbitrary text is no config, and says so without panicking.
    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = Config::parse(&text, "fuzz.toml");
    }

    /// rtnetlink datagrams: well-framed messages of every route-family type with random bodies,
    /// then arbitrary trailing bytes.
    #[test]
    fn rtnetlink_datagrams_never_panic(
        msgs in prop::collection::vec(
            (16u16..120, any::<u16>(), prop::collection::vec(any::<u8>(), 0..96)),
            0..6,
        ),
        tail in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut data = Vec::new();
        for (kind, flags, body) in &msgs {
            data.extend(nlmsg(*kind, *flags, body));
            data.resize(data.len().next_multiple_of(4), 0);
        }
        data.extend(tail);
        let _ = rtnl::events_in(&data);
    }

    /// `/proc/net/pppoe` as the kernel prints it, edited: sessions or nothing, never a panic,
    /// and every session found has a valid ID and MAC and a device name.
    #[test]
    fn edited_pppoe_tables_never_panic(edits in prop::collection::vec(edit(), 1..6)) {
        let table = "Id       Address              Device\n\
                     00000100 52:54:00:12:34:56     eth0\n\
                     0000D204 02:00:00:00:00:aa   eth0.7\n";
        for s in pppoe::parse(&apply(table, &edits)) {
            prop_assert!(!s.lower.is_empty() && !s.lower.contains(char::is_whitespace));
        }
    }

    /// nftables notifications: NEWGEN (subsystem 10, message 15) and other nftables messages
    /// with random attributes, and raw bytes.
    #[test]
    fn nftables_datagrams_never_panic(
        msgs in prop::collection::vec(
            (0u16..24, prop::collection::vec(any::<u8>(), 0..64)),
            0..6,
        ),
        raw in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut data = Vec::new();
        for (msg, body) in &msgs {
            data.extend(nlmsg((10 << 8) | msg, 0, body));
            data.resize(data.len().next_multiple_of(4), 0);
        }
        let _ = nftables::events_in(&data);
        let _ = nftables::events_in(&raw);
    }
}
