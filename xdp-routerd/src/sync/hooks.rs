//! Hooks the fast path would jump over on a managed interface: nftables `netdev` chains
//! (ingress runs after XDP, egress after a redirect's target is chosen), classic tc filters
//! (ingress/egress of a `clsact` or ingress qdisc) and, on a bridge's ports, nftables `bridge`
//! family chains (`ebtables-nft` writes them too): `prerouting`/`input` see every frame a port
//! passes up to the IP layer, `output`/`postrouting` every frame the IP layer sends out of a
//! port. Bridge chains are not per device, so one such chain hooks every port of every
//! managed bridge (a rule inside it may still match on `iifname`; in doubt the kernel judges). A packet redirected by XDP passes neither,
//! so a direction that would meet one stays in the kernel (`IFACE_F_INGRESS_HOOK` /
//! `IFACE_F_EGRESS_HOOK`), unless the interface's config says `bypass_hooks = true`. The
//! daemon's own TC programs are TCX links, which `tc filter show` does not list, or on kernels
//! without TCX classic filters at its own priorities and handle, which are left out
//! ([`foreign_tc_filters`]).
//!
//! Read with `nft list chains` (the text form: nft 1.0.6's JSON omits the chain's device) and
//! `tc filter show dev X ingress|egress`, at start, after every ruleset change and after every
//! tc change on a managed interface.

use std::collections::BTreeMap;

use xdp_router_common::{CLASSIC_TC_HANDLE, CLASSIC_TC_PREFS};

/// The hooks found on one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hooks {
    /// An nftables netdev ingress chain or tc ingress filters.
    pub ingress: bool,
    /// An nftables netdev egress chain or tc egress filters.
    pub egress: bool,
}

/// What [`read`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// Per device: netdev chains and tc filters.
    pub devices: BTreeMap<String, Hooks>,
    /// nftables `bridge` family base chains, which apply to every bridge port.
    pub bridge_ports: Hooks,
}

impl Found {
    /// The hooks on `name`, a configured interface.
    pub fn device(&self, name: &str) -> Hooks {
        self.devices.get(name).copied().unwrap_or_default()
    }

    /// The hooks on `name`, a port of a managed bridge.
    pub fn port(&self, name: &str) -> Hooks {
        let h = self.device(name);
        Hooks {
            ingress: h.ingress || self.bridge_ports.ingress,
            egress: h.egress || self.bridge_ports.egress,
        }
    }
}

/// The `type … hook …` lines of the base chains of `family`'s tables in an `nft list chains`
/// listing, trimmed.
fn base_chains<'a>(listing: &'a str, family: &'a str) -> impl Iterator<Item = &'a str> {
    let mut in_family = false;
    listing.lines().map(str::trim).filter(move |line| {
        if let Some(rest) = line.strip_prefix("table ") {
            in_family = rest
                .strip_prefix(family)
                .is_some_and(|r| r.starts_with(' '));
            return false;
        }
        in_family && line.starts_with("type ")
    })
}

/// The hooks of the `bridge` family base chains in an `nft list chains` listing (pure;
/// tested): `prerouting`/`input` are ingress, `output`/`postrouting` egress. `forward` only
/// sees bridged (port to port) frames, which the fast path never carries.
pub fn bridge_chain_hooks(listing: &str) -> Hooks {
    let mut out = Hooks::default();
    for line in base_chains(listing, "bridge") {
        out.ingress |= line.contains(" hook prerouting ") || line.contains(" hook input ");
        out.egress |= line.contains(" hook output ") || line.contains(" hook postrouting ");
    }
    out
}

