//! The manual's reference pages (docs/manual/src/reference/), generated from the code: the
//! fallback reasons from [`Reason`] (names and doc comments) and the reasons a connection is not
//! offloaded from [`Skip`], the configuration keys from
//! [`KEYS`] with the defaults the code sets, and the metrics from the exposition of a registry
//! built the way the daemon builds it (its `# HELP` and `# TYPE` lines, and the labels of its
//! samples).
//!
//! A unit test compares each committed page with what the code generates and fails on any
//! difference; `cargo xtask docs` runs that test with `XDP_ROUTER_WRITE_REFERENCE=1`, which
//! writes the pages instead.

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf};

use xdp_router_common::Reason;

use crate::config::{
    Config,
    keys::{KEYS, Key, Section},
};
use crate::flows::Skip;

/// The environment variable that makes the test write the pages instead of comparing them.
const WRITE_VAR: &str = "XDP_ROUTER_WRITE_REFERENCE";

/// Where the pages are, relative to the workspace root.
const DIR: &str = "docs/manual/src/reference";

/// The first line of every page.
const GENERATED: &str =
    "<!-- Generated from the code by `cargo xtask docs`; edit the code, not this page. -->";

/// A doc comment as one Markdown paragraph: its lines trimmed and joined.
fn paragraph(doc: &str) -> String {
    doc.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A table cell: `|` escaped.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// reasons.md: every reason, by its name.
fn reasons_page() -> String {
    let mut out = format!(
        "{GENERATED}\n\n# Fallback reasons\n\n\
         Every packet an XDP or TC program of xdp-router sees is counted under exactly one \
         reason, per ingress interface: `xdp-routerd status` lists the counters, and \
         `xdp_router_fallback_packets_total{{reason}}` exports the ones that went to the kernel. \
         The two `forwarded_*` reasons are the fast path's; every other reason means the packet \
         was handed to the kernel unmodified, which forwards it (or not) as it would without \
         xdp-router.\n\n\
         | reason | meaning |\n| --- | --- |\n"
    );
    for r in Reason::ALL {
        let _ = writeln!(
            out,
            "| `{}` | {} |",
            r.name(),
            cell(&paragraph(r.description()))
        );
    }
    out.push_str(
        "\n## Connections not offloaded\n\n\
         The daemon decides which conntrack connections to offload; the ones \
         it leaves to the kernel are counted by reason in the `not offloaded:` line of \
         `xdp-routerd status` and in `xdp_router_connections_skipped_total{reason}`.\n\n\
         | reason | meaning |\n| --- | --- |\n",
    );
    for s in Skip::ALL {
        let _ = writeln!(out, "| `{}` | {} |", s.name(), cell(s.description()));
    }
    out
}

/// The TOML value of `key` in `table`, as the reference shows a default.
fn default_of(table: &toml::Table, key: &Key) -> Option<String> {
    table.get(key.name).map(|v| format!("`{v}`"))
}

/// The default configuration as TOML tables: the top level, and one interface with only its
/// required keys set.
fn default_tables() -> (toml::Table, toml::Table) {
    let config = Config::parse(
        "[[interface]]\nname = \"eth0\"\nrole = \"wan\"\n",
        "defaults",
    )
    .expect("the smallest config parses");
    let mut top = match toml::Value::try_from(&config).expect("the config serializes") {
        toml::Value::Table(t) => t,
        other => panic!("the config serializes as a table, not {other}"),
    };
    let interface = match top.remove("interface") {
        Some(toml::Value::Array(mut a)) => match a.remove(0) {
            toml::Value::Table(t) => t,
            other => panic!("an interface serializes as a table, not {other}"),
        },
        other => panic!("interfaces serialize as an array, not {other:?}"),
    };
    // What the smallest config set, not defaults.
    let mut interface = interface;
    interface.remove("name");
    interface.remove("role");
    (top, interface)
}

/// config.md: every key, its type, default and meaning.
fn config_page() -> String {
    let (top, interface) = default_tables();
    let mut out = format!(
        "{GENERATED}\n\n# Configuration reference\n\n\
         The configuration file is TOML (`xdp-routerd run --config FILE`; the Debian package \
         reads `/etc/xdp-router/xdp-routerd.toml`). Unknown keys are errors, and \
         `xdp-routerd check-config FILE` checks a file without running anything. \
         config/xdp-routerd.toml in the source tree is a commented example.\n"
    );
    for (section, title, table) in [
        (Section::Top, "Top level", &top),
        (Section::Interface, "`[[interface]]`", &interface),
    ] {
        let _ = write!(
            out,
            "\n## {title}\n\n| key | type | default | meaning |\n| --- | --- | --- | --- |\n"
        );
        for key in KEYS.iter().filter(|k| k.section == section) {
            let default = default_of(table, key)
                .or_else(|| key.unset.map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {} |",
                key.name,
                cell(key.ty),
                cell(&default),
                cell(key.doc)
            );
        }
    }
    out
}

/// One metric family of an exposition.
#[derive(Default)]
struct Family {
    kind: String,
    help: String,
    unit: String,
    labels: Vec<String>,
    samples: usize,
}

/// The label names of one sample line (`name{a="x",b="y"} 1`), in order.
fn label_names(sample: &str) -> Vec<String> {
    let Some(start) = sample.find('{') else {
        return Vec::new();
    };
    let mut names = Vec::new();
    let mut name = String::new();
    let mut in_value = false;
    let mut escaped = false;
    for c in sample[start + 1..].chars() {
        match (in_value, c) {
            (true, _) if escaped => escaped = false,
            (true, '\\') => escaped = true,
            (true, '"') => in_value = false,
            (true, _) => {}
            (false, '"') => in_value = true,
            (false, '=') => names.push(std::mem::take(&mut name)),
            (false, ',') => {}
            (false, '}') => break,
            (false, c) => name.push(c),
        }
    }
    names
}

/// The families of an OpenMetrics text exposition, by name (as in its `# TYPE` line).
fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in exposition.lines() {
        let mut words = line.splitn(4, ' ');
        match (words.next(), words.next(), words.next(), words.next()) {
            (Some("#"), Some("TYPE"), Some(name), Some(kind)) => {
                families.entry(name.into()).or_default().kind = kind.into();
            }
            (Some("#"), Some("HELP"), Some(name), Some(help)) => {
                families.entry(name.into()).or_default().help = help.into();
            }
            (Some("#"), Some("UNIT"), Some(name), Some(unit)) => {
                families.entry(name.into()).or_default().unit = unit.into();
            }
            _ if line.starts_with('#') || line.is_empty() => {}
            _ => {
                let sample = line.split(['{', ' ']).next().unwrap_or_default();
                let family = families
                    .iter_mut()
                    .filter(|(name, _)| {
                        sample == name.as_str()
                            || sample.strip_suffix("_total") == Some(name.as_str())
                    })
                    .map(|(_, f)| f)
                    .next()
                    .unwrap_or_else(|| panic!("sample {line} before its family's TYPE line"));
                family.samples += 1;
                for label in label_names(line) {
                    if !family.labels.contains(&label) {
                        family.labels.push(label);
                    }
                }
            }
        }
    }
    families
}

