//! Conntrack state tests in firewall rules, read for what they do with a packet of an
//! established connection ([`Match`]): nftables' `ct state` (a match, or the key of a verdict
//! map), iptables' `-m conntrack --ctstate` and `-m state --state`. Pure. A form not listed
//! here is [`Match::Maybe`].
//!
//! Such a packet has the state `established` (its connection saw a reply, see
//! `flows::rule_reach`). `-m conntrack` also matches the virtual states `SNAT` and `DNAT`
//! (conntrack_mt in net/netfilter/xt_conntrack.c sets them for NATed connections, which an
//! established packet may belong to): a test that depends on them is `Maybe`.

use serde_json::Value;

use super::ruleset_walk::Match;
use crate::flows::rule_reach::{CtState, CtStates};

/// The states a test lets through, before negation.
struct Tested {
    states: CtStates,
    /// `SNAT` or `DNAT` is among them (iptables only).
    virtual_nat: bool,
    negated: bool,
}

impl Tested {
    /// What the test alone does with an established packet.
    fn on_established(&self) -> Match {
        let listed = self.states.contains(CtState::Established);
        match (listed, self.negated) {
            (true, false) => Match::All,
            (true, true) => Match::Never(self.states.complement()),
            (false, _) if self.virtual_nat => Match::Maybe,
            (false, false) => Match::Never(self.states.clone()),
            (false, true) => Match::All,
        }
    }
}

/// Whether `e` is the expression `ct state` (nftables JSON).
fn is_ct_state(e: &Value) -> bool {
    e.get("ct")
        .and_then(|ct| ct.get("key"))
        .and_then(Value::as_str)
        == Some("state")
}

/// States named by a JSON string or array of strings; `None` when any is unknown.
fn state_list(v: &Value) -> Option<CtStates> {
    match v {
        Value::String(s) => Some([CtState::parse(s)?].into_iter().collect()),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().and_then(CtState::parse))
            .collect(),
        _ => None,
    }
}

/// What a `ct state` match (the object inside `{"match": …}`) does with an established packet;
/// `None` when it is not a `ct state` match. As nft 1.0.6 writes them: `ct state established,
/// related` is `"op": "in"` with a string or array (a bit test); `ct state == new` is `"=="`
/// with a string, `ct state { a, b }` `"=="` with `{"set": […]}`; `!=` negates either. Other
/// forms (`ct state != a,b` compares with the OR of the bits: `{"|": […]}`) are `Maybe`.
pub(super) fn nft_match(m: &Value) -> Option<Match> {
    if !m.get("left").is_some_and(is_ct_state) {
        return None;
    }
    let right = m.get("right")?;
    let op = m.get("op").and_then(Value::as_str).unwrap_or("");
    let listed = match (op, right) {
        ("in", v) => state_list(v),
        ("==" | "!=", Value::String(_)) => state_list(right),
        ("==" | "!=", Value::Object(o)) => o.get("set").and_then(state_list),
        _ => None,
    };
    let Some(states) = listed else {
        return Some(Match::Maybe);
    };
    let tested = Tested {
        states,
        virtual_nat: false,
        negated: op == "!=",
    };
    Some(tested.on_established())
}

/// For a verdict map keyed on `ct state` (the object inside `{"vmap": …}`), what each listed
/// element's key does with an established packet, with the element's verdict, in order; `None`
/// when the map is not keyed on `ct state` or is a named map (`"data": "@name"`).
pub(super) fn nft_vmap(vmap: &Value) -> Option<Vec<(Match, &Value)>> {
    if !vmap.get("key").is_some_and(is_ct_state) {
        return None;
    }
    let elems = vmap.get("data")?.get("set")?.as_array()?;
    Some(
        elems
            .iter()
            .filter_map(|e| {
                let pair = e.as_array()?;
                let (key, verdict) = (pair.first()?, pair.get(1)?);
                let test = match key.as_str().and_then(CtState::parse) {
                    Some(s) => Tested {
                        states: [s].into_iter().collect(),
                        virtual_nat: false,
                        negated: false,
                    }
                    .on_established(),
                    None => Match::Maybe,
                };
                Some((test, verdict))
            })
            .collect(),
    )
}