/// The devices with `netdev` ingress / egress base chains in an `nft list chains` listing
/// (pure; tested). A chain on several devices (`devices = { a, b }`) counts for each.
pub fn netdev_chain_hooks(listing: &str) -> BTreeMap<String, Hooks> {
    let mut out: BTreeMap<String, Hooks> = BTreeMap::new();
    for line in base_chains(listing, "netdev") {
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

/// Whether a line of `tc filter show dev X ingress|egress` is one of the daemon's classic tc
/// filters (kernels without TCX links, `datapath/tc_links.rs`): a `bpf` filter at the priority
/// of one of its entry points, with its handle and that entry point's name (or that priority's
/// own header line, which names no handle). Pure.
pub fn is_own_filter(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |key: &str| {
        words
            .iter()
            .position(|w| *w == key)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    let Some(pref) = after("pref") else {
        return false;
    };
    let mut at_pref = CLASSIC_TC_PREFS
        .iter()
        .filter(|(_, p)| pref == p.to_string())
        .peekable();
    if at_pref.peek().is_none() || !words.contains(&"bpf") {
        return false;
    }
    match after("handle") {
        None => true,
        Some(h) => {
            h == format!("{CLASSIC_TC_HANDLE:#x}")
                && at_pref.any(|(entry, _)| words.contains(entry))
        }
    }
}

/// Whether a `tc filter show dev X ingress|egress` listing has filters other than the
/// daemon's own classic ones (see [`is_own_filter`]). Pure.
pub fn foreign_tc_filters(listing: &str) -> bool {
    listing
        .lines()
        .any(|l| !l.trim().is_empty() && !is_own_filter(l))
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

/// The hooks on each of `names`, and the bridge family's. An interface whose tc filters cannot
/// be read counts as hooked both ways (in doubt the kernel handles it); without `nft` only tc
/// filters are looked at.
pub async fn read(names: &[String]) -> Found {
    let listing = output("nft", &["list", "chains"]).await.unwrap_or_default();
    let chains = netdev_chain_hooks(&listing);
    let mut out = Found {
        devices: BTreeMap::new(),
        bridge_ports: bridge_chain_hooks(&listing),
    };
    for name in names {
        let mut h = chains.get(name).copied().unwrap_or_default();
        for (dir, flag) in [("ingress", &mut h.ingress), ("egress", &mut h.egress)] {
            match output("tc", &["filter", "show", "dev", name, dir]).await {
                Some(text) => *flag |= foreign_tc_filters(&text),
                // No clsact/ingress qdisc: tc says so with an error only for missing devices.
                None => *flag = true,
            }
        }
        out.devices.insert(name.clone(), h);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tc filter show dev eth1 ingress` on Debian 12 (iproute2 6.1) with the daemon's TC fast
    /// path and DSCP stamp as classic filters, and a user's filter.
    #[test]
    fn the_daemons_own_filters_are_known_by_priority_handle_and_name() {
        let own = [
            "filter protocol all pref 30832 bpf chain 0 ",
            "filter protocol all pref 30832 bpf chain 0 handle 0x7872 xr_cls_tc direct-action \
             not_in_hw id 41 name xr_cls_tc tag 6c2a1b5e0f3d9e71 jited ",
            "filter protocol all pref 30833 bpf chain 0 handle 0x7872 xr_cls_stamp \
             direct-action not_in_hw id 44 name xr_cls_stamp tag 0123456789abcdef jited ",
        ];
        for line in own {
            assert!(is_own_filter(line), "{line}");
        }
        let foreign = [
            // Another priority, another handle at the daemon's, another program at both.
            "filter protocol all pref 49152 bpf chain 0 handle 0x1 cil_from_netdev direct-action",
            "filter protocol all pref 30832 bpf chain 0 handle 0x1 xr_cls_tc direct-action",
            "filter protocol all pref 30832 bpf chain 0 handle 0x7872 my_prog direct-action",
            "filter protocol ip pref 30832 u32 chain 0 ",
            "filter parent ffff: protocol ip pref 1 u32 chain 0 fh 800::800 order 2048 key ht 800",
        ];
        for line in foreign {
            assert!(!is_own_filter(line), "{line}");
        }
    }

    /// The daemon's own classic tc filters (kernels without TCX links) are no hook; anything
    /// else listed is.
    #[test]
    fn only_foreign_tc_filters_are_hooks() {
        let own = "filter protocol all pref 30834 bpf chain 0 \n\
                   filter protocol all pref 30834 bpf chain 0 handle 0x7872 xr_cls_arm \
                   direct-action not_in_hw id 40 name xr_cls_arm tag 00ff00ff00ff00ff jited \n";
        assert!(!foreign_tc_filters(own));
        assert!(!foreign_tc_filters(""));
        let with_user = format!(
            "{own}filter protocol ip pref 1 u32 chain 0 \n\
             filter protocol ip pref 1 u32 chain 0 fh 800: ht divisor 1 \n"
        );
        assert!(foreign_tc_filters(&with_user));
    }

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
        assert_eq!(bridge_chain_hooks(listing), Hooks::default());
    }

    #[test]
    fn bridge_family_chains_hook_every_port() {
        // `nft list chains` with an ebtables-nft filter table (INPUT and FORWARD) and a
        // bridge postrouting chain of a table of its own.
        let listing = r#"table bridge filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
	}
	chain FORWARD {
		type filter hook forward priority filter; policy accept;
	}
}
table bridge shaper {
	chain post {
		type filter hook postrouting priority filter; policy accept;
	}
}
table netdev t {
	chain in {
		type filter hook ingress device "lan1" priority filter; policy accept;
	}
}
"#;
        let both = Hooks {
            ingress: true,
            egress: true,
        };
        assert_eq!(bridge_chain_hooks(listing), both);
        let forward_only = "table bridge f {\n\tchain fw {\n\t\ttype filter hook forward priority filter; policy accept;\n\t}\n}\n";
        assert_eq!(bridge_chain_hooks(forward_only), Hooks::default());
        let found = Found {
            devices: netdev_chain_hooks(listing),
            bridge_ports: Hooks {
                ingress: false,
                egress: true,
            },
        };
        // A configured (routed) interface is not touched by bridge chains; a port is.
        assert_eq!(found.device("lan2"), Hooks::default());
        assert_eq!(
            found.port("lan2"),
            Hooks {
                ingress: false,
                egress: true
            }
        );
        assert_eq!(found.port("lan1"), both);
    }
}
