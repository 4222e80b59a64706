//! The options of iptables-nft's conntrack (and connbytes) matches. nft lists a rule iptables-nft wrote with
//! its xt matches by name only (`{"xt": {"type": "match", "name": "conntrack"}}`, also for
//! `-m state`), so `ct state established` and `ct state new` look the same there.
//! `iptables-nft-save` (`ip6tables-nft-save`) lists the same rules with their options: a
//! table's rules are paired by chain and position, and only where the two listings agree on
//! every rule of the table — the same chains with rules, as many in each, each rule's xt matches
//! among its `-m` matches in order, as many conntrack matches, the same verdict or target.
//! A table that disagrees (changed between the two reads, or not listed: a native nft table
//! of the `ip` family, one iptables-nft calls incompatible) keeps its conntrack matches
//! unread (`Maybe`), and a line says so.

use std::collections::BTreeMap;

use serde_json::Value;

use super::save_rules::{SavePart, parts};
use crate::sync::ruleset_listing::{NftTables, SaveChains, save_tables};

/// The `iptables-nft-save` words of every rule of the tables whose listings agree.
#[derive(Debug, Default)]
pub(super) struct XtOptions {
    /// (family, table) → chain → rules.
    tables: BTreeMap<(String, String), SaveChains>,
}

impl XtOptions {
    /// The words of rule `i` (0-based) of `chain` in the `family` table `table`, if paired.
    pub(super) fn rule(
        &self,
        family: &str,
        table: &str,
        chain: &str,
        i: usize,
    ) -> Option<&[String]> {
        self.tables
            .get(&(family.to_string(), table.to_string()))?
            .get(chain)?
            .get(i)
            .map(Vec::as_slice)
    }

    /// Pairs the `family` (`ip` or `ip6`) tables of `tables` that have conntrack matches with
    /// `listing`, the output of `iptables-nft-save` (`ip6tables-nft-save`); one line for each
    /// such table that cannot be paired.
    pub(super) fn pair(&mut self, tables: &NftTables, family: &str, listing: &str) -> Vec<String> {
        let mut saved = save_tables(listing);
        let mut unpaired = Vec::new();
        for ((fam, name), t) in tables {
            if fam != family || !t.chains.values().flatten().any(has_conntrack_match) {
                continue;
            }
            let Some(save) = saved.remove(name) else {
                unpaired.push(format!(
                    "{family} {name}: not listed by {family}tables-nft-save, its conntrack \
                     matches are not read"
                ));
                continue;
            };
            let disagreement = t.chains.iter().find_map(|(chain, rules)| {
                let Some(words) = save.get(chain) else {
                    return Some(format!("chain {chain} is missing"));
                };
                if words.len() != rules.len() {
                    return Some(format!(
                        "chain {chain} has {} rules, not {}",
                        words.len(),
                        rules.len()
                    ));
                }
                rules
                    .iter()
                    .zip(words)
                    .position(|(expr, w)| !agree(expr, w))
                    .map(|i| format!("{chain} rule {} differs", i + 1))
            });
            // iptables-nft-save also lists the built-in chains iptables-nft has not created.
            let extra = save
                .iter()
                .find(|(c, rules)| !rules.is_empty() && !t.chains.contains_key(*c))
                .map(|(c, _)| c.as_str());
            match (disagreement, extra) {
                (None, None) => {
                    self.tables.insert((fam.clone(), name.clone()), save);
                }
                (why, extra) => unpaired.push(format!(
                    "{family} {name}: {family}tables-nft-save lists it differently ({}), its \
                     conntrack matches are not read",
                    why.unwrap_or_else(|| format!("chain {} is extra", extra.unwrap_or("")))
                )),
            }
        }
        unpaired
    }
}

/// Whether some table of `family` has a rule with an xt conntrack or connbytes match (then
/// `iptables-nft-save` is worth running).
pub(super) fn wanted(tables: &NftTables, family: &str) -> bool {
    tables
        .iter()
        .filter(|((f, _), _)| f == family)
        .any(|(_, t)| t.chains.values().flatten().any(has_conntrack_match))
}

/// The xt matches of a rule by name, `state` written as the kernel's `conntrack`.
fn xt_matches(expr: &Value) -> Vec<&str> {
    expr.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.get("xt"))
        .filter(|xt| xt.get("type").and_then(Value::as_str) == Some("match"))
        .filter_map(|xt| xt.get("name").and_then(Value::as_str))
        .map(kernel_name)
        .collect()
}

/// iptables' `-m state` is the kernel's `conntrack` match (libxt_conntrack's alias).
fn kernel_name(name: &str) -> &str {
    if name == "state" { "conntrack" } else { name }
}

/// Whether a rule has an xt match whose options the hold needs: `conntrack` (the states it
/// tests) or `connbytes` (an upper bound narrows it).
fn has_conntrack_match(expr: &Value) -> bool {
    xt_matches(expr)
        .iter()
        .any(|m| matches!(*m, "conntrack" | "connbytes"))
}