/// metrics.md: every metric family the daemon exports, with its type, labels and help.
fn metrics_page() -> String {
    let families = families(&crate::metrics::tests::sample_exposition());
    let mut out = format!(
        "{GENERATED}\n\n# Metrics reference\n\n\
         `xdp-routerd run` serves these at `http://<metrics_listen>/metrics` (default \
         `{}`), in the OpenMetrics text format. Everything is read at scrape time. \
         The `reason` label takes the names in [Fallback reasons](reasons.md).\n\n\
         | metric | type | labels | help |\n| --- | --- | --- | --- |\n",
        crate::config::DEFAULT_METRICS_LISTEN
    );
    for (name, f) in &families {
        let sample = match f.kind.as_str() {
            "counter" => format!("{name}_total"),
            _ => name.clone(),
        };
        let labels = f
            .labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        let unit = match f.unit.as_str() {
            "" => String::new(),
            u => format!(" ({u})"),
        };
        let _ = writeln!(
            out,
            "| `{sample}` | {}{unit} | {} | {} |",
            f.kind,
            labels,
            cell(&f.help)
        );
    }
    out
}

/// Each page's file name and text.
fn pages() -> [(&'static str, String); 3] {
    [
        ("reasons.md", reasons_page()),
        ("config.md", config_page()),
        ("metrics.md", metrics_page()),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join(DIR)
}

/// The committed pages are what the code generates (or, with `XDP_ROUTER_WRITE_REFERENCE`
/// set, become it).
#[test]
fn committed_pages_match_the_code() {
    let write = std::env::var_os(WRITE_VAR).is_some();
    let mut stale = Vec::new();
    for (name, text) in pages() {
        let path = dir().join(name);
        if write {
            std::fs::create_dir_all(dir()).expect("create the reference directory");
            std::fs::write(&path, &text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            stale.push(format!("{DIR}/{name}"));
        }
    }
    assert!(
        stale.is_empty(),
        "{} differ from what the code generates: run `cargo xtask docs`",
        stale.join(", ")
    );
}

/// Every key serde accepts (the list its unknown-field error gives) is in [`KEYS`] once, and
/// nothing else is.
#[test]
fn keys_table_is_exhaustive() {
    fn accepted(toml: &str) -> Vec<String> {
        let e = Config::parse(toml, "t").expect_err("an unknown key is an error");
        let list =
            e.0.split("expected one of ")
                .nth(1)
                .unwrap_or_else(|| panic!("serde's unknown-field error lists the keys: {}", e.0));
        list.split(", ")
            .map(|k| k.trim().trim_matches('`').to_owned())
            .collect()
    }
    let listed = |section| -> Vec<String> {
        let mut v: Vec<String> = KEYS
            .iter()
            .filter(|k| k.section == section)
            .map(|k| k.name.to_owned())
            .collect();
        v.sort();
        v
    };
    let mut top = accepted("no_such_key = 1\n");
    top.sort();
    assert_eq!(top, listed(Section::Top));
    let mut iface = accepted("[[interface]]\nname = \"eth0\"\nrole = \"wan\"\nno_such_key = 1\n");
    iface.sort();
    assert_eq!(iface, listed(Section::Interface));
}

/// A key has `unset` text exactly when the default configuration has no value for it, and its
/// type names the default's TOML type.
#[test]
fn keys_table_matches_the_defaults() {
    let (top, interface) = default_tables();
    for key in KEYS {
        let table = match key.section {
            Section::Top => &top,
            Section::Interface => &interface,
        };
        match table.get(key.name) {
            None => assert!(
                key.unset.is_some(),
                "{}: no default and no `unset`",
                key.name
            ),
            Some(v) => {
                assert!(key.unset.is_none(), "{} has a default: {v}", key.name);
                let fits = match v {
                    toml::Value::Integer(_) => key.ty.starts_with("integer"),
                    toml::Value::Boolean(_) => key.ty.starts_with("boolean"),
                    toml::Value::String(s) if key.ty.starts_with("string:") => {
                        key.ty.contains(&format!("`\"{s}\"`"))
                    }
                    toml::Value::String(s) => {
                        key.ty.starts_with("string") || key.ty.contains(&format!("`\"{s}\"`"))
                    }
                    _ => false,
                };
                assert!(fits, "{}: type {:?}, default {v}", key.name, key.ty);
            }
        }
    }
}

#[test]
fn label_names_skip_quoted_values() {
    assert_eq!(
        label_names(r#"x_total{interface="a,b",reason="q\"=}"} 1"#),
        ["interface", "reason"]
    );
    assert!(label_names("x_total 1").is_empty());
}

/// Every family of the sample exposition has samples, so its labels are known.
#[test]
fn every_metric_family_has_samples_and_help() {
    for (name, f) in families(&crate::metrics::tests::sample_exposition()) {
        assert!(!f.help.is_empty(), "{name} has no help");
        assert!(f.samples > 0, "{name} has no sample in the sample status");
        assert!(
            f.kind == "counter" || f.kind == "gauge",
            "{name}: {}",
            f.kind
        );
    }
}
