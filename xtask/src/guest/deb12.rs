//! The Debian 12 guest: Debian 12's own amd64 kernel (6.1, `linux-image-6.1.0-<N>-amd64`, what
//! `apt install ./xdp-router_*.deb` meets on a stock bookworm router) booted as the amd64 guest
//! boots its 6.12, sharing this root filesystem. It has no TCX links (the TC programs go in as
//! classic tc filters), no `BPF_FIB_LOOKUP_MARK` and an older verifier than any kernel the other
//! steps run. The amd64 package of `cargo xtask dist` is installed there with dpkg (over
//! overlays: this machine's root stays untouched), its `xdp-routerd check-system` must pass,
//! the core end-to-end tests ([`E2E`]) run against the installed daemon, and the package is
//! purged and must leave nothing behind.

use std::{fs, path::PathBuf};

use anyhow::{Context as _, bail};

use super::{Prepared, Run, Script, Shared, amd64};
use crate::{cmd, dist};

/// The kernel series the guest boots.
pub const SERIES: [u32; 2] = [6, 1];

/// ipset's modules, loaded with [`super::CORE_MODULES`] (the `ipset add` test).
const IPSET_MODULES: &[&str] = &["xt_set", "ip_set_hash_ip"];

/// The core end-to-end tests, by test target: v4 NAT both ways and v4 and v6 offloaded and
/// intact (TTL and checksums at the receiver), a NATed TCP upload and download each ≥ 90 %
/// fast-pathed (both wait until the daemon lists the connection before their bulk, so the share
/// does not depend on how fast the emulated daemon offloads), the negative control, SIGKILL
/// failing open, a FORWARD DROP and an `ipset add` stopping an offloaded stream, the per-host
/// counters against the wire over a 100 MB transfer, and the TC datapath on classic tc
/// filters: forwarding, and doing nothing once the daemon is killed.
const E2E: &[(&str, &[&str])] = &[
    (
        "e2e",
        &[
            "udp_v4_both_directions_with_reverse_nat",
            "tcp_v4_bulk_is_fast_pathed_and_masqueraded",
            "tcp_v4_download_is_fast_pathed_through_reverse_nat",
            "ttl_and_checksums_at_the_receiver",
            "negative_control_fastpath_off",
            "sigkill_fails_open",
        ],
    ),
    ("firewall", &["iptables_drop_stops_an_offloaded_stream"]),
    ("verdicts", &["ipset_add_stops_an_offloaded_flow"]),
    (
        "accounting",
        &["hundred_megabytes_fast_pathed_are_counted_per_flow_and_per_host"],
    ),
    ("tc", &["tc_datapath_fails_open_on_sigkill"]),
];

/// The guest kernel: the newest 6.1 in /boot.
pub fn kernel() -> Option<PathBuf> {
    amd64::kernel_of(SERIES)
}

/// The newest `linux-image-6.1.0-<N>-amd64` in `names` (`apt-cache pkgnames` output): the
/// package `cargo xtask setup` installs for the guest. Pure.
pub fn newest_package(names: &str) -> Option<&str> {
    names
        .lines()
        .map(str::trim)
        .filter_map(|n| {
            let abi = n
                .strip_prefix("linux-image-6.1.0-")?
                .strip_suffix("-amd64")?
                .parse::<u32>()
                .ok()?;
            Some((abi, n))
        })
        .max()
        .map(|(_, n)| n)
}

/// Builds the amd64 package and the test binaries and sets up the boot that installs the
/// package and runs [`E2E`] against its daemon.
pub fn prepare() -> anyhow::Result<Prepared> {
    let kernel = kernel().context(
        "no Debian 12 kernel (6.1) with 8021q in /boot: run `cargo xtask setup` \
         (linux-image-6.1.0-<N>-amd64)",
    )?;
    prepare_core(kernel, "deb12", "Debian 12 guest")
}

/// Sets up the boot of `kernel` (a distribution's amd64 kernel in /boot, its modules in
/// /lib/modules) that installs the amd64 package, runs its `xdp-routerd check-system` and
/// [`E2E`] against its daemon, and purges it; `name` names its shared directory, `label` the
/// guest in what is printed. The Debian 12 guest and the Ubuntu 22.04 one ([`super::jammy`])
/// boot this way.
pub(super) fn prepare_core(kernel: PathBuf, name: &str, label: &str) -> anyhow::Result<Prepared> {
    if cmd::which("qemu-system-x86_64").is_none() {
        bail!("qemu-system-x86_64 not found: run `cargo xtask setup`");
    }
    let (_, built) = dist::run(dist::DistArch::Amd64)?;
    let deb = &built.first().context("dist built no amd64 package")?.deb;
    let targets: Vec<&str> = E2E.iter().map(|(t, _)| *t).collect();
    let binaries = super::build_test_binaries(&targets, &[], &[])?;
    let shared = Shared::new(name)?;
    // A copy in the guest's directory: the packages step rebuilds target/dist's while the
    // guest may still be running beside other steps.
    let guest_deb = shared
        .dir
        .join(deb.file_name().context("the package's file name")?);
    fs::copy(deb, &guest_deb)
        .with_context(|| format!("copy {} to {}", deb.display(), guest_deb.display()))?;
    let runs = E2E
        .iter()
        .zip(binaries)
        .map(|((_, names), binary)| {
            let mut args: Vec<String> = ["--test-threads=1", "--show-output", "--exact"]
                .map(str::to_owned)
                .into();
            args.extend(names.iter().map(|n| (*n).to_owned()));
            Run { binary, args }
        })
        .collect();
    let script = Script {
        // See the amd64 guest: a socket holding SO_TIMESTAMP keeps the kernel from patching a
        // static branch live while a test runs.
        prelude: vec![amd64::HOLD_TIMESTAMPS_ON.into()],
        modules: [super::CORE_MODULES, IPSET_MODULES].concat(),
        path: std::env::var("PATH").unwrap_or_default(),
        env: vec![
            ("XDP_ROUTERD_BIN", format!("/{}", dist::DAEMON_PATH)),
            (
                "XDP_ROUTER_SKIP_LOG",
                shared.skips().to_string_lossy().into_owned(),
            ),
            // An emulated CPU (no KVM): "promptly" may take five times longer.
            ("XDP_ROUTER_TIME_SCALE", "5".into()),
        ],
        cwd: crate::workspace::root().join("tests"),
        setup: super::install_package(&guest_deb),
        runs,
        teardown: super::purge_package(),
    };
    println!(
        "{label}: will boot {} (qemu, no KVM) to install {}, run check-system and {} \
         end-to-end tests",
        kernel.display(),
        guest_deb.display(),
        E2E.iter().map(|(_, n)| n.len()).sum::<usize>()
    );
    let mut args = super::vng_boot_args(kernel);
    for dir in super::PACKAGE_OVERLAYS {
        args.extend(["--overlay-rwdir".into(), dir.into()]);
    }
    let guest_dir = shared.dir.clone();
    Ok(Prepared {
        shared,
        script,
        args,
        guest_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_abi_of_the_plain_amd64_flavour_is_installed() {
        let names = "linux-image-6.1.0-49-amd64\nlinux-image-6.1.0-57-rt-amd64\n\
                     linux-image-6.1.0-57-amd64\nlinux-image-6.1.0-9-amd64\n\
                     linux-image-6.1.0-50-cloud-amd64\nlinux-image-6.1.0-57-amd64-dbg\n";
        assert_eq!(newest_package(names), Some("linux-image-6.1.0-57-amd64"));
        assert_eq!(newest_package("linux-image-6.12-amd64\n"), None);
    }
}