/// Whether the nft rule `expr` and the iptables-nft-save rule `words` are the same rule: the
/// xt matches among the `-m` matches in order, as many conntrack matches, and the same verdict
/// or xt target (a native statement iptables-nft writes as a target, `log group` for NFLOG,
/// has none in nft).
fn agree(expr: &Value, words: &[String]) -> bool {
    let Some(parts) = parts(words) else {
        return false;
    };
    let saved: Vec<&str> = parts
        .iter()
        .filter_map(|p| match p {
            SavePart::Match(name, _) => Some(kernel_name(name)),
            _ => None,
        })
        .collect();
    let listed = xt_matches(expr);
    let mut rest = saved.iter();
    let in_order = listed.iter().all(|m| rest.any(|s| s == m));
    let count = |v: &[&str]| v.iter().filter(|m| **m == "conntrack").count();
    if !in_order || count(&listed) != count(&saved) {
        return false;
    }
    let target = parts.iter().find_map(|p| match p {
        SavePart::Jump(name, _) => Some(("-j", *name)),
        SavePart::Goto(name) => Some(("-g", *name)),
        _ => None,
    });
    let verdict = expr.as_array().into_iter().flatten().find_map(|e| {
        let (k, inner) = e.as_object()?.iter().next()?;
        let target = || inner.get("target").and_then(Value::as_str);
        Some(match k.as_str() {
            "accept" => ("-j", "ACCEPT"),
            "drop" => ("-j", "DROP"),
            "return" => ("-j", "RETURN"),
            "jump" => ("-j", target()?),
            "goto" => ("-g", target()?),
            "xt" if inner.get("type").and_then(Value::as_str) == Some("target") => {
                ("-j", inner.get("name").and_then(Value::as_str)?)
            }
            _ => return None,
        })
    });
    verdict.is_none() || verdict == target
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::ruleset_listing::{nft_tables, save_words};

    fn agrees(expr: &str, save: &str) -> bool {
        agree(&serde_json::from_str(expr).unwrap(), &save_words(save))
    }

    #[test]
    fn rules_agree_by_xt_matches_and_verdict() {
        let est = r#"[{"xt": {"type": "match", "name": "conntrack"}}, {"counter": null}, {"accept": null}]"#;
        assert!(agrees(
            est,
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
        ));
        assert!(agrees(
            est,
            "-m state --state RELATED,ESTABLISHED -j ACCEPT"
        ));
        assert!(!agrees(est, "-m conntrack --ctstate NEW -j DROP"));
        assert!(!agrees(est, "-j ACCEPT"));
        assert!(!agrees(
            est,
            "-m conntrack --ctstate NEW -m conntrack --ctstate INVALID -j ACCEPT"
        ));
        // Native expressions iptables-nft-save writes as matches (`-m tcp`, `-m limit`).
        let log = r#"[{"match": {"op": "==", "left": {"payload": {"protocol": "tcp", "field": "dport"}}, "right": 22}},
            {"xt": {"type": "match", "name": "conntrack"}}, {"limit": {"rate": 3, "per": "minute"}},
            {"counter": null}, {"xt": {"type": "target", "name": "LOG"}}]"#;
        assert!(agrees(
            log,
            r#"-p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -m limit --limit 3/min -j LOG --log-prefix "x""#
        ));
        assert!(!agrees(
            log,
            "-p tcp -m tcp --dport 22 -m conntrack --ctstate NEW -j NFLOG"
        ));
        // NFLOG is a native `log group` in nft: no verdict to compare.
        assert!(agrees(
            r#"[{"counter": null}, {"log": {"group": 2}}]"#,
            "-j NFLOG --nflog-group 2"
        ));
        assert!(agrees(r#"[{"goto": {"target": "sub"}}]"#, "-g sub"));
        assert!(!agrees(r#"[{"jump": {"target": "sub"}}]"#, "-g sub"));
    }

    #[test]
    fn a_table_is_paired_only_when_both_listings_agree() {
        let json = r#"{"nftables": [
 {"chain": {"family": "ip", "table": "filter", "name": "FORWARD", "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
 {"rule": {"family": "ip", "table": "filter", "chain": "FORWARD", "expr": [{"xt": {"type": "match", "name": "conntrack"}}, {"counter": null}, {"accept": null}]}},
 {"rule": {"family": "ip", "table": "filter", "chain": "FORWARD", "expr": [{"counter": null}, {"xt": {"type": "target", "name": "LOG"}}]}}]}"#;
        let tables = nft_tables(json).unwrap();
        assert!(wanted(&tables, "ip"));
        assert!(!wanted(&tables, "ip6"));
        let save = "*filter\n:FORWARD DROP [0:0]\n-A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n-A FORWARD -j LOG\nCOMMIT\n";
        let mut xt = XtOptions::default();
        assert_eq!(xt.pair(&tables, "ip", save), Vec::<String>::new());
        assert_eq!(
            xt.rule("ip", "filter", "FORWARD", 0).map(|w| w.join(" ")),
            Some("-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT".into())
        );
        // A rule more (the ruleset changed between the two reads): not paired.
        let changed = save.replace("COMMIT", "-A FORWARD -j DROP\nCOMMIT");
        let mut xt = XtOptions::default();
        assert_eq!(
            xt.pair(&tables, "ip", &changed),
            vec![
                "ip filter: iptables-nft-save lists it differently (chain FORWARD has 3 rules, \
                  not 2), its conntrack matches are not read"
                    .to_string()
            ]
        );
        assert_eq!(xt.rule("ip", "filter", "FORWARD", 0), None);
        let mut xt = XtOptions::default();
        assert_eq!(
            xt.pair(
                &tables,
                "ip",
                "# Table `filter' is incompatible, use 'nft' tool.\n"
            ),
            vec![
                "ip filter: not listed by iptables-nft-save, its conntrack matches are not read"
                    .to_string()
            ]
        );
    }
}
