//! Hooks the fast path would jump over on a managed interface: nftables `netdev` chains
//! (ingress runs after XDP, egress after a redirect's target is chosen) and classic tc filters
//! (ingress/egress of a `clsact` or ingress qdisc). A packet redirected by XDP passes neither,
//! so a direction that would meet one stays in the kernel (`IFACE_F_INGRESS_HOOK` /
//! `IFACE_F_EGRESS_HOOK`), unless the interface's config says `bypass_hooks = true`. The
//! daemon's own TC arming program is a TCX link, not a classic filter, and is not listed by
//! `tc filter show`.
//!
//! Read with `nft list chains` (the text form: nft 1.0.6's JSON omits the chain's device) and
//! `tc filter show dev X ingress|egress`, at start, after every ruleset change and after every
//! tc change on a managed interface.

use std::collections::BTreeMap;

/// The hooks found on one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hooks {
    /// An nftables netdev ingress chain or tc ingress filters.
    pub ingress: bool,
    /// An nftables netdev egress chain or tc egress filters.
    pub egress: bool,
}

/// The devices with `netdev` ingress / egress base chains in an `nft list chains` listing
/// (pure; tested). A chain on several devices (`devices = { a, b }`) counts for each.
pub fn netdev_chain_hooks(listing: &str) -> BTreeMap<String, Hooks> {
    let mut out: BTreeMap<String, Hooks> = BTreeMap::new();
    let mut in_netdev = false;
    for line in listing.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("table ") {
            in_netdev = rest.starts_with("netdev ");
            continue;
        }
        if !in_netdev || !line.starts_with("type ") {
            continue;
        }
        let ingress = line.contains(" hook ingress ");
        let egress = line.contains(" hook egress ");
        if !ingress && !egress {
            continue;
        }
        let devices = if let Some((_, rest)) = line.split_once(" device ") {
            rest.split_whitespace()
                .next()
                .map(|d| vec![d.trim_matches('"').to_string()])
                .unwrap_or_default()
        } else if let Some((_, rest)) = line.split_once(" devices = {") {
            rest.split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(|d| d.trim().trim_matches('"').to_string())
                .filter(|d| !d.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        for dev in devices {
            let h = out.entry(dev).or_default();
            h.ingress |= ingress;
            h.egress |= egress;
        }
    }
    out
}

/// Output of `cmd args…`, or `None` when it cannot run or fails.
async fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = crate::signals::unblocked_in_child(&mut tokio::process::Command::new(cmd))
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The hooks on each of `names`. An interface whose tc filters cannot be read counts as hooked
/// both ways (in doubt the kernel handles it); without `nft` only tc filters are looked at.
pub async fn read(names: &[String]) -> BTreeMap<String, Hooks> {
    let chains = output("nft", &["list", "chains"])
        .await
        .map(|l| netdev_chain_hooks(&l))
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for name in names {
        let mut h = chains.get(name).copied().unwrap_or_default();
        for (dir, flag) in [("ingress", &mut h.ingress), ("egress", &mut h.egress)] {
            match output("tc", &["filter", "show", "dev", name, dir]).await {
                Some(text) => *flag |= !text.trim().is_empty(),
                // No clsact/ingress qdisc: tc says so with an error only for missing devices.
                None => *flag = true,
            }
        }
        out.insert(name.clone(), h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netdev_chains_name_their_devices() {
        // `nft list chains` of nft 1.0.6 with an inet table and two netdev chains.
        let listing = r#"table inet filter {
	chain forward {
		type filter hook forward priority filter; policy accept;
	}
}
table netdev t {
	chain in {
		type filter hook ingress device "eth1" priority filter; policy accept;
	}
	chain out {
		type filter hook egress devices = { "eth0", "eth2" } priority filter; policy accept;
	}
	chain regular {
	}
}
"#;
        let h = netdev_chain_hooks(listing);
        assert_eq!(
            h.get("eth1"),
            Some(&Hooks {
                ingress: true,
                egress: false
            })
        );
        for d in ["eth0", "eth2"] {
            assert_eq!(
                h.get(d),
                Some(&Hooks {
                    ingress: false,
                    egress: true
                })
            );
        }
        assert_eq!(h.len(), 3);
        assert!(netdev_chain_hooks("table inet filter {\n}\n").is_empty());
    }
}