/// What an iptables `-m conntrack` or `-m state` match does with an established packet, from
/// the words that follow its name (`--ctstate RELATED,ESTABLISHED`, `! --state NEW`);
/// `None` for another match. Options besides the state (`--ctdir`, `--ctstatus`, …) are
/// further tests: the match is then `Maybe` unless the state alone excludes the packet.
pub(super) fn iptables_match(name: &str, options: &[String]) -> Option<Match> {
    let state_option = match name {
        "conntrack" => "--ctstate",
        "state" => "--state",
        _ => return None,
    };
    let mut tested: Option<Tested> = None;
    let mut other = false;
    let mut negate = false;
    let mut words = options.iter();
    while let Some(w) = words.next() {
        match w.as_str() {
            "!" => {
                negate = true;
                continue;
            }
            o if o == state_option => {
                let Some(list) = words.next() else {
                    return Some(Match::Maybe);
                };
                let mut states = CtStates::default();
                let mut virtual_nat = false;
                for s in list.split(',') {
                    match (CtState::parse(s), s) {
                        (Some(state), _) => {
                            states.0.insert(state);
                        }
                        (None, "SNAT" | "DNAT") if name == "conntrack" => virtual_nat = true,
                        (None, _) => return Some(Match::Maybe),
                    }
                }
                tested = Some(Tested {
                    states,
                    virtual_nat,
                    negated: negate,
                });
            }
            o if o.starts_with("--") => other = true,
            // An option's value.
            _ => {}
        }
        negate = false;
    }
    Some(match tested.map(|t| t.on_established()) {
        Some(never @ Match::Never(_)) => never,
        Some(Match::All) if !other => Match::All,
        _ => Match::Maybe,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use CtState::*;

    fn never(states: &[CtState]) -> Option<Match> {
        Some(Match::Never(states.iter().copied().collect()))
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    /// Every form nft 1.0.6 listed for the `ct state` rules written in the comments.
    #[test]
    fn nft_ct_state_matches_as_listed() {
        let m = |json: &str| nft_match(&serde_json::from_str(json).unwrap());
        let ct = r#""left": {"ct": {"key": "state"}}"#;
        // ct state established
        assert_eq!(
            m(&format!(r#"{{"op": "in", {ct}, "right": "established"}}"#)),
            Some(Match::All)
        );
        // ct state established,related
        assert_eq!(
            m(&format!(
                r#"{{"op": "in", {ct}, "right": ["established", "related"]}}"#
            )),
            Some(Match::All)
        );
        // ct state { established, related }
        assert_eq!(
            m(&format!(
                r#"{{"op": "==", {ct}, "right": {{"set": ["established", "related"]}}}}"#
            )),
            Some(Match::All)
        );
        // ct state new,invalid
        assert_eq!(
            m(&format!(
                r#"{{"op": "in", {ct}, "right": ["invalid", "new"]}}"#
            )),
            never(&[New, Invalid])
        );
        // ct state == new
        assert_eq!(
            m(&format!(r#"{{"op": "==", {ct}, "right": "new"}}"#)),
            never(&[New])
        );
        // ct state != established
        assert_eq!(
            m(&format!(r#"{{"op": "!=", {ct}, "right": "established"}}"#)),
            never(&[New, Related, Invalid, Untracked])
        );
        // ct state != { new }
        assert_eq!(
            m(&format!(
                r#"{{"op": "!=", {ct}, "right": {{"set": ["new"]}}}}"#
            )),
            Some(Match::All)
        );
        // ct state != established,related (a comparison with the OR of the bits)
        assert_eq!(
            m(&format!(
                r#"{{"op": "!=", {ct}, "right": {{"|": ["established", "related"]}}}}"#
            )),
            Some(Match::Maybe)
        );
        // ct status dnat: not a state test.
        assert_eq!(
            m(r#"{"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}"#),
            None
        );
    }

    #[test]
    fn nft_ct_state_verdict_maps() {
        // OpenWrt fw4: ct state vmap { established : accept, related : accept, invalid : drop }
        let v: Value = serde_json::from_str(
            r#"{"key": {"ct": {"key": "state"}}, "data": {"set": [["invalid", {"drop": null}],
                ["established", {"accept": null}], ["related", {"accept": null}]]}}"#,
        )
        .unwrap();
        let tests: Vec<Match> = nft_vmap(&v).unwrap().into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            tests,
            vec![
                Match::Never([Invalid].into_iter().collect()),
                Match::All,
                Match::Never([Related].into_iter().collect()),
            ]
        );
        let named: Value =
            serde_json::from_str(r#"{"key": {"ct": {"key": "state"}}, "data": "@m"}"#).unwrap();
        assert!(nft_vmap(&named).is_none());
        let other: Value =
            serde_json::from_str(r#"{"key": {"meta": {"key": "iifname"}}, "data": {"set": []}}"#)
                .unwrap();
        assert!(nft_vmap(&other).is_none());
    }

    #[test]
    fn iptables_conntrack_and_state_matches() {
        let m = |name, opts: &str| iptables_match(name, &words(opts));
        assert_eq!(
            m("conntrack", "--ctstate RELATED,ESTABLISHED"),
            Some(Match::All)
        );
        assert_eq!(m("state", "--state ESTABLISHED,RELATED"), Some(Match::All));
        assert_eq!(m("conntrack", "--ctstate NEW"), never(&[New]));
        assert_eq!(m("conntrack", "--ctstate INVALID"), never(&[Invalid]));
        assert_eq!(m("state", "! --state NEW"), Some(Match::All));
        assert_eq!(
            m("conntrack", "! --ctstate ESTABLISHED"),
            never(&[New, Related, Invalid, Untracked])
        );
        // Further tests: the state alone no longer decides, unless it excludes.
        assert_eq!(
            m("conntrack", "--ctstate ESTABLISHED --ctdir ORIGINAL"),
            Some(Match::Maybe)
        );
        assert_eq!(
            m("conntrack", "--ctstate NEW --ctdir ORIGINAL"),
            never(&[New])
        );
        // Virtual states: an established packet of a NATed connection matches SNAT.
        assert_eq!(m("conntrack", "--ctstate NEW,SNAT"), Some(Match::Maybe));
        assert_eq!(
            m("conntrack", "--ctstate ESTABLISHED,SNAT"),
            Some(Match::All)
        );
        assert_eq!(m("conntrack", "--ctstatus ASSURED"), Some(Match::Maybe));
        assert_eq!(m("conntrack", "--ctstate BOGUS"), Some(Match::Maybe));
        assert_eq!(m("conntrack", "--ctstate"), Some(Match::Maybe));
        assert_eq!(m("limit", "--limit 3/min"), None);
    }
}
