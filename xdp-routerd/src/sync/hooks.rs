//! Hooks the fast path would jump over on a managed interface: nftables `netdev` chains
//! (ingress runs after XDP, egress after a redirect's target is chosen), classic tc filters
//! (ingress/egress of a `clsact` or ingress qdisc) and, on a bridge's ports, nftables `bridge`
//! family chains (`ebtables-nft` writes them too): `prerouting`/`input` see every frame a port
//! passes up to the IP layer, `output`/`postrouting` every frame the IP layer sends out of a
//! port. Bridge chains are not per device, so one such chain hooks every port of every
//! managed bridge (a rule inside it may still match on `iifname`; in doubt the kernel judges). A packet redirected by XDP passes neither,
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
                Some(text) => *flag |= !text.trim().is_empty(),
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
