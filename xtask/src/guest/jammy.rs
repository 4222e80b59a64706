//! The Ubuntu 22.04 guest: Ubuntu 22.04's own amd64 kernel (5.15, `linux-image-unsigned-5.15.0-
//! <N>-generic` with its two module packages, as on a stock jammy router and close to OpenWrt
//! 23.05's 5.15) booted as the Debian 12 guest boots 6.1 (see [`super::deb12`]), sharing this
//! root filesystem. It has no multi-buffer XDP (the daemon attaches its single-buffer XDP
//! program), no TCX links, no `BPF_FIB_LOOKUP_MARK`, no netdev XDP-features family, and the
//! oldest verifier of any kernel the test command boots: `xdp-routerd check-system` must pass
//! there, and the Debian 12 guest's core end-to-end tests run against the release daemon.
//!
//! Opt-in (`cargo xtask test --jammy`): its boot and tests take as long as the Debian 12
//! guest's. `cargo xtask setup` fetches the kernel from archive.ubuntu.com ([`fetch`]): Ubuntu's
//! packages are not in this machine's apt sources, so they are unpacked (`dpkg-deb -x`) into
//! /boot and /lib/modules, not installed.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use super::{Prepared, amd64};
use crate::cmd;

/// The kernel series the guest boots.
pub const SERIES: [u32; 2] = [5, 15];

/// Where the packages come from: Ubuntu's archive, jammy-updates.
const ARCHIVE: &str = "http://archive.ubuntu.com/ubuntu";
const INDEX: &str = "dists/jammy-updates/main/binary-amd64/Packages.xz";

/// The packages of one kernel ABI, `{}` standing for `5.15.0-<N>`: the image and its modules
/// (veth, 8021q, nf_tables… are in `linux-modules`, ipset's and sch_ingress's partly in
/// `-extra`).
const PACKAGES: [&str; 3] = [
    "linux-image-unsigned-{}-generic",
    "linux-modules-{}-generic",
    "linux-modules-extra-{}-generic",
];

/// The guest kernel: the newest 5.15 in /boot with 8021q.
pub fn kernel() -> Option<PathBuf> {
    amd64::kernel_of(SERIES)
}

/// The newest `5.15.0-<N>` in `index` (an apt `Packages` file) for which all of [`PACKAGES`]
/// are there, with each package's path in the archive. Pure.
pub fn newest(index: &str) -> Option<(String, Vec<String>)> {
    let mut files: Vec<(String, String)> = Vec::new();
    let mut package = None;
    for line in index.lines() {
        if let Some(p) = line.strip_prefix("Package: ") {
            package = Some(p.trim().to_owned());
        } else if let (Some(f), Some(p)) = (line.strip_prefix("Filename: "), &package) {
            files.push((p.clone(), f.trim().to_owned()));
        }
    }
    let abi_of = |p: &str| -> Option<u32> {
        p.strip_prefix("linux-image-unsigned-5.15.0-")?
            .strip_suffix("-generic")?
            .parse()
            .ok()
    };
    let mut abis: Vec<u32> = files.iter().filter_map(|(p, _)| abi_of(p)).collect();
    abis.sort_unstable();
    abis.into_iter().rev().find_map(|abi| {
        let version = format!("5.15.0-{abi}");
        let paths: Option<Vec<String>> = PACKAGES
            .iter()
            .map(|p| {
                let name = p.replace("{}", &version);
                files
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, f)| f.clone())
            })
            .collect();
        Some((version, paths?))
    })
}

