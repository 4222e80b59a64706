//! The daemon's configuration file for a part of the scale benchmark.

use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::Result;

use crate::testbed::Testbed;

/// Writes `dir/xdp-routerd.toml`: the testbed's LAN and WAN ports, native XDP, the control
/// socket in `dir`, and `extra` (more top-level settings).
pub(super) fn config(dir: &Path, tb: &Testbed, extra: &str) -> Result<PathBuf> {
    let path = dir.join("xdp-routerd.toml");
    fs::write(
        &path,
        format!(
            "control_socket = \"{}\"\nxdp_mode = \"native\"\nkeepalive_interval_ms = 2000\n\
             log_level = \"info\"\n{extra}\n\
             [[interface]]\nname = \"{}\"\nrole = \"lan\"\n\n\
             [[interface]]\nname = \"{}\"\nrole = \"wan\"\n",
            dir.join("control.sock").display(),
            tb.names.rl,
            tb.names.rw
        ),
    )?;
    Ok(path)
}
