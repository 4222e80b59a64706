//! The guest step of `cargo xtask test`: privileged tests that need kernel modules this
//! machine's kernel lacks (802.1Q VLAN, PPPoE, ESP, bridge VLAN filtering) run in a qemu guest that boots Debian's kernel
//! with virtme-ng, sharing this root filesystem (binaries, tools, the workspace). One boot runs
//! them all. The guest is emulated (no KVM here): its timings mean nothing, its results do.
//!
//! Such tests are `#[ignore]`d on the host (with a reason naming this step) and run here with
//! `--ignored`.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::cmd;

/// Test targets of `xdp-router-tests` whose ignored tests run in the guest.
pub const TEST_TARGETS: &[&str] = &["vlan", "pppoe", "ipsec", "bridge"];

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
];

/// The Debian package that provides the guest kernel (`cargo xtask setup` installs it): 6.12
/// has what the daemon needs (TCX for arming, BPF_FIB_LOOKUP_MARK) and, as modules, 8021q and
/// pppoe.
pub const KERNEL_PACKAGE: &str = "linux-image-6.12-amd64";

/// The newest kernel in /boot that is not the running one and has the 8021q module: the guest
/// kernel.
pub fn kernel() -> Option<PathBuf> {
    let running = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut found: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/boot")
        .ok()?
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let version = name.strip_prefix("vmlinuz-")?.to_owned();
            let modules = Path::new("/lib/modules").join(&version);
            (version != running.trim() && modules.join("kernel/net/8021q").is_dir())
                .then(|| (version_key(&version), Path::new("/boot").join(&name)))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p)
}

