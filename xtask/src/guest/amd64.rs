//! The amd64 guest: privileged tests that need kernel modules this machine's kernel lacks
//! (802.1Q VLAN, PPPoE, ESP, bridge VLAN filtering, NIC drivers: two emulated e1000e NICs
//! wired to each other, two `mac80211_hwsim` Wi-Fi radios) run in a qemu guest that boots
//! Debian's amd64 kernel with virtme-ng, sharing this root filesystem (binaries, tools, the
//! workspace). One boot runs them all.
//!
//! Such tests are `#[ignore]`d on the host (with a reason naming this step) and run here with
//! `--ignored`.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

use super::{Prepared, Run, Script, Shared};
use crate::cmd;

/// Test targets of `xdp-router-tests` whose ignored tests run in the guest.
pub const TEST_TARGETS: &[&str] = &["vlan", "pppoe", "ipsec", "bridge", "nic", "wireguard"];

/// The MACs of the guest's two emulated e1000e NICs, wired to each other (`tests/nic.rs` finds
/// them by these).
const NIC_MACS: [&str; 2] = ["52:54:00:e1:00:01", "52:54:00:e1:00:02"];

/// Modules the guest tests use (the guest kernel loads nothing on demand for a netns).
const MODULES: &[&str] = &[
    "veth",
    "bridge",
    "8021q",
    "pppoe",
    "ppp_mppe",
    "nf_conntrack",
    "nf_tables",
    "nft_masq",
    "nft_ct",
    "nft_chain_nat",
    "iptable_nat",
    "iptable_filter",
    "ip6table_filter",
    "xt_conntrack",
    "xt_MASQUERADE",
    "nft_compat",
    "iptable_mangle",
    "xt_tcpudp",
    "xt_TCPMSS",
    "nf_conntrack_netlink",
    "sch_ingress",
    "esp4",
    "xfrm_user",
    "xt_policy",
    "gcm",
    "ghash-generic",
    "seqiv",
    "e1000e",
    "mac80211_hwsim",
    "wireguard",
];

/// The Debian package that provides the guest kernel (`cargo xtask setup` installs it): 6.12
/// has what the daemon needs (TCX for arming, BPF_FIB_LOOKUP_MARK) and, as modules, 8021q and
/// pppoe.
pub const KERNEL_PACKAGE: &str = "linux-image-6.12-amd64";

/// The kernel series of [`KERNEL_PACKAGE`]: the guest boots the newest 6.12 in /boot.
pub const KERNEL_SERIES: [u32; 2] = [6, 12];

/// The guest kernel: the newest 6.12 in /boot (see [`kernel_of`]).
pub fn kernel() -> Option<PathBuf> {
    kernel_of(KERNEL_SERIES)
}

