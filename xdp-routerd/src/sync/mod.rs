//! Keeping the datapath maps in step with the kernel.
pub mod conntrack;
pub mod ctnetlink;
pub mod hooks;
pub mod nftables;
pub mod qdisc;
pub mod rtnl;