/// `6.12.117+deb12-amd64` → [6, 12, 117, 12] for ordering.
fn version_key(v: &str) -> Vec<u32> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Builds the guest test binaries, boots the guest once and runs their ignored tests (with
/// `extra` arguments, e.g. a name filter). Returns the names of failed tests; an error when the
/// guest cannot run or its run did not finish.
pub fn run(daemon: &Path, skip_log: &Path, extra: &[String]) -> anyhow::Result<Vec<String>> {
    let vng = cmd::which("vng").context("virtme-ng (`vng`) not found: run `cargo xtask setup`")?;
    if cmd::which("qemu-system-x86_64").is_none() {
        bail!("qemu-system-x86_64 not found: run `cargo xtask setup`");
    }
    let kernel = kernel().with_context(|| {
        format!("no guest kernel with 8021q in /boot: run `cargo xtask setup` ({KERNEL_PACKAGE})")
    })?;
    let binaries = build_test_binaries()?;
    let root = crate::workspace::root();
    // The guest sees this machine's files read-only and has a /tmp of its own: its result and
    // skips go to a directory shared writable (`--rwdir`).
    let dir = root
        .join("target")
        .join(format!("guest-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let result = dir.join("result");
    let guest_skips = dir.join("skips");
    let script = dir.join("run.sh");
    fs::write(
        &script,
        script_text(&binaries, daemon, &guest_skips, &result, root, extra),
    )
    .with_context(|| format!("write {}", script.display()))?;
    println!(
        "guest: booting {} (qemu, no KVM: ~30 s) to run {}",
        kernel.display(),
        TEST_TARGETS.join(", ")
    );
    // The guest's console goes to stderr, which qemu reopens (truncating a log file that
    // stderr is redirected to): `sh` sends it into the stdout pipe read below instead.
    let mut c = Command::new("sh");
    c.args(["-c", "exec \"$@\" 2>&1", "sh", "timeout", "1800"])
        .arg(vng)
        .arg("-r")
        .arg(&kernel)
        .args(["--disable-kvm", "--cpus", "2", "--memory", "4G", "--rwdir"])
        .arg(&dir)
        .arg("--exec")
        .arg(format!("bash {}", script.display()));
    let failed = cmd::run_collecting_failures(&mut c);
    let status = fs::read_to_string(&result);
    if let Ok(skips) = fs::read_to_string(&guest_skips) {
        use std::io::Write as _;
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(skip_log)
            .and_then(|mut f| f.write_all(skips.as_bytes()))
            .with_context(|| format!("append the guest's skips to {}", skip_log.display()))?;
    }
    let _ = fs::remove_dir_all(&dir);
    let failed = failed?;
    match status.as_deref().map(str::trim) {
        Ok("0") => Ok(failed),
        Ok(_) if !failed.is_empty() => Ok(failed),
        Ok(rc) => bail!("a guest test binary failed (exit {rc}) without naming a test"),
        Err(_) => bail!("the guest did not finish its tests (no result file): see its output"),
    }
}

/// `cargo test -p xdp-router-tests --no-run` for [`TEST_TARGETS`]; their executables.
fn build_test_binaries() -> anyhow::Result<Vec<PathBuf>> {
    let mut c = cmd::cargo();
    c.args([
        "test",
        "-p",
        "xdp-router-tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    for t in TEST_TARGETS {
        c.args(["--test", t]);
    }
    let out = cmd::output(&mut c)?;
    let mut bins = Vec::new();
    for line in out.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["reason"] == "compiler-artifact"
            && let (Some(name), Some(exe)) =
                (v["target"]["name"].as_str(), v["executable"].as_str())
            && TEST_TARGETS.contains(&name)
        {
            bins.push(PathBuf::from(exe));
        }
    }
    if bins.len() != TEST_TARGETS.len() {
        bail!(
            "expected {} guest test binaries, cargo built {bins:?}",
            TEST_TARGETS.len()
        );
    }
    Ok(bins)
}

/// The script the guest runs: load the modules, run each binary's ignored tests one at a time
/// (each one's exit status and the time so far printed), write the overall exit status to
/// `result`. Its stderr joins its stdout: the guest's two console streams reach the host as two
/// qemu ports writing into one pipe, where they could interleave inside a line.
fn script_text(
    binaries: &[PathBuf],
    daemon: &Path,
    skip_log: &Path,
    result: &Path,
    root: &Path,
    extra: &[String],
) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let extra: Vec<String> = extra.iter().map(|a| quote(a)).collect();
    let mut s = format!(
        "set -u\n\
         exec 2>&1\n\
         echo \"guest: $(uname -r)\"\n\
         modprobe -a {modules} || {{ echo 'guest: modprobe failed'; echo 1 > {result}; exit 1; }}\n\
         export PATH={path}\n\
         export XDP_ROUTERD_BIN={daemon} XDP_ROUTER_SKIP_LOG={skip_log}\n\
         {ci}\
         cd {tests}\n\
         rc=0\n",
        modules = MODULES.join(" "),
        result = quote(&result.to_string_lossy()),
        path = quote(&std::env::var("PATH").unwrap_or_default()),
        daemon = quote(&daemon.to_string_lossy()),
        skip_log = quote(&skip_log.to_string_lossy()),
        ci = if std::env::var_os("CI").is_some() {
            "export CI=1\n"
        } else {
            ""
        },
        tests = quote(&root.join("tests").to_string_lossy()),
    );
    for b in binaries {
        s.push_str(&format!(
            "{} --ignored --test-threads=1 --show-output {}\n\
             s=$?; printf 'guest: %s exited %s after %s s\\n' {} $s $SECONDS; [ $s -eq 0 ] || rc=1\n",
            quote(&b.to_string_lossy()),
            extra.join(" "),
            quote(&b.file_name().unwrap_or_default().to_string_lossy()),
        ));
    }
    s.push_str(&format!(
        "echo $rc > {}\n",
        quote(&result.to_string_lossy())
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_order_numerically() {
        assert!(version_key("6.12.117+deb12-amd64") > version_key("6.1.0-47-amd64"));
        assert!(version_key("6.12.117+deb12-amd64") > version_key("6.12.9+deb12-amd64"));
    }

    #[test]
    fn script_runs_every_binary_and_records_the_status() {
        let s = script_text(
            &[PathBuf::from("/t/vlan-1"), PathBuf::from("/t/pppoe-2")],
            Path::new("/r/xdp-routerd"),
            Path::new("/tmp/skips"),
            Path::new("/tmp/g/result"),
            Path::new("/w"),
            &["name's".into()],
        );
        assert!(s.contains("modprobe -a veth bridge 8021q"));
        assert!(s.starts_with("set -u\nexec 2>&1\n"));
        assert!(s.contains(
            "'/t/vlan-1' --ignored --test-threads=1 --show-output 'name'\\''s'\n\
             s=$?; printf 'guest: %s exited %s after %s s\\n' 'vlan-1' $s $SECONDS; [ $s -eq 0 ] || rc=1\n"
        ));
        assert!(s.contains("'/t/pppoe-2' --ignored"));
        assert!(s.contains("export XDP_ROUTERD_BIN='/r/xdp-routerd'"));
        assert!(s.ends_with("echo $rc > '/tmp/g/result'\n"));
    }
}