/// The newest kernel of `series` (major, minor: Debian 12's own 6.1, its backported 6.12) in
/// /boot that is not the running one and has the 8021q module.
pub fn kernel_of(series: [u32; 2]) -> Option<PathBuf> {
    let running = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut found: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let version = name.strip_prefix("vmlinuz-")?.to_owned();
            let modules = Path::new("/lib/modules").join(&version);
            let key = version_key(&version);
            (version != running.trim()
                && key.starts_with(&series)
                && modules.join("kernel/net/8021q").is_dir())
            .then(|| (key, Path::new("/boot").join(&name)))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// qemu options for two e1000e NICs ([`NIC_MACS`]) wired to each other: each one's frames go
/// to the other's UDP socket on this machine's loopback (two ports free when asked; nothing
/// else reaches them).
fn wired_nics() -> anyhow::Result<String> {
    // Both bound at once, so they differ; released just before qemu binds them.
    let bind = || {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .context("finding a free UDP port for the guest's NICs")
    };
    let sockets = [bind()?, bind()?];
    let mut ports = [0u16; 2];
    for (port, s) in ports.iter_mut().zip(&sockets) {
        *port = s.local_addr()?.port();
    }
    Ok((0..2)
        .map(|i| {
            format!(
                "-netdev socket,id=xrnic{i},localaddr=127.0.0.1:{},udp=127.0.0.1:{} \
                 -device e1000e,netdev=xrnic{i},mac={}",
                ports[i],
                ports[1 - i],
                NIC_MACS[i]
            )
        })
        .collect::<Vec<_>>()
        .join(" "))
}

/// Starts a process that holds a socket with SO_TIMESTAMP (29 on x86; Python's `socket` has no
/// name for it) until the guest powers off, and waits until it holds it (up to 10 s).
pub(super) const HOLD_TIMESTAMPS_ON: &str = "{ /usr/bin/python3 -c 'import socket, time; \
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setsockopt(socket.SOL_SOCKET, 29, 1); \
open(\"/tmp/timestamps-held\", \"w\").close(); time.sleep(1e6)' </dev/null >/dev/null 2>&1 & \
for i in $(seq 20); do [ -e /tmp/timestamps-held ] && break; sleep 0.5; done; \
[ -e /tmp/timestamps-held ]; }";

/// `6.12.117+deb12-amd64` → [6, 12, 117, 12] for ordering.
pub(super) fn version_key(v: &str) -> Vec<u32> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Builds the guest test binaries (those of `only`, all [`TEST_TARGETS`] when it is empty;
/// with `extra` arguments for them, e.g. a name filter) and sets up the boot that runs their
/// ignored tests against `daemon`.
pub fn prepare(daemon: &Path, only: &[String], extra: &[String]) -> anyhow::Result<Prepared> {
    if cmd::which("qemu-system-x86_64").is_none() {
        bail!("qemu-system-x86_64 not found: run `cargo xtask setup`");
    }
    let kernel = kernel().with_context(|| {
        format!("no guest kernel with 8021q in /boot: run `cargo xtask setup` ({KERNEL_PACKAGE})")
    })?;
    let targets: Vec<&str> = TEST_TARGETS
        .iter()
        .copied()
        .filter(|t| only.is_empty() || only.iter().any(|o| o == t))
        .collect();
    let binaries = super::build_test_binaries(&targets, &[], &[])?;
    let root = crate::workspace::root();
    // The guest sees this machine's files read-only and has a /tmp of its own: its result and
    // skips go to a directory shared writable.
    let shared = Shared::new("amd64")?;
    let mut args = vec!["--ignored", "--test-threads=1", "--show-output"];
    args.extend(extra.iter().map(String::as_str));
    let script = Script {
        // cfg80211 (loaded with mac80211_hwsim) asks for `regulatory.db` from a kernel worker;
        // looked up on the 9p root, that lookup crashed the guest kernel in a clean-clone run
        // of 2026-11-27 (a double fault in `v9fs_vfs_lookup` under `request_firmware_work_func`,
        // 60 s after boot). An empty /lib/firmware of the guest's own answers it without 9p
        // (no country is set in the tests: the radios get the world domain either way).
        //
        // The kernel patches its static branches live (an int3 first, then the new bytes).
        // Under qemu without KVM another vCPU can still run that int3 once the patch is done,
        // and the kernel oopses: "Oops: int3" in `__netif_receive_skb_core`, on both boots of a
        // clean-clone run of 2026-11-28, while the PPPoE tests' sockets turned packet
        // timestamps on and off (`netstamp_needed_key`, the function's first branch). One
        // socket holding SO_TIMESTAMP for the whole run keeps that branch on: it is patched
        // once, here, and never again.
        prelude: vec![
            "mkdir -p /lib/firmware && mount -t tmpfs -o size=1m guest-firmware /lib/firmware"
                .into(),
            HOLD_TIMESTAMPS_ON.into(),
        ],
        modules: MODULES.to_vec(),
        path: std::env::var("PATH").unwrap_or_default(),
        env: vec![
            ("XDP_ROUTERD_BIN", daemon.to_string_lossy().into_owned()),
            (
                "XDP_ROUTER_SKIP_LOG",
                shared.skips().to_string_lossy().into_owned(),
            ),
            // An emulated CPU (no KVM), beside the privileged tests in the idle scheduling
            // class: "promptly" may take five times longer (testbed `time_scale`).
            ("XDP_ROUTER_TIME_SCALE", "5".into()),
        ],
        cwd: root.join("tests"),
        setup: Vec::new(),
        runs: binaries
            .into_iter()
            .map(|binary| Run {
                binary,
                args: args.iter().map(|&a| a.to_owned()).collect(),
            })
            .collect(),
        teardown: Vec::new(),
    };
    println!(
        "guest: booting {} (qemu, no KVM: ~30 s) to run {}",
        kernel.display(),
        targets.join(", ")
    );
    let mut vng_args = super::vng_boot_args(kernel);
    // One argument: vng's parser takes a separate value starting with `-` for an option.
    vng_args.push(format!("--qemu-opts={}", wired_nics()?).into());
    let guest_dir = shared.dir.clone();
    Ok(Prepared {
        shared,
        script,
        args: vng_args,
        guest_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_order_numerically() {
        assert!(version_key("6.12.117+deb12-amd64") > version_key("6.1.0-47-amd64"));
        assert!(version_key("6.12.117+deb12-amd64") > version_key("6.12.9+deb12-amd64"));
        // A series is matched on its numbers, not on a prefix of the text.
        assert!(version_key("6.1.0-57-amd64").starts_with(&[6, 1]));
        assert!(!version_key("6.12.117+deb12-amd64").starts_with(&[6, 1]));
        assert!(version_key("6.12.117+deb12-amd64").starts_with(&KERNEL_SERIES));
    }
}
