//! Why a conntrack entry is not (or no longer) offloaded: [`Skip`], with the stable names
//! logs, metrics and the status report use.

/// Why a conntrack entry is not (or no longer) offloaded, besides conntrack's own reasons. What
/// each means is [`Skip::description`] (also the manual's, generated from it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Skip {
    NotEstablished,
    PathNotManaged,
    NatAddressGone,
    TableFull,
    MapError,
    HeldByRule,
}

impl Skip {
    /// Stable name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Skip::NotEstablished => "not_established",
            Skip::PathNotManaged => "path_not_managed",
            Skip::NatAddressGone => "nat_address_gone",
            Skip::TableFull => "flow_table_full",
            Skip::MapError => "map_error",
            Skip::HeldByRule => "held_by_rule",
        }
    }

    /// What it means, for users (one sentence or two, Markdown).
    pub fn description(self) -> &'static str {
        match self {
            Skip::NotEstablished => {
                "Conntrack's state does not allow it: not established yet, a connection with a \
                 helper, a protocol other than TCP and UDP."
            }
            Skip::PathNotManaged => {
                "One endpoint is not reached through a managed interface, or is the router \
                 itself."
            }
            Skip::NatAddressGone => "The SNAT address is no longer an address of this router.",
            Skip::TableFull => {
                "The flow map is full (`flow_capacity`); the connection stays in the kernel."
            }
            Skip::MapError => "Another error of the flow maps.",
            Skip::HeldByRule => {
                "A firewall rule that must see every packet (a log, limit, queue, …) can match \
                 the connection's packets (`per_packet_rules = \"hold\"`): `status` names the \
                 rule."
            }
        }
    }

    /// Every reason.
    pub const ALL: [Skip; 6] = [
        Skip::NotEstablished,
        Skip::PathNotManaged,
        Skip::NatAddressGone,
        Skip::TableFull,
        Skip::MapError,
        Skip::HeldByRule,
    ];

    /// The reason called `name`, if any.
    pub fn from_name(name: &str) -> Option<Skip> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `pad`, not `write_str`: tables align names with `{:<28}`.
        f.pad(self.name())
    }
}

/// Serialized as its stable name (the `reason` label of `connections_skipped`).
impl serde::Serialize for Skip {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for Skip {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Skip::from_name(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown skip reason {name:?}")))
    }
}
