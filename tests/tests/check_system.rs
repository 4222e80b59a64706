//! `xdp-routerd check-system` on a router namespace: a veth port (native XDP), a macvlan port
//! (no native XDP) and a configured device that does not exist yet are each reported as such,
//! and the kernel requirements pass; without privileges the same command fails and says which
//! capabilities are missing (the negative control). Run as root (`cargo xtask test`).

use std::{fs, process::Output};

use xdp_router_tests::{
    netns::Netns,
    testbed::{TempDir, daemon_binary, ready},
};

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The report line of `what` (a requirement or a device name).
fn line<'a>(report: &'a str, what: &str) -> &'a str {
    report
        .lines()
        .find(|l| {
            l.get(6..)
                .is_some_and(|rest| rest.starts_with(&format!("{what} ")))
        })
        .unwrap_or_else(|| panic!("no line for {what}:\n{report}"))
}

#[test]
fn check_system_reports_each_device_and_the_missing_privileges() {
    if !ready("check_system_reports_each_device_and_the_missing_privileges") {
        return;
    }
    let ns = Netns::new("cks");
    ns.sh("ip link add eth1 type veth peer name eth9
         ip link add mv0 link eth1 type macvlan mode bridge
         ip link set eth1 up
         ip link set eth9 up
         ip link set mv0 up");
    let dir = TempDir::new();
    let config = dir.path().join("xdp-routerd.toml");
    fs::write(
        &config,
        "[[interface]]\nname = \"eth1\"\nrole = \"lan\"\n\
         [[interface]]\nname = \"mv0\"\nrole = \"lan\"\n\
         [[interface]]\nname = \"ppp0\"\nrole = \"wan\"\n",
    )
    .expect("write config");
    let bin = daemon_binary();
    let bin = bin.to_str().expect("utf-8 path");
    let config = config.to_str().expect("utf-8 path");

    let out = ns.exec(bin, &["check-system", "--config", config]);
    let report = text(&out);
    eprintln!("{report}");
    assert!(
        out.status.success(),
        "check-system failed as root:\n{report}"
    );
    for what in ["kernel", "btf", "privileges", "ebpf"] {
        assert!(line(&report, what).starts_with("ok "), "{what}:\n{report}");
    }
    assert!(
        line(&report, "eth1").starts_with("ok ") && line(&report, "eth1").contains("native XDP"),
        "{report}"
    );
    assert!(
        line(&report, "mv0").starts_with("warn") && line(&report, "mv0").contains("generic_xdp"),
        "{report}"
    );
    assert!(
        line(&report, "ppp0").contains("does not exist yet"),
        "{report}"
    );
    assert!(
        !report.contains("eth9"),
        "a device outside the config is listed:\n{report}"
    );

    // Without privileges: exit 1, the missing capabilities named, the load not tried.
    let out = ns.exec(
        "setpriv",
        &[
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            bin,
            "check-system",
            "--config",
            config,
        ],
    );
    let report = text(&out);
    eprintln!("{report}");
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        line(&report, "privileges").starts_with("FAIL")
            && line(&report, "privileges").contains("CAP_BPF"),
        "{report}"
    );
    assert!(line(&report, "ebpf").starts_with("FAIL"), "{report}");
}
