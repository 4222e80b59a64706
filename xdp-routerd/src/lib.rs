//! xdp-routerd: attaches the xdp-router XDP program to the managed interfaces and keeps its maps
//! in step with the kernel (conntrack over ctnetlink; links, addresses and routes over rtnetlink).
pub mod check_system;
pub mod config;
pub mod control;
pub mod daemon;
pub mod datapath;
pub mod flows;
pub mod kernel_features;
pub mod metrics;
pub mod paths;
#[cfg(test)]
mod reference;
pub mod signals;
pub mod startup;
pub mod state;
pub mod status;
pub mod sync;
pub mod tasks;