/// `cargo xtask setup`: makes sure a 5.15 kernel is in /boot with its modules, fetching the
/// newest of jammy-updates from archive.ubuntu.com when none is. An unreachable archive is an
/// error of one line (the step that needs the kernel then says it is missing).
pub fn fetch() -> anyhow::Result<()> {
    if let Some(k) = kernel() {
        println!("  Ubuntu 22.04 guest kernel {}", k.display());
        return Ok(());
    }
    let dir = std::env::temp_dir().join(format!("xdp-router-jammy-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let fetched = fetch_into(&dir);
    let _ = fs::remove_dir_all(&dir);
    fetched
}

/// [`fetch`] for `cargo xtask setup`: a kernel that cannot be fetched is said in one line and
/// fails nothing here (the opt-in step that boots it fails, saying it is missing).
pub fn setup() -> anyhow::Result<()> {
    if let Err(e) = fetch() {
        println!("  {e:#}");
    }
    Ok(())
}

fn fetch_into(dir: &Path) -> anyhow::Result<()> {
    let get = |path: &str, to: &Path| -> anyhow::Result<()> {
        let out = Command::new("curl")
            .args(["-fsS", "--retry", "2", "-m", "900", "-o"])
            .arg(to)
            .arg(format!("{ARCHIVE}/{path}"))
            .output()
            .context("cannot run curl")?;
        if !out.status.success() {
            bail!(
                "cannot fetch Ubuntu 22.04's 5.15 kernel (the --jammy guest step) from \
                 {ARCHIVE}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    let index_xz = dir.join("Packages.xz");
    get(INDEX, &index_xz)?;
    let index = cmd::output(Command::new("xz").arg("-dc").arg(&index_xz))?;
    let Some((version, paths)) = newest(&index) else {
        bail!("{ARCHIVE}/{INDEX} lists no complete linux-image-unsigned-5.15.0-<N>-generic");
    };
    println!("  fetching Ubuntu 22.04's kernel {version}-generic from {ARCHIVE}");
    let root = dir.join("root");
    for path in &paths {
        let deb = dir.join(path.rsplit('/').next().unwrap_or("package.deb"));
        get(path, &deb)?;
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    }
    let release = format!("{version}-generic");
    // Copied, not unpacked over /: /lib is a link to /usr/lib here, and the packages' own
    // maintainer scripts (initramfs, grub) are not wanted for a guest kernel.
    cmd::run(
        Command::new("cp")
            .arg("-a")
            .arg(root.join(format!("boot/vmlinuz-{release}")))
            .arg(root.join(format!("boot/config-{release}")))
            .arg("/boot/"),
    )?;
    cmd::run(
        Command::new("cp")
            .arg("-a")
            .arg(root.join(format!("lib/modules/{release}")))
            .arg("/lib/modules/"),
    )?;
    cmd::run(Command::new("depmod").arg(&release))?;
    match kernel() {
        Some(k) => {
            println!("  Ubuntu 22.04 guest kernel {}", k.display());
            Ok(())
        }
        None => bail!("{release} unpacked, but no 5.15 kernel with 8021q is in /boot"),
    }
}

/// Sets up the boot that installs the amd64 package and runs its check-system and the Debian
/// 12 guest's core end-to-end tests on Ubuntu 22.04's kernel.
pub fn prepare() -> anyhow::Result<Prepared> {
    let kernel = kernel().context(
        "no Ubuntu 22.04 kernel (5.15) with 8021q in /boot: run `cargo xtask setup` \
         (it fetches linux-image-unsigned-5.15.0-<N>-generic from archive.ubuntu.com)",
    )?;
    super::deb12::prepare_core(kernel, "jammy", "Ubuntu 22.04 guest")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_abi_with_all_three_packages_is_fetched() {
        let entry =
            |p: &str| format!("Package: {p}\nVersion: 1\nFilename: pool/main/l/linux/{p}.deb\n\n");
        let mut index = String::new();
        for abi in [203, 208] {
            for p in PACKAGES {
                index += &entry(&p.replace("{}", &format!("5.15.0-{abi}")));
            }
        }
        // 210 lacks its extra modules; lowlatency and HWE kernels are other flavours.
        index += &entry("linux-image-unsigned-5.15.0-210-generic");
        index += &entry("linux-modules-5.15.0-210-generic");
        index += &entry("linux-image-unsigned-5.15.0-211-lowlatency");
        index += &entry("linux-image-unsigned-6.8.0-90-generic");
        let (version, paths) = newest(&index).expect("a complete ABI");
        assert_eq!(version, "5.15.0-208");
        assert_eq!(
            paths,
            [
                "pool/main/l/linux/linux-image-unsigned-5.15.0-208-generic.deb",
                "pool/main/l/linux/linux-modules-5.15.0-208-generic.deb",
                "pool/main/l/linux/linux-modules-extra-5.15.0-208-generic.deb",
            ]
        );
        assert_eq!(newest(&entry("linux-modules-5.15.0-208-generic")), None);
    }
}
